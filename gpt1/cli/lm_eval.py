"""Run EleutherAI's lm-evaluation-harness on a gpt1 checkpoint, with gpt1 as a native model.

Every option other than those below is the harness's own (`lm_eval run --help`): --tasks,
--limit, --num_fewshot, --output_path, --log_samples, ... This command registers the model `gpt1`,
adds gpt1's local task definitions (gpt1_lambada, gpt1_sst2, gpt1_story_cloze; tag gpt1_zeroshot)
and runs the harness. --model defaults to gpt1 and --device to auto.

Model arguments (--model_args k=v,...): checkpoint (required), tokenizer (default: the
checkpoint's own), precision (auto, fp32, bf16, fp16), batch_tokens (tokens per forward pass,
default 4096), max_rows (default 64), max_length (default: the pretraining window),
max_gen_toks (default 256), prefix_token_id (default: <unk> for a pretrained LM, _start_
for a fine-tuned one, as the transformers export declares; GPT-1 has no BOS).

Examples:
  gpt1 lm-eval --model_args checkpoint=runs/mini --tasks gpt1_lambada --data ../data --limit 500
  gpt1 lm-eval --model_args checkpoint=runs/mini --tasks gpt1_zeroshot --data ../data
  gpt1 lm-eval --model_args checkpoint=runs/mini --tasks hellaswag,arc_easy   (online: the
      harness downloads its own tasks' data)
"""

from __future__ import annotations

import argparse

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


def run(args: argparse.Namespace) -> int:
    from gpt1.extras import require

    require("eval", "lm_eval", what="gpt1 lm-eval")
    import functools

    import lm_eval.tasks
    from lm_eval._cli import HarnessCLI

    from gpt1.recipes.harness import only_local, register

    register()
    cli = HarnessCLI()
    parsed = cli._parser.parse_args(harness_argv(args.extra, args.data))
    tasks = parsed.tasks if isinstance(parsed.tasks, list) else str(parsed.tasks or "").split(",")
    if only_local([t for item in tasks for t in str(item).split(",")]):
        # The harness builds its TaskManager itself; with only gpt1's tasks asked for, it need not
        # index the harness's own ~14,000 task files (over a minute on a loaded 2-core CPU).
        original = lm_eval.tasks.TaskManager
        lm_eval.tasks.TaskManager = functools.partial(original, include_defaults=False)
        try:
            cli.execute(parsed)
        finally:
            lm_eval.tasks.TaskManager = original
        return 0
    cli.execute(parsed)
    return 0
