"""lm-evaluation-harness: gpt1's native adapter vs the harness's own `hf` model, same checkpoint.

The checkpoint is exported with `gpt1 convert CK OUT --from gpt1 --to hf`; the `hf` model loads OUT
with the slow tokenizer (`use_fast_tokenizer=False`: with ftfy and spaCy installed its ids are
GPT-1's), `prefix_token_id=0` (`<unk>`: GPT-1 has no start token) and `max_length` = the window
the checkpoint was pretrained on, both given explicitly so that the comparison does not depend
on what the export's tokenizer files declare. Both run the local tasks `gpt1_lambada` and `gpt1_sst2` (gpt1/lm_eval_tasks)
through `lm_eval.simple_evaluate` on the same examples (the first --limit of each); the script
prints, per task,

* the largest per-request difference in log-likelihood and how many greedy flags differ,
* each model's metrics from its harness results (LAMBADA: acc, perplexity; SST-2: acc);

and the wall time of each model's `loglikelihood` call on the LAMBADA requests (the model's own
work, tokenization included), and of each whole `simple_evaluate` of both tasks (data loading and
the harness's bookkeeping included; the harness's task index is built once beforehand, the same
for both); best of --repeats, the two models alternating.

    python benchmarks/lm_eval_adapter.py --checkpoint runs/lm-small/final --limit 500
    python benchmarks/lm_eval_adapter.py --checkpoint CK --limit 100 --hf-batch-size 8 --repeats 3
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = Path(os.environ.get("GPT1_SHARED_DATA", ROOT.parent / "shared" / "data"))


def evaluate(lm, tasks: list[str], limit: int, manager, metadata: dict) -> tuple[dict, float]:
    """simple_evaluate: per task (metrics, per-request (loglik, greedy)), and its seconds."""
    import lm_eval

    start = time.perf_counter()
    out = lm_eval.simple_evaluate(
        model=lm,
        tasks=tasks,
        limit=limit,
        log_samples=True,
        metadata=metadata,
        bootstrap_iters=0,
        task_manager=manager,
    )
    seconds = time.perf_counter() - start
    per_task = {}
    for task in tasks:
        samples = sorted(out["samples"][task], key=lambda s: s["doc_id"])
        per_task[task] = (out["results"][task], [tuple(r[0]) for s in samples for r in s["resps"]])
    return per_task, seconds


def widened(checkpoint: str, out: Path) -> str:
    """The checkpoint itself, or, when its MLP is narrower than 4 x n_embd (transformers' OpenAIGPT
    cannot hold that), the same function with zero units added: gelu(0) = 0 and their output
    weights are 0, so the logits are unchanged. Both models then score the widened copy."""
    import shutil

    import torch

    from gpt1 import GPT, ModelConfig, load_checkpoint, save_model
    from gpt1.checkpoint_files import resolve_checkpoint_dir

    folder = resolve_checkpoint_dir(checkpoint)
    model = load_checkpoint(folder).eval()
    width = 4 * model.config.n_embd
    if model.config.n_inner == width:
        return str(folder)
    wide = GPT(ModelConfig(**{**model.config.to_dict(), "n_inner": width})).eval()
    state = wide.state_dict()
    for name, old in model.state_dict().items():
        state[name] = torch.zeros_like(state[name])
        state[name][tuple(slice(0, n) for n in old.shape)] = old
    wide.load_state_dict(state)
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.equal(model.lm_logits(model(x)), wide.lm_logits(wide(x)))
    save_model(wide, out / "final", tokenizer_dir=folder)
    if (folder.parent / "run.json").is_file():  # the trained window travels with it
        shutil.copy(folder.parent / "run.json", out / "run.json")
    print(
        f"MLP widened from {model.config.n_inner} to {width} units with zero units "
        "(logits identical) so that transformers can hold it"
    )
    return str(out / "final")


def loglikelihood_seconds(lm, passages: list[tuple[str, str]]) -> float:
    """Wall time of one `loglikelihood` call on the task's requests (context, " " + last word)."""
    from lm_eval.api.instance import Instance

    requests = [Instance("loglikelihood", {}, (c, " " + w), i) for i, (c, w) in enumerate(passages)]
    start = time.perf_counter()
    lm.loglikelihood(requests, disable_tqdm=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--checkpoint", required=True, help="a gpt1 checkpoint with its tokenizer")
    ap.add_argument("--data", default=str(DATA), help="data root holding corpus/lambada")
    ap.add_argument("--limit", type=int, default=500, help="LAMBADA passages")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per model (alternating)")
    ap.add_argument("--hf-batch-size", type=int, default=32, help="the hf model's batch size")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("lm_eval").setLevel(logging.ERROR)

    from lm_eval.models.huggingface import HFLM

    from gpt1.lm_eval.adapter import Gpt1LM
    from gpt1.recipes.convert import convert

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = widened(args.checkpoint, Path(tmp) / "widened")
        native = Gpt1LM(checkpoint=checkpoint, device="cpu", precision="fp32", prefix_token_id=0)
        export = convert(checkpoint, Path(tmp) / "hf", "gpt1", "hf")
        hf = HFLM(
            pretrained=str(export),
            tokenizer=str(export),
            use_fast_tokenizer=False,
            prefix_token_id=0,
            max_length=native.max_length,
            device="cpu",
            batch_size=args.hf_batch_size,
            dtype="float32",
        )
        from gpt1.recipes.harness import task_manager
        from gpt1.zeroshot.data import read_lambada

        passages = read_lambada(Path(args.data) / "corpus" / "lambada")[: args.limit]
        tasks = ["gpt1_lambada", "gpt1_sst2"]
        metadata = {"data": str(args.data)}
        manager = task_manager(tasks, metadata)  # built once: the same for both models
        times: dict[str, list[float]] = {"gpt1": [], "hf": []}
        calls: dict[str, list[float]] = {"gpt1": [], "hf": []}
        results = {}
        for _ in range(args.repeats):
            for name, lm in (("gpt1", native), ("hf", hf)):
                calls[name].append(loglikelihood_seconds(lm, passages))
                results[name], seconds = evaluate(lm, tasks, args.limit, manager, metadata)
                times[name].append(seconds)
    print(
        f"checkpoint {args.checkpoint}: context {native.max_length} tokens, {args.threads} "
        f"threads, hf batch {args.hf_batch_size}, --limit {args.limit}"
    )
    for task in tasks:
        (g_metrics, g_req), (h_metrics, h_req) = results["gpt1"][task], results["hf"][task]
        assert len(g_req) == len(h_req)
        diff = max(abs(a[0] - b[0]) for a, b in zip(g_req, h_req))
        flips = sum(bool(a[1]) != bool(b[1]) for a, b in zip(g_req, h_req))
        print(
            f"{task}: {len(g_req)} requests; per-request log-likelihood max |gpt1 - hf| = "
            f"{diff:.2e}; greedy flags differing: {flips}"
        )
        for name, metrics in (("gpt1", g_metrics), ("hf", h_metrics)):
            shown = ", ".join(
                f"{k.split(',')[0]} {v:.4f}"
                for k, v in metrics.items()
                if k.endswith(",none") and "stderr" not in k
            )
            print(f"  {name:5s} {shown}")
    for name in ("gpt1", "hf"):
        print(
            f"{name:5s} loglikelihood on the LAMBADA requests {min(calls[name]):.2f} s "
            f"({', '.join(f'{t:.2f}' for t in calls[name])}); simple_evaluate of both tasks "
            f"{min(times[name]):.2f} s ({', '.join(f'{t:.2f}' for t in times[name])})"
        )
    print(
        f"native adapter speed-up: loglikelihood {min(calls['hf']) / min(calls['gpt1']):.2f}x, "
        f"simple_evaluate {min(times['hf']) / min(times['gpt1']):.2f}x"
    )


if __name__ == "__main__":
    main()
