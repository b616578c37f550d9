"""Checkpoint folders: `model.safetensors` + `config.json` (+ tokenizer files), written atomically.

A checkpoint folder is self-contained: it carries the model config and, when known, the
tokenizer's `vocab.json` + `merges.txt`, so every command can rebuild model and tokenizer from it.
Loading never unpickles anything: weights come from safetensors only.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from gpt1.config import ModelConfig, read_json_file
from gpt1.errors import CheckpointError, ConfigError, Gpt1Error
from gpt1.files import atomic_dir, atomic_folder, follow_umask, publish_dir  # noqa: F401 (re-exported)
from gpt1.model.gpt import GPT

FORMAT = "gpt1"
FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TOKENIZER_FILES = ("vocab.json", "merges.txt")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def write_model_files(folder: Path, model: GPT, tokenizer_dir: str | Path | None = None,
                      extra: dict[str, Any] | None = None) -> None:
    """Write weights, config and tokenizer files into an existing (temporary) folder."""
    folder = Path(folder)
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / WEIGHTS), metadata={"format": FORMAT})
    follow_umask(folder / WEIGHTS)
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
    raise CheckpointError(f"{src}: no tokenizer files (expected vocab.json + merges.txt or "
                          "encoder_bpe_40000.json + vocab_40000.bpe)")


def save_model(model: GPT, out_dir: str | Path, tokenizer_dir: str | Path | None = None,
               extra: dict[str, Any] | None = None) -> Path:
    """Save `model` as a checkpoint folder, atomically (temporary name, then rename)."""
    out_dir = Path(out_dir)
    with atomic_folder(out_dir, needed=state_bytes(model.state_dict())) as tmp:
        write_model_files(tmp, model, tokenizer_dir, extra)
    return out_dir


def state_bytes(tensors: dict[str, torch.Tensor]) -> int:
    """Bytes the tensors take in a safetensors file (what a write of them needs)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """A checkpoint folder itself, or the newest checkpoint inside a run folder."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    if path.is_file():
        raise CheckpointError(f"{path}: expected a checkpoint folder (with {WEIGHTS} and {CONFIG}), "
                              "got a file")
    if (path / CONFIG).is_file():
        return path
    candidates = [p for p in path.iterdir() if p.is_dir() and (p / CONFIG).is_file()
                  and not p.name.startswith(".")]
    if (path / "final").is_dir() and (path / "final" / CONFIG).is_file():
        return path / "final"
    steps = [p for p in candidates if p.name.startswith("step-") and p.name[5:].isdigit()]
    if steps:
        return max(steps, key=lambda p: int(p.name[5:]))
    if len(candidates) == 1:
        return candidates[0]
    raise CheckpointError(f"{path}: not a checkpoint folder (no {CONFIG}) and no checkpoint inside")


def read_config(path: str | Path) -> dict[str, Any]:
    """The parsed `config.json` of a checkpoint folder, validated."""
    folder = resolve_checkpoint_dir(path)
    file = folder / CONFIG
    data = read_json_file(file, CheckpointError)
    if not isinstance(data, dict) or data.get("format") != FORMAT or "model" not in data:
        raise CheckpointError(f"{file}: not a gpt1 config (expected \"format\": \"gpt1\" and a "
                              "\"model\" table); convert other formats with `gpt1 convert`")
    version = data.get("format_version", 0)
    if type(version) is not int or version < 0:
        raise CheckpointError(f"{file}: format_version must be an integer >= 0, got {version!r}")
    if not isinstance(data["model"], dict):
        raise CheckpointError(f"{file}: \"model\" must be a table of settings")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{file}: format_version {data['format_version']} is newer than this "
                              f"gpt1 understands ({FORMAT_VERSION})")
    return data


def read_model_config(path: str | Path) -> ModelConfig:
    folder = resolve_checkpoint_dir(path)
    try:
        return ModelConfig.from_dict(read_config(folder)["model"], source=str(folder / CONFIG))
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None


def load_state_dict(file: str | Path) -> dict[str, torch.Tensor]:
    """Tensors from a safetensors file; pickles are refused with a clear message."""
    file = Path(file)
    refuse_pickle(file)
    try:
        state = load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{file}: not a valid safetensors file ({exc})") from None
    check_finite(state, file)
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
        raise CheckpointError(f"{file}: this is a pickle/torch file, not safetensors; gpt1 never "
                              "unpickles weights (convert it with `gpt1 convert --from hf`)")


def check_finite(state: dict[str, torch.Tensor], source: Path | str) -> None:
    """Every floating-point tensor holds only finite values (one pass each, no copy kept).

    NaN or inf weights never give a right answer: a model built from them would score at
    chance, or crash mid-sampling, without saying why.
    """
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise CheckpointError(f"{source}: tensor {name!r} holds {bad:,} NaN or infinite "
                                  "value(s); the weights are damaged")


def check_weights_size(config: ModelConfig, files: list[Path], source: Path | str,
                       min_bytes_per_param: int = 2) -> None:
    """Refuse a config that describes more parameters than the weight files can hold.

    Checked from file sizes before anything is read or built, so a config.json edited to a
    huge size is refused at once even when the machine could hold the model.
    """
    from gpt1.model.gpt import parameter_count
    need = parameter_count(config) * min_bytes_per_param
    have = sum(f.stat().st_size for f in files if f.is_file())
    if have < need:
        where = files[0] if len(files) == 1 else files[0].parent
        raise CheckpointError(f"{where}: {have:,} bytes of weights, but {source} describes "
                              f"{parameter_count(config):,} parameters (at least {need:,} bytes): "
                              "the weights are truncated, or config and weights do not belong "
                              "together")


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> GPT:
    """Load a gpt1 checkpoint folder (or the newest checkpoint of a run folder) as a `GPT`."""
    folder = resolve_checkpoint_dir(path)
    config = read_model_config(folder)
    weights = folder / WEIGHTS
    if not weights.is_file():
        pickles = [p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES]
        hint = f" (found {', '.join(pickles)}: pickles are never loaded)" if pickles else ""
        raise CheckpointError(f"{weights}: missing weights file{hint}")
    from gpt1.model.memory import ensure_model_fits
    ensure_model_fits(config, str(folder / CONFIG), device)
    refuse_pickle(weights)
    check_weights_size(config, [weights], folder / CONFIG)
    state = load_state_dict(weights)
    with torch.device("meta"):
        model = GPT(config)
    check_state_dict(model, state, weights)
    model.load_state_dict(state, assign=True)
    return model.to(device)


def check_state_dict(model: GPT, state: dict[str, torch.Tensor], source: Path | str) -> None:
    """Every tensor present, with the expected shape, and nothing unexpected."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{source}: weights do not match the config: missing "
                              f"{missing[:5] or 'none'}, unexpected {unexpected[:5] or 'none'}")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise CheckpointError(f"{source}: tensor {name!r} has shape {tuple(state[name].shape)}, "
                                  f"expected {shape} from config.json")


def tokenizer_dir_of(path: str | Path) -> Path | None:
    """The checkpoint folder if it carries tokenizer files, else None."""
    folder = resolve_checkpoint_dir(path)
    return folder if all((folder / f).is_file() for f in TOKENIZER_FILES) else None


# ------------------------------------------------------------------------- training state
TRAINER_TENSORS = "trainer_state.safetensors"
TRAINER_JSON = "trainer_state.json"


def optimizer_to_flat(state_dict: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split an optimizer `state_dict()` into safetensors-ready tensors and a JSON description."""
    tensors: dict[str, torch.Tensor] = {}
    entries = []
    for i, (key, values) in enumerate(state_dict["state"].items()):
        scalars = {}
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim/{i}/{name}"] = value.detach().to("cpu").contiguous()
            else:
                scalars[name] = value
        entries.append({"key": key, "tensors": [n for n, v in values.items()
                                                 if isinstance(v, torch.Tensor)],
                        "scalars": scalars})
    return tensors, {"state": entries, "param_groups": state_dict["param_groups"]}


def optimizer_from_flat(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """Inverse of `optimizer_to_flat`: an optimizer `state_dict()` (tensors on CPU)."""
    state = {}
    for i, entry in enumerate(meta["state"]):
        values: dict[str, Any] = dict(entry["scalars"])
        for name in entry["tensors"]:
            values[name] = tensors[f"optim/{i}/{name}"]
        state[entry["key"]] = values
    return {"state": state, "param_groups": meta["param_groups"]}


def save_training_state(folder: Path, tensors: dict[str, torch.Tensor], info: dict[str, Any]) -> None:
    """Write trainer tensors (optimizer moments, RNG states as uint8) and JSON state into `folder`."""
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(Path(folder) / TRAINER_TENSORS),
              metadata={"format": FORMAT})
    follow_umask(Path(folder) / TRAINER_TENSORS)
    (Path(folder) / TRAINER_JSON).write_text(json.dumps(info) + "\n")


def load_training_state(folder: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors and JSON state written by `save_training_state`."""
    folder = Path(folder)
    file = folder / TRAINER_JSON
    if not file.is_file():
        raise CheckpointError(f"{folder}: no {TRAINER_JSON}; this checkpoint cannot resume training "
                              "(it holds weights only)")
    info = read_trainer_json(folder)
    if not (isinstance(info.get("optimizer"), dict) and isinstance(info.get("sources"), list)
            and info["sources"]):
        raise CheckpointError(f"{file}: damaged trainer state (expected \"optimizer\" and "
                              "\"sources\" entries); resume from an older step-N folder")
    return load_state_dict(folder / TRAINER_TENSORS), info


def read_trainer_json(folder: str | Path) -> dict[str, Any]:
    """The parsed `trainer_state.json` of `folder`: a JSON object with a step >= 0."""
    file = Path(folder) / TRAINER_JSON
    try:
        info = read_json_file(file, CheckpointError, limit=64_000_000)
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}; resume from an older step-N folder or delete this "
                              "one") from None
    step = info.get("step") if isinstance(info, dict) else None
    if type(step) is not int or step < 0:
        raise CheckpointError(f"{file}: damaged trainer state (\"step\" must be an integer >= 0)")
    return info


def step_dirs(run_dir: str | Path) -> list[Path]:
    """`step-N` checkpoint folders of a run, oldest first (temporary folders excluded)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [p for p in run_dir.iterdir() if p.is_dir() and p.name.startswith("step-")
             and p.name[5:].isdigit() and (p / TRAINER_JSON).is_file()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def latest_resumable(run_dir: str | Path) -> Path | None:
    """The newest checkpoint of a run that carries trainer state (`step-N`, else `final`)."""
    steps = step_dirs(run_dir)
    final = Path(run_dir) / "final"
    candidates = steps + ([final] if (final / TRAINER_JSON).is_file() else [])
    if not candidates:
        return None
    return max(candidates, key=lambda p: read_trainer_json(p)["step"])


def prune_steps(run_dir: str | Path, keep_last: int) -> None:
    """Keep the newest `keep_last` step-N folders (0 keeps all)."""
    if keep_last <= 0:
        return
    for old in step_dirs(run_dir)[:-keep_last]:
        # Rename, then delete: a kill mid-delete leaves a hidden folder, never a checkpoint
        # folder with some of its files gone.
        trash = old.with_name(f".{old.name}.deleting-{os.getpid()}")
        os.replace(old, trash)
        shutil.rmtree(trash, ignore_errors=True)
    # Leftovers of killed processes (half-written or half-deleted folders); one process writes
    # a run, so hidden step folders of other process ids are dead.
    for stale in Path(run_dir).glob(".step-*"):
        if stale.is_dir() and not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)


def trained_context(path: str | Path) -> int | None:
    """The window length the checkpoint's pretraining run trained on, when its run folder says.

    A model pretrained on windows shorter than `n_positions` never trained the later position
    rows (they are still at their random init), so scoring and fine-tuning should not reach
    them by default. Read from `run.json` (`data.n_ctx`) beside the checkpoint folder.
    """
    folder = resolve_checkpoint_dir(path)
    run_file = folder.parent / "run.json"
    try:
        n_ctx = read_json_file(run_file)["data"]["n_ctx"]
    except (Gpt1Error, KeyError, TypeError):
        return None
    return n_ctx if type(n_ctx) is int and n_ctx > 0 else None


def run_checkpoints(run_dir: str | Path) -> list[tuple[str, int | None, Path]]:
    """(name, pretraining updates, folder) for every step-N and final checkpoint of a run, in
    update order; a `final` that repeats the last step-N is left out (same weights)."""
    run_dir = Path(run_dir)
    found = []
    for p in sorted(run_dir.iterdir()) if run_dir.is_dir() else []:
        if not (p / "config.json").is_file() or p.name.startswith("."):
            continue
        m = re.fullmatch(r"step-(\d+)", p.name)
        if m:
            found.append((p.name, int(m.group(1)), p))
        elif p.name == "final":
            found.append((p.name, updates_of(p), p))
    if not found:
        raise CheckpointError(f"{run_dir}: no step-N or final checkpoints in this run folder")
    # `final` usually repeats the last step-N (same update count): score those weights once.
    steps = {c[1] for c in found if c[0] != "final"}
    found = [c for c in found if not (c[0] == "final" and c[1] is not None and c[1] in steps)]
    return sorted(found, key=lambda c: (c[1] is None, c[1] or 0, c[0]))


def updates_of(folder: Path) -> int | None:
    """The update count a checkpoint records (trainer_state.json, else config.json), if any."""
    for name in ("trainer_state.json", "config.json"):
        try:
            data = json.loads((folder / name).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(data, dict):
            continue
        for table in (data, data.get("trainer") or {}):
            for key in ("step", "updates", "global_step"):
                # type(): a JSON true is not an update count
                if isinstance(table, dict) and type(table.get(key)) is int and table[key] >= 0:
                    return table[key]
    return None

