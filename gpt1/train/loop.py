"""The one training loop, shared by pretraining and fine-tuning.

`train(model, loss_fn, source, cfg, run)` runs `cfg.max_steps` optimizer updates in the run opened
by `gpt1.train.run.open_run` (or in a folder, opened there). Each update
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
import logging
import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from gpt1 import checkpoint_files as ckpt
from gpt1 import files
from gpt1.config import TrainConfig
from gpt1.errors import CheckpointError, ConfigError, Gpt1Error
from gpt1.train import distributed as dist
from gpt1.train import state as train_state
from gpt1.train.optim import build_optimizer, lr_at, set_lr
from gpt1.train.parallelize import checkpoint_blocks
from gpt1.train.resume import RUN_JSON
from gpt1.train.run import OpenedRun, RunSpec, open_run
from gpt1.train.telemetry import MetricsLogger, memory_bytes, peak_flops, train_line, val_line
from gpt1.train.trackers import Trackers

log = logging.getLogger("gpt1.train")


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
    already_finished: bool = False  # resumed at its last step: nothing trained, nothing written


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


def default_write_model(resolved: dict | None) -> Callable:
    """The checkpoint writer of a run whose recipe gives none: the model's files, with the
    resolved settings (`RunSpec.config`) under "run"."""

    def write(model: nn.Module, folder: Path) -> None:
        ckpt.write_model_files(folder, model, None, {"run": resolved} if resolved else None)

    return write


def default_read_model(model: nn.Module, folder: Path) -> None:
    model.load_state_dict(ckpt.load_state_dict(Path(folder) / ckpt.WEIGHTS, expect=model))


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
    run: OpenedRun | str | Path,
    spec: RunSpec | None = None,
) -> TrainResult:
    """Train `model` for `cfg.max_steps` updates; see the module docstring.

    `run` is the run opened by the recipe (`gpt1.train.run.open_run`: its folder, the
    checkpoint resumed from, device, precision, threads and trackers, decided once), which the
    caller closes; or a folder, for which the trainer opens a run itself without claiming it
    (a program that manages its folder) and closes it when it returns. `spec` holds what the
    recipe decided from its data and model (`RunSpec`). Its `record` is written as
    RUN/run.json (`gpt1.train.resume.RUN_JSON`) once every check of the run has passed: the
    batch arithmetic, and on a resume the checkpoint's weights, optimizer state and data
    cursor (checked against the data) restored, and the trackers started. Nothing in the run
    folder is written before, so a refused run or resume leaves the folder as it was."""
    if cfg.max_steps <= 0:
        raise ConfigError("train.max_steps must be set (> 0) before training")
    spec = spec or RunSpec()
    if not isinstance(run, OpenedRun):
        with open_run(run, cfg, claim=False) as opened:
            return _train(model, loss_fn, source, cfg, opened, spec)
    return _train(model, loss_fn, source, cfg, run, spec)


def _train(
    model: nn.Module,
    loss_fn: Callable[[Any, Any], tuple[torch.Tensor, dict]],
    source: BatchSource,
    cfg: TrainConfig,
    opened: OpenedRun,
    spec: RunSpec,
) -> TrainResult:
    """`train` in an opened run; sets `opened.outcome` when it returns."""
    trackers, run_dir = opened.trackers, opened.out
    if spec.config is not None:
        trackers.config = spec.config
    run = _Run(model, source, cfg, opened, spec)
    final = run_dir / "final"
    if run.resumed_from is not None and run.state["step"] == cfg.max_steps and final.is_dir():
        # A finished run resumed again (`--resume auto` run twice): nothing to train, and its
        # final model and records stay as they are.
        opened.outcome = "FINISHED"
        if run.info.is_main:
            log.info("%s: already trained to step %d; nothing to do", run_dir, cfg.max_steps)
        return TrainResult(cfg.max_steps, run_dir, final_dir=final, already_finished=True)
    # A new run refused in its first update (text that cannot be read, out of memory) removes
    # what it wrote, so that the same command can run again in the same --out.
    existed = opened.found
    meter = _meter(run, trackers, spec.flops_per_token)  # starts the trackers, then metrics.jsonl
    if spec.record is not None and run.info.is_main:
        files.write_json(run_dir / RUN_JSON, spec.record)
    stop = {"signal": 0}
    previous = _install_handlers(stop)
    try:
        with _out_of_memory_said(run):
            result = _run_updates(run, loss_fn, spec.eval_fn, meter, stop)
        opened.outcome = "KILLED" if result.interrupted else "FINISHED"
        return result
    except Gpt1Error:
        if existed is not None and run.state["step"] == 0:  # nothing trained: nothing to keep
            trackers.close("FAILED")
            files.remove_new(run_dir, existed)
        raise
    finally:
        if meter.logger.bar is not None:
            meter.logger.bar.close()
        _restore_handlers(previous)


@contextlib.contextmanager
def _out_of_memory_said(run: _Run) -> Iterator[None]:
    """A failed allocation inside the block raised as `OutOfMemory`, saying what to change."""
    try:
        yield
    except RuntimeError as exc:  # torch.OutOfMemoryError (CUDA) and CPU allocator failures
        if not _is_oom(exc):
            raise
        raise OutOfMemory(_oom_message(run.cfg, run.accum, run.info.world_size, exc)) from None


class _Run:
    """What one call of `train` works with: the model (plain, wrapped, and the view `loss_fn`
    receives), its optimizer and data, where it runs, and the resumable state. Building it
    places, wraps and (on a resume) restores the model, optimizer, data cursor and RNG."""

    def __init__(
        self,
        model: nn.Module,
        source: BatchSource,
        cfg: TrainConfig,
        opened: OpenedRun,
        spec: RunSpec,
    ):
        self.cfg, self.run_dir, self.source = cfg, opened.out, source
        self.resolved = spec.config
        self.write_model = spec.write_model or default_write_model(spec.config)
        # Decided once, when the run was opened.
        self.device = device = opened.device
        self.precision, self.threads = opened.precision, opened.threads
        self.resumed_from = opened.resumed_from
        self.info = info = dist.init(device.type)
        self.accum = _accumulation(cfg, info.world_size)  # micro-batches per update and rank
        self.total = cfg.total_steps or cfg.max_steps  # the schedule's length
        self.raw = raw = model.to(device)
        if cfg.gradient_checkpointing:
            checkpoint_blocks(raw)
        if self.resumed_from is not None:
            (spec.read_model or default_read_model)(raw, self.resumed_from)
        self.wrapped = dist.wrap(raw, cfg.distributed, device)
        if cfg.compile:
            self.wrapped = torch.compile(self.wrapped)
        self.view = _ModelView(self.wrapped, raw)
        self.optimizer = build_optimizer(raw, cfg)
        self.state = self._initial_state()  # what a checkpoint records besides the tensors

    def _initial_state(self) -> dict:
        """Step 0, or the step (and logging sums) of the checkpoint resumed from, whose
        optimizer moments, data cursor and RNG states are restored; and the thread count."""
        cfg, info = self.cfg, self.info
        torch.manual_seed(cfg.seed + 1000 * info.rank)  # dropout masks differ between ranks
        state = {"step": 0, "log": {"loss_sum": 0.0, "n": 0}}
        resumed = self.resumed_from
        if resumed is not None:
            fsdp = cfg.distributed == "fsdp"
            state = _load_state(
                resumed, self.raw, self.optimizer, self.source, info, self.device, fsdp=fsdp
            )
            if state["step"] > cfg.max_steps:  # would rewrite final/ with an earlier model
                raise ConfigError(
                    f"{resumed} is at step {state['step']}, past this run's length of "
                    f"{cfg.max_steps} updates (train.max_steps); resume with a length of at "
                    f"least {state['step']}, or from an earlier checkpoint"
                )
        # The count fixed when the run was opened (on a resume, the one it started with).
        state["threads"] = self.threads
        return state

    def save(self, name: str) -> Path:
        return _save(self, self.run_dir / name)


@dataclass
class _Meter:
    """Where progress goes: metrics.jsonl and the trackers, the console, the progress bar; and
    what tokens/s and MFU are measured against."""

    logger: MetricsLogger  # its `bar`: tqdm, or None when quiet or not the main process
    peak: float
    flops_per_token: float | None
    since: float = 0.0
    tokens: float = 0.0  # processed by all ranks since `since`

    def start(self) -> None:
        self.since, self.tokens = time.perf_counter(), 0.0

    def tokens_per_s(self) -> float:
        """Tokens/s since the last call (or the start), and start a new interval."""
        now = time.perf_counter()
        rate = self.tokens / (now - self.since)
        self.since, self.tokens = now, 0.0
        return rate


def _meter(run: _Run, trackers: Trackers, flops_per_token: float | None) -> _Meter:
    info, step = run.info, run.state["step"]
    logger = MetricsLogger(
        run.run_dir,
        info.is_main,
        resume_step=step if run.resumed_from is not None else None,
        trackers=trackers,
    )
    if info.is_main and run.resumed_from is not None:
        logger.console(f"resuming from {run.resumed_from} at step {step}")
    peak = peak_flops(run.device, run.precision, run.cfg.peak_flops) if info.is_main else 0.0
    if flops_per_token is None and hasattr(run.raw, "flops_per_token"):
        # gpt1.model.registry.LanguageModel; any other model trains without an MFU figure
        flops_per_token = run.raw.flops_per_token()
    logger.bar = _progress(run.cfg, info.is_main, step)  # console lines print above it
    return _Meter(logger, peak, flops_per_token)


@dataclass
class _Update:
    """What one optimizer update did (the loss and token count summed over ranks)."""

    step: int  # the update's number, counting from 1
    lr: float
    loss: float
    grad_norm: float
    tokens: float
    signalled: bool  # some rank received SIGINT/SIGTERM: checkpoint and stop


def _run_updates(
    run: _Run,
    loss_fn: Callable[[Any, Any], tuple[torch.Tensor, dict]],
    eval_fn: Callable[[Any], dict] | None,
    meter: _Meter,
    stop: dict,
) -> TrainResult:
    """Update until `cfg.max_steps` (then save `final`) or a signal (then save `step-N`)."""
    cfg, logger = run.cfg, meter.logger
    autocast = (
        torch.autocast(run.device.type, dtype=torch.bfloat16)
        if run.precision == "bf16"
        else contextlib.nullcontext()
    )
    result = TrainResult(step=run.state["step"], run_dir=run.run_dir)
    run.wrapped.train()
    if eval_fn is not None and cfg.eval_every and run.state["step"] == 0:
        result.last_eval = _evaluate(run.wrapped, run.view, eval_fn, autocast, logger, 0)
    meter.start()
    while run.state["step"] < cfg.max_steps:
        update = _update(run, loss_fn, autocast, stop)
        step = update.step
        meter.tokens += update.tokens
        result.last_loss = update.loss
        if logger.bar is not None:
            logger.bar.update(1)
            logger.bar.set_postfix(loss=f"{update.loss:.3f}", refresh=False)
        if step % cfg.log_every == 0 or step == cfg.max_steps:
            _log_update(run, meter, update)
        if eval_fn is not None and _due(step, cfg.eval_every, cfg.max_steps):
            result.last_eval = _evaluate(run.wrapped, run.view, eval_fn, autocast, logger, step)
        if update.signalled or (cfg.save_every and step % cfg.save_every == 0):
            run.save(f"step-{step}")
        if update.signalled:
            result.interrupted = stop["signal"] or signal.SIGTERM
            logger.console(
                f"stopped by signal {result.interrupted}; checkpoint "
                f"{run.run_dir / f'step-{step}'} written"
            )
            break
    else:
        result.final_dir = run.save("final")
    result.step = run.state["step"]
    return result


def _due(step: int, every: int, last: int) -> bool:
    """Whether an every-`every`-steps action (0: never) runs after update `step`."""
    return bool(every) and (step % every == 0 or step == last)


def _update(
    run: _Run,
    loss_fn: Callable[[Any, Any], tuple[torch.Tensor, dict]],
    autocast: Any,
    stop: dict,
) -> _Update:
    """One optimizer update: the scheduled lr, `accum` micro-batches (DDP syncs gradients on
    the last only), the loss reduced over ranks, the clipped global norm, a finite check."""
    cfg, state, world = run.cfg, run.state, run.info.world_size
    step = state["step"]
    lr = lr_at(step, cfg, run.total)
    set_lr(run.optimizer, lr)
    loss_sum = torch.zeros((), device=run.device)
    tokens = 0.0
    parts: dict[str, float] = {}  # the loss's named terms (fine-tuning: task, LM)
    for i in range(run.accum):
        batch = to_device(run.source.next_batch(cfg.micro_batch_size), run.device)
        with dist.no_sync(run.wrapped, skip=i < run.accum - 1):
            with autocast:
                loss, extra = loss_fn(run.view, batch)
            (loss / run.accum).backward()
        loss_sum += loss.detach().float()
        tokens += float(extra.get("tokens", 0.0))
        _add_parts(parts, extra)
    names = sorted(parts)
    stats = torch.tensor(
        [float(loss_sum) / run.accum, tokens, float(stop["signal"])]
        + [parts[k] / run.accum for k in names],
        dtype=torch.float64,
        device=run.device,
    )
    stats = dist.all_reduce_sum(stats)
    step_loss = float(stats[0]) / world
    _log_parts(state["log"], names, stats[3:].tolist(), world)
    grad_norm = _clip(run.raw, cfg.grad_clip)
    if not (math.isfinite(step_loss) and math.isfinite(grad_norm)):
        raise TrainingDiverged(_diverged_message(step + 1, step_loss, grad_norm, run.run_dir))
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    state["step"] = step + 1
    state["log"]["loss_sum"] += step_loss
    state["log"]["n"] += 1
    return _Update(step + 1, lr, step_loss, grad_norm, float(stats[1]), float(stats[2]) > 0)


def _log_update(run: _Run, meter: _Meter, update: _Update) -> None:
    """Write the logging interval's averages (metrics.jsonl, trackers, console)."""
    rec = _train_record(run, meter, update)
    meter.logger.write(rec)
    meter.logger.console(train_line(rec))


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


def _train_record(run: _Run, meter: _Meter, update: _Update) -> dict:
    """The logging interval's record (its loss terms averaged, then reset in `run.state`)."""
    state, tok_s, fpt, peak = run.state, meter.tokens_per_s(), meter.flops_per_token, meter.peak
    log = state["log"]
    n = max(log["n"], 1)
    loss = log["loss_sum"] / n
    parts = {k: v / n for k, v in (log.get("parts") or {}).items()}
    state["log"] = {"loss_sum": 0.0, "n": 0}
    mfu = (fpt * tok_s / (peak * run.info.world_size)) if (fpt and peak) else 0.0
    return {
        "step": update.step,
        "loss": loss,
        **parts,
        "lr": update.lr,
        "grad_norm": update.grad_norm,
        "tokens_per_s": tok_s,
        "mfu": mfu,
        "mem_gb": memory_bytes(run.device) / 1e9,
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


def _save(run: _Run, final: Path) -> Path:
    """Write a resumable checkpoint atomically; every rank contributes its cursor and RNG."""
    raw, info = run.raw, run.info
    per_rank = dist.all_gather_objects(
        {"source": run.source.state_dict(), "rng": _rng_state(next(raw.parameters()).device)}
    )
    model_for_files, opt_state = raw, run.optimizer.state_dict()
    if run.cfg.distributed == "fsdp" and info.enabled:
        model_for_files, opt_state = dist.full_state(raw, run.optimizer)
    if info.is_main:
        tensors, opt_meta = train_state.optimizer_to_flat(opt_state)
        for r, entry in enumerate(per_rank):
            for kind, t in entry["rng"].items():
                tensors[f"rng/{r}/{kind}"] = t.cpu()
        meta = {
            "format": "gpt1-trainer",
            "version": 1,
            "step": run.state["step"],
            "total_steps": run.total,
            "world_size": info.world_size,
            "sources": [e["source"] for e in per_rank],
            "log": run.state["log"],
            "threads": run.state["threads"],
            "optimizer": opt_meta,
            "config": run.resolved,
        }
        train_state.save_checkpoint(
            final, model_for_files, run.write_model, tensors, meta, run.cfg.keep_last
        )
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
    """Restore a checkpoint's optimizer moments, this rank's data cursor and RNG states; return
    the trainer state (step, logging sums) it records."""
    tensors, meta = train_state.load_training_state(folder)
    try:
        opt_state = train_state.optimizer_from_flat(tensors, meta["optimizer"])
        _restore_optimizer(raw, optimizer, opt_state, sharded=fsdp and info.enabled)
        sources = meta["sources"]
        source.load_state_dict(sources[info.rank] if info.rank < len(sources) else sources[0])
        _restore_rng(tensors, info.rank, device)
        return {
            "step": int(meta["step"]),
            "log": dict(meta.get("log") or {"loss_sum": 0.0, "n": 0}),
        }
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
        # A hand-edited or foreign trainer state must not surface as a bare KeyError.
        raise CheckpointError(
            f"{folder}: trainer state does not fit this run ({type(exc).__name__}: "
            f"{exc}); resume from another checkpoint or start a new --out"
        ) from None


def _restore_optimizer(
    raw: nn.Module, optimizer: torch.optim.Optimizer, opt_state: dict, sharded: bool
) -> None:
    if not sharded:
        optimizer.load_state_dict(opt_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(
        raw, optimizer, opt_state, options=StateDictOptions(full_state_dict=True)
    )


def _restore_rng(tensors: dict, rank: int, device: torch.device) -> None:
    """This rank's RNG states (rank 0's when the checkpoint was written by fewer processes)."""
    r = rank if f"rng/{rank}/cpu" in tensors else 0
    torch.set_rng_state(tensors[f"rng/{r}/cpu"])
    if device.type == "cuda" and f"rng/{r}/cuda" in tensors:
        torch.cuda.set_rng_state(tensors[f"rng/{r}/cuda"], device)
