"""`serve(...)`: load a model, build the app, run it under uvicorn until SIGINT or SIGTERM.

uvicorn's graceful shutdown does what a deployment needs on SIGTERM: it stops accepting
connections, lets the requests in flight (streams included) finish, then runs the app's
shutdown, which lets the batcher finish its queue before the process exits. `uvicorn_config`
adds what uvicorn lacks against slow or piled-up clients (`gpt1.serve.connections`): a deadline
for each request to arrive and a bound on open connections.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import torch

from gpt1.errors import ConfigError
from gpt1.serve.schemas import Limits
from gpt1.serve.security import Security

log = logging.getLogger("gpt1.serve")


def serve(
    path: str | Path,
    security: Security,
    device: str = "auto",
    precision: str = "auto",
    limits: Limits | None = None,
    batch_tokens: int = 8192,
    batch_items: int = 16,
    wait_ms: float = 2.0,
    max_queue: int = 1024,
    threads: str | int | None = None,
    graceful_timeout: float | None = None,
    max_generations: int = 16,
    request_timeout: float | None = 10.0,
    max_connections: int | None = 512,
    served_model_name: str | None = None,
    with_playground: bool = True,
) -> None:
    """Serve `path` (a fine-tuned run or a checkpoint) on `security`'s address and port, to the
    clients it lets in, until stopped. `threads`: "auto" or a count (`gpt1.threads`; None keeps
    torch's); `served_model_name`: what the OpenAI endpoints call the model (default: its run's
    name); the playground page at `/` unless `with_playground` is false."""
    import uvicorn

    from gpt1.serve.app import check_queue, create_app
    from gpt1.serve.engine import load_engine

    host, port = security.bind_host, security.port
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {port}")
    for name, value in (
        ("--batch-tokens", batch_tokens),
        ("--batch-items", batch_items),
        ("--max-queue", max_queue),
        ("--max-generations", max_generations),
        ("--max-connections", 1 if max_connections is None else max_connections),
    ):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1, got {value}")
    if wait_ms < 0:
        raise ConfigError(f"--batch-wait-ms must be >= 0, got {wait_ms}")
    if request_timeout is not None and not request_timeout > 0:
        raise ConfigError(f"--request-timeout must be > 0 seconds, got {request_timeout}")
    check_queue(max_queue, limits or Limits())
    if served_model_name is not None and not served_model_name.strip():
        raise ConfigError("--served-model-name must not be empty")
    ensure_file_descriptors(max_connections)
    threads_note = "torch's"
    if threads is not None:
        from gpt1.threads import apply_threads

        threads_note = "auto" if threads == "auto" else "asked for"
        apply_threads(threads)
    # What can be refused at once is, before the loading line (a refusal stays one line).
    from gpt1.checkpoint_files import resolve_checkpoint_dir
    from gpt1.devices import resolve_device, resolve_precision
    from gpt1.serve.engine import PRECISIONS

    resolve_checkpoint_dir(path)
    resolve_precision(precision, resolve_device(device), ("auto", *PRECISIONS))
    # Loading (and int8's quantising) takes seconds at GPT-1 size: say so before, not after.
    log.info("gpt1 serve: loading %s (precision %s) ...", path, precision)
    engine = load_engine(path, device, precision)
    if threads is not None:
        from gpt1.threads import announce_now

        announce_now()  # the count (and a cap at the CPUs), held until a status line
    app = create_app(
        engine,
        limits,
        batch_tokens,
        batch_items,
        wait_ms / 1000,
        max_queue,
        max_generations,
        request_timeout,
        served_model_name,
        with_playground,
        security,
    )
    log.info(
        "gpt1 serve: %s (%s, %s, %d CPU threads: %s) on http://%s:%d (API docs at /docs)",
        engine.folder,
        engine.kind,
        engine.precision,
        torch.get_num_threads(),
        threads_note,
        host,
        port,
    )
    for line in security.warnings():
        log.warning("gpt1 serve: %s", line)
    for line in security.describe():
        log.info("gpt1 serve: %s", line)
    config = uvicorn_config(
        app,
        host,
        port,
        request_timeout,
        max_connections,
        timeout_graceful_shutdown=graceful_timeout,
    )
    if threading.current_thread() is threading.main_thread():
        # uvicorn shuts down gracefully on SIGTERM, then re-raises it to the handler it found:
        # this one makes the drained exit a clean exit (status 0) instead of a signal death.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    uvicorn.Server(config).run()


def uvicorn_config(
    app: Any,
    host: str,
    port: int,
    request_timeout: float | None,
    max_connections: int | None,
    **options: Any,
) -> Any:
    """uvicorn's settings for `app`, its HTTP protocol bounded (`gpt1.serve.connections`)."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from gpt1.serve.connections import bounded_protocol

    # log_config=None: uvicorn's loggers go through the handler `gpt1` configured.
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        lifespan="on",
        http=bounded_protocol(AutoHTTPProtocol, request_timeout, max_connections),
        **options,
    )


FD_MARGIN = 128  # descriptors beside the connections: model files, the listening socket, ...


def ensure_file_descriptors(max_connections: int | None) -> None:
    """Raise this process's open-file limit to hold `max_connections` (up to the hard limit),
    or refuse a `--max-connections` the system does not allow."""
    try:
        import resource
    except ImportError:  # not on this system (Windows): nothing to raise
        return
    if max_connections is None:
        return
    need = max_connections + FD_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise ConfigError(
            f"--max-connections {max_connections} needs {need} open files, but this process "
            f"may open at most {hard} (ulimit -Hn); lower --max-connections"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
