"""Run EleutherAI's lm-evaluation-harness on a gpt1 checkpoint, with gpt1 as a native model.

Every option other than those below is the harness's own (`lm_eval run --help`): --tasks,
--limit, --num_fewshot, --output_path, --log_samples, ... This command registers the model `gpt1`,
adds gpt1's local task definitions (gpt1_lambada, gpt1_sst2, gpt1_story_cloze; tag gpt1_zeroshot)
and runs the harness. --model defaults to gpt1 and --device to auto.

Model arguments (--model_args k=v,...): checkpoint (required), tokenizer (default: the
checkpoint's own), precision (auto, fp32, bf16, fp16, int8), batch_tokens (tokens per forward pass,
default 4096), max_rows (default 64), max_length (default: the pretraining window),
max_gen_toks (default 256), prefix_token_id (default: <unk> for a pretrained LM, _start_
for a fine-tuned one, as the transformers export declares; GPT-1 has no BOS), model (the run's
name: --output_path DIR writes DIR/NAME/results_DATE.json; default the checkpoint as given,
runs/mini -> runs__mini). Missing or out-of-range arguments, unknown tasks and an output folder
that cannot be written stop the command in one line before anything is evaluated.

Examples:
  gpt1 lm-eval --model_args checkpoint=runs/mini --tasks gpt1_lambada --data ../data --limit 500
  gpt1 lm-eval --model_args checkpoint=runs/mini --tasks gpt1_zeroshot --data ../data
  gpt1 lm-eval --model_args checkpoint=runs/mini --tasks hellaswag,arc_easy   (online: the
      harness downloads its own tasks' data)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path

HELP = "lm-evaluation-harness with gpt1 as a native model (local tasks included)"
PASS_THROUGH = True  # unknown options go to the harness


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        metavar="DIR",
        help="data root (or one task's folder) read by the gpt1_* tasks; becomes the "
        "harness's metadata 'data'",
    )


def harness_argv(extra: list[str], data: str | None) -> list[str]:
    """The harness's `run` argv: our defaults for --model and --device, our tasks included."""
    import json

    from gpt1.recipes.harness import TASKS_DIR

    argv = list(extra)
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    if "--model" not in given:
        argv += ["--model", "gpt1"]
    if "--device" not in given:
        argv += ["--device", "auto"]
    if "--include_path" not in given:
        argv += ["--include_path", str(TASKS_DIR)]
    if data:
        if "--metadata" in given:
            from gpt1.errors import ConfigError

            raise ConfigError(
                "give the data folder once: --data DIR or --metadata '{\"data\": ...}'"
            )
        argv += ["--metadata", json.dumps({"data": str(data)})]
    return ["run", *argv]


def check_output_path(parsed: argparse.Namespace, data: str | None) -> None:
    """--output_path may not be, hold or lie inside the checkpoint's files or the data folder
    (`gpt1.files.check_inputs`)."""
    from gpt1.checkpoint_files import resolve_checkpoint_dir
    from gpt1.errors import Gpt1Error
    from gpt1.files import check_inputs, folder_files

    if not getattr(parsed, "output_path", None):
        return
    model_args = parsed.model_args if isinstance(parsed.model_args, dict) else {}
    inputs, roots = folder_files(data), [data]
    for key in ("checkpoint", "tokenizer"):
        if model_args.get(key):
            try:
                folder = resolve_checkpoint_dir(str(model_args[key]))
            except Gpt1Error:
                folder = Path(str(model_args[key]))
            inputs += folder_files(folder)
            roots.append(folder)
    check_inputs(parsed.output_path, inputs, roots)


def check_data(data: str | None) -> None:
    """--data names a folder (checked here: the harness would first print its own warnings)."""
    from gpt1.errors import DataError

    if data is not None and not Path(data).is_dir():
        raise DataError("--data must be a folder (a data root or one task's folder)", data)


def run(args: argparse.Namespace) -> int:
    from gpt1.errors import ConfigError
    from gpt1.extras import require

    require("eval", "lm_eval", what="gpt1 lm-eval")
    offline_unless_hub_reachable(args.extra)  # before the hub's libraries read their settings
    import time

    from lm_eval._cli import HarnessCLI

    from gpt1.lm_eval.adapter import MODEL_NAME, register
    from gpt1.recipes import harness

    register()
    cli = HarnessCLI()
    parsed = cli._parser.parse_args(harness_argv(args.extra, args.data))
    # Everything a user can get wrong is checked before the harness loads or evaluates anything.
    name = None
    if parsed.model == MODEL_NAME:
        parsed.model_args = harness.named_model_args(parsed.model_args)
        name = parsed.model_args["model"]
    check_output_path(parsed, args.data)
    check_data(args.data)
    tasks = parsed.tasks if isinstance(parsed.tasks, list) else str(parsed.tasks or "").split(",")
    tasks = [t for item in tasks for t in str(item).split(",") if t.strip()]
    if not tasks:
        raise ConfigError(
            "--tasks is required, e.g. --tasks gpt1_zeroshot (gpt1_lambada, gpt1_sst2, "
            "gpt1_story_cloze) or a harness task"
        )
    folder = harness.results_folder(parsed.output_path, name) if name else None
    harness.check_writable(folder)
    started = time.time()
    with harness.argument_errors(), harness.offline_errors(), _local_tasks_only(tasks):
        cli.execute(parsed)
    harness.check_saved(folder, parsed.output_path, started)
    return 0


HUB_HOST = "huggingface.co"
HUB_PROBE_S = 3.0  # a reachable hub answers a TCP connect well within this


def offline_unless_hub_reachable(extra: list[str]) -> None:
    """When the harness's own tasks are asked for and the Hugging Face Hub cannot be reached,
    put its libraries in offline mode before they load: data cached already is used, and data
    that is not fails at once in one line, instead of after half a minute of retries."""
    import logging
    import os
    import socket

    if os.environ.get("HF_HUB_OFFLINE") or not _asks_for_hub_tasks(extra):
        return
    try:
        socket.create_connection((HUB_HOST, 443), timeout=HUB_PROBE_S).close()
        return
    except OSError:
        pass
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    logging.getLogger("gpt1.lm_eval").warning(
        "%s cannot be reached: the harness runs offline (data cached already is used)", HUB_HOST
    )


def _asks_for_hub_tasks(extra: list[str]) -> bool:
    """Whether --tasks names any task besides gpt1's local ones."""
    from gpt1.recipes.harness import only_local

    tasks: list[str] = []
    for i, arg in enumerate(extra):
        if arg.startswith("--tasks="):
            tasks += arg.split("=", 1)[1].split(",")
        elif arg == "--tasks" and i + 1 < len(extra):
            tasks += extra[i + 1].split(",")
    return bool(tasks) and not only_local(tasks)


@contextlib.contextmanager
def _local_tasks_only(tasks: list[str]) -> Iterator[None]:
    """With only gpt1's tasks asked for, the harness need not index its own ~14,000 task files
    (over a minute on a loaded 2-core CPU); it builds its TaskManager itself, so the class is
    swapped for the call."""
    import lm_eval.tasks

    from gpt1.recipes.harness import only_local

    if not only_local(tasks):
        yield
        return
    original = lm_eval.tasks.TaskManager
    lm_eval.tasks.TaskManager = functools.partial(original, include_defaults=False)
    try:
        yield
    finally:
        lm_eval.tasks.TaskManager = original
