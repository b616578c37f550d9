"""Load test of `gpt1 serve` on loopback: N concurrent clients, requests/s, p50/p99 latency, errors.

A GPT-1-size (117M, random weights) SST-2 classifier run is written to a temporary folder and
served by a `gpt1 serve` process on 127.0.0.1 (a free port). Clients are asyncio tasks with one
keep-alive HTTP/1.1 connection each, sending SST-2 dev sentences (../shared/data) in file order:
- classify: one sentence per `POST /v1/predict`;
- generate: `POST /v1/generate`, greedy, `--gen-tokens` new tokens after the sentence; the
  server decodes up to `--max-generations` of them together (continuous batching).
- score: lm-evaluation-harness's `local-completions` scoring payloads (`POST /v1/completions`
  with the request's token ids, `echo`, `logprobs` 1, `max_tokens` 1, temperature 0), one
  request per payload as the harness sends them, for the local LAMBADA and SST-2 tasks
  (`--harness-docs` documents each) on a GPT-1-size pretrained checkpoint (random weights);
  the references are the in-process zero-shot scorer on the same (context, continuation)
  pairs (what the native `gpt1` harness model computes) and `Engine.sequence_logprobs` (what
  the server computes for them). Then whole harness runs, wall time: the native `gpt1` model
  against `local-completions` on the running server (base_url, model, max_length only, then
  with num_concurrent 8).
Each level (1, 8, 64 clients) is bounded by a request count and a time limit (no new request
starts after it). The reference is the in-process throughput of the same work with the same
engine (tokenize + `Engine.predict` in batches of 16, `gpt1 predict`'s default; the engine's
`BatchedDecoder` one prompt at a time),
measured in this process before and after the server levels. Both sides see the sentences once
untimed first, so the tokenizer's cache holds them on both (the figures are model + serving).

    python benchmarks/serve.py                                  # fp32, 1/8/64 clients
    python benchmarks/serve.py --precision bf16 --requests 512
    python benchmarks/serve.py --skip generate --clients 64 --requests 128   # quick look
    python benchmarks/serve.py --skip classify,generate --harness-docs 40     # the harness's
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = Path(os.environ.get("GPT1_SHARED_DATA", ROOT.parent / "shared" / "data"))


def write_run(folder: Path, preset: str) -> Path:
    """A fine-tuned SST-2 run with random weights (what `gpt1 finetune` writes)."""
    from gpt1.config import FinetuneConfig, model_preset
    from gpt1.model.gpt import GPT
    from gpt1.model.heads import FinetuneModel
    from gpt1.recipes.finetune import load_tokenizer, task_record, writer
    from gpt1.tasks.registry import get_task

    vocab = DATA / "gpt1_tokenizer"
    tok = load_tokenizer(vocab)
    torch.manual_seed(0)
    config = model_preset(preset).derive(vocab_size=tok.vocab_size)
    gpt = GPT(config)
    gpt.add_tokens(3)
    task = get_task("sst2")
    model = FinetuneModel(gpt, task.kind, task.n_outputs, tok.classify_id)
    (folder / "final").mkdir(parents=True)
    writer(vocab, task_record(task, FinetuneConfig(task="sst2"), tok, config.n_positions), {})(
        model, folder / "final"
    )
    return folder


def sentences() -> list[str]:
    lines = (DATA / "glue" / "SST-2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines]


# ------------------------------------------------------------------------------ client
async def http_post(reader, writer, path: str, body: bytes) -> tuple[int, bytes]:
    """One request on a keep-alive connection; the response must carry Content-Length."""
    writer.write(
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)
    )
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def load(port: int, path: str, bodies: list[bytes], clients: int, limit_s: float) -> dict:
    """`clients` connections sending `bodies` in order until all are sent or `limit_s` passes."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    nxt = {"i": 0}
    deadline = time.perf_counter() + limit_s

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while nxt["i"] < len(bodies) and time.perf_counter() < deadline:
                body = bodies[nxt["i"]]
                nxt["i"] += 1
                start = time.perf_counter()
                try:
                    status, _ = await http_post(reader, writer, path, body)
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    return
                if status == 200:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors[str(status)] = errors.get(str(status), 0) + 1
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - start
    lat = sorted(latencies)
    pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")  # noqa: E731
    return {
        "clients": clients,
        "ok": len(lat),
        "errors": errors,
        "seconds": wall,
        "rps": len(lat) / wall,
        "p50": pick(0.50),
        "p99": pick(0.99),
    }


# -------------------------------------------------------------------------- in process
def in_process(
    run: Path,
    precision: str,
    texts: list[str],
    gen_prompts: list[str],
    gen_tokens: int,
    threads: int,
) -> tuple[float, float | None]:
    """(sentences/s of tokenize + predict in batches of 16, new tokens/s of one-at-a-time
    greedy generation) with the engine the server uses."""
    from gpt1.serve.engine import load_engine

    engine = load_engine(run, precision=precision)
    torch.set_num_threads(threads)

    def classify() -> None:
        for s in range(0, len(texts), 16):
            engine.predict(engine.encode(engine.examples([{"text": t} for t in texts[s : s + 16]])))

    classify()  # warm-up (and the tokenizer's cache, as a running server's)
    start, cpu = time.perf_counter(), time.process_time()
    classify()
    rate = len(texts) / (time.perf_counter() - start)
    in_process.cpu_ms = 1e3 * (time.process_time() - cpu) / len(texts)
    gen_rate = None
    if gen_prompts:
        ids = [engine.token_ids(p, None, "prompt") for p in gen_prompts]
        generate_alone(engine, ids[0], 2)
        start = time.perf_counter()
        for prompt in ids:
            generate_alone(engine, prompt, gen_tokens)
        gen_rate = len(ids) * gen_tokens / (time.perf_counter() - start)
    return rate, gen_rate


def generate_alone(engine, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy new tokens for one prompt through the server's decoder (as the server's worker
    thread runs them: `engine.start`, `engine.step`), with no other generation in its batch."""
    from gpt1.inference.sampling import Sampling

    sampling = Sampling(max_new_tokens=new_tokens, temperature=0.0, seed=0)
    handle = engine.start(*engine.generation(prompt, sampling))
    out: list[int] = []
    while True:
        for gen, item in engine.step():
            if gen is not handle:
                continue
            if item is None:
                return out
            if isinstance(item, BaseException):
                raise item
            out.append(int(item))


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    run: Path, port: int, precision: str, threads: int, max_generations: int
) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpt1",
            "--quiet",
            "serve",
            str(run),
            "--port",
            str(port),
            "--precision",
            precision,
            "--threads",
            str(threads),
            "--max-queue",
            "100000",
            "--max-generations",
            str(max_generations),
        ],
        env=env,
    )
    import urllib.request

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("gpt1 serve exited")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("gpt1 serve did not start in 600 s")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", default="gpt1", help="model size (default gpt1: 117M)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--clients", default="1,8,64")
    p.add_argument("--requests", type=int, default=256, help="classify requests per level")
    p.add_argument("--gen-requests", type=int, default=16, help="generate requests per level")
    p.add_argument("--gen-tokens", type=int, default=16)
    p.add_argument("--limit-s", type=float, default=120.0, help="time limit per level")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--skip", default="", help="any of classify, generate, score, harness")
    p.add_argument(
        "--harness-docs", type=int, default=40, help="score, harness: documents per task"
    )
    p.add_argument(
        "--max-generations",
        type=int,
        default=16,
        help="the server's --max-generations: generations decoded together (default 16, "
        "the server's default)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="then N rounds alternating in-process classify and the server at the "
        "largest client count (the ratio with the least drift; default 0)",
    )
    args = p.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    levels = [int(c) for c in args.clients.split(",")]
    if {"classify", "generate"} <= skip:
        scoring(args, levels, skip)
        return
    texts = sentences()
    cls_texts = (texts * (args.requests // len(texts) + 1))[: args.requests]
    gen_texts = texts[: args.gen_requests] if "generate" not in skip else []
    with tempfile.TemporaryDirectory() as tmp:
        run = write_run(Path(tmp) / "sst2", args.preset)
        print(
            f"{args.preset} SST-2 classifier (random weights), {args.precision}, "
            f"{args.threads} threads, SST-2 dev sentences, loopback"
        )
        before = in_process(
            run, args.precision, cls_texts, gen_texts, args.gen_tokens, args.threads
        )
        port = free_port()
        server = start_server(run, port, args.precision, args.threads, args.max_generations)
        results = {"classify": [], "generate": []}
        try:
            if "classify" not in skip:
                bodies = [json.dumps({"inputs": {"text": t}}).encode() for t in cls_texts]
                # Untimed pass: the server's tokenizer cache then holds these sentences, as the
                # in-process reference's does after its warm-up.
                asyncio.run(load(port, "/v1/predict", bodies, max(levels), args.limit_s * 4))
                for c in levels:
                    cpu0 = process_cpu(server.pid)
                    r = asyncio.run(load(port, "/v1/predict", bodies, c, args.limit_s))
                    r["cpu_ms"] = 1e3 * (process_cpu(server.pid) - cpu0) / max(1, r["ok"])
                    results["classify"].append(r)
            if "generate" not in skip:
                bodies = [
                    json.dumps(
                        {"prompt": t, "max_new_tokens": args.gen_tokens, "temperature": 0}
                    ).encode()
                    for t in gen_texts
                ]
                for c in levels:
                    results["generate"].append(
                        asyncio.run(load(port, "/v1/generate", bodies, c, args.limit_s))
                    )
            ratios = []
            for _ in range(args.rounds):  # the engine in this process stays loaded: reuse it
                ref, _ = in_process(run, args.precision, cls_texts, [], 0, args.threads)
                r = asyncio.run(load(port, "/v1/predict", bodies, max(levels), args.limit_s))
                ratios.append((ref, r["rps"], r["errors"]))
        finally:
            server.terminate()
            server.wait(120)
        after = in_process(run, args.precision, cls_texts, gen_texts, args.gen_tokens, args.threads)
    report(results, before, after, args.gen_tokens)
    scoring(args, levels, skip)
    for ref, rps, errors in ratios:
        print(
            f"round: in process {ref:.1f} sentences/s, server at {max(levels)} clients "
            f"{rps:.1f} requests/s, errors {errors or 0}: {rps / ref:.2f}x"
        )
    if ratios:
        print(
            f"median ratio over {len(ratios)} rounds: "
            f"{statistics.median(r / f for f, r, _ in ratios):.2f}x"
        )


def scoring(args: argparse.Namespace, levels: list[int], skip: set[str]) -> None:
    """The score and harness workloads (benchmarks/serve_scoring.py)."""
    if not {"score", "harness"} <= skip:
        from benchmarks.serve_scoring import scoring_section

        scoring_section(args, levels, skip, DATA, start_server, load, free_port)


def report(results: dict, before: tuple, after: tuple, gen_tokens: int) -> None:
    ref_cls = (before[0] + after[0]) / 2
    print(
        f"in process: classify {before[0]:.1f} / {after[0]:.1f} sentences/s (before / after), "
        f"{in_process.cpu_ms:.2f} ms CPU per sentence"
        + (f"; generate {before[1]:.2f} / {after[1]:.2f} new tokens/s" if before[1] else "")
    )
    for kind, rows in results.items():
        for r in rows:
            per = r["rps"] * (gen_tokens if kind == "generate" else 1)
            ref = ref_cls if kind == "classify" else (before[1] + after[1]) / 2
            unit = "sentences/s" if kind == "classify" else "new tokens/s"
            print(
                f"{kind:8s} {r['clients']:3d} clients: {r['ok']:4d} ok, errors {r['errors'] or 0}, "
                f"{r['rps']:7.2f} req/s, p50 {r['p50'] * 1e3:8.1f} ms, p99 {r['p99'] * 1e3:8.1f} ms"
                f" | {per:7.2f} {unit} = {per / ref:.2f}x in process"
                + (f"; server CPU {r['cpu_ms']:.2f} ms/request" if "cpu_ms" in r else "")
            )


if __name__ == "__main__":
    main()
