"""Zero-shot evaluation of checkpoints: one checkpoint, or every checkpoint of a run as a curve.

`evaluate_checkpoint` scores one checkpoint on many tasks (`gpt1.zeroshot.heuristics`) as its
`ZeroshotOptions` say;
`evaluate_run` does so for every `step-N` / `final` checkpoint of a pretraining run (found by
`gpt1.model.checkpoint.run_checkpoints`) and writes Fig. 2 (right): a table and a PNG of the
normalised score against pretraining updates.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt1.checkpoint_files import open_checkpoint
from gpt1.devices import resolve_device, resolve_precision
from gpt1.errors import CheckpointError, DataError
from gpt1.files import OutputExists, write_json, write_text
from gpt1.inference.loading import load_for_inference
from gpt1.inference.scoring import Scorer
from gpt1.model.checkpoint import run_checkpoints
from gpt1.train.telemetry import save_figure
from gpt1.zeroshot.heuristics import REFERENCES, TASKS, run_task, task_folder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ZeroshotOptions:
    """How checkpoints are scored, each the `gpt1 zeroshot` flag of its name: `tokenizer`, a
    vocabulary folder (None: the checkpoint's own); `limit`, the first N examples of each split;
    `calibrate`, `device`, `precision` and `batch_tokens` (padded tokens per forward pass)."""

    tokenizer: str | Path | None = None
    limit: int | None = None
    calibrate: bool = False
    device: str = "auto"
    precision: str = "auto"
    batch_tokens: int = 4096


def evaluate_checkpoint(
    checkpoint: str | Path,
    tasks: Sequence[str],
    data: str | Path,
    options: ZeroshotOptions = ZeroshotOptions(),
) -> dict[str, dict[str, Any]]:
    """Results per task for one checkpoint; tasks without data under `data` are skipped (logged)."""
    opened = open_checkpoint(checkpoint)
    folder = opened.folder
    if not options.tokenizer and opened.tokenizer_dir is None:
        raise CheckpointError(
            f"{folder}: no tokenizer files (vocab.json + merges.txt); pass --tokenizer DIR"
        )
    folders = {t: task_folder(t, Path(data)) for t in tasks}
    missing = [t for t, f in folders.items() if f is None]
    if missing and len(tasks) == 1:
        raise DataError(
            f"no {tasks[0]} data here (looked for it and in {', '.join(TASKS[tasks[0]].folders)})",
            data,
        )
    for t in missing:
        log.info("zeroshot: skipping %s (no data under %s)", t, data)
    loaded = load_for_inference(opened, options.device, options.precision, options.tokenizer)
    tok = loaded.tokenizer
    scorer = Scorer(loaded.lm, batch_tokens=options.batch_tokens, max_context=loaded.window)
    if scorer.n_positions < scorer.model.config.n_positions:
        log.info(
            "zeroshot: context capped at %d tokens, the window %s was pretrained on",
            scorer.n_positions,
            folder.name,
        )
    results = {}
    for task in tasks:
        if folders[task] is not None:
            results[task] = run_task(
                task, scorer, tok, folders[task], options.limit, options.calibrate
            )
            r = results[task]
            log.info(
                "zeroshot %s %s: %s %.4f (normalised %.3f, n=%d, %.1fs)",
                folder.name,
                task,
                r["metric"],
                r["value"],
                r["normalised"],
                r["n"],
                r["seconds"],
            )
    return results


def evaluate_run(
    run_dir: str | Path,
    tasks: Sequence[str],
    data: str | Path,
    out_dir: str | Path,
    overwrite: bool = False,
    options: ZeroshotOptions = ZeroshotOptions(),
) -> dict[str, Any]:
    """Zero-shot over a pretraining run (Fig. 2 right): every checkpoint, every task with data.

    Resumable: results accumulate in OUT/curve.json after each checkpoint, and a rerun with the
    same settings evaluates only what is missing. Writes curve.md (table) and curve.png. A
    curve.json with other settings (or curve files without one) is replaced only with `overwrite`.
    """
    out_dir = Path(out_dir)
    cache_file = out_dir / "curve.json"
    # The precision as a concrete name: the results depend on it.
    precision = resolve_precision(options.precision, resolve_device(options.device))
    key = {"limit": options.limit, "calibrate": options.calibrate, "precision": precision}
    curve: dict[str, Any] = {"settings": key, "data": str(data), "checkpoints": {}}
    old = _read_curve(cache_file) if cache_file.is_file() else None
    if old is not None and old.get("settings") == key:
        curve = old
    elif not overwrite:
        for name in ("curve.json", "curve.md", "curve.png"):
            if (out_dir / name).exists():
                raise OutputExists(
                    f"{out_dir / name}: exists from a curve with other settings "
                    f"({old.get('settings') if old else 'unknown'}, now {key}); "
                    "pass --overwrite to start afresh, or choose another --out"
                )
    for name, updates, folder in run_checkpoints(run_dir):
        done = curve["checkpoints"].get(name, {"updates": updates, "tasks": {}})
        todo = [t for t in tasks if t not in done["tasks"]]
        if todo:
            results = evaluate_checkpoint(folder, todo, data, options)
            for r in results.values():
                r.pop("examples")  # per example: gpt1 zeroshot on one checkpoint writes them
            done["tasks"].update(results)
            done["updates"] = updates
            curve["checkpoints"][name] = done
            write_json(
                cache_file, curve, indent=1
            )  # a killed sweep keeps every finished checkpoint
    shown = [t for t in tasks if any(t in e["tasks"] for e in curve["checkpoints"].values())]
    write_text(out_dir / "curve.md", curve_table(curve, shown))
    plot_curve(curve, shown, out_dir / "curve.png")
    return curve


def _read_curve(file: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def curve_table(curve: dict[str, Any], tasks: Sequence[str]) -> str:
    """Markdown: one row per checkpoint, normalised score (raw metric) per task."""
    lines = [
        "| checkpoint | updates | " + " | ".join(tasks) + " |",
        "|---|---|" + "---|" * len(tasks),
    ]
    for name, entry in curve["checkpoints"].items():
        cells = []
        for t in tasks:
            r = entry["tasks"].get(t)
            cells.append(
                "–" if r is None else f"{r['normalised']:.3f} ({r['metric']} {r['value']:.3f})"
            )
        updates = "?" if entry["updates"] is None else str(entry["updates"])
        lines.append(f"| {name} | {updates} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Normalised: 0 = chance, 1 = reference state of the art ("
        + "; ".join(
            f"{t}: {REFERENCES[t].sota} {REFERENCES[t].metric}, {REFERENCES[t].source}"
            for t in tasks
        )
        + ")."
    )
    return "\n".join(lines) + "\n"


def plot_curve(curve: dict[str, Any], tasks: Sequence[str], png: Path) -> None:
    """Normalised score against pretraining updates (log x axis), one line per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for t in tasks:
        pts = sorted(
            (e["updates"], e["tasks"][t]["normalised"])
            for e in curve["checkpoints"].values()
            if t in e["tasks"] and e["updates"] is not None and e["updates"] > 0
        )
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=t)
    ax.axhline(0.0, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("pretraining updates")
    ax.set_ylabel("zero-shot score (0 = chance, 1 = SOTA)")
    ax.set_title("Zero-shot performance over pretraining")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, png)
    plt.close(fig)
