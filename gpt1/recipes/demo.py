"""`gpt1 demo`: GPT-1's whole idea, end to end, in a few minutes on a laptop CPU.

With no flags it builds a synthetic world (`gpt1.recipes.demo_world`): unlabelled text that states which
invented creatures are friendly or dangerous, and a labelled task whose dev examples mention only
creatures the labelled training examples never do. It then runs the real recipes, in order, by
calling them (each step logs the equivalent `gpt1` command line): tokenizer training -> corpus
preparation -> pretraining -> fine-tuning with pretraining, without pretraining and without the
auxiliary LM -> a zero-shot check -> a Markdown report with the loss curves. With
`--corpus/--task/--data` the same pipeline runs on a user's own data.
"""

from __future__ import annotations

import csv
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt1.config import check_seed
from gpt1.errors import Gpt1Error
from gpt1.files import (
    LOCK_FILE,
    OutputExists,
    RunLock,
    check_inputs,
    folder_files,
    write_json,
    write_text,
)
from gpt1.recipes.commands import FinetuneOptions, FinetuneRun

log = logging.getLogger("gpt1.recipes.demo")


@dataclass
class DemoSettings:
    """Sizes chosen so the whole demo runs in a few minutes on 2 CPU cores."""

    out: Path = Path("runs/demo")
    seed: int = 0
    merges: int = 1000
    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    n_ctx: int = 64
    pretrain_steps: int = 800
    pretrain_batch: int = 16
    pretrain_lr: float = 1e-3
    finetune_epochs: float = 5.0
    finetune_batch: int = 16
    finetune_lr: float = 5e-4
    corpus: list[str] = field(default_factory=list)  # user data instead of the synthetic world
    task: str | None = None
    data: str | None = None
    columns: str | None = None  # csv/tsv/jsonl tasks: as `gpt1 finetune --columns`
    labels: str | None = None  # csv/tsv/jsonl tasks: as `gpt1 finetune --labels`
    quiet: bool = False
    overwrite: bool = False  # write into a --out that holds things the demo did not make


# The fine-tuning arms, each a `FinetuneRun` setting beside the shared ones, in report order
# (each into --out/finetune-I).
ARMS: dict[str, dict[str, Any]] = {
    "pretrained + aux LM (GPT-1)": {},
    "pretrained, no aux LM": {"lm_coef": 0.0},
    # Same architecture and tokenizer, nothing transferred (reference a.5, n_transfer = -1).
    "no pretraining": {"transfer_layers": -1},
}


MAJORITY = "majority class (no model)"  # the baseline row of the synthetic world

# What the demo writes into --out (a rerun reuses finished steps; anything else is the user's).
DEMO_NAMES = {
    "data",
    "tokenizer",
    "prepared",
    "pretrain",
    "finetune-0",
    "finetune-1",
    "finetune-2",
    "report.md",
    "demo.json",
    LOCK_FILE,
}


def check_demo_folder(out: Path, overwrite: bool) -> None:
    """Refuse a --out holding anything the demo does not write, unless `overwrite`."""
    foreign = (
        sorted(p.name for p in out.iterdir() if p.name not in DEMO_NAMES) if out.is_dir() else []
    )
    if out.exists() and not out.is_dir():
        raise OutputExists(f"{out}: exists and is not a folder; choose another --out")
    if foreign and not overwrite:
        raise OutputExists(
            f"{out}: holds files the demo did not write ({', '.join(foreign[:4])}); "
            "choose another --out, or pass --overwrite to write the demo beside them"
        )


def check_user_inputs(s: DemoSettings) -> None:
    """Everything a run on the user's data needs, checked before any step runs: the corpus
    files, the task (with --columns for csv/tsv/jsonl) and its train and dev splits."""
    from gpt1.recipes.finetune import resolve_task
    from gpt1.tasks.generic import spec_from_flags
    from gpt1.text.prepare import find_files

    if not (s.task and s.data):
        raise Gpt1Error("with --corpus, also give --task and --data (a labelled task to fine-tune)")
    find_files(s.corpus)
    task = resolve_task(s.task, spec_from_flags(s.columns, s.labels), s.data, "train")
    for split in ("train", "dev"):
        if not task.read(s.data, split).examples:
            raise Gpt1Error(f"{s.data}: the {split} split of {s.task} has no examples")


def write_world(out: Path, seed: int) -> tuple[Path, Path, Any]:
    """Write the synthetic corpus (one .txt per document) and task (train/dev .csv)."""
    from gpt1.recipes.demo_world import build_world

    world = build_world(seed=seed)
    corpus_dir, task_dir = out / "data" / "corpus", out / "data" / "task"
    corpus_dir.mkdir(parents=True, exist_ok=True)
    task_dir.mkdir(parents=True, exist_ok=True)
    for i, doc in enumerate(world.corpus):
        (corpus_dir / f"doc-{i:04d}.txt").write_text(doc + "\n")
    for split, rows in (("train", world.train), ("dev", world.dev)):
        with open(task_dir / f"{split}.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["sentence", "label"])
            writer.writerows(rows)
    return corpus_dir, task_dir, world


def zero_shot_check(checkpoint: Path, world: Any) -> dict[str, Any]:
    """Does the pretrained LM alone know each held-out creature? Compare the log-probability of
    "dangerous" and "friendly" after "the NAME is a fierce and" style prompts, one per creature."""
    from gpt1.checkpoint_files import open_checkpoint
    from gpt1.inference.scoring import Scorer
    from gpt1.model.checkpoint import load_checkpoint
    from gpt1.text.tokenizer import Tokenizer

    model = load_checkpoint(checkpoint).eval()
    tok = Tokenizer.from_dir(open_checkpoint(checkpoint).tokenizer_dir)
    names = sorted({w for s, _ in world.dev for w in s.split() if w in world.creatures})
    requests, truth = [], []
    for name in names:
        context = tok.encode(f"farmers fear the {name} because it is")  # ends before the property
        for word in ("dangerous", "friendly"):
            requests.append((context, tok.encode(word)))
        truth.append(world.creatures[name])
    scores = Scorer(model).score(requests)
    correct = 0
    for i, nature in enumerate(truth):
        guess = "dangerous" if scores[2 * i].total > scores[2 * i + 1].total else "friendly"
        correct += guess == nature
    return {"n": len(truth), "accuracy": correct / max(1, len(truth))}


def read_results(run: Path) -> dict[str, Any]:
    return json.loads((run / "results.json").read_text())


def demo(settings: DemoSettings) -> dict[str, Any]:
    """Run the pipeline and write `report.md`; returns the results table as a dict."""
    s, out, t0 = settings, settings.out, time.time()
    if not s.corpus and (s.task or s.data or s.columns or s.labels):
        raise Gpt1Error(
            "--task, --data, --columns and --labels describe your own data: give them with --corpus"
        )
    if s.pretrain_steps < 1:
        raise Gpt1Error(f"--pretrain-steps must be >= 1, got {s.pretrain_steps}")
    check_seed(s.seed, "--seed")
    if s.corpus:  # checked before anything is written or run
        check_user_inputs(s)
    check_inputs(out, [*s.corpus, *folder_files(s.data)], [s.data])  # the user's corpus, task
    check_demo_folder(out, s.overwrite)
    with RunLock(out):
        return _demo(s, out, t0)


def _demo(s: DemoSettings, out: Path, t0: float) -> dict[str, Any]:
    """The pipeline, step by step (`demo` has checked the inputs and holds the folder)."""
    out.mkdir(parents=True, exist_ok=True)
    corpus, task, world = _inputs(s, out)
    tok_dir, data_dir, pre_dir = out / "tokenizer", out / "prepared", out / "pretrain"
    steps = _Steps(_earlier_timings(out))
    _tokenizer_and_data(steps, s, corpus, tok_dir, data_dir)
    _pretrain(steps, s, data_dir, pre_dir)
    table = _finetune_arms(steps, s, task, pre_dir, out)
    zero = None
    if world is not None:
        zero = zero_shot_check(pre_dir / "final", world)
        headline = next((r.get("headline") for r in table.values()), None)
        table[MAJORITY] = _majority_class(world, headline)
    plots = _plots(pre_dir, [out / f"finetune-{i}" for i in range(len(ARMS))])
    # A re-run that skips finished steps reports the time the whole pipeline took: the steps
    # this run did, the earlier run's time for the steps it reused, and this run's overhead.
    seconds = round(time.time() - t0 + sum(steps.timings[n] for n in steps.reused), 1)
    report = _report(table, zero, steps.timings, seconds, plots, out, steps.reused)
    write_text(out / "report.md", report)
    summary = {
        "results": table,
        "zero_shot": zero,
        "seconds": seconds,
        "timings": steps.timings,
        "reused_steps": steps.reused,
        "report": str(out / "report.md"),
    }
    write_json(out / "demo.json", summary)
    return summary


def _inputs(s: DemoSettings, out: Path) -> tuple[list[str], dict[str, Any], Any]:
    """(corpus paths, the task's `FinetuneRun` settings, the synthetic world or None): the
    user's data when given, else a synthetic world written into `out/data`."""
    if s.corpus:
        task = {"task": s.task, "data": s.data, "columns": s.columns, "labels": s.labels}
        return list(s.corpus), task, None
    corpus_dir, task_dir, world = write_world(out, s.seed)
    task = {
        "task": "csv",
        "data": str(task_dir),
        "columns": "text=sentence,label=label",
        "labels": "0,1",
    }
    return [str(corpus_dir)], task, world


class _Steps:
    """Runs the pipeline's steps, each unless an earlier run finished it, and times them."""

    def __init__(self, earlier: dict[str, float]):
        self.earlier = earlier  # step times an earlier run in the same folder recorded
        self.timings: dict[str, float] = {}
        self.reused: list[str] = []  # steps done by an earlier run: their times are that run's

    def run(self, name: str, argv: list[str], call: Callable[[], Any], done: Path) -> None:
        """Run `call` (the recipe behind the command line `argv`, logged for people) unless an
        earlier run finished it (`done` exists)."""
        start = time.time()
        if done.exists():
            log.info("%s: already done (%s)", name, done)
            if name in self.earlier:
                self.timings[name] = self.earlier[name]
                self.reused.append(name)
                return
        else:
            log.info("$ %s", " ".join(argv))
            call()
        self.timings[name] = round(time.time() - start, 1)


def _argv(command: str, **flags: Any) -> list[str]:
    """The command line `gpt1 COMMAND --flag value ...` (a list value repeats no flag: its items
    follow the one flag)."""
    argv = ["gpt1", *command.split()]
    for key, value in flags.items():
        argv.append("--" + key.replace("_", "-"))
        argv += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return argv


def _tokenizer_and_data(
    steps: _Steps, s: DemoSettings, corpus: list[str], tok_dir: Path, data_dir: Path
) -> None:
    from gpt1.text.prepare import PrepareOptions, prepare, train_tokenizer

    steps.run(
        "tokenizer",
        _argv("tokenizer train", corpus=corpus, merges=s.merges, out=tok_dir),
        lambda: train_tokenizer(corpus, s.merges, tok_dir),
        tok_dir / "merges.txt",
    )
    options = PrepareOptions(val_fraction=0.05, seed=s.seed, quiet=s.quiet)
    steps.run(
        "prepare",
        _argv(
            "prepare", corpus=corpus, vocab=tok_dir, out=data_dir, val_fraction=0.05, seed=s.seed
        ),
        lambda: prepare(corpus, tok_dir, data_dir, options),
        data_dir / "meta.json",
    )


def _pretrain(steps: _Steps, s: DemoSettings, data_dir: Path, pre_dir: Path) -> None:
    from gpt1.recipes.pretrain import pretrain, resolve_config

    model_sets = [
        f"model.n_layer={s.n_layer}",
        f"model.n_embd={s.n_embd}",
        f"model.n_head={s.n_head}",
        f"model.n_positions={s.n_ctx}",
        f"data.n_ctx={s.n_ctx}",
        "train.warmup=50",
        "train.save_every=200",
        "train.eval_every=100",
        "train.log_every=50",
    ]
    train = {
        "max_steps": s.pretrain_steps,
        "batch_size": s.pretrain_batch,
        "micro_batch_size": s.pretrain_batch,
        "lr": s.pretrain_lr,
        "seed": s.seed,
        "resume": "auto",
        "quiet": True if s.quiet else None,
    }
    flags = {"data": {"path": str(data_dir)}, "train": train}

    def run_pretrain() -> None:
        result = pretrain(resolve_config("tiny", None, flags, model_sets), pre_dir)
        if result.interrupted:
            raise Gpt1Error(f"pretraining was interrupted (signal {int(result.interrupted)})")

    argv = _argv(
        "pretrain",
        preset="tiny",
        data=data_dir,
        out=pre_dir,
        max_steps=s.pretrain_steps,
        batch_size=s.pretrain_batch,
        micro_batch=s.pretrain_batch,
        lr=s.pretrain_lr,
        seed=s.seed,
        resume="auto",
    )
    argv += [a for kv in model_sets for a in ("--set", kv)]
    steps.run("pretrain", argv, run_pretrain, pre_dir / "final")


def _finetune_arms(
    steps: _Steps, s: DemoSettings, task: dict[str, Any], pre_dir: Path, out: Path
) -> dict[str, Any]:
    """Fine-tune each of `ARMS` into `out/finetune-I`; their dev results by arm."""
    options = FinetuneOptions(
        epochs=s.finetune_epochs,
        batch_size=s.finetune_batch,
        micro_batch=s.finetune_batch,
        lr=s.finetune_lr,
        n_ctx=s.n_ctx,
        quiet=s.quiet,
    )
    table: dict[str, Any] = {}
    for i, (name, extra) in enumerate(ARMS.items()):
        run = out / f"finetune-{i}"
        sub = FinetuneRun(
            init=pre_dir, out=run, options=options, seed=s.seed, resume="auto", **task, **extra
        )
        steps.run(f"finetune {i}", sub.argv(), sub.run, run / "results.json")
        table[name] = read_results(run)
    return table


def _majority_class(world: Any, headline: str | None = None) -> dict[str, Any]:
    """What a model that ignores the sentence can reach: always the dev set's commoner label
    (`label`), scored by the fine-tuned runs' metrics (F1 of label 1, the task's positive class)."""
    from gpt1.tasks.metrics import compute

    gold = [label for _, label in world.dev]
    common = max((0, 1), key=gold.count)
    results = compute(("f1", "accuracy", "matthews"), [common] * len(gold), gold)
    return {**results, "headline": headline or "accuracy", "n": len(gold), "label": str(common)}


def _earlier_timings(out: Path) -> dict[str, float]:
    """Step times recorded by an earlier run in `out` (demo.json), if any."""
    try:
        timings = json.loads((out / "demo.json").read_text())["timings"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return (
        {k: float(v) for k, v in timings.items() if isinstance(v, (int, float))}
        if isinstance(timings, dict)
        else {}
    )


def _plots(pre_dir: Path, runs: list[Path]) -> list[Path]:
    from gpt1.train.telemetry import plot_run

    made: list[Path] = []
    for run in [pre_dir, *runs]:
        try:
            made += plot_run(run)
        except Gpt1Error as exc:  # a run without metrics still leaves the report usable
            log.warning("no plot for %s: %s", run, exc)
    return made


# The metrics a setting may report, in the order the table shows them, with their column names.
# Every one the settings report is shown, so no single figure decides how a row reads (F1 of
# one class flatters a model that always answers that class; the majority class shows it).
COLUMNS = {
    "accuracy": "accuracy",
    "f1": "F1",
    "matthews": "Matthews corr.",
    "pearson": "Pearson",
    "spearman": "Spearman",
}


def _columns(table: dict[str, Any]) -> list[str]:
    """The metrics of `COLUMNS` that at least one setting of `table` reports."""
    return [key for key in COLUMNS if any(key in res for res in table.values())]


def _cell(res: dict[str, Any], key: str) -> str:
    return f"{res[key]:.3f}" if isinstance(res.get(key), (int, float)) else "–"


def _f1_note(table: dict[str, Any], world: bool) -> list[str]:
    """What F1 and the majority class are, where the table shows them."""
    f1_label = next((r["f1_label"] for r in table.values() if "f1_label" in r), None)
    majority = table.get(MAJORITY)
    notes = []
    if f1_label is not None:
        meaning = " (*dangerous*; `0` is *friendly*)" if world and f1_label == "1" else ""
        notes.append(f"F1 is that of label `{f1_label}`{meaning}.")
    if majority is not None:
        notes.append(
            f"The majority class answers `{majority['label']}` for every dev example "
            f"({100 * majority['accuracy']:.0f}% of them are `{majority['label']}`)."
        )
    return ["", " ".join(notes)] if notes else []


def _report(
    table: dict[str, Any],
    zero: dict[str, Any] | None,
    timings: dict[str, float],
    seconds: float,
    plots: list[Path],
    out: Path,
    reused: list[str] = (),
) -> str:
    lines = [
        "# gpt1 demo",
        "",
        "Pretraining on unlabelled text, then fine-tuning on a small labelled task whose dev",
        "examples mention only creatures the labelled training set never shows: what they are",
        "is stated only in the unlabelled text.",
        "",
    ]
    columns = _columns(table)
    lines += [
        "| setting | " + " | ".join(f"dev {COLUMNS[k]}" for k in columns) + " | n |",
        "|---|" + "---|" * len(columns) + "---|",
    ]
    for name, res in table.items():
        cells = " | ".join(_cell(res, k) for k in columns)
        lines.append(f"| {name} | {cells} | {res.get('n', '?')} |")
    lines += _f1_note(table, zero is not None)
    if zero is not None:
        lines += [
            "",
            f"Zero-shot (pretrained LM only, no labels): {zero['accuracy']:.3f} accuracy "
            f"on the nature of {zero['n']} held-out creatures (chance 0.5).",
        ]
    lines += [
        "",
        f"Total time: {seconds:.0f} s ("
        + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
        + ")",
    ]
    if reused:
        lines += [
            "",
            f"Re-run: {', '.join(reused)} were done by an earlier run; their times are "
            "the ones that run measured.",
        ]
    lines += ["", "## Curves", ""]
    lines += [f"![{p.stem}]({p.relative_to(out)})" for p in plots if p.is_relative_to(out)]
    return "\n".join(lines) + "\n"


def format_table(summary: dict[str, Any]) -> str:
    columns = _columns(summary["results"])
    names = [COLUMNS[k] for k in columns]
    rows = [f"{'setting':32s} " + " ".join(f"{c:>9s}" for c in names) + f" {'n':>5s}"]
    for name, res in summary["results"].items():
        cells = " ".join(f"{_cell(res, k):>{max(9, len(c))}s}" for k, c in zip(columns, names))
        rows.append(f"{name:32s} {cells} {res.get('n', 0):5d}")
    if summary.get("zero_shot"):
        z = summary["zero_shot"]
        rows.append(f"zero-shot (LM only): accuracy {z['accuracy']:.3f} on {z['n']} creatures")
    rows.append(f"total time {summary['seconds']:.0f} s; report: {summary['report']}")
    return "\n".join(rows)
