"""More than one process: torchrun's environment, process group, DDP / FSDP2 wrapping, reductions.

This is the only module that reads torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK). Launched
without torchrun everything degrades to a single process. The model code never sees any of this:
`wrap` takes a plain GPT and returns the module to call forward on; `unwrap` gets it back.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import itertools
import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def env_info() -> DistInfo:
    """Rank and world size from torchrun's environment (single process when absent)."""
    return DistInfo(
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
        int(os.environ.get("LOCAL_RANK", 0)),
    )


def init(device_type: str) -> DistInfo:
    """Join the process group when launched by torchrun (nccl on CUDA, gloo on CPU)."""
    info = env_info()
    if info.enabled and not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    return info


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# FSDP2 shards a module in place; to write a checkpoint rank 0 needs the same module unsharded.
# `wrap` keeps a parameter-free (meta) twin of each module it shards, for `full_state` to fill.
_unsharded_twins: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()


def wrap(model: nn.Module, mode: str, device: torch.device) -> nn.Module:
    """DDP (default) or FSDP2 `fully_shard` per block when more than one process runs.

    The blocks are the members of every `h` ModuleList inside `model` (`GPT.h`, or
    `FinetuneModel.gpt.h`); FSDP2 shards `model` itself in place and returns it.
    """
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return model
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        _unsharded_twins[model] = _meta_twin(model)
        for block in _blocks(model):
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index or 0] if device.type == "cuda" else None
    return DDP(model, device_ids=ids)


def _blocks(model: nn.Module) -> list[nn.Module]:
    return [
        block
        for module in model.modules()
        if isinstance(getattr(module, "h", None), nn.ModuleList)
        for block in module.h
    ]


def _meta_twin(model: nn.Module) -> nn.Module:
    """A copy of `model` whose parameters and buffers are on the meta device (no memory)."""
    memo: dict[int, Any] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(meta, t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(model, memo)


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, dict]:
    """The unsharded model (CPU) and full optimizer state of an FSDP2-wrapped `model`, on rank 0.

    Every rank must call it (the shards are gathered); the other ranks get `model` and an empty
    optimizer state back.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=opts)
    if not env_info().is_main:
        return model, {"state": {}, "param_groups": []}
    plain = copy.deepcopy(_unsharded_twins[model])  # the twin stays meta for the next save
    plain.load_state_dict(model_sd, assign=True)
    return plain, optim_sd


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under DDP and/or torch.compile wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


@contextlib.contextmanager
def no_sync(model: nn.Module, skip: bool) -> Iterator[None]:
    """Skip gradient all-reduce on accumulation micro-steps (DDP `no_sync`; FSDP2 equivalent)."""
    if skip and isinstance(model, nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
        return
    if skip and hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    yield


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj` (a list of length world_size), for per-rank checkpoint state."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
