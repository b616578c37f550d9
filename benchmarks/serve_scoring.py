"""lm-evaluation-harness's scoring through `gpt1 serve` (the score and harness workloads of
benchmarks/serve.py, which imports this module; see its docstring)."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

TASKS = ["gpt1_lambada", "gpt1_sst2"]


def write_lm(folder: Path, preset: str, data: Path) -> Path:
    """A pretrained checkpoint with random weights and GPT-1's tokenizer."""
    from gpt1.config import model_preset
    from gpt1.model.checkpoint import save_model
    from gpt1.model.gpt import GPT
    from gpt1.recipes.finetune import load_tokenizer

    vocab = data / "gpt1_tokenizer"
    torch.manual_seed(0)
    config = model_preset(preset).derive(vocab_size=load_tokenizer(vocab).vocab_size)
    return save_model(GPT(config), folder, tokenizer_dir=vocab)


def encode_pair(tok: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The harness's split (`TemplateLM._encode_pair`): the pair encoded whole, the context's
    trailing spaces moved to the continuation."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tok.encode(context + continuation)
    ctx = tok.encode(context)
    return ctx, whole[len(ctx) :]


def harness_pairs(data: Path, docs: int, tok: Any) -> list[tuple[list[int], list[int]]]:
    """The (context ids, continuation ids) of the harness's requests for the first `docs`
    documents of the local LAMBADA and SST-2 tasks (gpt1/lm_eval_tasks)."""
    from gpt1.tasks.registry import get_task
    from gpt1.zeroshot.data import read_lambada

    pairs = [
        encode_pair(tok, c, " " + w) for c, w in read_lambada(data / "corpus" / "lambada")[:docs]
    ]
    for e in get_task("sst2").read(data / "glue" / "SST-2", "dev").examples[:docs]:
        pairs += [encode_pair(tok, e.text + " very", " " + w) for w in ("negative", "positive")]
    return pairs


def in_process(ck: Path, pairs: list, threads: int) -> tuple[float, float]:
    """Seconds for all pairs through the zero-shot scorer in one call (the native harness
    model's path) and through `Engine.sequence_logprobs` (the server's path for them)."""
    from gpt1.serve.engine import SequenceScoring, load_engine

    engine = load_engine(ck)
    torch.set_num_threads(threads)
    items = [SequenceScoring(c + x, 1, True) for c, x in pairs]
    engine.scorer.score(pairs[:8], greedy=True)  # warm-up
    start = time.perf_counter()
    engine.scorer.score(pairs, greedy=True)
    native = time.perf_counter() - start
    start = time.perf_counter()
    for lo in range(0, len(items), 16):  # the server's batches hold 16 items at most
        engine.sequence_logprobs(items[lo : lo + 16])
    return native, time.perf_counter() - start


def harness_runs(ck: Path, url: str, data: Path, docs: int) -> list[tuple[str, float, dict]]:
    """(name, wall seconds, metrics) of whole harness runs on the same tasks. The native model
    is loaded before its clock starts, as the server is (its load time is printed apart)."""
    import lm_eval.models.openai_completions  # noqa: F401  (registers local-completions)

    from gpt1.lm_eval.adapter import Gpt1LM
    from gpt1.recipes.harness import evaluate_with_local_tasks

    start = time.perf_counter()
    native = Gpt1LM(checkpoint=str(ck), device="cpu", precision="fp32")
    print(f"harness: the native model loads in {time.perf_counter() - start:.1f} s (not counted)")
    remote = {"base_url": f"{url}/v1/completions", "model": ck.name, "max_length": 512}
    runs = [
        ("native gpt1 model", native, None),
        ("local-completions", "local-completions", remote),
        (
            "local-completions, num_concurrent=8",
            "local-completions",
            {**remote, "num_concurrent": 8},
        ),
    ]
    out = []
    for name, model, model_args in runs:
        start = time.perf_counter()
        res = evaluate_with_local_tasks(model, TASKS, data, model_args=model_args, limit=docs)
        out.append((name, time.perf_counter() - start, res["results"]))
    return out


def scoring_section(args, levels, skip, data, start_server, load, free_port) -> None:
    from gpt1.recipes.finetune import load_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        ck = write_lm(Path(tmp) / "lm", args.preset, data)
        pairs = harness_pairs(data, args.harness_docs, load_tokenizer(data / "gpt1_tokenizer"))
        tokens = sum(len(c) + len(x) for c, x in pairs)
        print(
            f"\n{args.preset} language model (random weights), fp32, {args.threads} threads: "
            f"{len(pairs)} harness scoring requests ({args.harness_docs} LAMBADA passages, "
            f"{args.harness_docs} SST-2 sentences x 2 choices), {tokens} tokens"
        )
        native, echo = in_process(ck, pairs, args.threads)
        print(
            f"in process: zero-shot scorer {len(pairs) / native:.1f} requests/s ({native:.2f} s); "
            f"sequence_logprobs (every position, top-1) {len(pairs) / echo:.1f} requests/s "
            f"({echo:.2f} s)"
        )
        port = free_port()
        server = start_server(ck, port, "fp32", args.threads, args.max_generations)
        try:
            if "score" not in skip:
                payload = {"model": ck.name, "max_tokens": 1, "logprobs": 1, "echo": True}
                bodies = [
                    json.dumps(
                        {**payload, "prompt": [c + x], "temperature": 0, "seed": 1234}
                    ).encode()
                    for c, x in pairs
                ]
                asyncio.run(load(port, "/v1/completions", bodies[:8], 1, args.limit_s))  # warm
                for c in levels:
                    r = asyncio.run(load(port, "/v1/completions", bodies, c, args.limit_s * 4))
                    print(
                        f"score    {c:3d} clients: {r['ok']:4d} ok, errors {r['errors'] or 0}, "
                        f"{r['rps']:7.2f} req/s, p50 {r['p50'] * 1e3:8.1f} ms, p99 "
                        f"{r['p99'] * 1e3:8.1f} ms | {r['rps'] * native / len(pairs):.2f}x "
                        "the in-process scorer"
                    )
            if "harness" not in skip:
                runs = harness_runs(ck, f"http://127.0.0.1:{port}", data, args.harness_docs)
                base = runs[0][1]
                for name, wall, metrics in runs:
                    accs = ", ".join(f"{t} acc {metrics[t]['acc,none']:.4f}" for t in TASKS)
                    print(f"harness {name}: {wall:.1f} s ({wall / base:.2f}x native); {accs}")
        finally:
            server.terminate()
            server.wait(120)
