"""The one training loop, shared by pretraining and fine-tuning.

`train(model, loss_fn, source, cfg, run_dir)` runs `cfg.max_steps` optimizer updates. Each update
accumulates `batch_size / (micro_batch_size * world_size)` micro-batches (DDP gradient sync only on
the last one), clips the global gradient norm, sets the scheduled learning rate (a pure function of
the step) and steps the optimizer. It logs, evaluates, and writes `RUN/step-N` checkpoints holding
everything needed for an exact resume: unwrapped weights, optimizer moments (safetensors), the step,
every rank's data cursor and RNG states (JSON + uint8 tensors; nothing is pickled).

`loss_fn(model, batch) -> (loss, info)` receives a view of the model: calling it runs the wrapped
(DDP / compiled) forward, and any other attribute (`lm_weight`, `lm_logits`, `config`, ...) comes
from the plain module. `info` is a dict of floats; its "tokens" entry feeds tokens/s and MFU.
"""

from __future__ import annotations

import contextlib
import errno
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from gpt1 import checkpoint_files as ckpt
from gpt1 import files, threads
from gpt1.config import TrainConfig
from gpt1.devices import TRAIN_PRECISIONS, resolve_device, resolve_precision
from gpt1.errors import CheckpointError, ConfigError, Gpt1Error
from gpt1.train import distributed as dist
from gpt1.train import state as train_state
from gpt1.train.optim import build_optimizer, lr_at, set_lr
from gpt1.train.parallelize import checkpoint_blocks
from gpt1.train.telemetry import MetricsLogger, memory_bytes, peak_flops, train_line, val_line
from gpt1.train.trackers import Trackers


class BatchSource(Protocol):
    """What the trainer pulls micro-batches from (one per rank)."""

    def next_batch(self, micro_batch_size: int) -> Any: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


class TrainingDiverged(Gpt1Error):
    """The loss or gradient norm became NaN/inf; nothing was saved after the last good checkpoint."""


class OutOfMemory(Gpt1Error):
    """A micro-batch did not fit in memory; the message names the flags that fix it."""


@dataclass
class TrainResult:
    step: int
    run_dir: Path
    final_dir: Path | None = None
    last_loss: float = float("nan")
    last_eval: dict[str, float] = field(default_factory=dict)
    interrupted: int = 0  # the signal number that stopped the run, 0 if it finished


class _ModelView:
    """Calls go through the wrapped module (DDP/compile); attributes come from the plain model."""

    def __init__(self, wrapped: nn.Module, raw: nn.Module):
        self.__dict__["_wrapped"], self.__dict__["_raw"] = wrapped, raw

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrapped(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def default_write_model(tokenizer_dir: Path | None, resolved: dict | None) -> Callable:
    def write(model: nn.Module, folder: Path) -> None:
        ckpt.write_model_files(
            folder, model, tokenizer_dir, {"run": resolved} if resolved else None
        )

    return write


def default_read_model(model: nn.Module, folder: Path) -> None:
    state = ckpt.load_state_dict(Path(folder) / ckpt.WEIGHTS)
    ckpt.check_state_dict(model, state, Path(folder) / ckpt.WEIGHTS)
    model.load_state_dict(state)


def _accumulation(cfg: TrainConfig, world: int) -> int:
    per_step = cfg.micro_batch_size * world
    if cfg.batch_size % per_step:
        raise ConfigError(
            f"train.batch_size ({cfg.batch_size}) must be a multiple of micro_batch_size"
            f" x processes ({cfg.micro_batch_size} x {world})"
        )
    return cfg.batch_size // per_step


def train(
    model: nn.Module,
    loss_fn: Callable[[Any, Any], tuple[torch.Tensor, dict]],
    source: BatchSource,
    cfg: TrainConfig,
    run_dir: Path,
    *,
    eval_fn: Callable[[Any], dict] | None = None,
    write_model: Callable[[nn.Module, Path], None] | None = None,
    read_model: Callable[[nn.Module, Path], None] | None = None,
    tokenizer_dir: Path | None = None,
    resolved_config: dict | None = None,
    flops_per_token: float | None = None,
    trackers: Trackers | None = None,
    command: str | None = None,
) -> TrainResult:
    """Train `model` for `cfg.max_steps` updates; see the module docstring.

    `trackers` (cfg.loggers) receive what metrics.jsonl receives; a caller that passes its own
    also closes it (fine-tuning adds its final results first), else the trainer closes them.
    `command` is the command line recorded with the tracker runs (default: this process's)."""
    if cfg.max_steps <= 0:
        raise ConfigError("train.max_steps must be set (> 0) before training")
    run_dir = Path(run_dir)
    owned = trackers is None
    if trackers is None:  # checks the trackers' packages now, before any work
        trackers = Trackers(
            run_dir,
            cfg.loggers,
            config=resolved_config,
            command=command,
            project=cfg.tracker_project,
            mlflow_uri=cfg.mlflow_uri,
        )
    device = resolve_device(cfg.device, local_rank=dist.env_info().local_rank)
    precision = resolve_precision(cfg.precision, device, TRAIN_PRECISIONS)
    info = dist.init(device.type)
    accum = _accumulation(cfg, info.world_size)
    total = cfg.total_steps or cfg.max_steps
    write_model = write_model or default_write_model(tokenizer_dir, resolved_config)
    read_model = read_model or default_read_model

    raw = model.to(device)
    if cfg.gradient_checkpointing:
        checkpoint_blocks(raw)
    resume_dir = train_state.resume_checkpoint(cfg.resume, run_dir)
    if resume_dir is not None:
        read_model(raw, resume_dir)
    wrapped = dist.wrap(raw, cfg.distributed, device)
    if cfg.compile:
        wrapped = torch.compile(wrapped)
    view = _ModelView(wrapped, raw)
    optimizer = build_optimizer(raw, cfg)

    torch.manual_seed(cfg.seed + 1000 * info.rank)  # dropout masks differ between ranks
    state = {"step": 0, "log": {"loss_sum": 0.0, "n": 0}}
    # One thread count for the whole run (and the one it started with, on a resume): the last
    # bits of the gradients depend on it, so following the machine's load would change them.
    recorded = train_state.recorded_threads(resume_dir) if resume_dir is not None else None
    run_threads = threads.pin_for_training(recorded)
    if resume_dir is not None:
        state = _load_state(
            resume_dir, raw, optimizer, source, info, device, fsdp=cfg.distributed == "fsdp"
        )
    state["threads"] = run_threads
    logger = MetricsLogger(
        run_dir,
        info.is_main,
        resume_step=state["step"] if resume_dir is not None else None,
        trackers=trackers,
    )
    if info.is_main and resume_dir is not None:
        logger.console(f"resuming from {resume_dir} at step {state['step']}")
    peak = peak_flops(device, precision, cfg.peak_flops) if info.is_main else 0.0
    if flops_per_token is None and hasattr(raw, "flops_per_token"):
        flops_per_token = raw.flops_per_token()  # gpt1.model.registry.LanguageModel; else no MFU

    def save(name: str) -> Path:
        return _save(
            run_dir / name,
            raw,
            optimizer,
            source,
            state,
            write_model,
            info,
            cfg,
            total,
            resolved_config,
        )

    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if precision == "bf16"
        else contextlib.nullcontext()
    )
    stop = {"signal": 0}
    outcome = "FAILED"
    previous = _install_handlers(stop)
    result = TrainResult(step=state["step"], run_dir=run_dir)
    bar = _progress(cfg, info.is_main, state["step"])
    logger.bar = bar
    try:
        wrapped.train()
        if eval_fn is not None and cfg.eval_every and state["step"] == 0:
            result.last_eval = _evaluate(wrapped, view, eval_fn, autocast, logger, 0)
        t_last, tokens_since = time.perf_counter(), 0.0
        while state["step"] < cfg.max_steps:
            step = state["step"]
            lr = lr_at(step, cfg, total)
            set_lr(optimizer, lr)
            loss_sum = torch.zeros((), device=device)
            tokens = 0.0
            parts: dict[str, float] = {}  # the loss's named terms (fine-tuning: task, LM)
            for i in range(accum):
                batch = to_device(source.next_batch(cfg.micro_batch_size), device)
                with dist.no_sync(wrapped, skip=i < accum - 1):
                    with autocast:
                        loss, extra = loss_fn(view, batch)
                    (loss / accum).backward()
                loss_sum += loss.detach().float()
                tokens += float(extra.get("tokens", 0.0))
                _add_parts(parts, extra)
            names = sorted(parts)
            stats = torch.tensor(
                [float(loss_sum) / accum, tokens, float(stop["signal"])]
                + [parts[k] / accum for k in names],
                dtype=torch.float64,
                device=device,
            )
            stats = dist.all_reduce_sum(stats)
            step_loss = float(stats[0]) / info.world_size
            _log_parts(state["log"], names, stats[3:].tolist(), info.world_size)
            grad_norm = _clip(raw, cfg.grad_clip)
            if not (math.isfinite(step_loss) and math.isfinite(grad_norm)):
                raise TrainingDiverged(_diverged_message(step + 1, step_loss, grad_norm, run_dir))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state["step"] = step = step + 1
            state["log"]["loss_sum"] += step_loss
            state["log"]["n"] += 1
            tokens_since += float(stats[1])
            result.last_loss = step_loss
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{step_loss:.3f}", refresh=False)
            if step % cfg.log_every == 0 or step == cfg.max_steps:
                now = time.perf_counter()
                rec = _train_record(
                    state,
                    step,
                    lr,
                    grad_norm,
                    tokens_since / (now - t_last),
                    flops_per_token,
                    peak,
                    info.world_size,
                    device,
                )
                logger.write(rec)
                logger.console(train_line(rec))
                t_last, tokens_since = now, 0.0
            if (
                eval_fn is not None
                and cfg.eval_every
                and (step % cfg.eval_every == 0 or step == cfg.max_steps)
            ):
                result.last_eval = _evaluate(wrapped, view, eval_fn, autocast, logger, step)
            signalled = int(float(stats[2]) > 0)
            if signalled or (cfg.save_every and step % cfg.save_every == 0):
                save(f"step-{step}")
            if signalled:
                result.interrupted = stop["signal"] or signal.SIGTERM
                logger.console(
                    f"stopped by signal {result.interrupted}; checkpoint "
                    f"{run_dir / f'step-{step}'} written"
                )
                break
        else:
            result.final_dir = save("final")
        result.step = state["step"]
        outcome = "KILLED" if result.interrupted else "FINISHED"
        return result
    except RuntimeError as exc:  # torch.OutOfMemoryError (CUDA) and CPU allocator failures
        if not _is_oom(exc):
            raise
        raise OutOfMemory(_oom_message(cfg, accum, info.world_size, exc)) from None
    finally:
        if bar is not None:
            bar.close()
        _restore_handlers(previous)
        if owned:
            trackers.close(outcome)


# ----------------------------------------------------------------------------- helpers
def _clip(model: nn.Module, max_norm: float) -> float:
    params = [p for p in model.parameters() if p.grad is not None]
    if max_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
    if hasattr(norm, "full_tensor"):  # DTensor under FSDP2
        norm = norm.full_tensor()
    return float(norm)


def _diverged_message(step: int, loss: float, grad_norm: float, run_dir: Path) -> str:
    last = train_state.latest_resumable(run_dir)
    where = f"the last good checkpoint is {last}" if last else "no checkpoint was written yet"
    return (
        f"training diverged at step {step}: loss {loss}, gradient norm {grad_norm}; stopped "
        f"without saving ({where}). Lower train.lr, raise warm-up, or use precision fp32."
    )


def _is_oom(exc: BaseException) -> bool:
    text = str(exc)
    return (
        isinstance(exc, torch.OutOfMemoryError)
        or "can't allocate memory" in text
        or "out of memory" in text.lower()
    )


def _oom_message(cfg: TrainConfig, accum: int, world: int, exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
    smaller = max(1, cfg.micro_batch_size // 2)
    return (
        f"out of memory with --micro-batch {cfg.micro_batch_size} ({first}). Lower "
        f"--micro-batch (e.g. {smaller}): gradient accumulation then rises from {accum} to "
        f"{cfg.batch_size // (smaller * world)} steps so --batch-size {cfg.batch_size} and the "
        "results stay the same; --precision bf16 or --set train.gradient_checkpointing=true "
        "also save memory."
    )


def _add_parts(parts: dict[str, float], extra: dict) -> None:
    """Sum a micro-batch's named loss terms (every float of `extra` but "tokens")."""
    for key, value in extra.items():
        if key != "tokens":
            parts[key] = parts.get(key, 0.0) + float(value)


def _log_parts(log: dict, names: list[str], totals: list[float], world: int) -> None:
    """Add one step's loss terms (summed over ranks) to the logging interval's sums."""
    sums = log.setdefault("parts", {})
    for key, total in zip(names, totals):
        sums[key] = sums.get(key, 0.0) + total / world


def _train_record(
    state: dict,
    step: int,
    lr: float,
    grad_norm: float,
    tok_s: float,
    fpt: float | None,
    peak: float,
    world: int,
    device: torch.device,
) -> dict:
    log = state["log"]
    n = max(log["n"], 1)
    loss = log["loss_sum"] / n
    parts = {k: v / n for k, v in (log.get("parts") or {}).items()}
    state["log"] = {"loss_sum": 0.0, "n": 0}
    mfu = (fpt * tok_s / (peak * world)) if (fpt and peak) else 0.0
    return {
        "step": step,
        "loss": loss,
        **parts,
        "lr": lr,
        "grad_norm": grad_norm,
        "tokens_per_s": tok_s,
        "mfu": mfu,
        "mem_gb": memory_bytes(device) / 1e9,
    }


def _evaluate(
    wrapped: nn.Module,
    view: Any,
    eval_fn: Callable,
    autocast: Any,
    logger: MetricsLogger,
    step: int,
) -> dict:
    wrapped.eval()
    try:
        with torch.no_grad(), autocast:
            res = {k: float(v) for k, v in eval_fn(view).items()}
    finally:
        wrapped.train()
    rec = {"step": step, **res}
    logger.write(rec)
    if "val_loss" in res:
        rec.setdefault("val_ppl", math.exp(min(res["val_loss"], 700)))
        logger.console(val_line(rec))
    else:
        logger.console(f"step {step:>6d} | " + " | ".join(f"{k} {v:.4f}" for k, v in res.items()))
    return res


def _progress(cfg: TrainConfig, main: bool, initial: int) -> Any:
    if not main or cfg.quiet:
        return None
    from tqdm.auto import tqdm

    return tqdm(
        total=cfg.max_steps,
        initial=initial,
        unit="step",
        dynamic_ncols=True,
        leave=False,
        desc="train",
    )


def _install_handlers(stop: dict) -> dict:
    def handler(signum: int, frame: Any) -> None:
        stop["signal"] = signum

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread: leave signals alone
            pass
    return previous


def _restore_handlers(previous: dict) -> None:
    for sig, old in previous.items():
        signal.signal(sig, old)


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    out = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def _save(
    final: Path,
    raw: nn.Module,
    optimizer: torch.optim.Optimizer,
    source: BatchSource,
    state: dict,
    write_model: Callable,
    info: dist.DistInfo,
    cfg: TrainConfig,
    total: int,
    resolved: dict | None,
) -> Path:
    """Write a resumable checkpoint atomically; every rank contributes its cursor and RNG."""
    per_rank = dist.all_gather_objects(
        {"source": source.state_dict(), "rng": _rng_state(next(raw.parameters()).device)}
    )
    model_for_files, opt_state = raw, optimizer.state_dict()
    if cfg.distributed == "fsdp" and info.enabled:
        model_for_files, opt_state = dist.full_state(raw, optimizer)
    if info.is_main:
        tensors, opt_meta = train_state.optimizer_to_flat(opt_state)
        for r, entry in enumerate(per_rank):
            for kind, t in entry["rng"].items():
                tensors[f"rng/{r}/{kind}"] = t.cpu()
        meta = {
            "format": "gpt1-trainer",
            "version": 1,
            "step": state["step"],
            "total_steps": total,
            "world_size": info.world_size,
            "sources": [e["source"] for e in per_rank],
            "log": state["log"],
            "threads": state["threads"],
            "optimizer": opt_meta,
            "config": resolved,
        }
        needed = ckpt.state_bytes(model_for_files.state_dict()) + ckpt.state_bytes(tensors)
        try:
            with files.atomic_folder(final, needed=needed) as tmp:
                write_model(model_for_files, tmp)
                train_state.save_training_state(tmp, tensors, meta)
        except files.WriteError as exc:  # disk full, quota, read-only: older checkpoints untouched
            last = train_state.latest_resumable(final.parent)
            fix = (
                "Free space"
                if exc.errno in (errno.ENOSPC, errno.EDQUOT)
                else "Make the folder writable"
                if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
                else "Fix the disk"
            )
            raise CheckpointError(
                f"{exc}; "
                + (
                    f"the last complete checkpoint {last} is intact"
                    if last
                    else "no earlier checkpoint exists"
                )
                + f". {fix}, then rerun with --resume auto"
            ) from None
        if final.name.startswith("step-"):
            train_state.prune_steps(final.parent, cfg.keep_last)
    dist.barrier()
    return final


def _load_state(
    folder: Path,
    raw: nn.Module,
    optimizer: torch.optim.Optimizer,
    source: BatchSource,
    info: dist.DistInfo,
    device: torch.device,
    fsdp: bool,
) -> dict:
    tensors, meta = train_state.load_training_state(folder)
    try:
        return _restore(tensors, meta, raw, optimizer, source, info, device, fsdp)
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
        # A hand-edited or foreign trainer state must not surface as a bare KeyError.
        raise CheckpointError(
            f"{folder}: trainer state does not fit this run ({type(exc).__name__}: "
            f"{exc}); resume from another checkpoint or start a new --out"
        ) from None


def _restore(
    tensors: dict,
    meta: dict,
    raw: nn.Module,
    optimizer: torch.optim.Optimizer,
    source: BatchSource,
    info: dist.DistInfo,
    device: torch.device,
    fsdp: bool,
) -> dict:
    opt_state = train_state.optimizer_from_flat(tensors, meta["optimizer"])
    if fsdp and info.enabled:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        set_optimizer_state_dict(
            raw, optimizer, opt_state, options=StateDictOptions(full_state_dict=True)
        )
    else:
        optimizer.load_state_dict(opt_state)
    rank = info.rank
    sources = meta["sources"]
    source.load_state_dict(sources[rank] if rank < len(sources) else sources[0])
    r = rank if f"rng/{rank}/cpu" in tensors else 0
    torch.set_rng_state(tensors[f"rng/{r}/cpu"])
    if device.type == "cuda" and f"rng/{r}/cuda" in tensors:
        torch.cuda.set_rng_state(tensors[f"rng/{r}/cuda"], device)
    return {"step": int(meta["step"]), "log": dict(meta.get("log") or {"loss_sum": 0.0, "n": 0})}
