"""Generate text from a checkpoint: greedy (--temperature 0) or sampled with top-k / top-p.

Text appears as it is generated (one sample; with several they are printed when done).
--prompt - reads the prompt from standard input; --interactive keeps the model loaded and
answers one prompt per input line until end of input, an empty (or all-blank) line or Ctrl-C.
GPT and LSTM-baseline checkpoints both work (the LSTM re-reads its window at each step).
On standard error (not with -q) it says what it loads before loading (a GPT-1-sized model takes
seconds, int8 quantising included) and, after each answer, its speed: prompt tokens, new tokens
and tokens/s, and with one greedy sample (or --speculate on) how many of the tokens drafted from
the text were accepted (docs/commands/sample.md#speculative-decoding). A generation that runs
past the model's trained window (the one `gpt1 serve` reports) is warned about up front and when
it happens: from there each token re-reads the window.

Examples:
  gpt1 sample runs/mini/final --prompt "the old man" --max-new-tokens 40 --top-k 40 --seed 1
  gpt1 sample runs/mini/final --prompt-ids "12 7 99" --temperature 0
  echo "the old man" | gpt1 sample runs/mini --prompt - --temperature 0
  gpt1 sample runs/mini --interactive --top-k 40
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator

HELP = "generate text from a checkpoint (streamed; one prompt or --interactive)"

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from gpt1.cli import options

    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint folder or run folder")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--prompt",
        help="text to continue (needs the checkpoint's tokenizer files); "
        "- reads it from standard input",
    )
    src.add_argument("--prompt-ids", help='token ids to continue, e.g. "12 7 99"')
    src.add_argument(
        "--interactive",
        action="store_true",
        help="read prompts line by line from standard input and answer each "
        "(ends at end of input, an empty or all-blank line, or Ctrl-C)",
    )
    options.add_sampling(p)
    options.add_number(p, "--num-samples", 1, "independent continuations of the same prompt")
    options.add_inference_hardware(p)
    p.add_argument("--ids", action="store_true", help="print token ids even when text is known")
    p.add_argument(
        "--speculate",
        choices=("auto", "on", "off"),
        default="auto",
        help="verify tokens drafted from the prompt and the text so far several per step "
        "(one sample): auto (default) when greedy, where the tokens are plain decoding's; "
        "on: when sampling too (the same distribution, other draws for a seed); off",
    )


def run(args: argparse.Namespace) -> int:
    from gpt1.checkpoint_files import resolve_checkpoint_dir
    from gpt1.cli.options import sampling_settings
    from gpt1.devices import resolve_device, resolve_precision
    from gpt1.errors import ConfigError
    from gpt1.recipes.sample import Sampler

    # Every option is checked before the model is loaded.
    args.sampling = sampling_settings(args)
    if args.num_samples < 1:
        raise ConfigError(f"--num-samples must be >= 1, got {args.num_samples}")
    prompt_ids = _parse_ids(args.prompt_ids) if args.prompt_ids is not None else None
    prompt = args.prompt
    if prompt == "-":
        prompt = sys.stdin.read().rstrip("\n")
        if not prompt.strip():
            raise ConfigError("--prompt -: standard input held no text")
    resolve_checkpoint_dir(args.checkpoint)  # a missing one is refused in one line, no "loading"
    device = resolve_device(args.device)
    precision = resolve_precision(args.precision, device)
    said = "int8: quantising" if precision == "int8" else precision  # the slow step named
    log.info("loading %s (%s) ...", args.checkpoint, said)
    sampler = Sampler(args.checkpoint, device, precision, args.speculate)
    prompts = _typed_prompts(sampler) if args.interactive else [(prompt, prompt_ids)]
    try:
        for prompt, prompt_ids in prompts:
            _answer(sampler, args, prompt, prompt_ids)
    except KeyboardInterrupt:  # --interactive ends there; one prompt is interrupted as usual
        if not args.interactive:
            raise
        print(file=sys.stderr)
    return 0


def _answer(
    sampler, args: argparse.Namespace, prompt: str | None, prompt_ids: list[int] | None
) -> None:
    """Print the continuation(s) of one prompt; one text sample is streamed as it is made."""
    ids = sampler.prompt_ids(prompt, prompt_ids)
    as_text = sampler.tokenizer is not None and not args.ids
    if as_text and args.num_samples == 1:
        shown = (prompt or "").strip()
        sys.stdout.write(shown)
        sys.stdout.flush()
        separator = " " if shown else ""  # between the prompt and the first piece only
        for piece in sampler.stream(ids, args.sampling):
            sys.stdout.write(separator + piece)
            separator = ""
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        log.info("%s", sampler.speed)
        return
    samples = sampler.draw(ids, args.sampling, args.num_samples)
    for i, s in enumerate(samples):
        if len(samples) > 1:
            print(f"=== sample {i + 1} ===")
        if s.text is not None and not args.ids:
            # as streamed: the prompt, a space, the continuation (whose newlines are kept)
            print(" ".join(t for t in ((prompt or "").strip(), s.text) if t))
        else:
            print(" ".join(str(t) for t in s.ids))
    sys.stdout.flush()  # the output before the speed line that follows it on stderr
    log.info("%s", sampler.speed)


def _parse_ids(raw: str) -> list[int]:
    """ "1 2 3" or "1,2,3" -> [1, 2, 3]."""
    from gpt1.errors import ConfigError

    try:
        return [int(t) for t in raw.replace(",", " ").split()]
    except ValueError:
        raise ConfigError(
            f"--prompt-ids must be integers separated by spaces, got {raw!r}"
        ) from None


def _typed_prompts(sampler) -> Iterator[tuple[str, None]]:
    """--interactive: the prompts typed on standard input, one a line, until its end or an
    empty (or blank) line."""
    if sampler.tokenizer is None:
        from gpt1.errors import CheckpointError

        raise CheckpointError(
            f"{sampler.folder}: no tokenizer files, so --interactive cannot read text prompts"
        )
    tty = sys.stdin.isatty()
    while True:
        if tty:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line.strip():  # end of input or an empty line
            return
        yield line.rstrip("\n"), None
