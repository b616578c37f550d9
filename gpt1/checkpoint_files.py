"""Checkpoint folder files that know no model class: safetensors + `config.json`, tokenizer files.

A checkpoint folder is self-contained: it carries the model config and, when known, the
tokenizer's `vocab.json` + `merges.txt`, so every command can rebuild model and tokenizer from it;
a fine-tuned one also carries its task record (`task.json`) and head (`head.safetensors`).
Loading never unpickles anything: weights come from safetensors only. This module sits on the
ground floor (beside `config` and `files`) so that text preparation, the training loop and the
model all read and write these folders without importing each other; building a model from a
folder is `gpt1.model.checkpoint`'s job, resumable training state `gpt1.train.state`'s.

`open_checkpoint(path)` reads and checks a folder once (the folder a run resolves to, its parsed
config.json, architecture, tokenizer folder and trained window; the task record when first asked
for) into a `CheckpointFolder`, which every loader takes in place of a path, so that one load
resolves and parses each file once.
"""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from gpt1.config import check_task_record, read_json_file
from gpt1.errors import CheckpointError, ConfigError, Gpt1Error
from gpt1.files import follow_umask

FORMAT = "gpt1"
FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TOKENIZER_FILES = ("vocab.json", "merges.txt")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
HEAD_FILE, TASK_FILE = "head.safetensors", "task.json"  # a fine-tuned checkpoint's
# The types a weights file may store a floating-point tensor in: gpt1 writes fp32; a half-precision
# file (fp16, bf16: an exported or hand-made one) loads widened to the model's own type.
FLOAT_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
ARCH_KEY = "arch"  # config.json's architecture name (absent: "gpt")
ARCHS = ("gpt", "lstm")


@dataclass(frozen=True)
class CheckpointFolder:
    """A checkpoint folder as `open_checkpoint` read and checked it (nothing read again)."""

    folder: Path  # the checkpoint folder itself (a run folder's newest checkpoint resolved)
    config_file: Path  # folder / config.json
    config: dict[str, Any]  # config.json, its format checked
    arch: str  # one of ARCHS
    weights: Path  # folder / model.safetensors (checked when loaded: `checked_weights`)
    tokenizer_dir: Path | None  # the folder itself when it carries vocab.json + merges.txt
    finetuned: bool  # it has a task.json (and a head): a fine-tuned checkpoint

    @functools.cached_property
    def task(self) -> dict[str, Any] | None:
        """A fine-tuned checkpoint's task record (task.json), validated; None for any other.
        Read when first asked for, once: loading only the GPT body of a fine-tuned
        checkpoint (convert, export) never needs it."""
        return read_task_record(self.folder) if self.finetuned else None

    @functools.cached_property
    def trained_context(self) -> int | None:
        """The window it trained on, if recorded (`trained_context`): a fine-tuned one's from
        its task record (the one read of task.json), else from config.json or run.json. An
        unreadable record means no recorded window; the task record is refused where used."""
        try:
            if self.finetuned:
                return positive_int(self.task["n_ctx"])
        except (Gpt1Error, KeyError, TypeError):
            return None
        return recorded_window(self.folder, self.config)


# What a loader is given: a path (a checkpoint folder, or a run folder) or a folder already open.
AnyCheckpoint = str | Path | CheckpointFolder


def open_checkpoint(path: AnyCheckpoint) -> CheckpointFolder:
    """Resolve `path` (`resolve_checkpoint_dir`) and read its config.json, architecture,
    tokenizer files and trained window once, each checked (the task record when first asked
    for: `CheckpointFolder.task`); an opened folder is returned as is."""
    if isinstance(path, CheckpointFolder):
        return path
    folder = resolve_checkpoint_dir(path)
    config = parse_config(folder / CONFIG)
    arch = config.get(ARCH_KEY, "gpt")
    if arch not in ARCHS:
        raise CheckpointError(
            f'{folder}: unknown "{ARCH_KEY}" {arch!r} in config.json (expected "gpt" or "lstm")'
        )
    tokenizer = folder if all((folder / f).is_file() for f in TOKENIZER_FILES) else None
    finetuned = (folder / TASK_FILE).is_file()
    return CheckpointFolder(
        folder, folder / CONFIG, config, arch, folder / WEIGHTS, tokenizer, finetuned
    )


def read_task_record(folder: str | Path) -> dict[str, Any]:
    """The validated `task.json` of a fine-tuned checkpoint folder."""
    file = Path(folder) / TASK_FILE
    record = read_json_file(file, CheckpointError)
    try:
        return check_task_record(record, str(file))
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None


def checked_weights(checkpoint: CheckpointFolder) -> Path:
    """The checkpoint's weights file; missing (naming any pickles beside it) or a pickle is an
    error."""
    weights = checkpoint.weights
    if not weights.is_file():
        pickles = [p.name for p in checkpoint.folder.iterdir() if p.suffix in PICKLE_SUFFIXES]
        hint = f" (found {', '.join(pickles)}: pickles are never loaded)" if pickles else ""
        raise CheckpointError(f"{weights}: missing weights file{hint}")
    refuse_pickle(weights)
    return weights


def check_weights_size(
    params: int, files: list[Path], source: Path | str, min_bytes_per_param: int = 2
) -> None:
    """Refuse a config (`source`) that describes more parameters (`params`) than the weight
    files can hold.

    Checked from file sizes before anything is read or built, so a config.json edited to a
    huge size is refused at once even when the machine could hold the model.
    """
    need = params * min_bytes_per_param
    have = sum(f.stat().st_size for f in files if f.is_file())
    if have < need:
        where = files[0] if len(files) == 1 else files[0].parent
        raise CheckpointError(
            f"{where}: {have:,} bytes of weights, but {source} describes "
            f"{params:,} parameters (at least {need:,} bytes): "
            "the weights are truncated, or config and weights do not belong "
            "together"
        )


def load_weights(checkpoint: CheckpointFolder, expect: nn.Module) -> dict[str, torch.Tensor]:
    """The weights of an open checkpoint folder for `expect`, the model its config describes
    (built on the meta device: nothing allocated yet). The file is there and no pickle
    (`checked_weights`) and holds at least 2 bytes per parameter of `expect`
    (`check_weights_size`, before anything is read); its tensors are then read and checked
    against `expect` (`load_state_dict`)."""
    weights = checked_weights(checkpoint)
    params = sum(p.numel() for p in expect.parameters())
    check_weights_size(params, [weights], checkpoint.config_file)
    return load_state_dict(weights, expect=expect)


def save_tensors(tensors: dict[str, torch.Tensor], file: str | Path) -> None:
    """Write contiguous CPU tensors as a gpt1 safetensors file that follows the umask."""
    save_file(tensors, str(file), metadata={"format": FORMAT})
    follow_umask(file)


def write_model_files(
    folder: Path,
    model: nn.Module,
    tokenizer_dir: str | Path | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write weights, config and tokenizer files into an existing (temporary) folder.

    `model` is any module with a `config` that has `to_dict()` (a GPT, the LSTM baseline).
    """
    folder = Path(folder)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    save_tensors(state, folder / WEIGHTS)
    config = {"format": FORMAT, "format_version": FORMAT_VERSION, "model": model.config.to_dict()}
    if extra:
        config.update(extra)
    (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer_dir is not None:
        copy_tokenizer_files(tokenizer_dir, folder)


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> None:
    """Copy a vocabulary (HF or original file names) into `dst` as vocab.json + merges.txt."""
    src, dst = Path(src), Path(dst)
    pairs = [("vocab.json", "merges.txt"), ("encoder_bpe_40000.json", "vocab_40000.bpe")]
    for vocab, merges in pairs:
        if (src / vocab).is_file() and (src / merges).is_file():
            shutil.copyfile(src / vocab, dst / "vocab.json")
            shutil.copyfile(src / merges, dst / "merges.txt")
            return
    raise CheckpointError(
        f"{src}: no tokenizer files (expected vocab.json + merges.txt or "
        "encoder_bpe_40000.json + vocab_40000.bpe)"
    )


def state_bytes(tensors: dict[str, torch.Tensor]) -> int:
    """Bytes the tensors take in a safetensors file (what a write of them needs)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """A checkpoint folder itself, or the newest checkpoint inside a run folder."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    if not path.is_dir():  # a file, or a device such as /dev/full (iterdir would raise)
        kind = "a file" if path.is_file() else "neither a file nor a folder"
        raise CheckpointError(
            f"{path}: expected a checkpoint folder (with {WEIGHTS} and {CONFIG}), got {kind}"
        )
    if (path / CONFIG).is_file():
        return path
    candidates = [
        p
        for p in path.iterdir()
        if p.is_dir() and (p / CONFIG).is_file() and not p.name.startswith(".")
    ]
    if (path / "final").is_dir() and (path / "final" / CONFIG).is_file():
        return path / "final"
    steps = [p for p in candidates if p.name.startswith("step-") and p.name[5:].isdigit()]
    if steps:
        return max(steps, key=lambda p: int(p.name[5:]))
    if len(candidates) == 1:
        return candidates[0]
    raise CheckpointError(f"{path}: not a checkpoint folder (no {CONFIG}) and no checkpoint inside")


def parse_config(file: Path) -> dict[str, Any]:
    """A checkpoint's `config.json` file parsed, its format checked."""
    data = read_json_file(file, CheckpointError)
    if not isinstance(data, dict) or data.get("format") != FORMAT or "model" not in data:
        raise CheckpointError(
            f'{file}: not a gpt1 config (expected "format": "gpt1" and a '
            '"model" table); convert other formats with `gpt1 convert`'
        )
    version = data.get("format_version", 0)
    if type(version) is not int or version < 0:
        raise CheckpointError(f"{file}: format_version must be an integer >= 0, got {version!r}")
    if not isinstance(data["model"], dict):
        raise CheckpointError(f'{file}: "model" must be a table of settings')
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{file}: format_version {data['format_version']} is newer than this "
            f"gpt1 understands ({FORMAT_VERSION})"
        )
    return data


def load_state_dict(file: str | Path, expect: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """Tensors from a safetensors file; pickles are refused with a clear message. With `expect`
    (a model, e.g. on the meta device), every tensor it has must be there with its shape and a
    type it can take (`check_state_dict`), and comes back in the model's type."""
    file = Path(file)
    refuse_pickle(file)
    try:
        state = load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{file}: not a valid safetensors file ({exc})") from None
    check_finite(state, file)
    if expect is not None:
        check_state_dict(expect, state, file)
        want = expect.state_dict()
        state = {name: tensor.to(want[name].dtype) for name, tensor in state.items()}
    return state


def refuse_pickle(file: Path) -> None:
    """A missing file, or a pickle/torch zip posing as safetensors, is a clear error."""
    if not file.is_file():
        raise CheckpointError(f"{file}: missing weights file")
    with open(file, "rb") as fh:
        head = fh.read(9)
    # A safetensors file is an 8-byte header length then "{"; its length's low byte may be 0x80,
    # so only call it a pickle/zip when that JSON brace is absent.
    if (head[:1] == b"\x80" or head.startswith(b"PK\x03\x04")) and head[8:9] != b"{":
        raise CheckpointError(
            f"{file}: this is a pickle/torch file, not safetensors; gpt1 never "
            "unpickles weights (convert it with `gpt1 convert --from hf`)"
        )


def check_finite(state: dict[str, torch.Tensor], source: Path | str) -> None:
    """Every floating-point tensor holds only finite values (one pass each, no copy kept).

    NaN or inf weights never give a right answer: a model built from them would score at
    chance, or crash mid-sampling, without saying why.
    """
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(
                f"{source}: tensor {name!r} holds {bad:,} NaN or infinite "
                "value(s); the weights are damaged"
            )


def check_state_dict(model: nn.Module, state: dict[str, torch.Tensor], source: Path | str) -> None:
    """Every tensor present, with the expected shape and a type the model's can be loaded from
    (`FLOAT_DTYPES` for a floating-point one, else the same type), and nothing unexpected."""
    want = model.state_dict()
    expected = {k: tuple(v.shape) for k, v in want.items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{source}: weights do not match the config: missing "
            f"{missing[:5] or 'none'}, unexpected {unexpected[:5] or 'none'}"
        )
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise CheckpointError(
                f"{source}: tensor {name!r} has shape {tuple(state[name].shape)}, "
                f"expected {shape} from config.json"
            )
        got, need = state[name].dtype, want[name].dtype
        if got != need and not (need.is_floating_point and got in FLOAT_DTYPES):
            expect = "fp32, fp16 or bf16" if need.is_floating_point else str(need)
            raise CheckpointError(
                f"{source}: tensor {name!r} holds {str(got).removeprefix('torch.')}, "
                f"expected {expect}"
            )


def trained_context(path: AnyCheckpoint) -> int | None:
    """The window length the checkpoint was trained on, when its folder records one: the one
    place every command (serve, sample, convert, lm-eval, zeroshot, fine-tuning) learns it.

    A model pretrained on windows shorter than `n_positions` never trained the later position
    rows (they are still at their random init), so scoring, generation and fine-tuning should
    not reach them by default. A fine-tuned checkpoint's window is its own task.json `n_ctx`
    (the window its inputs were cut to); a pretrained one's, `run.json`'s `data.n_ctx` beside
    the checkpoint folder; a converted one's, the `trained_context` `gpt1 convert` carried into
    its config.json. The model's window is this, capped at its `n_positions`.
    """
    return open_checkpoint(path).trained_context


def recorded_window(folder: Path, config: dict[str, Any]) -> int | None:
    """The window a checkpoint that is not fine-tuned records: the `trained_context` gpt1
    convert carried into its config.json, else its pretraining run's `run.json` `data.n_ctx`.
    Read leniently: an unreadable record means no recorded window."""
    try:
        if "trained_context" in config:
            return positive_int(config["trained_context"])
        return positive_int(read_json_file(folder.parent / "run.json")["data"]["n_ctx"])
    except (Gpt1Error, KeyError, TypeError):
        return None


def positive_int(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None
