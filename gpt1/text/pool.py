"""The text pipeline's worker processes (encoding, counting words), started one way: no more of
them than CPUs (`gpt1.threads.cap_to_cpus`), and none when the machine cannot start them (a full
process table makes fork fail with EAGAIN): the work then runs in the calling process, slower but
with the same result, after one warning."""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable
from multiprocessing.pool import Pool
from typing import Any

from gpt1.threads import cap_to_cpus

log = logging.getLogger(__name__)

_warned = False  # the fallback's warning is given once per process, not once per batch


def open_pool(
    processes: int, what: str, initializer: Callable[..., Any] | None = None, initargs=()
) -> Pool | None:
    """A pool of `processes` workers (capped at the CPUs) running `initializer(*initargs)`
    first, or None when the caller should do the work itself: one process asked for, or the
    workers could not be started. `what` names the processes in messages."""
    global _warned
    processes = cap_to_cpus(processes, what)
    if processes <= 1:
        return None
    # fork shares the loaded vocabulary for free; elsewhere the arguments are pickled per worker
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    try:
        # Pool ends the workers it had started when a later one fails to start
        return multiprocessing.get_context(method).Pool(processes, initializer, initargs)
    except OSError as exc:  # BlockingIOError (EAGAIN: process table full), ENOMEM, ...
        if not _warned:
            _warned = True
            reason = exc.strerror or type(exc).__name__
            log.warning("%s: cannot start %d (%s); working in this one", what, processes, reason)
        return None
