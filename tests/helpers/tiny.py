"""Tiny inputs and tiny runs, one way each, for the tests, the fault harness and the benchmarks:
model sizes, a prepared corpus, a character vocabulary, a classification task, a checkpoint, the
`gpt1 pretrain` and `gpt1 finetune` command lines, and a fine-tuned run.

Nothing here needs the shared data folder; everything takes seconds on one CPU thread.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np

import gpt1

# The checkout whose `gpt1` this process imported, and the folder holding these helpers:
# a subprocess gets both on its path, so it runs the same code.
ROOT = Path(gpt1.__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------- model sizes
# The tiny GPT the unit tests build (2 layers, 4 heads of 8); tests override single fields
# through conftest's `tiny_config`.
TINY_MODEL: dict[str, Any] = dict(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4)
# The smallest model that still has several heads' worth of width to mix (1 layer, 2 heads of 8).
TINIER_MODEL: dict[str, Any] = dict(vocab_size=50, n_positions=24, n_embd=16, n_layer=1, n_head=2)
# A tiny GPT whose vocabulary (101) and window (24) equal no other dimension, so that a weight
# saved transposed or under another name cannot load by accident: conversions and file checks.
ODD_SIZES_MODEL: dict[str, Any] = dict(
    vocab_size=101, n_positions=24, n_embd=32, n_layer=2, n_head=4
)
# A tiny GPT over GPT-1's real BPE vocabulary (40,478 tokens), for tests that load its tokenizer.
BPE_VOCAB_MODEL: dict[str, Any] = dict(
    vocab_size=40478, n_positions=48, n_embd=32, n_layer=2, n_head=2
)


# ---------------------------------------------------------------------------- running gpt1
def subprocess_env() -> dict[str, str]:
    """The environment for a `python -m gpt1` subprocess: this checkout's gpt1 and helpers, one
    OpenMP thread (the tests run on shared cores)."""
    path = os.pathsep.join([str(ROOT), str(TESTS)])
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}


def gpt1_process(*argv: str, launcher: tuple[str, ...] = (sys.executable,)) -> list[str]:
    """The command line running `gpt1 --quiet ARGV` in a new process (under `launcher`, e.g.
    torchrun's `python -m torch.distributed.run --nproc_per_node 2`)."""
    return [*launcher, "-m", "gpt1", "--quiet", *argv]


# torchrun with two processes on this machine (gloo on CPU), as a `gpt1_process` launcher.
TORCHRUN_TWO_PROCESSES = (sys.executable, "-m", "torch.distributed.run")
TORCHRUN_TWO_PROCESSES += ("--standalone", "--nproc_per_node", "2")


def run_cli(argv: list[str], cwd: Path | None = None) -> tuple[int, str]:
    """(exit status, stderr) of `gpt1 --quiet ARGV` run in this process (in `cwd` if given)."""
    from gpt1.cli import main

    err = io.StringIO()
    old = Path.cwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(["--quiet", *argv])
            except SystemExit as exc:  # argparse refuses a malformed flag by exiting (status 2)
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(old)
    return code, err.getvalue().strip()


# ------------------------------------------------------------------------------ tiny inputs
def make_corpus(
    folder: Path, vocab: int = 300, n_train: int = 6000, n_val: int = 1200, seed: int = 0
) -> Path:
    """A tiny `gpt1 prepare`-style folder: a noisy periodic token stream in two train shards and
    one val shard, and a character vocabulary (another `seed`: other tokens, the same sizes)."""
    from gpt1.text.shards import write_shard

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def stream(n: int) -> np.ndarray:
        base = np.arange(n) % 37 * 7 % vocab
        return np.where(rng.random(n) < 0.2, rng.integers(0, vocab, n), base)

    half = n_train // 2
    write_shard(folder / "train-00000.bin", stream(half), 3, vocab)
    write_shard(folder / "train-00001.bin", stream(n_train - half), 3, vocab)
    write_shard(folder / "val-00000.bin", stream(n_val), 1, vocab)
    train = {"shards": ["train-00000.bin", "train-00001.bin"], "tokens": n_train, "documents": 6}
    meta = {
        "format": "gpt1-tokens",
        "version": 1,
        "vocab_size": vocab,
        "dtype": "uint16",
        "splits": {
            "train": train,
            "val": {"shards": ["val-00000.bin"], "tokens": n_val, "documents": 1},
        },
    }
    (folder / "meta.json").write_text(json.dumps(meta))
    char_vocab(folder)
    return folder


_CHARS = [chr(c) for c in range(33, 127)]
# `char_vocab`'s pieces: <unk>, each printable character, and each as a word's end.
CHAR_PIECES = ["<unk>"] + _CHARS + [c + "</w>" for c in _CHARS]


def char_vocab(folder: Path) -> Path:
    """A character-level GPT-1 vocabulary (`CHAR_PIECES`, no merges): tiny, no shared data."""
    folder.mkdir(parents=True, exist_ok=True)
    tokens = CHAR_PIECES
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return folder


def make_task(folder: Path, n_train: int = 48, n_dev: int = 16) -> Path:
    """A generic TSV classification task (`text`, `label` in pos/neg) learnable from the text."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    words = {"pos": ["good", "great", "fine", "nice"], "neg": ["bad", "awful", "poor", "sad"]}
    for split, n in (("train", n_train), ("dev", n_dev)):
        rows = ["text\tlabel"]
        for _ in range(n):
            label = rng.choice(["pos", "neg"])
            text = " ".join(rng.choice(words[label] + ["the", "a", "film"]) for _ in range(6))
            rows.append(f"{text}\t{label}")
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return folder


def tiny_checkpoint(folder: Path, model: dict[str, Any] | None = None, vocab: bool = True) -> Path:
    """A gpt1 checkpoint folder with seed-0 random weights: the `tiny` preset over 300 tokens
    unless `model` gives the sizes, and a character vocabulary (in `folder.parent / "vocab"`)
    unless `vocab` is false."""
    import torch

    from gpt1.config import ModelConfig, model_preset
    from gpt1.model.checkpoint import save_model
    from gpt1.model.gpt import GPT

    torch.manual_seed(0)
    config = ModelConfig(**model) if model else model_preset("tiny").derive(vocab_size=300)
    return save_model(GPT(config), folder, char_vocab(folder.parent / "vocab") if vocab else None)


# ----------------------------------------------------------------------- tiny command lines
def tiny_pretrain(data: Path, out: Path, steps: int = 2, *extra: str) -> list[str]:
    """`gpt1 pretrain` arguments (no interpreter): the tiny preset on the prepared folder `data`
    for `steps` steps, a checkpoint every step, no evaluation, MFU against 1 FLOP/s (skips the
    matmul probe that measures the CPU's peak). `extra` may repeat a flag: the last one counts."""
    return [
        "pretrain",
        "--preset",
        "tiny",
        "--data",
        str(data),
        "--out",
        str(out),
        "--max-steps",
        str(steps),
        "--save-every",
        "1",
        "--eval-every",
        "0",
        "--set",
        "train.peak_flops=1",
        *extra,
    ]


# `make_task`'s TSV classification task, as `gpt1 finetune` options.
TSV_TASK = ("--task", "tsv", "--columns", "text=text,label=label", "--labels", "neg,pos")


def tiny_finetune(
    data: Path, vocab: Path, out: Path, steps: int, *extra: str, task: tuple[str, ...] = TSV_TASK
) -> list[str]:
    """`gpt1 finetune` arguments (no interpreter): the tiny preset from random weights on the
    task folder `data` (`task` options, `make_task`'s by default), batches of 4 in micro-batches
    of 2, a 32-token window, no peak-FLOPs probe. `extra` may repeat a flag: the last one
    counts."""
    return [
        "finetune",
        *task,
        "--data",
        str(data),
        "--init",
        "none",
        "--preset",
        "tiny",
        "--vocab",
        str(vocab),
        "--out",
        str(out),
        "--max-steps",
        str(steps),
        "--batch-size",
        "4",
        "--micro-batch",
        "2",
        "--n-ctx",
        "32",
        "--set",
        "train.peak_flops=1",
        *extra,
    ]


def tiny_finetuned_run(work: Path) -> tuple[Path, Path]:
    """(fine-tuned run, its task folder with a test split), trained once per `work` (2 steps of
    the tiny model on `make_task`'s task)."""
    task, run = work / "task", work / "ft"
    if not (run / "final").is_dir():
        make_task(task)
        (task / "test.tsv").write_text((task / "dev.tsv").read_text())
        code, err = run_cli(tiny_finetune(task, char_vocab(work / "vocab"), run, 2))
        if code:
            raise RuntimeError(f"the tiny fine-tuning run failed: {err[-300:]}")
    return run, task
