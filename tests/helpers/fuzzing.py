"""How many generated cases a hostile-input test tries: a fast slice in `make test`, the full
run behind `make fuzz` (which sets GPT1_FUZZ=full). Each generated test reports what it tried
through `report`: a line on stderr, also appended to the file GPT1_FUZZ_REPORT names (`make fuzz`
prints that file at the end, since pytest's workers keep their stderr)."""

from __future__ import annotations

import os
import sys

FULL = os.environ.get("GPT1_FUZZ", "") == "full"


def budget(fast: int, full: int) -> int:
    """`full` under `make fuzz`, else `fast`."""
    return full if FULL else fast


def report(what: str, **counts: int) -> None:
    """One line of counts for the fuzz summary (`make fuzz` shows them), e.g.
    report("cli walk", runs=1500, tracebacks=0)."""
    fields = ", ".join(f"{k}={v}" for k, v in counts.items())
    line = f"[fuzz] {what}: {fields}"
    print(line, file=sys.stderr)
    if os.environ.get("GPT1_FUZZ_REPORT"):
        with open(os.environ["GPT1_FUZZ_REPORT"], "a", encoding="utf-8") as out:
            out.write(line + "\n")
