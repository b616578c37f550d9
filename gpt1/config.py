"""Typed configuration: the model's shape (transformers' `OpenAIGPTConfig` names), named presets,
the training sections, and the one resolver every command uses.

Every config is a frozen dataclass: once resolved it cannot change; a variant is derived with
`dataclasses.replace` (or `ModelConfig.derive`, which keeps derived sizes following their source).
`resolve_pretrain` and `resolve_finetune` build a run's configs in one order for every command:
preset -> TOML file -> command-line flags -> `--set section.key=value`, later layers winning, and
the whole result validated once (types, ranges, agreement between fields) where it is built.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from gpt1.errors import ConfigError

# ------------------------------------------------------------------------------ validation
# Upper bounds far above any GPT-1-family model and far below sizes whose mere bookkeeping
# (a million-layer module list, a 2**40-row table) would hang or overflow. What fits within them
# is then judged against the device's memory by `gpt1.model.memory`.
MODEL_LIMITS: dict[str, int] = {
    "vocab_size": 2**31 - 1,
    "n_positions": 2**20,
    "n_embd": 2**17,
    "n_layer": 4096,
    "n_head": 2**17,
    "n_inner": 2**20,
}


MAX_JSON_BYTES = 16_000_000  # settings and metadata files; the largest real one is ~100 kB


def read_json_file(path: Any, error: type = ConfigError, limit: int = MAX_JSON_BYTES) -> Any:
    """Parse a small JSON settings/metadata file, refusing one over `limit` bytes before it is
    read (a huge file would take minutes and gigabytes to parse). Errors are `error` instances
    naming the file."""
    from pathlib import Path

    path = Path(path)
    try:
        size = path.stat().st_size
        if not path.is_file():  # a folder, or a device such as /dev/zero that reads forever
            raise error(f"{path}: not a file")
        if size > limit:
            raise error(f"{path}: {size:,} bytes; a file of this kind is at most {limit:,}")
        return json.loads(path.read_text(encoding="utf-8"))
    # ValueError: also an integer of more than 4300 digits, which Python will not convert
    except (OSError, ValueError, RecursionError) as exc:
        raise error(f"{path}: unreadable JSON ({str(exc).split(';')[0]})") from None


def file_inside(folder: Any, name: Any, roots: tuple = ()) -> Any:
    """`folder / name` for a file name read from a file, or ConfigError when the name is not a
    plain relative path or the file resolves (through symlinks) outside `folder` and `roots`.

    One rule for every file that names other files (an HF index's weight_map, meta.json's
    shards): a crafted name must not make gpt1 read, say, `../../secret.safetensors`.
    """
    from pathlib import Path

    folder = Path(folder)
    if type(name) is not str or not name or "\0" in name:
        raise ConfigError(f"file name {name!r} is not a non-empty string")
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise ConfigError(f"file {name!r} is outside {folder}; only files inside it are read")
    real = (folder / name).resolve()
    if not any(Path(r).resolve() in real.parents for r in (folder, *roots)):
        raise ConfigError(
            f"file {name!r} resolves to {real}, outside {folder}; only files inside it are read"
        )
    return folder / name


# The widest integer a setting may hold: torch and numpy take integers as int64, and a value
# past it (a count of 10^30) failed deep inside them with an OverflowError.
MAX_INT = 2**63 - 1
# Seeds feed torch, numpy and scikit-learn; numpy's legacy and scikit-learn's random states are
# 32-bit, and the derived seeds (seed * 1000003 + epoch, seed + 1000 * rank) stay within torch's 64.
MAX_SEED = 2**32 - 1


def is_int(value: Any) -> bool:
    """A real integer: not a bool (JSON `true`), a float (`2.0`) or a string (`"2"`)."""
    return type(value) is int


def check_seed(value: int, name: str) -> None:
    """Refuse a seed outside 0..MAX_SEED, naming the flag or field `name`."""
    if not 0 <= value <= MAX_SEED:
        raise ConfigError(f"{name} must be in 0..2**32-1 ({MAX_SEED}), got {value}")


def is_number(value: Any) -> bool:
    """A finite int or float, not a bool."""
    return type(value) in (int, float) and math.isfinite(value)


_TYPE_RULES: dict[str, tuple[Any, str]] = {
    "int": (is_int, "an integer"),
    "float": (is_number, "a finite number"),
    "bool": (lambda v: type(v) is bool, "true or false"),
    "str": (lambda v: type(v) is str, "a string"),
    "int | None": (lambda v: v is None or is_int(v), "an integer or null"),
}


def check_types(obj: Any, section: str) -> None:
    """Every field of dataclass `obj` holds a value of its declared type (no coercion), an
    integer within 64 bits (`MAX_INT`).

    A string `"2"`, a float `2.5` or `true` where an integer belongs is an error naming the
    field, not a silent conversion.
    """
    for f in fields(obj):
        rule = _TYPE_RULES.get(str(f.type))
        if rule is None:
            continue
        value = getattr(obj, f.name)
        ok, expected = rule
        if not ok(value):
            raise ConfigError(
                f"{section}.{f.name} must be {expected}, got {value!r} ({type(value).__name__})"
            )
        if is_int(value) and abs(value) > MAX_INT:
            raise ConfigError(f"{section}.{f.name} must be within ±(2**63-1), got {value}")


def check_ranges(obj: Any, section: str, limits: dict[str, int]) -> None:
    """Each named integer field is in 1..limit."""
    for name, limit in limits.items():
        value = getattr(obj, name)
        if not 1 <= value <= limit:
            raise ConfigError(f"{section}.{name} must be in 1..{limit:,}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Shape and regularisation of a GPT-1 decoder. Defaults are the paper's 117M model."""

    vocab_size: int = 40478  # rows of the token table (grows when task tokens are added)
    n_positions: int = 512  # learned position rows = longest context
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None  # MLP width; None means 4 * n_embd (GPT-1), filled in at build
    afn: str = "gelu"  # "gelu" is GPT-1's tanh approximation (HF: gelu_new); or "relu"
    embd_pdrop: float = 0.1
    attn_pdrop: float = 0.1
    resid_pdrop: float = 0.1
    layer_norm_epsilon: float = 1e-5
    initializer_range: float = 0.02
    # Where embedding dropout acts: "sum" drops the summed token+position vectors (HF);
    # "matrix" drops the embedding tables themselves, as OAI did, and the tied output layer
    # then uses the same dropped token table in that forward pass.
    embd_dropout: str = "sum"

    def __post_init__(self) -> None:
        check_types(self, "model")
        if self.n_inner is None:
            # Derived: the paper's 4x MLP width (the class is frozen, hence object.__setattr__).
            object.__setattr__(self, "n_inner", 4 * self.n_embd)
        check_ranges(self, "model", MODEL_LIMITS)
        if self.n_embd % self.n_head:
            raise ConfigError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.afn not in ("gelu", "relu"):
            raise ConfigError(f"afn must be 'gelu' or 'relu', got {self.afn!r}")
        if self.embd_dropout not in ("sum", "matrix"):
            raise ConfigError(f"embd_dropout must be 'sum' or 'matrix', got {self.embd_dropout!r}")
        for name in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):
            if not 0.0 <= float(getattr(self, name)) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)!r}")
        if not 0.0 < self.layer_norm_epsilon < 1.0 or self.initializer_range < 0:
            raise ConfigError(
                "model.layer_norm_epsilon must be in (0, 1) and model.initializer_range >= 0"
            )

    @property
    def head_dim(self) -> int:
        """Head size, always derived: n_embd / n_head."""
        return self.n_embd // self.n_head

    def derive(self, **changes: Any) -> ModelConfig:
        """A copy with `changes`; the MLP width follows a new n_embd (4x) unless `changes` sets
        n_inner or this config's width was not the 4x default (then it was chosen on purpose)."""
        if "n_embd" in changes and "n_inner" not in changes and self.n_inner == 4 * self.n_embd:
            changes["n_inner"] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> ModelConfig:
        return from_dict(cls, data, source)


# What each model preset sets; everything else (n_inner = 4 * n_embd among it) is derived when
# the config is built, so a later `n_embd` from a TOML, flag or --set carries n_inner along.
MODEL_PRESET_SETTINGS: dict[str, dict[str, Any]] = {
    # The paper's model: 116,534,784 parameters with the 40,478-token vocabulary.
    "gpt1": {},
    # For CPU experiments: a 6-layer, 384-wide model (about 17M parameters with an 8k vocabulary).
    "mini": {"vocab_size": 8192, "n_positions": 256, "n_embd": 384, "n_layer": 6, "n_head": 6},
    # For tests: runs a training step in milliseconds.
    "tiny": {"vocab_size": 512, "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 2},
}
MODEL_PRESETS: dict[str, ModelConfig] = {
    name: ModelConfig(**settings) for name, settings in MODEL_PRESET_SETTINGS.items()
}


def model_preset(name: str) -> ModelConfig:
    """A named model preset (frozen: derive variants with `.derive(...)`)."""
    if name not in MODEL_PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(MODEL_PRESETS)}")
    return dataclasses.replace(MODEL_PRESETS[name])


def from_dict(cls: type, data: dict[str, Any], source: str = "config") -> Any:
    """Build dataclass `cls` from a mapping; unknown keys, wrong types and out-of-range values
    are errors naming `source` (every loader of a file that carries sizes comes through here)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a table of settings, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) {', '.join(unknown)}; "
            f"known keys are {', '.join(sorted(known))}"
        )
    try:
        return cls(**data)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def convert(obj: Any, key: str, raw: str, source: str = "override") -> Any:
    """The string `raw` (a `--set` value) converted to the type of field `key` of `obj`."""
    by_name = {f.name: f for f in fields(obj)}
    if key not in by_name:
        raise ConfigError(
            f"{source}: unknown key {key!r}; known keys are {', '.join(sorted(by_name))}"
        )
    current = getattr(obj, key)
    if raw.lower() in ("none", "null") and (current is None or "None" in str(by_name[key].type)):
        return None
    try:
        if isinstance(current, bool):
            low = raw.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            value: Any = low in ("true", "1", "yes")
        elif isinstance(current, int):
            value = int(raw)
        elif isinstance(current, float):
            value = float(raw)
        elif current is None:
            value = _guess(raw)
        else:
            value = raw
    except ValueError:
        expected = _TYPE_RULES.get(type(current).__name__, (None, type(current).__name__))[1]
        raise ConfigError(f"{source}: {key} must be {expected}, got {raw!r}") from None
    return value


def _guess(raw: str) -> Any:
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


# ---------------------------------------------------------------------------------- training
SCHEDULES = ("warmup_cosine", "warmup_linear", "warmup_constant", "constant")
# Where training metrics go (gpt1.train.trackers): jsonl is metrics.jsonl, always written.
LOGGERS = ("jsonl", "tensorboard", "wandb", "mlflow")


@dataclass(frozen=True)
class TrainConfig:
    """The one training loop's settings (pretraining and fine-tuning share them).

    Defaults are the paper's pretraining recipe (reference a.8) except the batch geometry and
    length, which presets and commands set. The fields form four groups (kept in one flat class
    so that every saved run.json and trainer_state keeps loading as it was written):

    - length and batch: micro_batch_size, batch_size, max_steps, epochs, total_steps;
    - optimiser and schedule: lr, schedule, warmup, oai_first_step, weight_decay, beta1, beta2,
      eps, grad_clip, optimizer, seed;
    - runtime: precision, compile, gradient_checkpointing, distributed, device, loss_chunk_tokens;
    - checkpoints and telemetry: save_every, keep_last, eval_every, log_every, resume, peak_flops,
      quiet, loggers, tracker_project, mlflow_uri.

    `max_steps` means the same in every command: the run's length in optimizer updates, or 0 to
    derive it from `epochs` (pretraining: epochs over the training tokens; fine-tuning: OAI's
    `(n_train // batch_size) * epochs`).
    """

    micro_batch_size: int = 8  # sequences per forward/backward on one device
    batch_size: int = 64  # global batch; accumulation = batch / (micro * world)
    max_steps: int = 0  # optimizer updates; 0 = derive from `epochs` (pretraining)
    epochs: float = 100.0  # used only when max_steps == 0
    total_steps: int = (
        0  # schedule length; 0 = max_steps (set it to stop early on a longer schedule)
    )
    lr: float = 2.5e-4
    schedule: str = "warmup_cosine"
    warmup: float = 2000  # >= 1: steps; < 1: fraction of total_steps
    oai_first_step: bool = True  # schedule at the pre-increment step (OAI: first update has lr 0)
    weight_decay: float = 0.01  # L2 on matrices only (rank > 1), decoupled, OAI style
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0  # global-norm clipping; <= 0 disables
    optimizer: str = "oai"  # "oai": exact OAI Adam (reference a.8); "adamw": torch AdamW
    precision: str = "auto"  # "auto" | "fp32" | "bf16" (autocast); auto: gpt1.devices
    compile: bool = False
    gradient_checkpointing: bool = False
    distributed: str = "ddp"  # "ddp" | "fsdp" (FSDP2 fully_shard) when launched by torchrun
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    save_every: int = 1000
    keep_last: int = 3
    eval_every: int = 500
    log_every: int = 10
    seed: int = 1234
    resume: str = ""  # "" | "auto" | path to a step-N folder
    peak_flops: float = 0.0  # for MFU; 0 = known GPU table or a short matmul probe on CPU
    loss_chunk_tokens: int = 4096  # LM loss computed this many positions at a time
    quiet: bool = False
    # Experiment trackers besides metrics.jsonl (always written): comma-separated LOGGERS.
    loggers: str = "jsonl"
    tracker_project: str = "gpt1"  # W&B project and MLflow experiment name
    mlflow_uri: str = ""  # "" = MLFLOW_TRACKING_URI, else a SQLite store RUN/mlflow.db

    def __post_init__(self) -> None:
        check_types(self, "train")
        for name in ("micro_batch_size", "batch_size", "log_every"):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"train.{name} must be positive, got {getattr(self, name)!r}")
        for name in ("max_steps", "total_steps", "save_every", "eval_every", "keep_last"):
            if int(getattr(self, name)) < 0:
                raise ConfigError(f"train.{name} must be >= 0, got {getattr(self, name)!r}")
        check_seed(self.seed, "train.seed")
        if self.schedule not in SCHEDULES:
            raise ConfigError(
                f"train.schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        if self.optimizer not in ("oai", "adamw"):
            raise ConfigError(f"train.optimizer must be 'oai' or 'adamw', got {self.optimizer!r}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ConfigError(f"train.precision must be auto, fp32 or bf16, got {self.precision!r}")
        if self.distributed not in ("ddp", "fsdp"):
            raise ConfigError(
                f"train.distributed must be 'ddp' or 'fsdp', got {self.distributed!r}"
            )
        if self.device not in ("auto", "cpu", "cuda") and not re.fullmatch(
            r"cuda:\d+", self.device
        ):
            raise ConfigError(
                f"train.device must be auto, cpu, cuda or cuda:N, got {self.device!r}"
            )
        if self.lr < 0 or self.warmup < 0 or self.epochs < 0:
            raise ConfigError("train.lr, train.warmup and train.epochs must be >= 0")
        unknown = [n for n in self.loggers.split(",") if n.strip().lower() not in ("", *LOGGERS)]
        if unknown:
            raise ConfigError(
                f"train.loggers: unknown logger {unknown[0].strip()!r}; choose from "
                f"{', '.join(LOGGERS)}"
            )


@dataclass(frozen=True)
class DataConfig:
    """Where pretraining tokens come from and how windows are cut."""

    path: str = (
        ""  # a `gpt1 prepare` output folder, or .txt/.jsonl/.parquet files (file, folder, glob)
    )
    n_ctx: int = 0  # window length; 0 = model.n_positions
    val_windows: int = 64  # fixed validation set: this many evenly spaced windows (0 = all)
    # random: windows at random offsets (prepared folders only); sequential: consecutive windows
    # of the token stream in document order; auto: random for a prepared folder, else sequential
    order: str = "auto"
    # Text files read directly (tokenized while training), as `gpt1 prepare` reads them:
    tokenizer: str = ""  # tokenizer folder (vocab.json + merges.txt or the original files)
    text_field: str = "text"  # the .jsonl / .parquet field holding a document
    doc_sep: str = ""  # "": a .txt file is one document; blank-line, line or a literal string
    strip_gutenberg: bool = False
    workers: int = 1  # tokenizing processes per rank (1: the training process itself)

    def __post_init__(self) -> None:
        check_types(self, "data")
        if self.n_ctx < 0 or self.val_windows < 0:
            raise ConfigError("data.n_ctx and data.val_windows must be >= 0")
        if self.workers < 1:
            raise ConfigError(f"data.workers must be >= 1, got {self.workers}")
        if self.order not in ("auto", "random", "sequential"):
            raise ConfigError(f"data.order must be auto, random or sequential, got {self.order!r}")


@dataclass(frozen=True)
class RunConfig:
    """A whole pretraining run: model, training loop and data sections."""

    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> RunConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a table of settings")
        unknown = sorted(set(data) - {"model", "train", "data"})
        if unknown:
            raise ConfigError(
                f"{source}: unknown section(s) {', '.join(unknown)}; "
                "known sections are model, train, data"
            )
        return cls(
            model=ModelConfig.from_dict(data.get("model", {}), f"{source} [model]"),
            train=from_dict(TrainConfig, data.get("train", {}), f"{source} [train]"),
            data=from_dict(DataConfig, data.get("data", {}), f"{source} [data]"),
        )


# Pretraining presets: the model preset of the same name plus a training recipe.
PRETRAIN_PRESETS: dict[str, dict[str, Any]] = {
    # The paper (reference a.8): 64 x 512 tokens, lr 2.5e-4, 2000 warm-up updates from 0, cosine
    # to 0, 100 epochs, dropout 0.1, L2 0.01 on matrices.
    "gpt1": {
        "train": {
            "batch_size": 64,
            "micro_batch_size": 8,
            "lr": 2.5e-4,
            "warmup": 2000,
            "schedule": "warmup_cosine",
            "epochs": 100.0,
        },
        "data": {"n_ctx": 512},
    },
    # CPU-sized: about an hour on a small corpus.
    "mini": {
        "train": {
            "batch_size": 32,
            "micro_batch_size": 8,
            "lr": 6e-4,
            "warmup": 100,
            "schedule": "warmup_cosine",
            "epochs": 2.0,
            "save_every": 200,
            "eval_every": 100,
            "log_every": 10,
        },
        "data": {"n_ctx": 128, "val_windows": 128},
    },
    # Tests and smoke runs.
    "tiny": {
        "train": {
            "batch_size": 4,
            "micro_batch_size": 2,
            "lr": 1e-3,
            "warmup": 2,
            "schedule": "warmup_cosine",
            "max_steps": 20,
            "save_every": 10,
            "eval_every": 10,
            "log_every": 1,
        },
        "data": {"n_ctx": 32, "val_windows": 8},
    },
}


def run_preset(name: str) -> RunConfig:
    """The RunConfig of a pretraining preset (model preset + recipe)."""
    return resolve_pretrain(preset=name)


# ---------------------------------------------------------------------------------- resolver
def load_toml(path: Any) -> dict[str, Any]:
    """A TOML settings file as a table; unreadable or invalid files are ConfigErrors naming it."""
    from pathlib import Path

    import tomllib

    path = Path(path)
    if path.exists() and not path.is_file():  # a device such as /dev/zero reads forever
        raise ConfigError(f"{path}: not a file")
    try:
        return tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from None


Layer = dict[str, dict[str, Any]]  # {section: {key: value}}


def _check_layer(table: Any, defaults: dict[str, Any], source: str) -> Layer:
    """A TOML/flags table checked against the sections' fields (unknown names are errors)."""
    known_sections = ", ".join(defaults)
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: expected tables {', '.join(f'[{s}]' for s in defaults)}")
    for section, values in table.items():
        if section not in defaults:
            raise ConfigError(f"{source}: unknown section [{section}]; known: {known_sections}")
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [{section}] must be a table")
        known = {f.name for f in fields(defaults[section])}
        for key in values:
            if key not in known:
                raise ConfigError(
                    f"{source}: unknown key {section}.{key}; known keys are "
                    f"{', '.join(sorted(known))}"
                )
    return table


def _parse_sets(sets: list[str], defaults: dict[str, Any], source: str = "--set") -> Layer:
    """`section.key=value` strings as a layer, each value converted to its field's type."""
    layer: Layer = {}
    for assignment in sets:
        dotted, sep, raw = assignment.partition("=")
        section, dot, key = dotted.strip().partition(".")
        if not sep or not dot:
            raise ConfigError(
                f"{source}: expected section.key=value "
                f"({' or '.join(s + '.KEY=VALUE' for s in defaults)}), "
                f"got {assignment!r}"
            )
        if section not in defaults:
            raise ConfigError(
                f"{source}: unknown section {section!r}; known: {', '.join(defaults)}"
            )
        value = convert(defaults[section], key.strip(), raw.strip(), f"{source} {section}")
        layer.setdefault(section, {})[key.strip()] = value
    return layer


def resolve(
    base: dict[str, tuple[type, dict[str, Any]]], layers: list[tuple[str, Layer]]
) -> dict[str, Any]:
    """The one resolution rule: each section's `base` settings, then each (source, layer) in
    order, later values winning (a None value means "not given", except from `--set`, where
    `KEY=none` restores the field's derived default); every section is built, and so validated,
    after each layer, errors naming the layer's source. Returns {section: frozen config}.

    Derived sizes follow their source: a model's n_inner is 4 * n_embd unless a layer (not the
    preset) sets n_inner explicitly; head size is always n_embd // n_head.
    """
    settings = {name: dict(values) for name, (_, values) in base.items()}
    explicit: set[tuple[str, str]] = set()
    built: dict[str, Any] = {}
    for source, layer in [("defaults", {}), *layers]:
        for section, values in layer.items():
            for key, value in values.items():
                if value is None and source != "--set":
                    continue  # a flag that was not given
                settings[section][key] = value
                if value is None:
                    explicit.discard((section, key))  # --set KEY=none: back to the derived value
                else:
                    explicit.add((section, key))
        if ("model", "n_inner") not in explicit and "model" in settings:
            settings["model"]["n_inner"] = None  # follows n_embd
        for name, (cls, _) in base.items():
            try:
                built[name] = cls(**settings[name])
            except ConfigError as exc:
                raise ConfigError(f"{source}: {exc}") from None
    return built


def _model_defaults(preset: str) -> dict[str, Any]:
    if preset not in MODEL_PRESET_SETTINGS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(MODEL_PRESETS)}")
    return {**dataclasses.asdict(ModelConfig()), **MODEL_PRESET_SETTINGS[preset], "n_inner": None}


def resolve_pretrain(
    preset: str | None = None,
    toml: dict[str, Any] | None = None,
    flags: Layer | None = None,
    sets: list[str] | None = None,
    toml_source: str = "config",
) -> RunConfig:
    """A pretraining run's frozen RunConfig: preset (model + recipe; the argument, else the
    TOML's `preset` key, else gpt1) -> `toml` (a parsed table: [model] [train] [data]) ->
    `flags` ({section: {key: value}}, None values skipped) -> `sets` ("section.key=value")."""
    table = dict(toml or {})
    name = preset or table.pop("preset", None) or "gpt1"
    table.pop("preset", None)
    if name not in PRETRAIN_PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRETRAIN_PRESETS)}")
    recipe = PRETRAIN_PRESETS[name]
    base = {
        "model": (ModelConfig, _model_defaults(name)),
        "train": (TrainConfig, {**dataclasses.asdict(TrainConfig()), **recipe.get("train", {})}),
        "data": (DataConfig, {**dataclasses.asdict(DataConfig()), **recipe.get("data", {})}),
    }
    defaults = {"model": MODEL_PRESETS[name], "train": TrainConfig(), "data": DataConfig()}
    layers = [
        (toml_source, _check_layer(table, defaults, toml_source)),
        ("command line", _check_layer(flags or {}, defaults, "command line")),
        ("--set", _parse_sets(sets or [], defaults)),
    ]
    built = resolve(base, layers)
    return RunConfig(model=built["model"], train=built["train"], data=built["data"])


def resolve_finetune(
    toml: dict[str, Any] | None = None,
    flags: Layer | None = None,
    sets: list[str] | None = None,
    toml_source: str = "config",
    require_run: bool = True,
) -> tuple[FinetuneConfig, TrainConfig]:
    """A fine-tuning run's frozen (FinetuneConfig, TrainConfig): the paper's recipe
    (`FINETUNE_TRAIN`) -> `toml` ([finetune] [train]) -> `flags` -> `sets`, by the same rule as
    `resolve_pretrain`. With `require_run`, task, data and init must be given."""
    base = {
        "finetune": (FinetuneConfig, dataclasses.asdict(FinetuneConfig())),
        "train": (TrainConfig, {**dataclasses.asdict(TrainConfig()), **FINETUNE_TRAIN}),
    }
    defaults = {"finetune": FinetuneConfig(), "train": TrainConfig(**FINETUNE_TRAIN)}
    layers = [
        (toml_source, _check_layer(toml or {}, defaults, toml_source)),
        ("command line", _check_layer(flags or {}, defaults, "command line")),
        ("--set", _parse_sets(sets or [], defaults)),
    ]
    built = resolve(base, layers)
    cfg, train_cfg = built["finetune"], built["train"]
    if require_run:
        if not cfg.task or not cfg.data:
            raise ConfigError("--task and --data are required")
        if not cfg.init:
            raise ConfigError("--init CHECKPOINT|none is required")
    return cfg, train_cfg


def override_dotted(cfg: RunConfig, assignment: str, source: str = "--set") -> RunConfig:
    """`cfg` with one `section.key=value` applied (a new, validated RunConfig)."""
    defaults = {"model": cfg.model, "train": cfg.train, "data": cfg.data}
    layer = _parse_sets([assignment], defaults, source)
    base = {
        "model": (ModelConfig, dataclasses.asdict(cfg.model)),
        "train": (TrainConfig, dataclasses.asdict(cfg.train)),
        "data": (DataConfig, dataclasses.asdict(cfg.data)),
    }
    if cfg.model.n_inner != 4 * cfg.model.n_embd:
        layer = {**layer, "model": {"n_inner": cfg.model.n_inner, **layer.get("model", {})}}
    built = resolve(base, [(source, layer)])
    return RunConfig(model=built["model"], train=built["train"], data=built["data"])


__all__ = [
    "ModelConfig",
    "MODEL_PRESETS",
    "model_preset",
    "from_dict",
    "convert",
    "field",
    "TrainConfig",
    "DataConfig",
    "RunConfig",
    "PRETRAIN_PRESETS",
    "run_preset",
    "resolve",
    "resolve_pretrain",
    "resolve_finetune",
    "override_dotted",
    "load_toml",
]


# ------------------------------------------------------------------------------- fine-tuning
@dataclass(frozen=True)
class FinetuneConfig:
    """What a fine-tuning run adds to the model and training sections (reference a.6, a.7, a.10).

    The paper's recipe lives in `FINETUNE_TRAIN`: lr 6.25e-5, batch 32, 3 epochs, warm-up over
    0.2% of training then linear decay, the same Adam, L2 and clipping as pretraining.
    """

    task: str = ""
    data: str = ""  # folder (or file, or hf:NAME) with the task's files
    init: str = ""  # checkpoint folder, or "none" (train from scratch)
    preset: str = "mini"  # model size with init = "none"
    vocab: str = ""  # tokenizer folder with init = "none"
    lm_coef: float = 0.5  # lambda for the auxiliary LM loss; 0 drops it
    transfer_layers: int = -2  # blocks taken from the checkpoint: -2 = all, -1 = nothing
    clf_pdrop: float = 0.1
    n_ctx: int = 0  # 0 = the model's n_positions
    train_split: str = "train"
    eval_split: str = "dev"
    skip_bad_rows: bool = False
    question_delimiter: bool = (
        False  # multiple choice: also a delimiter between context and question
    )
    encode_processes: int = 1
    train_examples: int = 0  # train on a seeded random subset of this size (0 = all)
    group_by_length: bool = False  # batches of similar length (less padding; not OAI's shuffle)

    def __post_init__(self) -> None:
        check_types(self, "finetune")
        if self.lm_coef < 0:
            raise ConfigError(f"finetune.lm_coef must be >= 0, got {self.lm_coef}")
        if self.transfer_layers < -2:
            raise ConfigError(
                "finetune.transfer_layers must be -1 (nothing), 0..n_layer, or -2 (all)"
            )
        if not 0.0 <= self.clf_pdrop < 1.0:
            raise ConfigError(f"finetune.clf_pdrop must be in [0, 1), got {self.clf_pdrop}")


# The paper's fine-tuning recipe (reference a.8, a.10) for the shared training loop.
FINETUNE_TRAIN: dict[str, Any] = {
    "lr": 6.25e-5,
    "batch_size": 32,
    "micro_batch_size": 8,
    "epochs": 3.0,
    "warmup": 0.002,
    "schedule": "warmup_linear",
    "save_every": 0,
    "eval_every": 0,
    "log_every": 10,
    "seed": 42,
}


# ------------------------------------------------------------------ fine-tuned task record
class TaskKind(str, Enum):
    """A fine-tuned task's kind: which of the paper's input transformations (Figure 1) its
    examples take and which head reads them. The one definition: task readers, heads, task
    records and exports all name kinds by these values (a member equals its string)."""

    SINGLE = "single"  # one text: classification
    PAIR = "pair"  # two texts with a delimiter: entailment
    SIMILARITY = "similarity"  # two texts in both orders, summed
    CHOICE = "choice"  # a context and each answer, a softmax over the answers

    __str__ = str.__str__  # messages and JSON show the value, never `TaskKind.PAIR`
    __format__ = str.__format__


TASK_KINDS = tuple(kind.value for kind in TaskKind)
MAX_OUTPUTS = 2**20  # classes of one head; far beyond any task, far below a runaway head


def check_task_record(record: Any, source: str) -> dict[str, Any]:
    """Validate a fine-tuned run's `task.json` (types, ranges and agreement between fields)
    before anything is sized from it. Returns the record."""

    def fail(field_name: str, expected: str) -> None:
        value = record.get(field_name) if isinstance(record, dict) else None
        raise ConfigError(f"{source}: {field_name} must be {expected}, got {value!r}")

    if not isinstance(record, dict):
        raise ConfigError(f"{source}: expected a JSON object")
    if type(record.get("task")) is not str or not record["task"]:
        fail("task", "a task name")
    if record.get("kind") not in TASK_KINDS:
        fail("kind", " or ".join(TASK_KINDS))
    labels = record.get("labels")
    if labels is not None and not (
        isinstance(labels, list) and labels and all(type(x) is str for x in labels)
    ):
        fail("labels", "a non-empty list of strings or null")
    n_out = record.get("n_outputs")
    if not is_int(n_out) or not 1 <= n_out <= MAX_OUTPUTS:
        fail("n_outputs", f"an integer in 1..{MAX_OUTPUTS:,}")
    want = 1 if record["kind"] == TaskKind.CHOICE or labels is None else len(labels)
    if "labels" in record and n_out != want:
        fail("n_outputs", f"{want} (from kind and labels)")
    for name, limit in (
        ("n_ctx", MODEL_LIMITS["n_positions"]),
        ("classify_id", MODEL_LIMITS["vocab_size"]),
    ):
        value = record.get(name)
        low = 1 if name == "n_ctx" else 0
        if not is_int(value) or not low <= value <= limit:
            fail(name, f"an integer in {low}..{limit:,}")
    pdrop = record.get("clf_pdrop", 0.1)
    if not is_number(pdrop) or not 0.0 <= pdrop < 1.0:
        fail("clf_pdrop", "a number in [0, 1)")
    if type(record.get("question_delimiter", False)) is not bool:
        fail("question_delimiter", "true or false")
    if record.get("spec") is not None and not isinstance(record["spec"], dict):
        fail("spec", "a table or null")
    return record
