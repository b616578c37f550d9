"""Weights in and out: the original OpenAI release, transformers' OpenAIGPT folders, gpt1 checkpoints.

Every conversion goes through a `GPT` model: read the source into one, then write the target.
- openai: `params_shapes.json` + `params_0.npy` .. `params_9.npy`, ten float32 shards of ONE flat
  vector (boundaries are arbitrary); split at the cumulative shape products (reference a.5).
  Conv weights are stored `[1, in, out]`: squeeze and transpose for `nn.Linear`.
- hf: an `OpenAIGPTLMHeadModel` (or `OpenAIGPTModel`) `save_pretrained` folder. HF `Conv1D`
  weights are `[in, out]`; the LM head is tied to `transformer.tokens_embed`.
Pickled weights (`pytorch_model.bin`) are read only with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from safetensors.torch import save_file

from gpt1.checkpoint_files import (
    TOKENIZER_FILES,
    check_finite,
    check_state_dict,
    check_weights_size,
    copy_tokenizer_files,
    load_state_dict,
    open_checkpoint,
    resolve_checkpoint_dir,
    state_bytes,
    trained_context,
    write_model_files,
)
from gpt1.config import MODEL_LIMITS, ModelConfig, file_inside, read_json_file
from gpt1.errors import CheckpointError, ConfigError, Gpt1Error
from gpt1.extras import require
from gpt1.files import atomic_folder, check_output, folder_files, follow_umask
from gpt1.model.checkpoint import load_checkpoint
from gpt1.model.gpt import GPT, parameter_count
from gpt1.model.memory import ensure_model_fits

if TYPE_CHECKING:
    from gpt1.recipes.export_hf import HFExport

log = logging.getLogger(__name__)

FORMATS_IN = ("openai", "hf", "gpt1")
FORMATS_OUT = ("gpt1", "hf", "onnx")
OPENAI_SHAPES = "params_shapes.json"
OPENAI_SHARDS = 10
# 2 + 12 * 4096 shape entries of at most ~30 characters each fit well within this.
OPENAI_SHAPES_MAX_BYTES = 4_000_000
OPENAI_VOCAB = ("encoder_bpe_40000.json", "vocab_40000.bpe")
# Per block, the release stores 12 arrays in this order (reference a.5), named here in our layout.
# "linear" arrays are conv weights [1, in, out] that become nn.Linear weights [out, in].
OPENAI_BLOCK = [
    ("attn.c_attn.weight", "linear"),
    ("attn.c_attn.bias", "vector"),
    ("attn.c_proj.weight", "linear"),
    ("attn.c_proj.bias", "vector"),
    ("ln_1.weight", "vector"),
    ("ln_1.bias", "vector"),
    ("mlp.c_fc.weight", "linear"),
    ("mlp.c_fc.bias", "vector"),
    ("mlp.c_proj.weight", "linear"),
    ("mlp.c_proj.bias", "vector"),
    ("ln_2.weight", "vector"),
    ("ln_2.bias", "vector"),
]
HF_CONFIG_KEYS = (
    "vocab_size",
    "n_positions",
    "n_embd",
    "n_layer",
    "n_head",
    "embd_pdrop",
    "attn_pdrop",
    "resid_pdrop",
    "layer_norm_epsilon",
    "initializer_range",
)
HF_LINEARS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


# ------------------------------------------------------------------------------------ openai
def plan_openai(
    shapes: list, n_head: int = 12, source: str = OPENAI_SHAPES
) -> tuple[ModelConfig, list[tuple[str, tuple[int, ...]]]]:
    """Infer the config from the released shapes and name each array in our layout.

    Returns the config and, in file order, (parameter name, stored shape). The head count is not
    recoverable from shapes, hence `n_head`. Raises `CheckpointError` naming the array that does
    not fit the GPT-1 layout.
    """
    if not isinstance(shapes, list) or len(shapes) < 2 or (len(shapes) - 2) % 12:
        n = len(shapes) if isinstance(shapes, list) else type(shapes).__name__
        raise CheckpointError(
            f"{source}: expected a list of 2 + 12*n_layer shapes (146 for GPT-1), got {n}"
        )
    if (len(shapes) - 2) // 12 > MODEL_LIMITS["n_layer"]:
        raise CheckpointError(
            f"{source}: {len(shapes):,} arrays describe {(len(shapes) - 2) // 12:,} "
            f"layers; model.n_layer must be in 1..{MODEL_LIMITS['n_layer']:,}"
        )
    shapes = _shape_tuples(shapes, source)
    if len(shapes[0]) != 2 or len(shapes[1]) != 2 or shapes[0][1] != shapes[1][1]:
        raise CheckpointError(
            f"{source}: arrays 0 and 1 must be positions [n_ctx, C] and tokens "
            f"[vocab, C], got {list(shapes[0])} and {list(shapes[1])}"
        )
    (n_pos, C), (vocab, _) = shapes[0], shapes[1]
    n_layer = (len(shapes) - 2) // 12
    n_inner = shapes[2 + 6][2] if len(shapes[2 + 6]) == 3 else -1
    try:
        config = ModelConfig(
            vocab_size=vocab,
            n_positions=n_pos,
            n_embd=C,
            n_layer=n_layer,
            n_head=n_head,
            n_inner=n_inner,
        )
    except ConfigError as exc:
        raise CheckpointError(f"{source}: {exc}") from None
    # Expected shapes from arithmetic, not from a (meta) model: nothing is built from the file's
    # sizes until they have been checked against each other and against the shards.
    F_ = config.n_inner
    block = {
        "attn.c_attn.weight": (3 * C, C),
        "attn.c_attn.bias": (3 * C,),
        "attn.c_proj.weight": (C, C),
        "attn.c_proj.bias": (C,),
        "mlp.c_fc.weight": (F_, C),
        "mlp.c_fc.bias": (F_,),
        "mlp.c_proj.weight": (C, F_),
        "mlp.c_proj.bias": (C,),
    }
    plan = [("wpe.weight", shapes[0]), ("wte.weight", shapes[1])]
    for i in range(n_layer):
        for j, (name, kind) in enumerate(OPENAI_BLOCK):
            idx = 2 + 12 * i + j
            full = f"h.{i}.{name}"
            want = block.get(name, (C,))
            if kind == "linear":
                want = (1, want[1], want[0])  # stored [1, in, out], ours [out, in]
            if shapes[idx] != want:
                raise CheckpointError(
                    f"{source}: array {idx} ({full}) has shape {list(shapes[idx])}, "
                    f"expected {list(want)} for n_embd={C}, n_inner={n_inner}"
                )
            plan.append((full, shapes[idx]))
    return config, plan


def _shape_tuples(shapes: list, source: str) -> list[tuple[int, ...]]:
    """Each entry a list of 1 to 3 positive integers (JSON `true` or `2.0` are not sizes)."""
    out = []
    for i, shape in enumerate(shapes):
        if (
            not isinstance(shape, list)
            or not 1 <= len(shape) <= 3
            or not all(type(d) is int and 0 < d <= 2**31 for d in shape)
        ):
            raise CheckpointError(
                f"{source}: array {i} has shape {str(shape)[:60]}; every entry "
                "must be a list of 1 to 3 positive integers"
            )
        out.append(tuple(shape))
    return out


def _read_shapes(folder: Path) -> list:
    file = folder / OPENAI_SHAPES
    if not file.is_file():
        raise CheckpointError(
            f"{file}: missing (the original release has {OPENAI_SHAPES} beside "
            "params_0.npy .. params_9.npy)"
        )
    size = file.stat().st_size
    if size > OPENAI_SHAPES_MAX_BYTES:  # refuse before parsing millions of entries
        raise CheckpointError(
            f"{file}: {size:,} bytes of shapes; a model within "
            f"model.n_layer <= {MODEL_LIMITS['n_layer']:,} needs under "
            f"{OPENAI_SHAPES_MAX_BYTES:,} (the release's file is 3 kB)"
        )
    return read_json_file(file, CheckpointError)


def _open_shards(folder: Path) -> list[np.ndarray]:
    """Memory-map the ten shards (nothing is copied yet); each must be a flat float32 array."""
    arrays = []
    for i in range(OPENAI_SHARDS):
        file = folder / f"params_{i}.npy"
        if not file.is_file():
            raise CheckpointError(
                f"{file}: missing shard (expected params_0.npy .. params_{OPENAI_SHARDS - 1}.npy)"
            )
        try:
            arr = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise CheckpointError(f"{file}: unreadable or truncated .npy shard ({exc})") from None
        if arr.dtype != np.float32 or arr.ndim != 1:
            raise CheckpointError(
                f"{file}: expected a flat float32 array, got {arr.dtype} "
                f"with shape {list(arr.shape)}"
            )
        arrays.append(arr)
    return arrays


def _pieces(shards: list[np.ndarray], sizes: list[int]) -> Iterator[np.ndarray]:
    """Split the virtual concatenation of `shards` into consecutive pieces of `sizes` elements,
    copying each piece once (never the whole 466 MB vector)."""
    s, offset = 0, 0
    for size in sizes:
        out = np.empty(size, dtype=np.float32)
        filled = 0
        while filled < size:
            take = min(size - filled, len(shards[s]) - offset)
            out[filled : filled + take] = shards[s][offset : offset + take]
            filled, offset = filled + take, offset + take
            if offset == len(shards[s]):
                s, offset = s + 1, 0
        yield out


def load_openai(folder: str | Path, n_head: int = 12) -> GPT:
    """The original release (`params_shapes.json` + ten `params_N.npy`) as a `GPT`."""
    folder = Path(folder)
    source = str(folder / OPENAI_SHAPES)
    shapes = _read_shapes(folder)
    config, plan = plan_openai(shapes, n_head, source)
    # The shapes must account for exactly the floats the shards hold (read from the .npy
    # headers) before any model or buffer is sized from the untrusted shapes.
    shards = _open_shards(folder)
    sizes = [math.prod(shape) for _, shape in plan]
    have = sum(len(a) for a in shards)
    if have != sum(sizes):
        raise CheckpointError(
            f"{folder}: the shards hold {have:,} floats but {OPENAI_SHAPES} needs "
            f"{sum(sizes):,} (a shard is truncated or from another release)"
        )
    ensure_model_fits(config, source)
    state = {}
    for (name, shape), flat in zip(plan, _pieces(shards, sizes)):
        if not np.isfinite(flat).all():
            raise CheckpointError(
                f"{folder}: array {name!r} holds NaN or infinite values; the release is damaged"
            )
        t = torch.from_numpy(flat).view(shape)
        if len(shape) == 3:
            t = t[0].t().contiguous()  # [1, in, out] -> [out, in] for nn.Linear
        state[name] = t
    with torch.device("meta"):
        model = GPT(config)
    model.load_state_dict(state, assign=True)
    return model


def openai_vocab_dir(folder: Path) -> Path | None:
    return folder if all((folder / f).is_file() for f in OPENAI_VOCAB) else None


# ---------------------------------------------------------------------------------------- hf
def hf_to_gpt1_state(state: dict[str, torch.Tensor], source: str = "hf") -> dict[str, torch.Tensor]:
    """Rename an OpenAIGPT(LMHead)Model state dict to ours; Conv1D [in, out] -> Linear [out, in]."""
    out: dict[str, torch.Tensor] = {}
    unexpected = []
    for key, value in state.items():
        k = key.removeprefix("transformer.")
        if k == "lm_head.weight" or re.fullmatch(r"h\.\d+\.attn\.bias", k) or k == "position_ids":
            continue  # the tied head and old non-persistent buffers carry nothing of their own
        if k == "tokens_embed.weight":
            out["wte.weight"] = value
        elif k == "positions_embed.weight":
            out["wpe.weight"] = value
        elif re.fullmatch(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight", k):
            out[k] = value.t().contiguous()
        elif re.fullmatch(r"h\.\d+\.((attn|mlp)\.c_\w+|ln_[12])\.(weight|bias)", k):
            out[k] = value
        else:
            unexpected.append(key)
    if unexpected:
        raise CheckpointError(
            f"{source}: not an OpenAIGPT state dict; unexpected tensors {unexpected[:5]}"
        )
    head = state.get("lm_head.weight")
    if head is not None and "wte.weight" in out and not torch.equal(head, out["wte.weight"]):
        raise CheckpointError(
            f"{source}: lm_head.weight differs from tokens_embed.weight; GPT-1 "
            "ties its output layer to the token embedding"
        )
    return out


def gpt1_to_hf_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict in transformers' `OpenAIGPTLMHeadModel` naming (head left to tying)."""
    out = {}
    for k, v in state.items():
        if k == "wte.weight":
            out["transformer.tokens_embed.weight"] = v
        elif k == "wpe.weight":
            out["transformer.positions_embed.weight"] = v
        elif k.endswith(".weight") and k.rsplit(".", 1)[0].split(".", 2)[-1] in HF_LINEARS:
            out["transformer." + k] = v.t().contiguous()  # nn.Linear [out, in] -> Conv1D [in, out]
        else:
            out["transformer." + k] = v
    return out


def hf_config_to_model(data: dict, source: str) -> ModelConfig:
    """Our ModelConfig from transformers' OpenAIGPTConfig JSON (other HF keys are HF's own)."""
    if data.get("model_type") not in (None, "openai-gpt"):
        raise CheckpointError(
            f"{source}: model_type {data.get('model_type')!r} is not 'openai-gpt'"
        )
    afn = data.get("afn", "gelu")
    if afn not in ("gelu", "relu"):  # HF's "gelu" for this model is the tanh approximation
        raise CheckpointError(f"{source}: afn {afn!r} is not supported (GPT-1 uses 'gelu')")
    values = {k: data[k] for k in HF_CONFIG_KEYS if k in data}
    missing = [
        k for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head") if k not in data
    ]
    if missing:
        raise CheckpointError(f"{source}: missing key(s) {', '.join(missing)}")
    try:
        return ModelConfig(afn=afn, **values)
    except (ConfigError, TypeError) as exc:
        raise CheckpointError(f"{source}: {exc}") from None


def inside_folder(folder: Path, name: object, source: Path | str) -> Path:
    """A weight file named by `source` (an HF index), refused when it leaves `folder`.

    A hub snapshot (`.../snapshots/REV/`) links its files into the repository's `blobs/`
    folder; those links are the snapshot's own and are followed.
    """
    roots = (folder.parent.parent / "blobs",) if folder.parent.name == "snapshots" else ()
    try:
        return file_inside(folder, name, roots)
    except ConfigError as exc:
        raise CheckpointError(f"{source}: {exc}") from None


def hf_weight_files(folder: Path) -> list[Path]:
    """The weight files of an HF folder (model.safetensors, the shards its index names, or
    pytorch_model.bin), each checked to lie inside `folder`; nothing is read but the index."""
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        data = read_json_file(index, CheckpointError)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(
                f"{index}: weight_map must be a non-empty table (tensor name -> file)"
            )
        names = []
        for value in weight_map.values():
            if type(value) is not str:
                raise CheckpointError(
                    f"{index}: weight_map values must be file names, got {value!r}"
                )
            names.append(value)
        return [inside_folder(folder, name, index) for name in sorted(set(names))]
    binary = folder / "pytorch_model.bin"
    if binary.is_file():
        return [binary]
    raise CheckpointError(
        f"{folder}: no weights (expected model.safetensors, "
        "model.safetensors.index.json or pytorch_model.bin)"
    )


def read_hf_weights(folder: Path, files: list[Path] | None = None) -> dict[str, torch.Tensor]:
    """Tensors of an HF folder: model.safetensors (single or sharded) or pytorch_model.bin."""
    files = hf_weight_files(folder) if files is None else files
    if files[0].name != "pytorch_model.bin":
        state: dict[str, torch.Tensor] = {}
        for file in files:
            state.update(load_state_dict(file))
        return state
    binary = files[0]
    try:  # weights_only: plain tensors only, no arbitrary objects are unpickled
        state = torch.load(binary, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # torch's own message suggests weights_only=False, i.e. running the file's code: never.
        raise CheckpointError(
            f"{binary}: refused: it pickles objects other than tensors, which gpt1 never "
            "unpickles (nothing in it was run); convert it to safetensors with code you trust"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any failure here is a bad file, not a bug
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CheckpointError(f"{binary}: not a loadable torch state dict ({reason})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(
            f"{binary}: expected a state dict of tensors, got {type(state).__name__}"
        )
    check_finite(state, binary)
    return state


def load_hf(folder: str | Path) -> GPT:
    """A transformers OpenAIGPT `save_pretrained` folder as a `GPT`."""
    folder = Path(folder)
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file}: missing (an HF model folder has config.json)")
    data = read_json_file(cfg_file, CheckpointError)
    if not isinstance(data, dict):
        raise CheckpointError(f"{cfg_file}: expected a JSON object")
    if data.get("format") == "gpt1":
        raise CheckpointError(f"{folder}: this is a gpt1 checkpoint; use --from gpt1")
    config = hf_config_to_model(data, str(cfg_file))
    files = hf_weight_files(folder)
    ensure_model_fits(config, str(cfg_file))
    check_weights_size(parameter_count(config), files, cfg_file)
    state = hf_to_gpt1_state(read_hf_weights(folder, files), str(folder))
    with torch.device("meta"):
        model = GPT(config)
    check_state_dict(model, state, folder)
    model.load_state_dict({k: v.float() for k, v in state.items()}, assign=True)
    return model


def hf_config_of(config: ModelConfig) -> dict:
    """transformers' OpenAIGPTConfig JSON for `config` (what `save_pretrained` would write)."""
    if config.n_inner != 4 * config.n_embd:
        raise ConfigError(
            f"transformers' OpenAIGPT fixes the MLP width at 4*n_embd="
            f"{4 * config.n_embd}; this model has n_inner={config.n_inner}"
        )
    out = {
        "architectures": ["OpenAIGPTLMHeadModel"],
        "model_type": "openai-gpt",
        "afn": config.afn,
        "torch_dtype": "float32",
        "tie_word_embeddings": True,
    }
    out.update({k: getattr(config, k) for k in HF_CONFIG_KEYS})
    return out


def save_hf(
    model: GPT,
    out_dir: str | Path,
    tokenizer_dir: Path | None = None,
    export: HFExport | None = None,
) -> Path:
    """Write `model` as a folder `OpenAIGPTLMHeadModel.from_pretrained` loads; `export`
    (gpt1.recipes.export_hf) adds the tokenizer, the trained window, the task head and the card."""
    from gpt1.recipes.export_hf import HFExport

    out_dir = Path(out_dir)
    export = export or HFExport()
    config = hf_config_of(model.config)
    if model.config.embd_dropout != "sum":
        log.warning(
            "transformers drops the summed embedding; embd_dropout=%r is not carried over",
            model.config.embd_dropout,
        )
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    hf_state, config = export.adjust(gpt1_to_hf_state(state), config)
    with atomic_folder(out_dir, needed=state_bytes(hf_state)) as tmp:
        save_file(hf_state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        follow_umask(tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, tmp)
        export.write(tmp, config)
    return out_dir


# -------------------------------------------------------------------------------------- hub
def fetch_hub(name: str) -> Path:
    """Download an HF hub model folder (only when the user named one); offline -> Gpt1Error."""
    require("hf", "huggingface_hub", what=f"{name}: not a local folder; fetching it from the hub")
    from huggingface_hub import snapshot_download

    patterns = ["config.json", "*.safetensors", "model.safetensors.index.json", *TOKENIZER_FILES]
    try:
        path = snapshot_download(name, allow_patterns=patterns)
    except Exception as exc:  # noqa: BLE001 - network/hub failures are reported, not traced
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Gpt1Error(
            f"{name}: not a local folder and could not be fetched from the hub (offline?): {first}"
        ) from None
    if not any(Path(path).glob("*.safetensors")):
        # Some hub repos only carry pytorch_model.bin; fetch it (read with weights_only=True).
        try:
            path = snapshot_download(name, allow_patterns=patterns + ["pytorch_model.bin"])
        except Exception as exc:  # noqa: BLE001
            raise Gpt1Error(f"{name}: could not fetch weights from the hub: {exc}") from None
    return Path(path)


def _looks_like_hub_name(src: str) -> bool:
    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+", src)) and not src.startswith((".", "/"))


# --------------------------------------------------------------------------------- convert
def read_any(src: str | Path, fmt: str, n_head: int = 12) -> tuple[GPT, Path | None]:
    """Load `src` in format `fmt` as a GPT; also return a folder holding its tokenizer files."""
    if fmt not in FORMATS_IN:
        raise ConfigError(f"--from must be one of {', '.join(FORMATS_IN)}, got {fmt!r}")
    path = Path(src)
    if not path.exists():
        if fmt == "hf" and _looks_like_hub_name(str(src)):
            path = fetch_hub(str(src))
        else:
            raise CheckpointError(f"{src}: no such folder")
    if not path.is_dir():
        raise CheckpointError(f"{src}: expected a folder, got a file")
    if fmt == "openai":
        return load_openai(path, n_head), openai_vocab_dir(path)
    if fmt == "hf":
        vocab = path if all((path / f).is_file() for f in TOKENIZER_FILES) else None
        return load_hf(path), vocab
    checkpoint = open_checkpoint(path)
    return load_checkpoint(checkpoint), checkpoint.tokenizer_dir


def source_files(src: str | Path, fmt: str) -> list[Path]:
    """The files `convert` reads from `src` (for gpt1 run folders, those of RUN/final too)."""
    found = folder_files(src) if Path(src).exists() else []
    if fmt == "gpt1" and Path(src).is_dir():
        with contextlib.suppress(Gpt1Error):
            found += folder_files(resolve_checkpoint_dir(src))
    return found


def convert(
    src: str | Path,
    dst: str | Path,
    src_format: str,
    dst_format: str = "gpt1",
    n_head: int = 12,
    overwrite: bool = False,
    notes: list[str] | None = None,
) -> Path:
    """Convert a model folder between formats; returns the written folder (or .onnx file).

    An existing `dst` is replaced only with `overwrite`, never the current folder, and never,
    even with it, when it is, holds or lies inside a file of `src` (`gpt1.files.check_inputs`). `notes` receives the lines the user must read
    about an hf or onnx export (how to load the tokenizer exactly, what happened to a task head,
    the trained window); "DIR" in them stands for `dst`."""
    if dst_format not in FORMATS_OUT:
        raise ConfigError(f"--to must be one of {', '.join(FORMATS_OUT)}, got {dst_format!r}")
    check_output(dst, overwrite, source_files(src, src_format), roots=(src,))
    model, vocab = read_any(src, src_format, n_head)
    out = Path(
        os.path.abspath(dst)
    )  # `.`-style names have no name to build a temporary sibling from
    if dst_format == "onnx":
        from gpt1.recipes.export_onnx import export_onnx

        return export_onnx(src, src_format, model, out, notes)
    if dst_format == "hf":
        from gpt1.recipes.export_hf import plan

        export = plan(src, src_format, model.config.n_positions, vocab, os.fspath(dst))
        if notes is not None:
            notes.extend(export.notes)
        save_hf(model, out, vocab, export)
        return Path(dst)
    extra: dict = {"converted_from": {"format": src_format, "path": os.fspath(src)}}
    window = source_window(src, src_format, vocab)
    if window is not None and window < model.config.n_positions:
        extra["trained_context"] = window  # read back by `trained_context`
    with atomic_folder(out, needed=state_bytes(model.state_dict())) as tmp:
        write_model_files(tmp, model, vocab, extra=extra)
    return Path(dst)


def source_window(src: str | Path, src_format: str, vocab: Path | None) -> int | None:
    """The window a source records as trained: a gpt1 checkpoint's `trained_context`, an HF
    folder's `model_max_length` (tokenizer_config.json beside its vocabulary, as the hf export
    writes it), so that a model converted back keeps the window it was trained on."""
    if src_format == "gpt1":
        return trained_context(src)
    if src_format != "hf" or vocab is None:
        return None
    with contextlib.suppress(Gpt1Error, KeyError, TypeError):
        length = read_json_file(vocab / "tokenizer_config.json")["model_max_length"]
        return length if type(length) is int and length > 0 else None
    return None
