"""In-process inference speed: gpt1 vs transformers, ONNX Runtime and CTranslate2, GPT-1 size.

Classification of SST-2 dev sentences (../shared/data, the original GPT-1 vocabulary,
`[start] sentence [classify]`), in file order:
* gpt1: `gpt1.inference.prediction.predict_raw` on the model prepacked for CPU inference
  (`gpt1.inference.prepack.prepack_for_inference`) -- what `gpt1 predict` and `gpt1 serve` run:
  batches of 32, longest first, on the unpadded path (`GPT.forward(ids, lengths=...)`); with
  `--plain`, also without prepacking ("gpt1 plain", plain `F.linear`; for int8 "gpt1 float
  path": its many-row products as bf16 matrix products over the int8 values, the path without
  oneDNN's int8 kernel, `GPT1_INT8_MATMUL=0`), and with `--file-order`
  on the padded file-order batches ("gpt1 file order") to show what the length sort adds;
* HF: transformers' `OpenAIGPTForSequenceClassification`, batches of 32 in file order, right-padded
  with an attention mask (the usual way);
* ORT: ONNX Runtime on an ONNX export (torch.onnx, made here) of that same HF model, the same
  padded batches. ORT's CPU provider has no bf16 kernels for this graph, so it runs fp32 only.

Generation: greedy, 128 new tokens after a 32-token prompt, batch 1: gpt1's KV-cache decoder
(`gpt1.inference.generate.generate` on the model made ready by `gpt1.inference.prepared.for_inference`,
what `gpt1 sample` runs and what `/v1/generate` runs for a lone request) vs transformers'
`generate` on `OpenAIGPTLMHeadModel` with the same weights, and vs CTranslate2 (fp32 and int8)
running the same weights mapped onto its decoder spec, in a child process of this one
(`CT2Child`: while a CTranslate2 generator lives in a process, gpt1 decodes there at about half
speed), called in turn with the others. Every system's greedy tokens are compared with fp32
transformers'.

int8 (`--precision int8`: int8 weights with per-channel scales, bf16 activations, and for many
rows int8 x int8 products on oneDNN's kernel with the activations quantised per tensor) is
compared with ONNX Runtime's `quantize_dynamic` int8 model for classification and CTranslate2's
int8 generator for generation.

Weights are random (speed does not depend on them). The systems alternate within each repeat;
figures are medians over repeats. The matmul peak of this machine is measured too (the best of
torch's and oneDNN's 2048^3 products; for int8, of `torch._int_mm` and oneDNN's int8 product,
two operations a multiply-add), so each throughput can be read as a fraction of it; so is
the memory read bandwidth that bounds batch-1 decoding: each precision's bound is that
bandwidth over the bytes its decoding step reads (`decode_bytes`).

    python benchmarks/inference.py                          # 256 sentences, 3 repeats
    python benchmarks/inference.py --sentences 64 --repeats 1 --dtypes fp32   # quick look
    python benchmarks/inference.py --dtypes bf16,int8 --skip classify          # decoding only
    python benchmarks/inference.py --dtypes fp32 --skip generate,ort --profile   # where time goes
"""

from __future__ import annotations

import argparse
import multiprocessing
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
from gpt1.inference.generate import generate  # noqa: E402
from gpt1.inference.prediction import predict_raw  # noqa: E402
from gpt1.inference.prepack import prepack_available  # noqa: E402
from gpt1.inference.prepared import for_inference  # noqa: E402
from gpt1.inference.quantize import Int8Head, Int8Linear  # noqa: E402
from gpt1.model.gpt import GPT  # noqa: E402
from gpt1.model.heads import FinetuneModel  # noqa: E402
from gpt1.recipes.convert import gpt1_to_hf_state  # noqa: E402
from gpt1.tasks.batches import Encoded  # noqa: E402
from gpt1.tasks.registry import get_task  # noqa: E402

# Each precision's float type for the transformers anchor (int8 has none: its anchors are ONNX
# Runtime's dynamic int8 model and CTranslate2's int8 generator).
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": None}


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


def onnx_int8_session(session, threads: int, folder: Path):
    """ONNX Runtime's dynamic int8 quantisation (`quantize_dynamic`, per-channel int8 weights,
    int8 activations quantised per batch) of the exported HF classifier."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = folder / "hf_openai_gpt_clf.onnx", folder / "hf_openai_gpt_clf.int8.onnx"
    quantize_dynamic(str(src), str(dst), per_channel=True, weight_type=QuantType.QInt8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(dst), options, providers=["CPUExecutionProvider"])


def ctranslate2_generator(gpt: GPT, folder: Path, compute_type: str, threads: int):
    """GPT-1's weights in CTranslate2's decoder spec (post-LN, learned positions, no final
    LayerNorm, tanh GELU, the token table as the output layer), saved and loaded in
    `compute_type` (float32 or int8)."""
    import ctranslate2
    from ctranslate2.specs import common_spec, transformer_spec

    c = gpt.config
    spec = transformer_spec.TransformerDecoderModelSpec.from_config(
        c.n_layer,
        c.n_head,
        pre_norm=False,
        activation=common_spec.Activation.GELUTanh,
        no_final_norm=True,
    )
    sd = {k: v.detach().float().numpy() for k, v in gpt.state_dict().items()}
    dec = spec.decoder
    dec.scale_embeddings = False
    dec.embeddings.weight = sd["wte.weight"]
    dec.position_encodings.encodings = sd["wpe.weight"]
    dec.projection.weight = sd["wte.weight"]
    for i, layer in enumerate(dec.layer):
        pairs = [
            (layer.self_attention.layer_norm, "ln_1", "gamma", "beta"),
            (layer.ffn.layer_norm, "ln_2", "gamma", "beta"),
            (layer.self_attention.linear[0], "attn.c_attn", "weight", "bias"),
            (layer.self_attention.linear[1], "attn.c_proj", "weight", "bias"),
            (layer.ffn.linear_0, "mlp.c_fc", "weight", "bias"),
            (layer.ffn.linear_1, "mlp.c_proj", "weight", "bias"),
        ]
        for target, name, w, b in pairs:  # nn.Linear and CTranslate2 both store [out, in]
            setattr(target, w, sd[f"h.{i}.{name}.weight"])
            setattr(target, b, sd[f"h.{i}.{name}.bias"])
    spec.register_vocabulary([f"t{i}" for i in range(c.vocab_size)])
    spec.validate()
    spec.optimize(quantization=compute_type)
    out = folder / f"ct2-{compute_type}"
    out.mkdir(parents=True, exist_ok=True)
    spec.save(str(out))
    return ctranslate2.Generator(
        str(out), device="cpu", compute_type=compute_type, intra_threads=threads
    )


class CT2Child:
    """A CTranslate2 generator in a child process, called from this one: `generate(prompt,
    new_tokens)` as `ct2_generate`, timed here around the round trip (a pipe message each way).

    While a CTranslate2 generator lives in a process, gpt1's decoding in that process runs at
    about half its speed (the figures and what was ruled out are in docs/results.md); the child
    keeps the two runtimes apart while the benchmark still alternates them in one run."""

    def __init__(self, gpt: GPT, folder: Path, compute_type: str, threads: int) -> None:
        weights = folder / f"gpt-{compute_type}.pt"
        torch.save(gpt.state_dict(), weights)
        context = multiprocessing.get_context("spawn")
        self.conn, theirs = context.Pipe()
        self.process = context.Process(
            target=_ct2_child,
            args=(theirs, gpt.config, weights, folder, compute_type, threads),
            daemon=True,
        )
        self.process.start()
        if self.conn.recv() != "ready":
            raise RuntimeError("the CTranslate2 child process failed to start")

    def generate(self, prompt: torch.Tensor, new_tokens: int) -> list[int]:
        self.conn.send((prompt.tolist(), new_tokens))
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(timeout=30)


def _ct2_child(conn, config, weights: Path, folder: Path, compute_type: str, threads: int) -> None:
    torch.set_num_threads(threads)
    gpt = GPT(config)
    gpt.load_state_dict(torch.load(weights))
    generator = ctranslate2_generator(gpt, folder, compute_type, threads)
    del gpt
    conn.send("ready")
    while (request := conn.recv()) is not None:
        prompt, new_tokens = request
        conn.send(ct2_generate(generator, torch.tensor(prompt), new_tokens))


def ct2_generate(generator, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """Greedy decoding of exactly `new_tokens` tokens after `prompt` `[1, T]` with CTranslate2."""
    result = generator.generate_batch(
        [[f"t{i}" for i in prompt[0].tolist()]],
        max_length=new_tokens,
        min_length=new_tokens,
        sampling_topk=1,
        beam_size=1,
        include_prompt_in_result=False,
    )
    return result[0].sequences_ids[0]


def hf_greedy(hf_lm, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """transformers' greedy `generate` of exactly `new_tokens` tokens after `prompt` `[1, T]`."""
    return hf_lm.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )


def decode_bytes(gpt: GPT, context: int = 0) -> int:
    """Bytes a batch-1 decoding step must read: every block weight, bias and LayerNorm, the
    output layer (the token table, or its int8 copy), and the keys and values of `context`
    cached positions (in the activations' dtype); the embedding lookups read two rows."""
    width = gpt.h[0].ln_1.weight.element_size()  # the activations', which the cache holds
    total = 2 * gpt.config.n_layer * context * gpt.config.n_embd * width
    for module in gpt.h.modules():
        if isinstance(module, Int8Linear):
            total += sum(b.numel() * b.element_size() for b in module.buffers())
        tensors = module.parameters(recurse=False)
        total += sum(t.numel() * t.element_size() for t in tensors)
    head = gpt.lm_head_kernel
    if isinstance(head, Int8Head):
        return total + head.q.numel() + head.scale.numel() * head.scale.element_size()
    return total + gpt.wte.weight.numel() * gpt.wte.weight.element_size()


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


class PlainReads:
    """The plain reads of `mib` MiB that bound batch-1 decoding, which must read every weight
    once per token; `rate()` is the bytes/s of the fastest.

    Four reads: torch summing an fp32 tensor, and gpt1's decoding kernel
    (`gpt1.inference.matvec`) multiplying one row by an fp32 matrix of that size (two flops per
    four bytes read: a read), each on plain memory and on memory advised for huge pages (as
    `for_inference` stores the weights decoding streams: `gpt1.inference.arena`). Which is
    fastest differs between CPUs and from hour to hour on one (torch's sum reads without
    fetching ahead; the kernel fetches ahead), so all four are timed and the fastest counts: a
    bound from one alone, or from 4 KiB pages alone, would be too low. The buffers are made
    once, so a benchmark can take the rate beside each of its timed rounds: on a shared host the
    memory's speed drifts by a fifth within minutes."""

    def __init__(self, mib: int = 512) -> None:
        from gpt1.inference import arena, backend

        self.op = backend.kernel()
        plain = torch.ones(mib << 18)
        huge = arena.huge_page_bytes(plain.numel() * 4).view(torch.float32).fill_(1.0)
        self.buffers = (plain, huge)
        self.bytes = plain.numel() * 4
        self.row = torch.ones(1, 4096)
        for x in self.buffers:  # first touches and the kernel's first call, untimed
            x.sum()
            if self.op is not None:
                self.op(self.row, x.view(-1, 4096), None, None)

    def rate(self, reps: int = 1) -> float:
        """Bytes/s of the fastest read, each of the four read `reps` times."""
        best = float("inf")
        for x in self.buffers:
            best = min(best, min(timed(lambda: x.sum()) for _ in range(reps)))
            if self.op is not None:
                w = x.view(-1, 4096)
                best = min(
                    best, min(timed(lambda: self.op(self.row, w, None, None)) for _ in range(reps))
                )
        return self.bytes / best


def read_bandwidth(mib: int = 512, reps: int = 5) -> float:
    """Bytes/s of the fastest plain read of `mib` MiB, best of `reps` (`PlainReads`)."""
    return PlainReads(mib).rate(reps)


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
    p.add_argument("--dtypes", default="fp32,bf16,int8")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument(
        "--skip", default="", help="comma list of parts to skip: classify,generate,ort,ct2"
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="also time gpt1 without prepacked weights (plain F.linear); int8: without "
        "oneDNN's int8 kernel (GPT1_INT8_MATMUL=0)",
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

    ct2: dict[str, CT2Child] = {}  # CTranslate2 generators by compute type, made once
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        if dtype is None:  # int8: the integer product's peak, two operations a multiply-add
            from concurrency import int8_peak

            peak, peak_kind = 2 * int8_peak(args.threads, "wall"), "int8 x int8, "
        else:
            peak, peak_kind = matmul_peak(dtype), ""
        import copy

        plain = copy.deepcopy(clf32).to(dtype).eval() if dtype is not None else None
        clf = for_inference(copy.deepcopy(clf32), "cpu", dname)
        hf_clf = hf_lm = None
        if dtype is not None:
            hf_clf = copy.deepcopy(hf_clf32).to(dtype) if dtype != torch.float32 else hf_clf32
            hf_lm = copy.deepcopy(hf_lm32).to(dtype) if dtype != torch.float32 else hf_lm32
        print(
            f"\n== {dname}: matmul peak {peak / 1e9:.0f} G{'OP' if dtype is None else 'FLOP'}/s "
            f"({peak_kind}2048^3, {args.threads} threads)"
        )
        if "classify" not in skip:
            systems = {"gpt1": lambda: predict_raw(clf, task, enc, args.batch)}
            if args.plain and plain is not None:
                systems["gpt1 plain"] = lambda: predict_raw(plain, task, enc, args.batch)
            if args.plain and dname == "int8":
                systems["gpt1 float path"] = lambda: without_int8_matmul(
                    lambda: predict_raw(clf, task, enc, args.batch)
                )
            if hf_clf is not None:
                systems["HF"] = lambda: [
                    hf_clf(input_ids=ids, attention_mask=mask).logits for ids, mask in batches
                ]
            if args.file_order:
                systems["gpt1 file order"] = lambda: [
                    clf(ids[:, None], mask[:, None].float(), with_lm=False) for ids, mask in batches
                ]
            ort_run = lambda sess: [  # noqa: E731
                sess.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
                for ids, mask in batches
            ]
            if session is not None and dname == "fp32":
                systems["ORT fp32"] = lambda: ort_run(session)
            if session is not None and dname == "int8":
                session8 = onnx_int8_session(session, args.threads, Path(tmp.name))
                systems["ORT int8"] = lambda: ort_run(session8)
            with torch.inference_mode():
                if hf_clf is not None:
                    check_classifier(clf, hf_clf, batches, task, enc, args.batch, session, dtype)
                times = alternate(systems, args.repeats)
            rates = {k: len(seqs) / statistics.median(v) for k, v in times.items()}
            for name, rate in rates.items():
                print(
                    f"  classify {name:16s} {rate:8.1f} sentences/s  "
                    f"({flops * rate / len(seqs) / peak:5.1%} of matmul peak)"
                )
            print(
                "  "
                + ", ".join(
                    f"gpt1 / {k} {rates['gpt1'] / v:.2f}x" for k, v in rates.items() if k != "gpt1"
                )
            )
            if args.profile:
                with torch.inference_mode():
                    print_profile(lambda: predict_raw(clf, task, enc, args.batch))
        if "generate" not in skip:
            prompt = torch.tensor([sum(seqs, [])[: args.prompt]])
            new = args.new_tokens
            gen = {"gpt1": lambda: generate(clf.gpt, prompt, new, temperature=0)}
            if args.plain and plain is not None:
                gen["gpt1 plain"] = lambda: generate(plain.gpt, prompt, new, temperature=0)
            if hf_lm is not None:
                gen["HF"] = lambda: hf_greedy(hf_lm, prompt, new)
            ct2_type = {"fp32": "float32", "int8": "int8"}.get(dname)
            if "ct2" not in skip and ct2_type is not None:
                if ct2_type not in ct2:
                    ct2[ct2_type] = CT2Child(clf32.gpt, Path(tmp.name), ct2_type, args.threads)
                gen[f"CT2 {ct2_type}"] = lambda: ct2[ct2_type].generate(prompt, new)
            with torch.inference_mode():
                reference = hf_greedy(hf_lm32, prompt, new)[0, args.prompt :].tolist()
                for name, fn in gen.items():
                    out = fn()
                    out = out[0, args.prompt :].tolist() if isinstance(out, torch.Tensor) else out
                    same = next((i for i, (a, b) in enumerate(zip(out, reference)) if a != b), new)
                    print(
                        f"  generate {name}: greedy tokens equal fp32 transformers' for the first {same} of {new}"
                    )
                times = alternate(gen, args.repeats, warm=False)  # the check above warmed up
            rates = {k: new / statistics.median(v) for k, v in times.items()}
            bandwidth = read_bandwidth()
            weight_bytes = decode_bytes(clf.gpt)
            bound = bandwidth / weight_bytes
            for name, rate in rates.items():
                print(f"  generate {name:16s} {rate:8.1f} new tokens/s")
            print(
                "  "
                + ", ".join(
                    f"gpt1 / {k} {rates['gpt1'] / v:.2f}x" for k, v in rates.items() if k != "gpt1"
                )
            )
            print(
                f"  memory read bandwidth {bandwidth / 1e9:.1f} GB/s; {dname} weights read per "
                f"token {weight_bytes / 1e6:.0f} MB: at most {bound:.1f} tokens/s at batch 1; "
                f"gpt1 {dname} at {rates['gpt1'] / bound:.0%} of that bound"
            )
    for child in ct2.values():
        child.close()
    tmp.cleanup()


SETTLE_S = 0.5


def without_int8_matmul(fn):
    """`fn()` with int8's many-row products on the float path (GPT1_INT8_MATMUL=0)."""
    before = os.environ.get("GPT1_INT8_MATMUL")
    os.environ["GPT1_INT8_MATMUL"] = "0"
    try:
        return fn()
    finally:
        if before is None:
            del os.environ["GPT1_INT8_MATMUL"]
        else:
            os.environ["GPT1_INT8_MATMUL"] = before


def alternate(systems: dict, repeats: int, warm: bool = True) -> dict[str, list[float]]:
    """Warm each system up once (unless `warm` is False), then time them in turn, `repeats`
    rounds, pausing `SETTLE_S` before each: a runtime's worker threads keep spinning for a while
    after its call returns (Intel OpenMP's default is 200 ms, which CTranslate2 and ONNX Runtime
    builds may use), and a system timed in that while shares the cores with them."""
    for fn in systems.values() if warm else ():
        fn()
    times: dict[str, list[float]] = {k: [] for k in systems}
    for _ in range(repeats):
        for name, fn in systems.items():
            time.sleep(SETTLE_S)
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
