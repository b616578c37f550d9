"""`serve(...)`: load a model, build the app, run it under uvicorn until SIGINT or SIGTERM.

uvicorn's graceful shutdown does what a deployment needs on SIGTERM: it stops accepting
connections, lets the requests in flight (streams included) finish, then runs the app's
shutdown, which lets the batcher finish its queue before the process exits.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path

import torch

from gpt1.errors import ConfigError
from gpt1.serve.schemas import Limits

log = logging.getLogger("gpt1.serve")


def serve(
    path: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    device: str = "cpu",
    precision: str = "fp32",
    limits: Limits | None = None,
    batch_tokens: int = 8192,
    batch_items: int = 16,
    wait_ms: float = 2.0,
    max_queue: int = 1024,
    threads: int | None = None,
    graceful_timeout: float | None = None,
    max_generations: int = 16,
) -> None:
    """Serve `path` (a fine-tuned run or a checkpoint) on http://host:port until stopped."""
    import uvicorn

    from gpt1.serve.app import create_app
    from gpt1.serve.engine import load_engine

    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {port}")
    for name, value in (
        ("--batch-tokens", batch_tokens),
        ("--batch-items", batch_items),
        ("--max-queue", max_queue),
        ("--max-generations", max_generations),
    ):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if wait_ms < 0:
        raise ConfigError(f"--batch-wait-ms must be >= 0, got {wait_ms}")
    if threads:
        torch.set_num_threads(threads)
    engine = load_engine(path, device, precision)
    app = create_app(
        engine, limits, batch_tokens, batch_items, wait_ms / 1000, max_queue, max_generations
    )
    log.info(
        "gpt1 serve: %s (%s, %s) on http://%s:%d (API docs at /docs)",
        engine.folder,
        engine.kind,
        precision,
        host,
        port,
    )
    # log_config=None: uvicorn's loggers go through the handler `gpt1` configured.
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=graceful_timeout,
        lifespan="on",
    )
    if threading.current_thread() is threading.main_thread():
        # uvicorn shuts down gracefully on SIGTERM, then re-raises it to the handler it found:
        # this one makes the drained exit a clean exit (status 0) instead of a signal death.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    uvicorn.Server(config).run()
