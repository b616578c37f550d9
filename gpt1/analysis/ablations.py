"""Table 5: the full method against no pretraining, no auxiliary LM, and the LSTM baseline.

Rows (each a `gpt1 finetune` sub-run per task and seed):
  full     Transformer w/ aux LM: --init CKPT (lambda = 0.5)
  scratch  Transformer w/o pre-training: --init CKPT --transfer-layers -1, i.e. the same
           architecture and tokenizer with every weight freshly initialised
  no_aux   Transformer w/o aux LM: --init CKPT --lm-coef 0
  lstm     LSTM w/ aux LM: --init LSTM_CKPT (a `gpt1 pretrain --arch lstm` run on the same corpus)
The LSTM row is left out (with a note) when no LSTM checkpoint is given. Output: ablations.md in
the paper's layout (Avg first, then one column per task; mean ± std when several seeds),
ablations.json. Every task trains on its train split and is scored on dev; --splits TASK=TRAIN:EVAL
says otherwise (e.g. data without a train split), and the table says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt1.analysis import report
from gpt1.analysis.runs import FinetuneOptions, TaskSweep, headline
from gpt1.analysis.sweep import Sweep
from gpt1.errors import ConfigError
from gpt1.tasks.registry import TASKS

ROWS = {
    "full": "Transformer w/ aux LM (full)",
    "scratch": "Transformer w/o pre-training",
    "no_aux": "Transformer w/o aux LM",
    "lstm": "LSTM w/ aux LM",
}
METRIC_NAMES = {"matthews": "mc", "pearson": "pc", "f1": "F1", "accuracy": "acc"}


def parse_mapping(items: Sequence[str], name: str) -> dict[str, str]:
    """['a=x', 'b=y'] -> {'a': 'x', 'b': 'y'}."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"{name}: expected TASK=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def task_plan(
    tasks: Sequence[str], data_root: str | Path, folders: dict[str, str], splits: dict[str, str]
) -> dict[str, dict[str, str]]:
    """Per task: its data folder and the (train, eval) splits used."""
    plan = {}
    for task in tasks:
        known = TASKS.get(task)
        folder = folders.get(task) or (known.folders[0] if known and known.folders else None)
        if folder is None:
            raise ConfigError(
                f"--tasks: no default folder for {task!r}; pass --task-data {task}=DIR"
            )
        path = Path(folder) if Path(folder).is_absolute() else Path(data_root) / folder
        train, scored = "train", "dev"
        if task in splits:
            train, _, scored = splits[task].partition(":")
            if not train or not scored:
                raise ConfigError(f"--splits {task}={splits[task]}: expected TRAIN:EVAL")
        plan[task] = {"data": str(path), "train_split": train, "eval_split": scored}
    return plan


@dataclass(frozen=True)
class Ablations:
    """What the ablation sweep holds fixed, each the flag of its name where one is: the
    pretrained checkpoint `init` (and `lstm_init`, an LSTM's; None leaves its row out), per task
    its data folder and splits (`plan`, from `task_plan`), the fine-tuning `options` of every
    sub-run and `train_examples` (a seeded subset of this size; None: the whole split)."""

    init: str | Path
    plan: dict[str, dict[str, str]]
    options: FinetuneOptions
    lstm_init: str | Path | None = None
    train_examples: int | None = None


def ablation_sweep(
    ablations: Ablations,
    out: str | Path,
    seeds: Sequence[int] = (0,),
    command: list[str] | None = None,
    only_rows: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the ablations; write ablations.md / .json; return the table.

    `only_rows` runs just those rows (e.g. the LSTM row in a folder of its own while another
    process runs the Transformer rows); the table shows every row it has results for.
    """
    init, lstm_init, plan = ablations.init, ablations.lstm_init, ablations.plan
    rows = {
        "full": (init, {}),
        "scratch": (init, {"transfer_layers": -1}),
        "no_aux": (init, {"lm_coef": 0.0}),
    }
    if lstm_init is not None:
        rows["lstm"] = (lstm_init, {})
    for row in only_rows or ():
        if row not in rows:
            hint = " (it needs --lstm-init)" if row == "lstm" else ""
            raise ConfigError(
                f"--rows: unknown or unavailable row {row!r}{hint}; choose from {', '.join(rows)}"
            )
    out = Path(out)
    settings = {
        "init": str(init),
        "lstm_init": str(lstm_init) if lstm_init else None,
        "plan": plan,
        "train_examples": ablations.train_examples,
        "finetune": ablations.options.settings(),
    }
    # Tasks and the LSTM row may be added to an existing folder by a later invocation.
    sweep = Sweep(out, "ablations", settings, command, growable=("plan", "lstm_init"))
    for task, where in plan.items():
        for row, (ckpt, extra) in rows.items():
            if only_rows and row not in only_rows:
                continue
            fixed = TaskSweep(ckpt, task, options=ablations.options, **where)  # data and splits
            for seed in seeds:
                run_dir = out / "runs" / f"{task}-{row}-seed{seed}"
                sub = fixed.sub_run(run_dir, seed, train_examples=ablations.train_examples, **extra)

                def job(sub=sub, task=task) -> dict[str, Any]:
                    results = sub.run()
                    metric, value = headline(task, results)
                    return {"metric": metric, "value": value, "results": results}

                sweep.run(f"{task}/{row}/seed={seed}", sub.argv(), job, run_dir=run_dir)
    table = summarise(sweep, plan, list(rows))
    report.write_json(out / "ablations.json", table)
    report.write_text(out / "ablations.md", markdown(table, lstm_given=lstm_init is not None))
    return table


def summarise(sweep: Sweep, plan: dict[str, dict[str, str]], rows: Sequence[str]) -> dict[str, Any]:
    """Per row and task: mean, std and count over every finished seed (including seeds run by
    earlier invocations into the same folder); the row's Avg = unweighted mean of its task means."""
    table: dict[str, Any] = {"tasks": list(plan), "plan": plan, "metrics": {}, "rows": {}}
    for row in rows:
        cells = {}
        for task in plan:
            done = [sweep.result(k) for k in sweep.done_with_prefix(f"{task}/{row}/seed=")]
            if done:
                table["metrics"][task] = done[0]["metric"]
            mean, std = report.mean_std([r["value"] for r in done])
            cells[task] = {"mean": mean, "std": std, "seeds": len(done)}
        means = [c["mean"] for c in cells.values() if c["seeds"]]
        complete = len(means) == len(plan)
        avg = sum(means) / len(means) if complete else float("nan")
        table["rows"][row] = {"label": ROWS[row], "avg": avg, "cells": cells}
    return table


def _seed_counts(table: dict[str, Any], task: str) -> str:
    counts = {row["cells"][task]["seeds"] for row in table["rows"].values()}
    return "/".join(str(c) for c in sorted(counts))


def markdown(table: dict[str, Any], lstm_given: bool) -> str:
    tasks = table["tasks"]
    header = ["method", "Avg"] + [
        f"{t} ({METRIC_NAMES.get(table['metrics'].get(t, ''), '?')})" for t in tasks
    ]
    rows = []
    for row in table["rows"].values():
        cells = [report.pct(row["cells"][t]["mean"], row["cells"][t]["std"]) for t in tasks]
        rows.append([row["label"], report.pct(row["avg"])] + cells)
    notes = [
        f"- {t}: trained on its {p['train_split']} split, scored on {p['eval_split']}"
        + (" (as --splits asked)" if p["train_split"] != "train" else "")
        + f"; seeds per cell: {_seed_counts(table, t)}"
        for t, p in table["plan"].items()
    ]
    if not lstm_given:
        notes.append(
            "- LSTM row left out: pass --lstm-init (a `gpt1 pretrain --arch lstm` run "
            "on the same corpus)"
        )
    return (
        "Ablations (Table 5 layout; values x 100; mean ± std over seeds where several)\n\n"
        + report.markdown_table(header, rows)
        + "\n"
        + "\n".join(notes)
        + "\n"
    )
