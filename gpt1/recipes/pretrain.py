"""`gpt1 pretrain`: the paper's language-model pretraining on a `gpt1 prepare` folder, or on text
files read and tokenized while training (`gpt1.text.stream`).

Configuration resolves in order: preset (model + recipe) -> TOML file -> command-line flags ->
`--set section.key=value`. The vocabulary size always comes from the prepared data (the tokenizer
it was made with). With `train.max_steps = 0` the run length is `epochs` passes over the training
tokens: ceil(epochs * train_tokens / (batch_size * n_ctx)) updates (the paper: 100 epochs).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gpt1.config import DataConfig, RunConfig, load_toml, resolve_pretrain
from gpt1.errors import ConfigError, Gpt1Error
from gpt1.files import folder_files
from gpt1.model.registry import build_model
from gpt1.text.stream import TextData, batch_source, find_text_files, open_data
from gpt1.text.windows import META, PreparedData, validation_windows
from gpt1.train import distributed as dist
from gpt1.train import resume
from gpt1.train import state as train_state
from gpt1.train.loop import TrainResult, train
from gpt1.train.objectives import WindowLMLoss, lm_loss_window
from gpt1.train.run import OpenedRun, RunSpec, open_run

log = logging.getLogger("gpt1.recipes.pretrain")
RUN_CONFIG = resume.RUN_JSON


def resolve_config(
    preset: str | None = None,
    config_file: str | Path | None = None,
    flags: dict[str, dict[str, Any]] | None = None,
    sets: list[str] | None = None,
) -> RunConfig:
    """Preset -> TOML file -> flags ({section: {key: value}}, None values skipped) -> `--set`
    strings: `gpt1.config.resolve_pretrain` with the TOML read from `config_file`."""
    table = load_toml(config_file) if config_file else {}
    return resolve_pretrain(preset, table, flags, sets, toml_source=str(config_file or "config"))


def finalize(cfg: RunConfig, data: PreparedData | TextData) -> RunConfig:
    """`cfg` completed from the data: vocab size (the tokenizer's), n_ctx (0 = n_positions) and
    run length (max_steps 0 = ceil(epochs * train_tokens / (batch_size * n_ctx)))."""
    n_ctx = cfg.data.n_ctx or cfg.model.n_positions
    if n_ctx > cfg.model.n_positions:
        raise ConfigError(
            f"data.n_ctx ({n_ctx}) exceeds model.n_positions ({cfg.model.n_positions})"
        )
    max_steps = cfg.train.max_steps
    if max_steps == 0:
        if isinstance(data, TextData):
            raise ConfigError(
                "set --max-steps: the length of text read directly is unknown until it is "
                "read (or encode it first with `gpt1 prepare`)"
            )
        tokens = data.splits["train"].tokens
        max_steps = max(1, math.ceil(cfg.train.epochs * tokens / (cfg.train.batch_size * n_ctx)))
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, vocab_size=data.vocab_size),
        data=dataclasses.replace(cfg.data, n_ctx=n_ctx),
        train=dataclasses.replace(cfg.train, max_steps=max_steps),
    )


def make_eval_fn(data: PreparedData, n_ctx: int, limit: int, micro: int, chunk: int) -> Any:
    """Validation loss and perplexity on a fixed set of windows, split evenly over ranks."""
    if "val" not in data.splits or data.splits["val"].tokens <= n_ctx:
        log.warning("no usable validation split in %s: evaluation is off", data.folder)
        return None
    windows = validation_windows(data.splits["val"], n_ctx, limit)
    info = dist.env_info()
    usable = len(windows) - len(windows) % info.world_size or len(windows)
    mine = windows[:usable][info.rank :: info.world_size]  # [n_mine, n_ctx + 1]

    def evaluate(model: Any) -> dict[str, float]:
        device = next(model.parameters()).device
        total = torch.zeros(2, dtype=torch.float64, device=device)  # [loss * count, count]
        for start in range(0, len(mine), micro):
            rows = mine[start : start + micro].to(device)
            loss = lm_loss_window(model, model(rows[:, :-1]), rows[:, 1:], chunk)
            count = rows[:, 1:].numel()
            total += torch.stack(
                [loss.double() * count, torch.tensor(count, device=device, dtype=torch.float64)]
            )
        dist.all_reduce_sum(total)
        val_loss = float(total[0] / total[1])
        return {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 700))}

    return evaluate


def pretrain(
    cfg: RunConfig,
    out: str | Path,
    arch: str = "gpt",
    overwrite: bool = False,
    command: str | None = None,
    inputs: Sequence[str | Path] = (),
) -> TrainResult:
    """Pretrain a GPT from scratch (or resume) on `cfg.data.path`; checkpoints go to `out`.

    `arch="lstm"` trains the paper's LSTM baseline instead (`gpt1.model.lstm.lstm_config_for(cfg.model)`,
    parameter-matched), with the identical data, objective and schedule. A non-empty `out` is
    continued only with `cfg.train.resume`, started over only with `overwrite` (the run is
    opened by `gpt1.train.run.open_run`); the folder stays locked while the run lasts. `out`
    may never be or hold an input: the data folder or its files, another run's checkpoint
    resumed from, or `inputs` (other files the caller read, such as its --config TOML). A
    resume may change only what `gpt1.train.resume.CHANGEABLE` lists, checked before anything
    is written. `command` is the command line recorded with the experiment-tracker runs
    (default: this process's).
    """
    out = Path(out)
    if not cfg.data.path:
        raise ConfigError(
            "no data: pass --data DIR (a `gpt1 prepare` output folder, or text files with "
            "--tokenizer DIR)"
        )
    data_files, roots = data_inputs(cfg.data)
    with open_run(
        out,
        cfg.train,
        overwrite=overwrite,
        inputs=[*data_files, *inputs],
        roots=roots,
        command=command,
    ) as opened:
        return _pretrain(cfg, opened, arch)


def _pretrain(cfg: RunConfig, run: OpenedRun, arch: str) -> TrainResult:
    """Read the data, check the run fits and may resume, build the model, and train it."""
    data = open_data(cfg.data)
    cfg = finalize(cfg, data)
    n_ctx = cfg.data.n_ctx
    info = dist.env_info()
    from gpt1.model.memory import ensure_training_fits

    # Sized from the configs alone, before run.json, the model or any optimizer state exist.
    ensure_training_fits(
        cfg.model, cfg.train, n_ctx, "pretrain config", run.device, world_size=info.world_size
    )
    resolved = cfg.to_dict()
    if arch != "gpt":
        resolved["arch"] = arch
    # Refuses a setting the run may not change; written as run.json by the trainer, once the
    # checkpoint, the data cursor, the batch arithmetic and the trackers have passed too.
    record = resume_record(cfg, resolved, arch, data, run)
    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
    model, model_flops, extra = build_model(cfg.model, arch, n_ctx)
    source = batch_source(data, cfg.data, n_ctx, cfg.train.seed, info.rank, info.world_size)
    eval_fn, tokenizer_dir = _evaluation(cfg, data)
    if info.is_main:
        _log_start(cfg, model.num_parameters(), run)
    spec = RunSpec(
        config=resolved,
        record=record,
        eval_fn=eval_fn,
        write_model=_writer(tokenizer_dir, resolved, extra),
        flops_per_token=model_flops,
    )
    try:
        result = train(
            model, WindowLMLoss(cfg.train.loss_chunk_tokens), source, cfg.train, run, spec
        )
    finally:
        # Every rank leaves the trainer's final barrier together and tears down at once (as
        # fine-tuning does); rank 0's plotting comes after, so no rank closes its process
        # group while another is still busy inside it.
        dist.destroy()
    if info.is_main and not (result.interrupted or result.already_finished):
        from gpt1.train.telemetry import METRICS, plot_run

        if (run.out / METRICS).is_file():  # a resume with no update left logs nothing to draw
            plot_run(run.out)
    return result


def _log_start(cfg: RunConfig, n_params: int, run: OpenedRun) -> None:
    log.info(
        "pretraining %s parameters for %d steps: batch %d x %d tokens, micro-batch %d, %s, out %s",
        f"{n_params:,}",
        cfg.train.max_steps,
        cfg.train.batch_size,
        cfg.data.n_ctx,
        cfg.train.micro_batch_size,
        run.precision,
        run.out,
    )


def _evaluation(cfg: RunConfig, data: PreparedData | TextData) -> tuple[Any, Path | None]:
    """(the trainer's eval_fn or None, the tokenizer folder checkpoints carry or None)."""
    if isinstance(data, TextData):  # no held-out split in a stream
        if cfg.train.eval_every:
            log.warning("text files read directly have no validation split: evaluation is off")
        eval_fn, tokenizer_dir = None, data.tokenizer_dir
    else:
        eval_fn = make_eval_fn(
            data,
            cfg.data.n_ctx,
            cfg.data.val_windows,
            cfg.train.micro_batch_size,
            cfg.train.loss_chunk_tokens,
        )
        tokenizer_dir = data.folder if (data.folder / "vocab.json").is_file() else None
    if tokenizer_dir is None:
        log.warning(
            "%s has no vocab.json/merges.txt: checkpoints will carry no tokenizer", data.folder
        )
    return eval_fn, tokenizer_dir


def data_inputs(data: DataConfig) -> tuple[list[Path], list[str]]:
    """What pretraining reads, for `gpt1.files.check_inputs`: a prepared folder's files, or the
    text files `--data` names and the --tokenizer folder's files; and the folders among them."""
    path = Path(data.path)
    if (path / META).is_file() or not data.tokenizer:
        return folder_files(path), [data.path]
    try:
        files = find_text_files(data.path)
    except Gpt1Error:  # reported, with its reason, when the data is opened
        files = []
    roots = [p for p in (data.path, data.tokenizer) if not any(c in p for c in "*?[")]
    return [*files, *folder_files(data.tokenizer)], roots


def resume_record(
    cfg: RunConfig,
    resolved: dict[str, Any],
    arch: str,
    data: PreparedData | TextData,
    run: OpenedRun,
) -> dict[str, Any]:
    """run.json's contents; on a resume, first refuse any setting the run may not change
    (`gpt1.train.resume`) and record the accepted changes."""
    checkpoint, out = run.resumed_from, run.out
    if checkpoint is None:
        return resolved
    recorded, source = resume.recorded_config(checkpoint, out / RUN_CONFIG)
    # A prepared folder may move (another path, another machine) where the checkpoint records the
    # digest of its tokens: the data cursor is then checked against the tokens themselves.
    moved = isinstance(data, PreparedData) and _records_tokens_digest(checkpoint)
    accepted = resume.changes(
        {"arch": "gpt", **recorded},
        {"arch": arch, **resolved},
        source,
        paths=frozenset({"data.path"}),
        also=frozenset({"data.path"}) if moved else frozenset(),
        origin={
            "model.vocab_size": f"vocab_size in {data.folder / META}"
            if isinstance(data, PreparedData)
            else f"the tokenizer in {data.tokenizer_dir}"
        },
    )
    return resume.run_record(resolved, checkpoint, out / RUN_CONFIG, accepted)


def _records_tokens_digest(checkpoint: Path) -> bool:
    """Whether `checkpoint`'s data cursor holds the digest of a prepared folder's tokens
    (`gpt1.text.windows.Split.digest`; checkpoints written before gpt1 recorded it do not)."""
    sources = train_state.read_trainer_json(checkpoint).get("sources")
    return (
        isinstance(sources, list)
        and bool(sources)
        and all(isinstance(s, dict) and isinstance(s.get("data"), str) for s in sources)
    )


def _writer(tokenizer_dir: Path | None, resolved: dict, extra: dict[str, Any]) -> Any:
    """The trainer's checkpoint writer: the model files, the tokenizer's, the resolved config,
    and `extra` (e.g. the arch)."""
    from gpt1.checkpoint_files import write_model_files

    def write(model: torch.nn.Module, folder: Path) -> None:
        write_model_files(folder, model, tokenizer_dir, {**extra, "run": resolved})

    return write
