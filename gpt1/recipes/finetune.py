"""`gpt1 finetune`: a task head on a (pre)trained GPT, trained by the shared training loop.

Pieces: `build_finetune_model` (checkpoint or fresh model, layer transfer, task tokens), `encode_split`
(examples -> id sequences through the task's transformation), `FinetuneSource` (seeded
shuffled epochs, exact-resume state), `FinetuneLoss` (task + lm_coef x LM), the run folder's
writer/reader (GPT files + `head.safetensors` + `task.json`), and `finetune` itself. The
training length is OAI's `(n_train // batch) * epochs` updates unless `max_steps` is set.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from gpt1 import checkpoint_files as ckpt
from gpt1 import files
from gpt1.checkpoint_files import HEAD_FILE, TASK_FILE
from gpt1.config import FinetuneConfig, TrainConfig, model_preset
from gpt1.errors import CheckpointError, ConfigError, Gpt1Error
from gpt1.model.checkpoint import load_model, model_config
from gpt1.model.gpt import GPT
from gpt1.model.heads import FinetuneModel
from gpt1.model.registry import arch_extra, model_flops

# load_finetuned is re-exported for the analyses, which still import it from here.
from gpt1.recipes.evaluate import (  # noqa: F401
    ScoringOptions,
    evaluate_model,
    load_finetuned,
    score,
    write_results,
)
from gpt1.tasks.batches import FinetuneSource, encode_split, report_skipped
from gpt1.tasks.registry import GENERIC, Task, complete_generic_spec, get_task
from gpt1.train import distributed as dist
from gpt1.train import resume
from gpt1.train.loop import TrainResult, train
from gpt1.train.objectives import finetune_loss
from gpt1.train.run import OpenedRun, RunSpec, open_run

log = logging.getLogger("gpt1.recipes.finetune")
RESULTS_FILE = "results.json"


# ---------------------------------------------------------------------------- model
def load_tokenizer(folder: str | Path):
    from gpt1.text.tokenizer import Tokenizer

    return Tokenizer.from_dir(folder)


def train_subset(n: int, k: int, seed: int) -> list[int]:
    """Sorted indices of a seeded random subset of `k` of `n` training examples (all if k >= n)."""
    if k <= 0 or k >= n:
        return list(range(n))
    return sorted(random.Random(seed).sample(range(n), k))


def _transfer(fresh: GPT, pretrained: GPT, k: int) -> None:
    """Copy the embeddings and the first `k` blocks of `pretrained` into `fresh` (a.5 n_transfer)."""
    src = pretrained.state_dict()
    keep = {
        n: t
        for n, t in src.items()
        if n.startswith(("wte.", "wpe.")) or any(n.startswith(f"h.{i}.") for i in range(k))
    }
    fresh.load_state_dict(keep, strict=False)


def build_finetune_model(
    cfg: FinetuneConfig, task: Task, seed: int
) -> tuple[FinetuneModel, Any, Path]:
    """(model with task tokens and head, tokenizer, tokenizer folder) for a fine-tuning run."""
    torch.manual_seed(seed)  # the same fresh weights (head, task tokens, new blocks) on every rank
    if cfg.init in ("", "none"):
        if not cfg.vocab:
            raise ConfigError("--init none needs --vocab DIR (the tokenizer to train with)")
        tok_dir = Path(cfg.vocab)
        tok = load_tokenizer(tok_dir)
        gpt = GPT(dataclasses.replace(model_preset(cfg.preset), vocab_size=tok.vocab_size))
    else:
        init = ckpt.open_checkpoint(cfg.init)  # read once for the weights and the tokenizer
        pretrained = load_model(init)  # GPT, or the LSTM baseline (gpt1.model.lstm)
        tok_dir = Path(cfg.vocab) if cfg.vocab else init.tokenizer_dir
        if tok_dir is None:
            raise CheckpointError(
                f"{cfg.init}: the checkpoint carries no tokenizer files; pass --vocab DIR"
            )
        tok = load_tokenizer(tok_dir)
        n_layer = pretrained.config.n_layer
        k = n_layer if cfg.transfer_layers == -2 else cfg.transfer_layers
        if k > n_layer:
            raise ConfigError(f"--transfer-layers {k}: the checkpoint has only {n_layer} blocks")
        gpt = type(pretrained)(pretrained.config) if k != n_layer else pretrained
        if k >= 0 and gpt is not pretrained:
            _transfer(gpt, pretrained, k)
    if gpt.config.vocab_size == tok.vocab_size:
        ids = gpt.add_tokens(3)
        assert ids == [tok.start_id, tok.delimiter_id, tok.classify_id], ids
    elif gpt.config.vocab_size != tok.total_size:
        raise CheckpointError(
            f"model vocab_size {gpt.config.vocab_size} does not match the "
            f"tokenizer ({tok.vocab_size} tokens + 3 task tokens)"
        )
    model = FinetuneModel(gpt, task.kind, task.n_outputs, tok.classify_id, cfg.clf_pdrop)
    return model, tok, tok_dir


def default_context(cfg: FinetuneConfig, gpt: Any) -> int:
    """n_positions, or the shorter window the initial checkpoint was pretrained on (positions
    past it were never trained)."""
    if cfg.init in ("", "none"):
        return gpt.config.n_positions
    return ckpt.trained_context(cfg.init) or gpt.config.n_positions


class FinetuneLoss:
    """`loss_fn(model, batch)`: task loss + lm_coef x per-sequence LM loss (reference a.7)."""

    def __init__(self, regression: bool, lm_coef: float):
        self.regression, self.lm_coef = regression, lm_coef

    def __call__(self, model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        out, lm = model(batch["ids"], batch["mask"], with_lm=self.lm_coef > 0)
        loss, logs = finetune_loss(out, lm, batch["labels"], self.regression, self.lm_coef)
        logs["tokens"] = float(batch["mask"].sum())
        return loss, logs


# ------------------------------------------------------------------------ run files
def task_record(task: Task, cfg: FinetuneConfig, tok: Any, n_ctx: int) -> dict[str, Any]:
    return {
        "task": task.name,
        "kind": task.kind,
        "labels": task.labels,
        "n_outputs": task.n_outputs,
        "spec": task.spec,
        "n_ctx": n_ctx,
        "classify_id": tok.classify_id,
        "question_delimiter": cfg.question_delimiter,
        "clf_pdrop": cfg.clf_pdrop,
    }


def writer(tok_dir: Path, record: dict, resolved: dict) -> Any:
    """The trainer's `write_model`: GPT files (loadable by gpt1.load_checkpoint) + head + task."""

    def write(model: FinetuneModel, folder: Path) -> None:
        ckpt.write_model_files(
            folder, model.gpt, tok_dir, {"finetune": resolved, **arch_extra(model.gpt)}
        )
        head = {k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()}
        save_file(head, str(Path(folder) / HEAD_FILE))
        files.follow_umask(Path(folder) / HEAD_FILE)
        (Path(folder) / TASK_FILE).write_text(json.dumps(record, indent=2) + "\n")

    return write


def read_into(model: FinetuneModel, folder: Path) -> None:
    """The trainer's `read_model`: weights of a fine-tuned folder into `model`."""
    folder = Path(folder)
    model.gpt.load_state_dict(ckpt.load_state_dict(folder / ckpt.WEIGHTS, expect=model.gpt))
    model.head.load_state_dict(ckpt.load_state_dict(folder / HEAD_FILE, expect=model.head))


def resolve_task(name: str, spec: dict | None, data: str, train_split: str) -> Task:
    """A registered task, or a generic one with its label set completed from the training file."""
    if name.lower() in GENERIC and spec is not None:
        spec = complete_generic_spec(name.lower(), spec, data, train_split)
    return get_task(name, spec)


def check_training_memory(
    cfg: FinetuneConfig,
    task: Task,
    train_cfg: TrainConfig,
    info: Any,
    device: torch.device | None = None,
) -> None:
    """Refuse, from the configs alone, a run that cannot fit before any model is built, on
    `device` (the opened run's; None: `train_cfg.device` resolved here, for a caller that
    checks a run it has not opened)."""
    from gpt1.devices import resolve_device
    from gpt1.model.memory import ensure_training_fits

    if cfg.init in ("", "none"):
        config, source = model_preset(cfg.preset), f"--preset {cfg.preset}"
    else:
        init = ckpt.open_checkpoint(cfg.init)
        if init.arch != "gpt":
            return  # the LSTM baseline is sized by its own config when it loads
        config, source = model_config(init), str(init.config_file)
    n_ctx = min(cfg.n_ctx or config.n_positions, config.n_positions)
    head = (config.n_embd + 1) * task.n_outputs
    ensure_training_fits(
        config,
        train_cfg,
        n_ctx,
        source,
        device or resolve_device(train_cfg.device, info.local_rank),
        extra_params=head,
        world_size=info.world_size,
    )


# ------------------------------------------------------------------------- entry point
def run_length(train_cfg: TrainConfig, n_train: int, cap: int = 0) -> TrainConfig:
    """`train_cfg` with its length fixed: `max_steps` as given, or (0) OAI's
    `(n_train // batch_size) * epochs` updates; then at most `cap` updates when `cap` > 0 (a
    library option for sweeps; the `--max-steps` flag sets `max_steps` itself)."""
    steps = train_cfg.max_steps or max(1, int(n_train // train_cfg.batch_size * train_cfg.epochs))
    if cap:
        steps = min(steps, cap)
    return dataclasses.replace(train_cfg, max_steps=steps)


def finetune(
    cfg: FinetuneConfig,
    train_cfg: TrainConfig,
    out: str | Path,
    spec: dict | None = None,
    max_steps_cap: int = 0,
    overwrite: bool = False,
    command: str | None = None,
    inputs: Sequence[str | Path] = (),
) -> tuple[TrainResult, dict]:
    """Fine-tune on `cfg.task`; evaluates on `cfg.eval_split` after training (results.json).

    A non-empty `out` is continued only with `train_cfg.resume`, started over only with
    `overwrite` (the run is opened by `gpt1.train.run.open_run`); the folder stays locked while
    the run lasts. `out` may never be or hold an input (the task data folder or its files, the
    --init checkpoint's files, the --vocab folder's, another run's checkpoint resumed from, or
    `inputs`: other files the caller read, such as its --config TOML). A resume may change
    only what `gpt1.train.resume.CHANGEABLE` lists, checked before anything is written.
    `command` is the command line the tracker runs record (default: this process's)."""
    read = [*files.folder_files(cfg.data), *inputs, *finetune_inputs(cfg)]
    with open_run(
        out,
        train_cfg,
        overwrite=overwrite,
        inputs=read,
        roots=[cfg.data, cfg.vocab],
        command=command,
    ) as opened:
        return _finetune(cfg, train_cfg, opened, spec, max_steps_cap)


def finetune_inputs(cfg: FinetuneConfig) -> list[Path]:
    """The files a fine-tuning run reads besides its task data: the --init checkpoint's and the
    --vocab folder's (an --init that does not resolve is reported when it is loaded)."""
    found: list[Path] = []
    if cfg.init not in ("", "none"):
        try:
            found += files.folder_files(ckpt.resolve_checkpoint_dir(cfg.init))
        except Gpt1Error:
            found.append(Path(cfg.init))
    if cfg.vocab:
        found += files.folder_files(cfg.vocab)
    return found


def resume_record(
    cfg: FinetuneConfig,
    run: OpenedRun,
    requested: dict[str, Any],
) -> dict[str, Any]:
    """run.json's contents (`requested`, or its sections checked so far); on a resume, first
    refuse any setting the run may not change (`gpt1.train.resume`), then record the accepted
    changes."""
    checkpoint, out = run.resumed_from, run.out
    if checkpoint is None:
        return requested
    recorded, source = resume.recorded_config(checkpoint, out / resume.RUN_JSON)
    fixed = {"train.micro_batch_size"} if cfg.group_by_length else set()  # batches by length
    accepted = resume.changes(
        recorded,
        requested,
        source,
        fixed=frozenset(fixed),
        paths=frozenset({"finetune.data", "finetune.init", "finetune.vocab"}),
    )
    return resume.run_record(requested, checkpoint, out / resume.RUN_JSON, accepted)


def _finetune(
    cfg: FinetuneConfig,
    train_cfg: TrainConfig,
    run: OpenedRun,
    spec: dict | None,
    max_steps_cap: int,
) -> tuple[TrainResult, dict]:
    """Plan the run in `run`, train it, then score it on the evaluation split (rank 0)."""
    info = dist.env_info()
    plan = _plan(cfg, train_cfg, run, spec, max_steps_cap, info)
    source = FinetuneSource(
        plan.enc,
        plan.train_cfg.seed,
        plan.task.regression,
        info.rank,
        info.world_size,
        plan.train_cfg.micro_batch_size if cfg.group_by_length else 0,
        plan.train_split.path,
    )
    run_spec = RunSpec(
        config=plan.resolved,
        record=plan.run_json,
        eval_fn=plan.eval_fn,
        write_model=writer(plan.tok_dir, plan.record, plan.resolved),
        read_model=read_into,
        flops_per_token=model_flops(plan.model.gpt, plan.n_ctx),
    )
    loss = FinetuneLoss(plan.task.regression, cfg.lm_coef)
    try:
        result = train(plan.model, loss, source, plan.train_cfg, run, run_spec)
    finally:
        dist.destroy()
    results: dict = {}
    if not result.interrupted and cfg.eval_split and info.is_main:
        results = _final_results(plan, cfg, result, info)
        write_results(run.out, results)
        run.trackers.summary(results, result.step)
    return result, results


@dataclass
class _Plan:
    """A fine-tuning run checked and ready to train (nothing written yet: the trainer writes
    run.json once the checkpoint, the batch arithmetic and the trackers have passed too)."""

    task: Task
    train_cfg: TrainConfig  # its length fixed by the training set's size
    model: FinetuneModel
    tok: Any
    tok_dir: Path
    n_ctx: int
    train_split: Any  # the examples read (and the rows skipped)
    enc: Any  # the examples as token sequences
    eval_fn: Any  # the trainer's periodic evaluation, or None
    record: dict[str, Any]  # task.json
    resolved: dict[str, Any]  # run.json's settings, also the trackers' config
    run_json: dict[str, Any]  # run.json: the settings, and the resumes with this one


def _plan(
    cfg: FinetuneConfig,
    train_cfg: TrainConfig,
    run: OpenedRun,
    spec: dict | None,
    max_steps_cap: int,
    info: dist.DistInfo,
) -> _Plan:
    """Check the run, build its model, read and encode its data, and decide run.json."""
    # The run's own settings first, before any model or data is read (the rest, from the model
    # and the task, below); nothing is written until both pass.
    resume_record(cfg, run, {"finetune": asdict(cfg), "train": asdict(train_cfg)})
    task = resolve_task(cfg.task, spec, cfg.data, cfg.train_split)
    check_training_memory(cfg, task, train_cfg, info, run.device)
    model, tok, tok_dir = build_finetune_model(cfg, task, train_cfg.seed)
    n_ctx = min(cfg.n_ctx or default_context(cfg, model.gpt), model.gpt.config.n_positions)
    train_split = _training_split(cfg, task, train_cfg.seed)
    enc = encode_split(train_split, task, tok, n_ctx, cfg.question_delimiter, cfg.encode_processes)
    train_cfg = run_length(train_cfg, len(enc.items), max_steps_cap)
    eval_fn = None
    if train_cfg.eval_every:
        eval_fn = periodic_eval(task, cfg, tok, n_ctx, train_cfg.micro_batch_size)
    record = task_record(task, cfg, tok, n_ctx)
    resolved = {
        "finetune": asdict(cfg),
        "train": asdict(train_cfg),
        "task": record,
        "model": model.gpt.config.to_dict(),
    }
    run_json = resume_record(cfg, run, resolved)  # the trainer writes it
    if info.is_main:
        _log_plan(task, cfg, train_cfg, len(enc.items))
    return _Plan(
        task,
        train_cfg,
        model,
        tok,
        tok_dir,
        n_ctx,
        train_split,
        enc,
        eval_fn,
        record,
        resolved,
        run_json,
    )


def _training_split(cfg: FinetuneConfig, task: Task, seed: int) -> Any:
    """The training examples (a seeded subset with --train-examples); the evaluation split is
    read too, as the final evaluation will read it (labels required), so a missing, malformed
    or unlabelled one fails now rather than after training."""
    train_split = task.read(cfg.data, cfg.train_split, cfg.skip_bad_rows)
    report_skipped(train_split)
    if cfg.eval_split and cfg.eval_split != cfg.train_split:
        for name in task.resolve_splits(cfg.eval_split):
            task.read(cfg.data, name, cfg.skip_bad_rows, need_labels=True)
    if cfg.train_examples:
        keep = train_subset(len(train_split.examples), cfg.train_examples, seed)
        train_split = dataclasses.replace(
            train_split, examples=[train_split.examples[i] for i in keep]
        )
    return train_split


def _log_plan(task: Task, cfg: FinetuneConfig, train_cfg: TrainConfig, n_train: int) -> None:
    log.info(
        "fine-tuning %s on %d %s examples for %d steps (batch %d, lr %g, lm_coef %g); "
        "headline metric %s%s",
        task.name,
        n_train,
        cfg.train_split,
        train_cfg.max_steps,
        train_cfg.batch_size,
        train_cfg.lr,
        cfg.lm_coef,
        task.metrics[0],
        f" (F1 of class {task.f1_label!r})" if task.f1_label else "",
    )


def _final_results(
    plan: _Plan, cfg: FinetuneConfig, result: TrainResult, info: dist.DistInfo
) -> dict[str, Any]:
    """The trained model's metrics on `cfg.eval_split` (results.json), scored by rank 0."""
    model = plan.model
    if info.enabled and plan.train_cfg.distributed == "fsdp":
        # Rank 0 scores alone, and an FSDP2 model is sharded over the (now closed) group:
        # score the unsharded weights the trainer just wrote instead.
        model = load_finetuned(result.final_dir)[0]
    model.eval()
    scored = ScoringOptions(
        result.final_dir,
        data=cfg.data,
        split=cfg.eval_split,
        micro_batch=plan.train_cfg.micro_batch_size,
        skip_bad_rows=cfg.skip_bad_rows,
    )
    results = evaluate_model(model, plan.task, plan.tok, plan.record, scored)
    results["train_n"] = len(plan.enc.items)
    results["train_skipped"] = len(plan.train_split.skipped)
    results["steps"] = result.step
    return results


def periodic_eval(task: Task, cfg: FinetuneConfig, tok: Any, n_ctx: int, micro: int) -> Any:
    """The trainer's eval_fn: headline metrics on the evaluation split, prefixed `dev_`."""
    splits = {
        s: task.read(cfg.data, s, cfg.skip_bad_rows) for s in task.resolve_splits(cfg.eval_split)
    }
    encoded = {
        s: encode_split(sp, task, tok, n_ctx, cfg.question_delimiter) for s, sp in splits.items()
    }

    def evaluate(model: Any) -> dict[str, float]:
        out = {}
        for name, enc in encoded.items():
            metrics = score(model, task, enc, micro)
            out.update({f"{name}_{k}": v for k, v in metrics.items() if k != "n"})
        return out

    return evaluate


# ---------------------------------------------------------------------------- config
def resolve(
    config_file: str | Path | None, flags: dict[str, dict[str, Any]], sets: list[str] | None = None
) -> tuple[FinetuneConfig, TrainConfig]:
    """Paper defaults -> TOML ([finetune], [train]) -> flags (None skipped) -> `--set` strings:
    `gpt1.config.resolve_finetune` with the TOML read from `config_file`."""
    from gpt1.config import load_toml, resolve_finetune

    table = load_toml(config_file) if config_file else {}
    return resolve_finetune(table, flags, sets, toml_source=str(config_file or "config"))
