"""`gpt1 demo`: GPT-1's whole idea, end to end, in a few minutes on a laptop CPU.

With no flags it builds a synthetic world (`gpt1.recipes.demo_world`): unlabelled text that states which
invented creatures are friendly or dangerous, and a labelled task whose dev examples mention only
creatures the labelled training examples never do. It then runs the real commands, in order:
tokenizer training -> corpus preparation -> pretraining -> fine-tuning with pretraining, without
pretraining and without the auxiliary LM -> a zero-shot check -> a Markdown report with the loss
curves. With `--corpus/--task/--data` the same pipeline runs on a user's own data.
"""
from __future__ import annotations

import csv
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt1.errors import Gpt1Error
from gpt1.files import LOCK_FILE, OutputExists, RunLock, write_json, write_text

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
    pretrain_steps: int = 600
    pretrain_batch: int = 16
    pretrain_lr: float = 1e-3
    finetune_epochs: float = 5.0
    finetune_batch: int = 16
    finetune_lr: float = 5e-4
    corpus: list[str] = field(default_factory=list)     # user data instead of the synthetic world
    task: str | None = None
    data: str | None = None
    columns: str | None = None    # csv/tsv/jsonl tasks: as `gpt1 finetune --columns`
    labels: str | None = None     # csv/tsv/jsonl tasks: as `gpt1 finetune --labels`
    quiet: bool = False
    overwrite: bool = False   # write into a --out that holds things the demo did not make


# What the demo writes into --out (a rerun reuses finished steps; anything else is the user's).
DEMO_NAMES = {"data", "tokenizer", "prepared", "pretrain", "finetune-0", "finetune-1", "finetune-2",
              "report.md", "demo.json", LOCK_FILE}


def check_demo_folder(out: Path, overwrite: bool) -> None:
    """Refuse a --out holding anything the demo does not write, unless `overwrite`."""
    foreign = sorted(p.name for p in out.iterdir() if p.name not in DEMO_NAMES) if out.is_dir() else []
    if out.exists() and not out.is_dir():
        raise OutputExists(f"{out}: exists and is not a folder; choose another --out")
    if foreign and not overwrite:
        raise OutputExists(f"{out}: holds files the demo did not write ({', '.join(foreign[:4])}); "
                           "choose another --out, or pass --overwrite to write the demo beside them")


def check_user_inputs(s: DemoSettings) -> list[str]:
    """Everything a run on the user's data needs, checked before any step runs: the corpus
    files, the task (with --columns for csv/tsv/jsonl) and its train and dev splits.
    Returns the task arguments for `gpt1 finetune`."""
    import argparse
    from gpt1.cli.finetune import generic_spec
    from gpt1.recipes.finetune import resolve_task
    from gpt1.text.prepare import find_files
    if not (s.task and s.data):
        raise Gpt1Error("with --corpus, also give --task and --data (a labelled task to fine-tune)")
    find_files(s.corpus)
    spec = generic_spec(argparse.Namespace(columns=s.columns, labels=s.labels, regression=False,
                                           similarity=False))
    task = resolve_task(s.task, spec, s.data, "train")
    for split in ("train", "dev"):
        if not task.read(s.data, split).examples:
            raise Gpt1Error(f"{s.data}: the {split} split of {s.task} has no examples")
    args = ["--task", s.task, "--data", s.data]
    for flag, value in (("--columns", s.columns), ("--labels", s.labels)):
        if value:
            args += [flag, value]
    return args


def run_cli(argv: list[str], quiet: bool) -> None:
    """Run one `gpt1` command in this process; a failure stops the demo with its message."""
    from gpt1.cli import main
    args = (["--quiet"] if quiet else []) + argv
    log.info("$ gpt1 %s", " ".join(argv))
    code = main(args)
    if code != 0:
        raise Gpt1Error(f"step `gpt1 {' '.join(argv)}` failed with exit code {code}")


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
    from gpt1.model.checkpoint import load_checkpoint, tokenizer_dir_of
    from gpt1.text.tokenizer import Tokenizer
    from gpt1.zeroshot.scorer import Scorer
    model = load_checkpoint(checkpoint).eval()
    tok = Tokenizer.from_dir(tokenizer_dir_of(checkpoint))
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
        raise Gpt1Error("--task, --data, --columns and --labels describe your own data: give "
                        "them with --corpus")
    if s.pretrain_steps < 1:
        raise Gpt1Error(f"--pretrain-steps must be >= 1, got {s.pretrain_steps}")
    corpus_args: list[str] = []
    task_args: list[str] = []
    if s.corpus:   # checked before anything is written or run
        corpus_args, task_args = list(s.corpus), check_user_inputs(s)
    check_demo_folder(out, s.overwrite)
    with RunLock(out):
        return _demo(s, out, t0, corpus_args, task_args)


def _demo(s: DemoSettings, out: Path, t0: float, corpus_args: list[str],
          task_args: list[str]) -> dict[str, Any]:
    world = None
    out.mkdir(parents=True, exist_ok=True)
    if not s.corpus:
        corpus_dir, task_dir, world = write_world(out, s.seed)
        corpus_args = [str(corpus_dir)]
        task_args = ["--task", "csv", "--data", str(task_dir), "--columns",
                     "text=sentence,label=label", "--labels", "0,1"]
    q = s.quiet
    tok_dir, data_dir, pre_dir = out / "tokenizer", out / "prepared", out / "pretrain"
    timings: dict[str, float] = {}
    reused: list[str] = []   # steps done by an earlier run: their times are that run's
    earlier = _earlier_timings(out)

    def step(name: str, argv: list[str], done: Path | None = None) -> None:
        start = time.time()
        if done is not None and done.exists():
            log.info("%s: already done (%s)", name, done)
            if name in earlier:
                timings[name] = earlier[name]
                reused.append(name)
                return
        else:
            run_cli(argv, q)
        timings[name] = round(time.time() - start, 1)

    step("tokenizer", ["tokenizer", "train", "--corpus", *corpus_args, "--merges", str(s.merges),
                       "--out", str(tok_dir)], tok_dir / "merges.txt")
    step("prepare", ["prepare", "--corpus", *corpus_args, "--vocab", str(tok_dir), "--out",
                     str(data_dir), "--val-fraction", "0.05", "--seed", str(s.seed)],
         data_dir / "meta.json")
    model_sets = [f"model.n_layer={s.n_layer}", f"model.n_embd={s.n_embd}",
                  f"model.n_head={s.n_head}", f"model.n_positions={s.n_ctx}",
                  f"data.n_ctx={s.n_ctx}", "train.warmup=50", "train.save_every=200",
                  "train.eval_every=100", "train.log_every=50"]
    step("pretrain", ["pretrain", "--preset", "tiny", "--data", str(data_dir), "--out", str(pre_dir),
                      "--max-steps", str(s.pretrain_steps), "--batch-size", str(s.pretrain_batch),
                      "--micro-batch", str(s.pretrain_batch), "--lr", str(s.pretrain_lr),
                      "--seed", str(s.seed), "--resume", "auto",
                      *[a for kv in model_sets for a in ("--set", kv)]], pre_dir / "final")
    ft_common = [*task_args, "--epochs", str(s.finetune_epochs), "--batch-size",
                 str(s.finetune_batch), "--micro-batch", str(s.finetune_batch), "--lr",
                 str(s.finetune_lr), "--seed", str(s.seed), "--n-ctx", str(s.n_ctx)]
    arms = {
        "pretrained + aux LM (GPT-1)": ["--init", str(pre_dir)],
        "pretrained, no aux LM": ["--init", str(pre_dir), "--lm-coef", "0"],
        # Same architecture and tokenizer, nothing transferred (reference a.5, n_transfer = -1).
        "no pretraining": ["--init", str(pre_dir), "--transfer-layers", "-1"],
    }
    table: dict[str, Any] = {}
    for i, (name, extra) in enumerate(arms.items()):
        run = out / f"finetune-{i}"
        step(f"finetune {i}", ["finetune", *ft_common, *extra, "--out", str(run), "--resume",
                               "auto"], run / "results.json")
        table[name] = read_results(run)
    zero = zero_shot_check(pre_dir / "final", world) if world is not None else None
    if world is not None:
        # What a model that ignores the sentence can reach: always the dev set's commoner label.
        positives = sum(label for _, label in world.dev) / len(world.dev)
        table["majority class (no model)"] = {"accuracy": max(positives, 1 - positives),
                                              "n": len(world.dev)}
    plots = _plots(pre_dir, [out / f"finetune-{i}" for i in range(len(arms))])
    # A re-run that skips finished steps reports the time the whole pipeline took: the steps
    # this run did, the earlier run's time for the steps it reused, and this run's overhead.
    seconds = round(time.time() - t0 + sum(timings[n] for n in reused), 1)
    report = _report(table, zero, timings, seconds, plots, out, reused)
    write_text(out / "report.md", report)
    summary = {"results": table, "zero_shot": zero, "seconds": seconds, "timings": timings,
               "reused_steps": reused, "report": str(out / "report.md")}
    write_json(out / "demo.json", summary)
    return summary


def _earlier_timings(out: Path) -> dict[str, float]:
    """Step times recorded by an earlier run in `out` (demo.json), if any."""
    try:
        timings = json.loads((out / "demo.json").read_text())["timings"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return {k: float(v) for k, v in timings.items() if isinstance(v, (int, float))} \
        if isinstance(timings, dict) else {}


def _plots(pre_dir: Path, runs: list[Path]) -> list[Path]:
    from gpt1.train.telemetry import plot_run
    made: list[Path] = []
    for run in [pre_dir, *runs]:
        try:
            made += plot_run(run)
        except Gpt1Error as exc:  # a run without metrics still leaves the report usable
            log.warning("no plot for %s: %s", run, exc)
    return made


def _metric(results: dict[str, Any]) -> tuple[str, float]:
    skip = {"task", "split", "n", "skipped_rows", "seconds"}
    for key in ("accuracy", "matthews", "pearson", "f1"):
        if key in results:
            return key, float(results[key])
    key = next(k for k, v in results.items() if k not in skip and isinstance(v, (int, float)))
    return key, float(results[key])


def _report(table: dict[str, Any], zero: dict[str, Any] | None, timings: dict[str, float],
            seconds: float, plots: list[Path], out: Path, reused: list[str] = ()) -> str:
    lines = ["# gpt1 demo", "",
             "Pretraining on unlabelled text, then fine-tuning on a small labelled task whose dev",
             "examples mention only creatures the labelled training set never shows: what they are",
             "is stated only in the unlabelled text.", "",
             "| setting | dev metric | n |", "|---|---|---|"]
    for name, res in table.items():
        key, value = _metric(res)
        lines.append(f"| {name} | {key} {value:.3f} | {res.get('n', '?')} |")
    if zero is not None:
        lines += ["", f"Zero-shot (pretrained LM only, no labels): {zero['accuracy']:.3f} accuracy "
                  f"on the nature of {zero['n']} held-out creatures (chance 0.5)."]
    lines += ["", f"Total time: {seconds:.0f} s (" +
              ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + ")"]
    if reused:
        lines += ["", f"Re-run: {', '.join(reused)} were done by an earlier run; their times are "
                  "the ones that run measured."]
    lines += ["", "## Curves", ""]
    lines += [f"![{p.stem}]({p.relative_to(out)})" for p in plots if p.is_relative_to(out)]
    return "\n".join(lines) + "\n"


def format_table(summary: dict[str, Any]) -> str:
    rows = [f"{'setting':32s} {'metric':>10s} {'value':>7s} {'n':>5s}"]
    for name, res in summary["results"].items():
        key, value = _metric(res)
        rows.append(f"{name:32s} {key:>10s} {value:7.3f} {res.get('n', 0):5d}")
    if summary.get("zero_shot"):
        z = summary["zero_shot"]
        rows.append(f"{'zero-shot (LM only)':32s} {'accuracy':>10s} {z['accuracy']:7.3f} {z['n']:5d}")
    rows.append(f"total time {summary['seconds']:.0f} s; report: {summary['report']}")
    return "\n".join(rows)
