"""Activation checkpointing, applied to a model from outside it (the model code never knows).

`checkpoint_blocks(model)` makes every block in `model.h` (GPT's repeated decoder blocks) keep only
its input in a training pass and recompute its activations during backward: compute traded for
memory (`benchmarks/memory.py --checkpointing` measures both). Parameter names, state dicts and
outputs are unchanged: only the block's `forward` is routed through
`torch.utils.checkpoint.checkpoint` (non-reentrant, RNG state restored, so dropout masks in the
recomputation equal the first pass). Models without blocks (the LSTM baseline) are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class _Recomputed:
    """A block's forward that recomputes in backward when training with autograd on."""

    def __init__(self, block: nn.Module, forward: Callable[..., Any]):
        self.block, self.forward = block, forward

    def __call__(self, x: torch.Tensor, layout: Any = None) -> Any:
        # Evaluation keeps the plain path (nothing to save), and so does a pass that writes a
        # key/value cache (`gpt1.model.layouts`: recomputing it would write the cache twice).
        writes_cache = getattr(layout, "writes_cache", False)
        if self.block.training and torch.is_grad_enabled() and not writes_cache:
            return checkpoint(self.forward, x, layout, use_reentrant=False)
        return self.forward(x, layout)


def checkpoint_blocks(model: nn.Module) -> int:
    """Checkpoint the activations of each block in `model.h`; return how many blocks it covers.

    Idempotent: a block already checkpointed is left as it is.
    """
    blocks = getattr(model, "h", None) or []
    for block in blocks:
        if not isinstance(block.forward, _Recomputed):
            # An instance attribute shadows the class's forward; nn.Module.__call__ (and its
            # hooks, e.g. FSDP's) still wraps it.
            block.forward = _Recomputed(block, block.forward)
    return len(blocks)


def is_checkpointed(model: nn.Module) -> bool:
    """Whether `checkpoint_blocks` has been applied to `model` (and it has blocks)."""
    blocks = getattr(model, "h", None) or []
    return len(blocks) > 0 and all(isinstance(b.forward, _Recomputed) for b in blocks)
