"""The worker of tests/test_cli_walk.py: runs `gpt1` command lines one after another in this one
process (`gpt1.cli.main`), which saves the 1-2 s of imports a `python -m gpt1` per case costs.

Protocol: one JSON case per line on stdin ({"argv": [...], "cwd": DIR, "stdin": TEXT}); for
each, a line {"started": true} as it starts and {"code": N, "stderr": TEXT} when it ends, on
the stdout this process was started with. What a case prints goes elsewhere: its stdout to
/dev/null, and its stderr, at the file-descriptor level (so that what native code writes is
caught too), to a file read back into "stderr". A case that kills this process (a signal) shows
as a "started" with no end: the parent sees the exit status, and faulthandler's stack, which
goes to this process's own stderr (a file the parent names).
"""

from __future__ import annotations

import faulthandler
import io
import json
import os
import sys
import tempfile


def run_case(case: dict) -> dict:
    from gpt1.cli import main  # imported by `serve` already: a case's time is its own

    os.chdir(case["cwd"])
    sys.stdin = io.TextIOWrapper(
        io.BytesIO(case.get("stdin", "").encode("utf-8", "surrogateescape"))
    )
    with tempfile.TemporaryFile() as err:
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            try:
                code = main(["--quiet", *case["argv"]])
            except SystemExit as exc:  # argparse refuses a malformed flag by exiting
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException as exc:  # reported as what main let escape
                import traceback

                traceback.print_exc()
                code = f"raised {type(exc).__name__}"
            sys.stderr.flush()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    return {"code": code, "stderr": text}


def serve() -> None:
    # The protocol keeps this process's stdout; the cases' stdout goes to /dev/null.
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    faulthandler.enable(file=sys.__stderr__, all_threads=True)
    import gpt1.cli  # noqa: F401  before the first "started": the parent allows a fresh worker time for it

    cases = io.TextIOWrapper(os.fdopen(os.dup(0), "rb"), encoding="utf-8")
    for line in cases:
        proto.write(json.dumps({"started": True}) + "\n")
        proto.flush()
        result = run_case(json.loads(line))
        sys.stdin = sys.__stdin__
        proto.write(json.dumps(result) + "\n")
        proto.flush()


if __name__ == "__main__":
    serve()
