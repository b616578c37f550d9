"""Training telemetry: the console line, `metrics.jsonl`, tokens/s, MFU, memory, and loss/lr plots.

Only rank 0 writes; other ranks get a logger whose methods do nothing. `metrics.jsonl` holds one
JSON object per line: training lines carry `step`, `loss`, `lr`, `grad_norm`, ... (fine-tuning
also `task_loss` and, with the auxiliary LM, `lm_loss`: the interval's means); validation
lines carry `step`, `val_loss`, `val_ppl`. On resume, lines past the resumed step are dropped so
the file reads like one uninterrupted run. The same records go to the trackers named by
`train.loggers` (gpt1.train.trackers), which re-attach on resume without repeating a step.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from gpt1.files import write_bytes, write_failure, write_files, write_text
from gpt1.train.resume import RUN_JSON

log = logging.getLogger("gpt1.train")

METRICS = "metrics.jsonl"
# The largest step and metric magnitude a plot takes: past 2**53 a float (the axis) no longer
# tells steps apart; past 1e300 matplotlib's tick arithmetic overflows.
MAX_STEP, MAX_VALUE = 2**53, 1e300

# Dense bf16 peak FLOP/s of common accelerators (no sparsity).
_GPU_PEAKS = {
    "H100": 989e12,
    "H200": 989e12,
    "H800": 989e12,
    "GH200": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10G": 125e12,
    "4090": 165e12,
    "3090": 71e12,
    "V100": 125e12,
    "T4": 65e12,
    "B200": 2250e12,
}


def peak_flops(device: torch.device, precision: str, override: float = 0.0) -> float:
    """Peak FLOP/s for MFU: `override` if set, a table for GPUs, a short matmul probe on CPU."""
    if override > 0:
        return override
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in _GPU_PEAKS.items():
            if key in name:
                return value if precision == "bf16" else value / 2  # tf32 tensor cores: half
        return 0.0
    return cpu_matmul_peak(torch.bfloat16 if precision == "bf16" else torch.float32)


def cpu_matmul_peak(dtype: torch.dtype, n: int = 1024, seconds: float = 0.3) -> float:
    """Measured matmul FLOP/s on this CPU (best of repeated n x n x n products)."""
    # A private generator: the probe must not consume the training RNG (exact resume).
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(dtype) for _ in range(2))
    a @ b
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2.0 * n**3 / (time.perf_counter() - t0))
    return best


def memory_bytes(device: torch.device) -> int:
    """Max allocated on CUDA; resident set size of this process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MetricsLogger:
    """Console lines and `metrics.jsonl` for one run (a no-op on ranks other than 0), and the
    same records for the run's experiment trackers (`gpt1.train.trackers.Trackers`)."""

    def __init__(
        self,
        run_dir: Path,
        enabled: bool,
        resume_step: int | None = None,
        trackers: Any = None,
    ):
        self.enabled = enabled
        self.file = Path(run_dir) / METRICS
        self.bar: Any = None
        self.trackers = trackers if enabled else None
        if not enabled:
            return
        if self.trackers is not None:
            # Started before metrics.jsonl is touched: a tracker that cannot start refuses the
            # run with the file as it was.
            logged, kept = history(self.file, resume_step)
            self.trackers.open(resume_step, logged, kept)
        if resume_step is None:
            write_text(self.file, "")
        else:
            truncate_after(self.file, resume_step)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = json.dumps(record) + "\n"
        try:
            with open(self.file, "a") as fh:
                fh.write(line)
        except OSError as exc:  # disk full, read-only folder: one line naming the file
            raise write_failure(self.file, exc, len(line)) from None
        # After the file: a run killed in between may miss a tracker point, never repeat one.
        if self.trackers is not None:
            self.trackers.log(record)

    def console(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            log.info(text)


def truncate_after(file: Path, step: int) -> None:
    """Drop lines of `file` whose step is past `step` (work lost when a run was killed)."""
    if not file.is_file():
        return
    kept = [line for line, _, at in _records(file) if at <= step]
    # Temporary file then rename: a kill during this rewrite must not lose the kept lines.
    write_text(file, "".join(k + "\n" for k in kept))


def history(file: Path, resume_step: int | None) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """For trackers opened on a resume at `resume_step`: the last step `file` (metrics.jsonl)
    holds each metric at, and its records up to `resume_step` (what `truncate_after` keeps);
    nothing for a new run."""
    if resume_step is None or not file.is_file():
        return {}, []
    kept = [record for _, record, at in _records(file) if "step" in record and at <= resume_step]
    return last_steps(file), kept


def last_steps(file: Path) -> dict[str, int]:
    """The last step at which `file` (metrics.jsonl) holds each metric."""
    last: dict[str, int] = {}
    if not file.is_file():
        return last
    for _, record, step in _records(file):
        for key in record:
            if key != "step":
                last[key] = max(last.get(key, -1), step)
    return last


def _records(file: Path) -> list[tuple[str, dict[str, Any], int]]:
    """(line, record, its step: 0 if none) of every line of a metrics file that holds a JSON
    object with an integer step. Any other line is passed over: a half-written last line from
    a killed run (`read_metrics`, which plots, refuses them)."""
    out = []
    for line in _lines(file):
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, ValueError, RecursionError):  # ValueError: 4300+ digits
            continue
        step = record.get("step", 0) if isinstance(record, dict) else None
        if type(step) is int:
            out.append((line, record, step))
    return out


def _lines(file: Path) -> list[str]:
    """The lines of a metrics file; undecodable bytes are replaced (such a line is damaged)."""
    return file.read_bytes().decode("utf-8", "replace").split("\n")


def train_line(rec: dict[str, Any]) -> str:
    """The console line for one logging interval."""
    mem = rec.get("mem_gb")
    # Fine-tuning's loss is task + lm_coef x LM: each term shown, so a stuck task loss shows.
    terms = "".join(
        f" | {name} {rec[key]:.4f}"
        for key, name in (("task_loss", "task"), ("lm_loss", "lm"))
        if key in rec
    )
    return (
        f"step {rec['step']:>6d} | loss {rec['loss']:.4f}{terms} | lr {rec['lr']:.3e} | "
        f"grad {rec['grad_norm']:.3f} | {rec['tokens_per_s']:,.0f} tok/s | "
        f"MFU {100 * rec.get('mfu', 0.0):.1f}% | mem {mem:.2f} GB"
    )


def val_line(rec: dict[str, Any]) -> str:
    return f"step {rec['step']:>6d} | val_loss {rec['val_loss']:.4f} | val_ppl {rec['val_ppl']:.2f}"


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    file = Path(run_dir) / METRICS
    from gpt1.errors import DataError

    if not file.is_file():
        raise DataError(f"no {METRICS} in this run folder", run_dir)
    records = []
    for n, line in enumerate(_lines(file), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, ValueError, RecursionError):  # ValueError: 4300+ digits
            record = None
        if not isinstance(record, dict):
            raise DataError("not a JSON object", file, line=n)
        step = record.get("step")
        if type(step) is not int or not 0 <= step <= MAX_STEP:
            got = "nothing" if step is None else repr(step)[:40]
            raise DataError(f"expected a step in 0..2**53, got {got}", file, n, "step")
        for key, value in record.items():
            if type(value) not in (int, float) or not abs(value) <= MAX_VALUE:
                if type(value) is not float or not math.isnan(value):  # a NaN point is a gap
                    raise DataError(
                        f"expected a number within ±1e300, got {repr(value)[:40]}", file, n, key
                    )
        records.append(record)
    return records


def png(fig: Any) -> bytes:
    """A matplotlib figure as PNG bytes (the resolution every gpt1 figure has)."""
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    return buffer.getvalue()


def save_figure(fig: Any, path: Path) -> Path:
    """Write a matplotlib figure as PNG atomically (a failed write leaves no partial file)."""
    return write_bytes(path, png(fig))


def plot_run(run_dir: str | Path, overwrite: bool = True) -> list[Path]:
    """Write loss.png (its loss curves, each named by what it is: `loss_curves`) and lr.png
    from a run's metrics.jsonl.

    With `overwrite=False`, existing plots are refused (`gpt1 plot` without --overwrite)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    train = [r for r in records if "loss" in r]
    if not overwrite:
        from gpt1.files import check_output

        for name in ("loss.png", "lr.png"):
            check_output(run_dir / name, overwrite)
    drawn = {}  # both plots drawn before either is written
    fig, ax = plt.subplots(figsize=(7, 4))
    curves, unit = loss_curves(records, task_loss_name(run_dir))
    for key, label in curves.items():
        points = [r for r in records if key in r]
        style = "o-" if key == "val_loss" else "-"  # sparse validation points stay visible
        ax.plot([r["step"] for r in points], [r[key] for r in points], style, label=label, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel(unit)
    ax.set_title(f"{run_dir.name}: loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    drawn["loss.png"] = png(fig)
    plt.close(fig)
    lr = [r for r in train if "lr" in r]
    if lr:
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.plot([r["step"] for r in lr], [r["lr"] for r in lr])
        ax.set_xlabel("step")
        ax.set_ylabel("learning rate")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        drawn["lr.png"] = png(fig)
        plt.close(fig)
    return write_files(run_dir, drawn)


def loss_curves(
    records: list[dict[str, Any]], task_loss: str | None = None
) -> tuple[dict[str, str], str]:
    """The loss curves a run's records hold ({metrics.jsonl field: what it is}) and the y axis.

    Named from the fields the records carry: pretraining logs the LM's cross-entropy (`loss`,
    `val_loss`); fine-tuning logs `loss` = `task_loss` + lm_coef x `lm_loss`, `lm_loss` only with
    the auxiliary LM, and the coefficient is read back from those three (the log does not record
    it). `task_loss` names the task's loss where the run says it (`task_loss_name`).
    """
    fields = {key for r in records for key in r}
    if "task_loss" not in fields:
        curves = {"loss": "train LM cross-entropy", "val_loss": "validation LM cross-entropy"}
        return {k: v for k, v in curves.items() if k in fields}, "LM cross-entropy (nats/token)"
    if "lm_loss" not in fields:
        return {"loss": "fine-tuning loss = task loss (no auxiliary LM)"}, task_loss or "loss"
    terms = [r for r in records if {"loss", "task_loss", "lm_loss"} <= r.keys() and r["lm_loss"]]
    ratios = sorted(
        x for x in ((r["loss"] - r["task_loss"]) / r["lm_loss"] for r in terms) if math.isfinite(x)
    )
    coef = f"{ratios[len(ratios) // 2]:.2g}" if ratios else "lm_coef"
    curves = {
        "loss": f"fine-tuning loss: task + {coef} x LM",
        "task_loss": f"task loss: {task_loss}" if task_loss else "task loss",
        "lm_loss": "auxiliary LM cross-entropy (nats/token)",
    }
    return curves, "loss (nats)" if task_loss and "nats" in task_loss else "loss"


def task_loss_name(run_dir: Path) -> str | None:
    """What a fine-tuning run's task loss is, from the task its run.json records: squared error
    for a regression (no class labels), else cross-entropy; None when run.json does not say."""
    from gpt1.config import TaskKind, read_json_file
    from gpt1.errors import ConfigError

    try:
        task = read_json_file(run_dir / RUN_JSON)["task"]
        regression = task["kind"] != TaskKind.CHOICE and task["labels"] is None
    except (ConfigError, KeyError, TypeError):  # no run.json, or not a fine-tuning one
        return None
    return "squared error" if regression else "cross-entropy (nats/example)"


def plot_runs(
    runs: list[str | Path], metric: str, out: str | Path, overwrite: bool = False
) -> Path:
    """One figure of `metric` against the step for several runs (one line each, labelled by
    the run folder as given), written to `out`; a run without that metric is an error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpt1.errors import DataError
    from gpt1.files import check_output

    series = []
    for run in runs:
        points = [(r["step"], r[metric]) for r in read_metrics(run) if metric in r]
        if not points:
            names = sorted({k for r in read_metrics(run) for k in r} - {"step"})
            raise DataError(f"no {metric!r} in {METRICS}; it holds {', '.join(names)}", run)
        series.append((str(run), sorted(points)))
    out = Path(out)
    # Each run's metrics.jsonl is read in full; a run folder only in part (a figure may go in it).
    check_output(out, overwrite, [Path(run) / METRICS for run in runs], runs)
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in series:
        style = "o-" if len(points) <= 30 else "-"  # sparse validation points stay visible
        ax.plot([s for s, _ in points], [v for _, v in points], style, label=label, lw=1, ms=3)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} of {len(series)} run{'s' if len(series) > 1 else ''}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, out)
    plt.close(fig)
    return out


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else float("inf")
