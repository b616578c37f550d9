"""In-process inference speed: gpt1 vs transformers vs ONNX Runtime, GPT-1 size, one process.

Classification of SST-2 dev sentences (../shared/data, the original GPT-1 vocabulary,
`[start] sentence [classify]`), in file order:
* gpt1: `gpt1.recipes.evaluate.predict_raw` on the model prepacked for CPU inference
  (`gpt1.model.fast_cpu.prepack_for_inference`) -- what `gpt1 predict` and `gpt1 serve` run:
  batches of 32, longest first, on the unpadded path (`GPT.forward(ids, lengths=...)`); with
  `--plain`, also without prepacking ("gpt1 plain", plain `F.linear`), and with `--file-order`
  on the padded file-order batches ("gpt1 file order") to show what the length sort adds;
* HF: transformers' `OpenAIGPTForSequenceClassification`, batches of 32 in file order, right-padded
  with an attention mask (the usual way);
* ORT: ONNX Runtime on an ONNX export (torch.onnx, made here) of that same HF model, the same
  padded batches. ORT's CPU provider has no bf16 kernels for this graph, so it runs fp32 only.

Generation: greedy, 128 new tokens after a 32-token prompt, batch 1: gpt1's KV-cache decoder
(`gpt1.recipes.sample.generate` on the prepacked model, what `gpt1 sample` runs and what
`/v1/generate` runs for a lone request) vs transformers' `generate` on `OpenAIGPTLMHeadModel`
with the same weights (their greedy outputs are compared).

Weights are random (speed does not depend on them). fp32 and bf16, the systems alternating
within each repeat; figures are medians over repeats. The matmul peak of this machine is
measured too (the best of torch's and oneDNN's 2048^3 products), so each throughput can be read
as a fraction of it; so is the memory read bandwidth that bounds batch-1 decoding.

    python benchmarks/inference.py                          # 256 sentences, 3 repeats
    python benchmarks/inference.py --sentences 64 --repeats 1 --dtypes fp32   # quick look
    python benchmarks/inference.py --dtypes fp32 --skip generate,ort --profile   # where time goes
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = Path(os.environ.get("GPT1_SHARED_DATA", ROOT.parent / "shared" / "data"))

from gpt1.config import model_preset  # noqa: E402
from gpt1.model.fast_cpu import prepack_available, prepack_for_inference  # noqa: E402
from gpt1.model.gpt import GPT  # noqa: E402
from gpt1.model.heads import FinetuneModel  # noqa: E402
from gpt1.recipes.convert import gpt1_to_hf_state  # noqa: E402
from gpt1.recipes.evaluate import predict_raw  # noqa: E402
from gpt1.recipes.sample import generate  # noqa: E402
from gpt1.tasks import get_task  # noqa: E402
from gpt1.tasks.batches import Encoded  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def sst2_sequences(n: int, min_len: int, max_len: int, start: int, clf: int) -> list[list[int]]:
    """The first `n` SST-2 dev sentences whose `[start] ids [classify]` has min..max tokens."""
    from gpt1.text.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(DATA / "gpt1_tokenizer")
    lines = (DATA / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    out = []
    for line in lines:
        seq = [start] + tok.encode(line.split("\t")[0]) + [clf]
        if min_len <= len(seq) <= max_len:
            out.append(seq)
        if len(out) == n:
            break
    return out


def padded_batches(seqs: list[list[int]], size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """File-order batches, right-padded with 0, and their attention masks."""
    out = []
    for s in range(0, len(seqs), size):
        chunk = seqs[s : s + size]
        T = max(len(q) for q in chunk)
        ids = torch.zeros(len(chunk), T, dtype=torch.long)
        mask = torch.zeros(len(chunk), T, dtype=torch.long)
        for b, q in enumerate(chunk):
            ids[b, : len(q)] = torch.tensor(q)
            mask[b, : len(q)] = 1
        out.append((ids, mask))
    return out


def build_models(vocab: int):
    from transformers import (
        OpenAIGPTConfig,
        OpenAIGPTForSequenceClassification,
        OpenAIGPTLMHeadModel,
    )

    torch.manual_seed(0)
    config = model_preset("gpt1").derive(vocab_size=vocab)
    gpt = GPT(config).eval()
    clf = FinetuneModel(gpt, "single", 2, vocab - 1).eval()
    hf_config = OpenAIGPTConfig(
        vocab_size=vocab,
        n_positions=config.n_positions,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        num_labels=2,
        pad_token_id=0,
    )
    state = gpt1_to_hf_state(gpt.state_dict())
    hf_clf = OpenAIGPTForSequenceClassification(hf_config).eval()
    hf_clf.load_state_dict({**hf_clf.state_dict(), **state})
    hf_lm = OpenAIGPTLMHeadModel(hf_config).eval()
    hf_lm.load_state_dict({**hf_lm.state_dict(), **state, "lm_head.weight": gpt.wte.weight})
    return clf, hf_clf, hf_lm


def onnx_session(hf_clf, batches, threads: int, folder: Path):
    """Export the HF classifier with torch.onnx (dynamic batch and length) and open it in ORT."""
    import onnxruntime as ort

    path = folder / "hf_openai_gpt_clf.onnx"
    ids, mask = batches[0]
    torch.onnx.export(
        hf_clf,
        (ids, mask),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["logits"],
        opset_version=17,
        dynamo=False,
        dynamic_axes={
            "input_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "seq"},
            "logits": {0: "batch"},
        },
    )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    """FLOP/s of a large square matmul in `dtype`: the best of `reps` runs of torch.mm and,
    where available, of oneDNN's inner product on a prepacked weight (faster here)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    products = [lambda: torch.mm(a, b)]
    if prepack_available(dtype):
        packed = torch.ops.mkldnn._reorder_linear_weight(b, n)
        products.append(lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], ""))
    best = float("inf")
    for product in products:
        product()
        best = min(best, *(timed(product) for _ in range(reps)))
    return 2 * n**3 / best


def read_bandwidth(mib: int = 512, reps: int = 5) -> float:
    """Bytes/s of summing a `mib` MiB fp32 tensor (best of `reps`): the memory read speed that
    bounds batch-1 decoding, which must read every weight once per token."""
    x = torch.ones(mib << 18)
    x.sum()
    best = min(timed(lambda: x.sum()) for _ in range(reps))
    return x.numel() * 4 / best


def print_profile(fn, rows: int = 8) -> None:
    """Where `fn`'s CPU time goes: the share of the `rows` costliest operators (self time)."""
    from torch.profiler import profile

    fn()  # warm (packed copies made, allocator primed)
    with profile() as prof:
        fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    print(f"  profile of gpt1 classify ({total / 1e6:.2f} s under the profiler):")
    for e in events[:rows]:
        print(f"    {e.self_cpu_time_total / total:6.1%}  {e.key} ({e.count} calls)")


def classify_flops(seqs: list[list[int]], n_embd: int = 768, n_layer: int = 12) -> float:
    """Forward FLOPs of the unpadded classifier on `seqs`: weight matmuls on real tokens plus
    attention (causal half credited), the head ignored."""
    tokens = sum(len(s) for s in seqs)
    per_token = 2 * n_layer * 12 * n_embd * n_embd
    attn = sum(2 * 2 * n_layer * n_embd * len(s) * (len(s) + 1) / 2 for s in seqs)
    return tokens * per_token + attn


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sentences", type=int, default=256)
    p.add_argument("--min-len", type=int, default=8)
    p.add_argument("--max-len", type=int, default=96)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--skip", default="", help="comma list of parts to skip: classify,generate,ort")
    p.add_argument(
        "--plain",
        action="store_true",
        help="also time gpt1 without prepacked weights (plain F.linear)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also profile gpt1's classification once (torch.profiler): where its time goes",
    )
    p.add_argument(
        "--file-order",
        action="store_true",
        help="also time gpt1 on the padded file-order batches (no length sort)",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    vocab = 40478 + 3
    start_id, clf_id = vocab - 3, vocab - 1
    seqs = sst2_sequences(args.sentences, args.min_len, args.max_len, start_id, clf_id)
    lengths = [len(s) for s in seqs]
    print(
        f"{len(seqs)} SST-2 dev sentences, {min(lengths)}..{max(lengths)} tokens "
        f"(mean {statistics.mean(lengths):.1f}), batches of {args.batch}, "
        f"{args.threads} threads, torch {torch.__version__}"
    )
    clf32, hf_clf32, hf_lm32 = build_models(vocab)
    task = get_task("sst2")
    enc = Encoded([[s] for s in seqs], [None] * len(seqs), [""] * len(seqs))
    batches = padded_batches(seqs, args.batch)
    flops = classify_flops(seqs)
    tmp = tempfile.TemporaryDirectory()
    session = None
    if "classify" not in skip and "ort" not in skip:
        import onnxruntime as ort

        session = onnx_session(hf_clf32, batches, args.threads, Path(tmp.name))
        print(f"onnxruntime {ort.__version__}: exported the HF classifier with torch.onnx")

    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        peak = matmul_peak(dtype)
        import copy

        plain = copy.deepcopy(clf32).to(dtype)
        clf = prepack_for_inference(copy.deepcopy(plain))
        hf_clf = copy.deepcopy(hf_clf32).to(dtype) if dtype != torch.float32 else hf_clf32
        hf_lm = copy.deepcopy(hf_lm32).to(dtype) if dtype != torch.float32 else hf_lm32
        print(
            f"\n== {dname}: matmul peak {peak / 1e9:.0f} GFLOP/s (2048^3, {args.threads} threads)"
        )
        if "classify" not in skip:
            systems = {
                "gpt1": lambda: predict_raw(clf, task, enc, args.batch),
                **(
                    {"gpt1 plain": lambda: predict_raw(plain, task, enc, args.batch)}
                    if args.plain
                    else {}
                ),
                "HF": lambda: [
                    hf_clf(input_ids=ids, attention_mask=mask).logits for ids, mask in batches
                ],
            }
            if args.file_order:
                systems["gpt1 file order"] = lambda: [
                    clf(ids[:, None], mask[:, None].float(), with_lm=False) for ids, mask in batches
                ]
            if session is not None:
                systems["ORT fp32"] = lambda: [
                    session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
                    for ids, mask in batches
                ]
            with torch.inference_mode():
                check_classifier(clf, hf_clf, batches, task, enc, args.batch, session, dtype)
                times = alternate(systems, args.repeats)
            rates = {k: len(seqs) / statistics.median(v) for k, v in times.items()}
            for name, rate in rates.items():
                print(
                    f"  classify {name:16s} {rate:8.1f} sentences/s  "
                    f"({flops * rate / len(seqs) / peak:5.1%} of matmul peak)"
                )
            print(
                f"  gpt1 / HF {rates['gpt1'] / rates['HF']:.2f}x"
                + (
                    f", gpt1 / ORT {rates['gpt1'] / rates['ORT fp32']:.2f}x, ORT / HF "
                    f"{rates['ORT fp32'] / rates['HF']:.2f}x"
                    if "ORT fp32" in rates
                    else ""
                )
            )
            if args.profile:
                with torch.inference_mode():
                    print_profile(lambda: predict_raw(clf, task, enc, args.batch))
        if "generate" not in skip:
            prompt = torch.tensor([sum(seqs, [])[: args.prompt]])
            gen = {
                "gpt1": lambda: generate(clf.gpt, prompt, args.new_tokens, temperature=0),
                **(
                    {
                        "gpt1 plain": lambda: generate(
                            plain.gpt, prompt, args.new_tokens, temperature=0
                        )
                    }
                    if args.plain
                    else {}
                ),
                "HF": lambda: hf_lm.generate(
                    prompt,
                    attention_mask=torch.ones_like(prompt),
                    max_new_tokens=args.new_tokens,
                    min_new_tokens=args.new_tokens,
                    do_sample=False,
                    pad_token_id=0,
                ),
            }
            with torch.inference_mode():
                ours, theirs = gen["gpt1"](), gen["HF"]()
                same = int((ours[0] == theirs[0]).long().cumprod(0).sum()) - args.prompt
                print(
                    f"  generate: greedy outputs agree on the first {same} of "
                    f"{args.new_tokens} new tokens"
                )
                times = alternate(gen, args.repeats, warm=False)  # the check above warmed up
            rates = {k: args.new_tokens / statistics.median(v) for k, v in times.items()}
            for name, rate in rates.items():
                print(f"  generate {name:16s} {rate:8.1f} new tokens/s")
            print(f"  gpt1 / HF {rates['gpt1'] / rates['HF']:.2f}x")
            # Batch-1 decoding reads every weight once per token (the position table aside).
            weight_bytes = sum(
                p.numel() * p.element_size()
                for n, p in clf.gpt.named_parameters()
                if n != "wpe.weight"
            )
            bandwidth = read_bandwidth()
            bound = bandwidth / weight_bytes
            print(
                f"  memory read bandwidth {bandwidth / 1e9:.1f} GB/s; weights "
                f"{weight_bytes / 1e6:.0f} MB: at most {bound:.1f} tokens/s at batch 1; gpt1 at "
                f"{rates['gpt1'] / bound:.0%} of that bound, which is {bound / rates['HF']:.2f}x HF"
            )
    tmp.cleanup()


def alternate(systems: dict, repeats: int, warm: bool = True) -> dict[str, list[float]]:
    """Warm each system up once (unless `warm` is False), then time them in turn, `repeats`
    rounds."""
    for fn in systems.values() if warm else ():
        fn()
    times: dict[str, list[float]] = {k: [] for k in systems}
    for _ in range(repeats):
        for name, fn in systems.items():
            times[name].append(timed(fn))
    return times


def check_classifier(clf, hf_clf, batches, task, enc, micro, session, dtype) -> None:
    """The three compute the same hidden states: compare the extract-token states' head outputs
    through HF's (random) head is not possible, so compare final hidden states at the last token."""
    ids, mask = batches[0]
    lengths = mask.sum(1)
    ours = clf.gpt(ids, lengths=lengths)  # [B, T, C]
    theirs = hf_clf.transformer(input_ids=ids, attention_mask=mask)[0]  # [B, T, C]
    rows = torch.arange(ids.shape[0])
    diff = (ours[rows, lengths - 1].float() - theirs[rows, lengths - 1].float()).abs().max()
    print(f"  check: last-token hidden states gpt1 vs HF, max |diff| {float(diff):.2e}")


if __name__ == "__main__":
    main()
