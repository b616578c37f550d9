"""Serve a fine-tuned run or a pretrained checkpoint over HTTP (JSON; OpenAPI page at /docs).

Endpoints: POST /v1/predict (fine-tuned runs), /v1/generate, /v1/score; GET /health, /metrics;
the playground page at / (unless --no-playground).
SIGTERM (or Ctrl-C) finishes the requests in flight, then exits.

Examples:
  gpt1 serve runs/sst2                       # http://127.0.0.1:8000
  gpt1 serve runs/pretrain/final --port 8080 --precision bf16
  gpt1 serve runs/sst2 --cors-origin http://localhost:3000   # a web app's page may call it
  gpt1 serve runs/sst2 --host 0.0.0.0 --api-key-file key.txt  # reachable by others: use a key
  curl -s localhost:8000/v1/predict --json '{"inputs": {"text": "a gripping film"}}'

Who may use it (docs/commands/serve.md#security): on 127.0.0.1 it answers only requests naming
it (Host localhost, 127.0.0.1 or [::1]), from its own pages or --cors-origin ones, with a JSON
body; with an API key, every route but /health and the pages needs Authorization: Bearer KEY.
"""

from __future__ import annotations

import argparse

HELP = "serve a run or checkpoint over HTTP (predict, generate, score)"
API_KEY_ENV = "GPT1_API_KEY"  # gpt1.serve.security's, named here: parsing imports no server code


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpt1.cli import options
    from gpt1.devices import SERVE_PRECISIONS

    options.add_source(
        p, "run", "RUN_OR_CHECKPOINT", "a fine-tuned run, a pretraining run or a checkpoint folder"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    options.add_inference_hardware(p, SERVE_PRECISIONS)
    p.add_argument(
        "--served-model-name",
        metavar="NAME",
        help="the model's id in the OpenAI API (/v1/models, `model` in requests; default: the "
        "run's name, e.g. sst2 for runs/sst2)",
    )
    p.add_argument(
        "--no-playground",
        dest="playground",
        action="store_false",
        help="do not serve the playground page at / (docs/commands/serve.md#playground)",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let browser pages from ORIGIN (scheme://host[:port], or * for any) call the API; "
        "repeat for several (default: none)",
    )
    add_access(p)
    group = p.add_argument_group("batching and limits")
    add_batching(group)
    add_limits(group)


def add_access(p: argparse.ArgumentParser) -> None:
    """Who may use the server (`gpt1.serve.security`)."""
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests whose Host header is NAME (a name this machine is reached "
        "by, e.g. behind a proxy), or * for any; repeat for several (default: on a loopback "
        "address only localhost, 127.0.0.1 and [::1]; elsewhere any)",
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help="require Authorization: Bearer KEY on every route but /health and the pages "
        f"(default: ${API_KEY_ENV} if set, else no key; --api-key-file keeps it out of ps)",
    )
    p.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="as --api-key, the key read from FILE (its first line)",
    )


def api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key, --api-key-file or $GPT1_API_KEY (one of them), or None."""
    import os
    from pathlib import Path

    from gpt1.errors import ConfigError

    if args.api_key is not None and args.api_key_file is not None:
        raise ConfigError("give --api-key or --api-key-file, not both")
    if args.api_key_file is not None:
        path = Path(args.api_key_file)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise ConfigError(f"--api-key-file {path}: cannot read the key ({reason})") from None
        if not lines or not lines[0].strip():
            raise ConfigError(f"--api-key-file {path}: the file's first line is empty")
        return lines[0].strip()
    if args.api_key is not None:
        return args.api_key
    return os.environ.get(API_KEY_ENV) or None


def add_batching(g: argparse._ArgumentGroup) -> None:
    """How requests are joined into model batches and queued."""
    g.add_argument(
        "--batch-tokens",
        type=int,
        default=8192,
        help="most tokens in one model batch (default 8192)",
    )
    g.add_argument(
        "--batch-items",
        type=int,
        default=16,
        help="most examples in one model batch (default 16, as gpt1 predict)",
    )
    g.add_argument(
        "--batch-wait-ms",
        type=float,
        default=2.0,
        help="how long a batch waits for more requests (default 2 ms)",
    )
    g.add_argument(
        "--max-queue",
        type=int,
        default=1024,
        help="queued items past which requests get 503 (default 1024; at least --max-items)",
    )
    g.add_argument(
        "--max-generations",
        type=int,
        default=None,
        help="generations decoded together, one batched step per token (default 32 for an "
        "int8 model, else 16); more wait in the queue",
    )


def add_limits(g: argparse._ArgumentGroup) -> None:
    """What one request and one connection may take."""
    g.add_argument(
        "--max-items", type=int, default=64, help="items per predict or score request (default 64)"
    )
    g.add_argument(
        "--max-new-tokens",
        type=int,
        default=1024,
        help="largest max_new_tokens a generate request may ask for (default 1024)",
    )
    g.add_argument(
        "--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB)"
    )
    g.add_argument(
        "--request-timeout",
        type=float,
        default=10.0,
        help="seconds a request (headers and body) may take to arrive before a 408 (default 10)",
    )
    g.add_argument(
        "--max-connections",
        type=int,
        default=512,
        help="open connections past which a new one gets 503 (default 512)",
    )
    g.add_argument(
        "--graceful-timeout",
        type=float,
        default=None,
        help="on SIGTERM, seconds to wait for requests in flight (default: no limit)",
    )


def run(args: argparse.Namespace) -> int:
    from gpt1.extras import require

    require("serve", "fastapi", "uvicorn", "prometheus_client", what="gpt1 serve")
    from gpt1.cli.options import from_flags
    from gpt1.serve.options import ServeOptions
    from gpt1.serve.schemas import Limits
    from gpt1.serve.security import Security
    from gpt1.serve.server import serve
    from gpt1.threads import requested_threads

    # Checked here, before the model loads: a typo costs no wait.
    options = from_flags(
        ServeOptions,
        args,
        security=Security(
            args.host, args.port, tuple(args.allowed_host), tuple(args.cors_origin), api_key(args)
        ),
        limits=from_flags(Limits, args),
        threads=requested_threads(args.threads),  # auto unless the flag or $GPT1_THREADS says
        with_playground=args.playground,
    )
    serve(args.run, options)
    return 0
