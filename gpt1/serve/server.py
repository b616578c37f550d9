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
from gpt1.serve.options import ServeOptions

log = logging.getLogger("gpt1.serve")


def serve(path: str | Path, options: ServeOptions | None = None) -> None:
    """Serve `path` (a fine-tuned run or a checkpoint) as `options` say (default: as
    `gpt1 serve PATH` does), on their address and port, to the clients they let in, until
    stopped."""
    import uvicorn

    from gpt1.checkpoint_files import resolve_checkpoint_dir
    from gpt1.devices import SERVE_PRECISIONS, resolve_device, resolve_precision
    from gpt1.serve.app import create_app
    from gpt1.serve.engine import load_engine

    options = options or ServeOptions()
    ensure_file_descriptors(options.max_connections)
    threads_note = "torch's"
    if options.threads is not None:
        from gpt1.threads import apply_threads

        threads_note = "auto" if options.threads == "auto" else "asked for"
        apply_threads(options.threads)
    # What can be refused at once is, before the loading line (a refusal stays one line).
    resolve_checkpoint_dir(path)
    resolve_precision(options.precision, resolve_device(options.device), SERVE_PRECISIONS)
    # Loading (and int8's quantising) takes seconds at GPT-1 size: say so before, not after.
    log.info("gpt1 serve: loading %s (precision %s) ...", path, options.precision)
    engine = load_engine(path, options.device, options.precision)
    if options.threads is not None:
        from gpt1.threads import announce_now

        announce_now()  # the count (and a cap at the CPUs), held until a status line
    app = create_app(engine, options)
    security = options.security
    log.info(
        "gpt1 serve: %s (%s, %s, %d CPU threads: %s) on http://%s:%d (API docs at /docs)",
        engine.folder,
        engine.kind,
        engine.precision,
        torch.get_num_threads(),
        threads_note,
        security.bind_host,
        security.port,
    )
    for line in security.warnings():
        log.warning("gpt1 serve: %s", line)
    for line in security.describe():
        log.info("gpt1 serve: %s", line)
    if threading.current_thread() is threading.main_thread():
        # uvicorn shuts down gracefully on SIGTERM, then re-raises it to the handler it found:
        # this one makes the drained exit a clean exit (status 0) instead of a signal death.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    uvicorn.Server(uvicorn_config(app, options)).run()


def uvicorn_config(app: Any, options: ServeOptions) -> Any:
    """uvicorn's settings for `app` served as `options` say, its HTTP protocol bounded
    (`gpt1.serve.connections`)."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    from gpt1.serve.connections import bounded_protocol

    # log_config=None: uvicorn's loggers go through the handler `gpt1` configured.
    return uvicorn.Config(
        app,
        host=options.security.bind_host,
        port=options.security.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        http=bounded_protocol(AutoHTTPProtocol, options.request_timeout, options.max_connections),
        timeout_graceful_shutdown=options.graceful_timeout,
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
