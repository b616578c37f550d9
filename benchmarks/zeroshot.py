"""Zero-shot scoring throughput: gpt1's selective batched scorer vs transformers, same inputs.

For each task the heuristic's own requests are recorded once (real data from ../shared/data,
tokenized with the original GPT-1 vocabulary), then scored by:

* gpt1: `gpt1.inference.scoring.Scorer` -- one forward per length-sorted batch, the tied output layer only at
  the positions whose next token is scored, rows that are prefixes of other rows shared;
* gpt1 (all positions): the same batches through our model with full logits at every position,
  to show how much comes from the output layer;
* HF: transformers' `OpenAIGPTLMHeadModel` with the same weights, "the plain way": one row per
  distinct `context + continuation[:-1]`, the same length-sorted batches and token budget, full
  logits and log-softmax at every position, then the needed entries gathered.

Weights are random (speed does not depend on them); log-probabilities of gpt1 and HF are compared
so the timing is of equal work. Prints requests/s and the speedup per task and dtype.

    python benchmarks/zeroshot.py                    # mini preset shape, 100 examples a task
    python benchmarks/zeroshot.py --preset gpt1 --limit 30 --repeats 2 --threads 2
    python benchmarks/zeroshot.py --tasks cola --dtypes fp32 --ceiling   # + GEMM-bound ceiling
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = Path(os.environ.get("GPT1_SHARED_DATA", ROOT.parent / "shared" / "data"))

from gemm_profile import gemm_seconds  # noqa: E402  (benchmarks/)

from gpt1.config import model_preset  # noqa: E402
from gpt1.inference.scoring import Scorer  # noqa: E402
from gpt1.model.gpt import GPT  # noqa: E402
from gpt1.zeroshot import heuristics as zh  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Recorder:
    """Stands in for a Scorer to capture the requests a heuristic makes."""

    def __init__(self, scorer: Scorer):
        self.scorer, self.requests, self.truncated = scorer, [], 0
        self.n_positions, self.model = scorer.n_positions, scorer.model  # read by run_task

    def score(self, requests, greedy: bool = False):
        self.requests.extend(requests)
        return self.scorer.score(requests, greedy=greedy)


def record_requests(model: GPT, tok, tasks: list[str], limit: int) -> dict[str, list]:
    out = {}
    for task in tasks:
        folder = zh.task_folder(task, DATA)
        rec = Recorder(Scorer(model))
        zh.run_task(task, rec, tok, folder, limit=limit)
        out[task] = rec.requests
    return out


def hf_model(model: GPT):
    import transformers

    transformers.logging.set_verbosity_error()
    c = model.config
    cfg = transformers.OpenAIGPTConfig(
        vocab_size=c.vocab_size,
        n_positions=c.n_positions,
        n_embd=c.n_embd,
        n_layer=c.n_layer,
        n_head=c.n_head,
        afn="gelu",
    )
    hf = transformers.OpenAIGPTLMHeadModel(cfg).eval()
    state = {}
    for k, v in model.state_dict().items():
        name = {"wte.weight": "tokens_embed.weight", "wpe.weight": "positions_embed.weight"}.get(
            k, k
        )
        # nn.Linear stores [out, in]; HF's Conv1D stores [in, out].
        state["transformer." + name] = v.t() if ".c_" in k and k.endswith("weight") else v
    hf.load_state_dict(state, strict=False)
    hf.tie_weights()
    return hf


def plain_batches(requests, n_positions: int, batch_tokens: int, max_rows: int):
    """Distinct rows (context + continuation[:-1]), longest first, packed like the Scorer packs."""
    rows = {}
    for ctx, cont in requests:
        room = n_positions - len(cont) + 1
        rows.setdefault(tuple(list(ctx)[-room:] + list(cont)[:-1]), None)
    ordered = sorted(rows, key=len, reverse=True)
    batches, batch = [], []
    for row in ordered:
        if batch and ((len(batch) + 1) * len(batch[0]) > batch_tokens or len(batch) >= max_rows):
            batches.append(batch)
            batch = []
        batch.append(row)
    return batches + ([batch] if batch else [])


@torch.inference_mode()
def score_plain(forward_logits, batches, requests, n_positions: int) -> list[list[float]]:
    """Full logits at every position of every row, then the requested entries."""
    table = {}
    for batch in batches:
        ids = torch.zeros(len(batch), len(batch[0]), dtype=torch.long)
        for b, row in enumerate(batch):
            ids[b, : len(row)] = torch.tensor(row)
        logp = torch.log_softmax(forward_logits(ids).float(), dim=-1)  # [B, T, V]
        for b, row in enumerate(batch):
            table[row] = logp[b]
    out = []
    for ctx, cont in requests:
        room = n_positions - len(cont) + 1
        ctx = list(ctx)[-room:]
        lp = table[tuple(ctx + list(cont)[:-1])]
        out.append([float(lp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont)])
    return out


def interleaved(fns: dict, repeats: int) -> tuple[dict, dict]:
    """Best-of-N seconds per engine, the engines taking turns so that bursts of load from other
    processes on a shared machine hit all of them alike; plus each engine's last result."""
    best = {name: float("inf") for name in fns}
    results = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            results[name] = fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, results


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--preset", default="mini", help="model shape (vocabulary: GPT-1's 40,478)")
    ap.add_argument("--tasks", default="sst2,cola,story_cloze,lambada")
    ap.add_argument("--limit", type=int, default=100, help="examples per task")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="best of N timings")
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--max-rows", type=int, default=64)
    ap.add_argument(
        "--ceiling",
        action="store_true",
        help="also profile gpt1's GEMM time per task: HF time / that = the best "
        "speedup possible on these inputs",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from gpt1.text.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DATA / "gpt1_tokenizer")
    config = model_preset(args.preset).derive(vocab_size=40478)
    torch.manual_seed(0)
    base = GPT(config).eval()
    requests = record_requests(base, tok, args.tasks.split(","), args.limit)
    print(
        f"preset {args.preset} ({base.num_parameters():,} parameters), {args.threads} thread(s), "
        f"batch_tokens {args.batch_tokens}, best of {args.repeats}"
    )
    print(
        f"{'task':12s} {'dtype':5s} {'reqs':>5s} {'tokens':>7s} {'gpt1 r/s':>9s} "
        f"{'all-pos r/s':>11s} {'HF r/s':>8s} {'speedup':>8s} {'max|dlogp|':>10s}"
    )
    for dtype in args.dtypes.split(","):
        ours = GPT(config).eval()
        ours.load_state_dict(base.state_dict())
        ours = ours.to(DTYPES[dtype])
        hf = hf_model(base).to(DTYPES[dtype])
        n_pos = config.n_positions
        for task, reqs in requests.items():
            batches = plain_batches(reqs, n_pos, args.batch_tokens, args.max_rows)
            tokens = sum(len(r) for b in batches for r in b)
            scorer = Scorer(ours, batch_tokens=args.batch_tokens, max_rows=args.max_rows)
            t, res = interleaved(
                {
                    "gpt1": lambda: scorer.score(reqs),
                    "all": lambda: score_plain(
                        lambda ids: ours.lm_logits(ours(ids)), batches, reqs, n_pos
                    ),
                    "hf": lambda: score_plain(lambda ids: hf(ids).logits, batches, reqs, n_pos),
                },
                args.repeats,
            )
            t_ours, t_all, t_hf, scored, ref = t["gpt1"], t["all"], t["hf"], res["gpt1"], res["hf"]
            diff = max(abs(a - b) for s, r in zip(scored, ref) for a, b in zip(s.logprobs, r))
            n = len(reqs)
            print(
                f"{task:12s} {dtype:5s} {n:5d} {tokens:7d} {n / t_ours:9.1f} {n / t_all:11.1f} "
                f"{n / t_hf:8.1f} {t_hf / t_ours:7.2f}x {diff:10.2e}",
                flush=True,
            )
            if args.ceiling:
                gemm, _ = gemm_seconds(lambda: scorer.score(reqs))
                print(
                    f"{'':12s} {dtype:5s} GEMM-bound ceiling: HF {t_hf:.3f} s / gpt1's GEMMs "
                    f"{gemm:.3f} s (of {t_ours:.3f} s) = {t_hf / gemm:.2f}x",
                    flush=True,
                )


if __name__ == "__main__":
    main()
