"""Zero-shot task performance of a pretrained LM, with the paper's heuristics (Fig. 2 right).

A checkpoint folder gives OUT/results.json (raw metric, normalised score, n per task) and one
OUT/TASK.jsonl per task, a line per example (id, answer, each choice and its score, gold). A
pretraining run folder (with step-N/ and final/ checkpoints) gives the curve over pretraining:
OUT/curve.json, OUT/curve.md and OUT/curve.png; rerunning resumes where it stopped.

Heuristics (paper §5): sst2 appends "very" and compares "positive" with "negative" (a word of
several BPE pieces scores the sum of its pieces' log-probabilities); cola thresholds the mean token
log-probability (threshold chosen on the train split, reported); race and story_cloze pick the
answer/ending with the highest mean token log-probability; dpr substitutes each candidate for the
pronoun and compares the mean log-probability of the rest of the sentence; lambada counts last
words whose every piece is the greedy prediction. --calibrate subtracts each candidate's score
after the content-free input "N/A". Normalised scores: 0 = chance, 1 = the 2018 state of the art.

--data is a task's folder, or a data root holding them in folders named glue/SST-2,
glue/CoLA, story_cloze, corpus/lambada, dpr, RACE; with --task all, tasks without data are skipped.

Examples:
  gpt1 zeroshot runs/mini/final --task sst2 --data data/glue/SST-2 --out zs/sst2
  gpt1 zeroshot runs/mini --task all --data data --out zs/mini --limit 500
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

HELP = "zero-shot heuristics (sst2, cola, race, dpr, story_cloze, lambada) on a checkpoint or run"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpt1.cli import options
    from gpt1.devices import PRECISION_HELP, PRECISIONS

    options.add_source(
        p,
        "checkpoint",
        "CHECKPOINT|RUN_DIR",
        "a checkpoint folder, or a pretraining run folder for the curve",
    )
    p.add_argument(
        "--task",
        default="all",
        help="sst2, cola, race, dpr, story_cloze, lambada, a comma list, or all",
    )
    p.add_argument("--data", required=True, help="the task's data folder, or a data root")
    p.add_argument("--out", required=True, help="output folder")
    options.add_overwrite(p, "OUT/results.json, or a curve made with other settings")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="score candidates against a content-free prompt (contextual calibration)",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        help="first N examples of each split (CoLA: of train and of dev)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="vocab.json + merges.txt folder (default: the checkpoint's own)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="weights and activations in this type: " + PRECISION_HELP,
    )
    # The old name, kept working but no longer shown.
    p.add_argument("--dtype", choices=PRECISIONS, default=None, help=argparse.SUPPRESS)
    options.add_device(p)
    options.add_number(p, "--batch-tokens", 4096, "padded tokens per forward pass")


def _precision(args: argparse.Namespace) -> str:
    """--precision, or the deprecated --dtype (a warning says so); both given must agree."""
    from gpt1.errors import ConfigError

    if args.dtype is None:
        return args.precision or "auto"
    import logging

    logging.getLogger(__name__).warning("zeroshot: --dtype is deprecated; use --precision")
    if args.precision is not None and args.precision != args.dtype:
        raise ConfigError(f"--precision {args.precision} and --dtype {args.dtype} disagree")
    return args.dtype


def run(args: argparse.Namespace) -> int:
    from gpt1.cli.options import from_flags
    from gpt1.errors import ConfigError
    from gpt1.files import check_inputs, check_output, folder_files, write_json, write_text
    from gpt1.zeroshot.curve import ZeroshotOptions, evaluate_checkpoint, evaluate_run
    from gpt1.zeroshot.heuristics import parse_tasks

    if args.limit is not None and args.limit <= 0:
        raise ConfigError(f"--limit must be positive, got {args.limit}")
    if args.batch_tokens <= 0:
        raise ConfigError(f"--batch-tokens must be positive, got {args.batch_tokens}")
    tasks = parse_tasks(args.task)
    options = from_flags(ZeroshotOptions, args, precision=_precision(args))
    out = Path(args.out)
    path = Path(args.checkpoint)
    inputs = [*folder_files(args.data), *folder_files(args.tokenizer), *folder_files(path)]
    roots = [args.data, args.tokenizer, path]
    inputs += [f for sub in (path.iterdir() if path.is_dir() else ()) for f in folder_files(sub)]
    if path.is_dir() and not (path / "config.json").is_file():
        for name in ("curve.json", "curve.md", "curve.png"):
            check_inputs(out / name, inputs, roots)
        curve = evaluate_run(path, tasks, args.data, out, args.overwrite, options)
        print((out / "curve.md").read_text(), end="")
        print(
            f"wrote {out / 'curve.json'}, {out / 'curve.md'}, {out / 'curve.png'} "
            f"({len(curve['checkpoints'])} checkpoints)"
        )
        return 0
    check_output(out / "results.json", args.overwrite, inputs, roots)
    results = evaluate_checkpoint(path, tasks, args.data, options)
    # One line per example (OUT/TASK.jsonl) beside the totals, to compare answer by answer with
    # the server's guided_choice or lm-eval.
    for task, r in results.items():
        rows = r.pop("examples")
        write_text(out / f"{task}.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    record = {
        "checkpoint": str(path),
        "data": str(args.data),
        "settings": {k: v for k, v in asdict(options).items() if k != "tokenizer"},
        "tasks": results,
    }
    write_json(out / "results.json", record)
    for task, r in results.items():
        extra = f", threshold {r['threshold']:.4f}" if "threshold" in r else ""
        print(
            f"{task:12s} {r['metric']} {r['value']:.4f}  normalised {r['normalised']:+.3f}  "
            f"n={r['n']}{extra}"
        )
    print(f"wrote {out / 'results.json'} and one {out}/TASK.jsonl per task")
    return 0
