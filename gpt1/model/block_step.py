"""Every block of one decoding step in one call (`kernels/step.cpp`, built with `gpt1.model.matvec`).

Decoding one token of the 117M model through the blocks as torch operators is about 150 small
operators and the Python between them: 2.7-4 ms a token on a 2-core server, as long as reading
all of a step's int8 weights (docs/results.md). `decode_step` runs the same maths in C++: the
weight products on the decoding kernel, LayerNorm, attention over each row's key/value cache and
GELU as vector loops, one call for all blocks. With bf16 activations it rounds every intermediate
to bf16 where the operators would, so it computes the operators' numbers up to the order of
summation (`tests/test_block_step.py`).

`plan(model, x)` says whether it applies and holds what it needs: the CPU kernel is built for
AVX-512 or AVX2 with FMA (else `None`: the operators run), no autograd, eval mode, fp32 or bf16
activations, up to `matvec.MAX_ROWS` rows, GPT-1's own blocks with plain, prepacked or int8
linear layers, and no forward hooks on the blocks or their layers (a hook would not see the
step). A model's plan is
kept between steps and remade whenever a module, parameter or buffer is registered anywhere in
the process (torch's global registration hooks: swapping a layer, as quantising does, is
seen); weights changed in place are read as they are.
"""

from __future__ import annotations

import warnings
import weakref
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from gpt1.model import matvec
from gpt1.model.fast_cpu import PackedLinear
from gpt1.model.quantize import Int8Linear

if TYPE_CHECKING:
    from gpt1.model.gpt import GPT

_ABSENT = torch.empty(0)  # "this layer has no scale / bias" in the kernel's tensor list
_ACTIVATIONS = (torch.float32, torch.bfloat16)

# Bumped whenever any module registers a module, parameter or buffer: a plan made before is stale.
_generation = 0
_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (key, plan or None)


def _registered(*_args) -> None:
    global _generation
    _generation += 1


for _register in (
    torch_module.register_module_module_registration_hook,
    torch_module.register_module_parameter_registration_hook,
    torch_module.register_module_buffer_registration_hook,
):
    _register(_registered)


class BlockStep:
    """One model's blocks as the kernel takes them: `run` is one decoding step through all."""

    def __init__(
        self, op, tensors: list[torch.Tensor], hooks: list, n_head: int, eps: float, gelu: bool
    ) -> None:
        self.op, self.tensors, self.hooks = op, tensors, hooks
        self.n_head, self.eps, self.gelu = n_head, eps, gelu

    def run(
        self,
        x: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        rows: list[int],
        lengths: list[int],
    ) -> torch.Tensor:
        """x `[R, C]`, the embedded new tokens -> the last block's output `[R, C]`. keys and
        values: per block, per row, the row's cache buffer `[B, H, capacity, D]` with room at
        position `lengths[r]`, where the new token's keys and values are written; `rows[r]` is
        the row's index in its buffer. The caller advances the caches' lengths."""
        return self.op(
            x, self.tensors, keys, values, rows, lengths, self.n_head, self.eps, self.gelu
        )


def plan(model: GPT, x: torch.Tensor) -> BlockStep | None:
    """The step for `model`'s blocks on `x` `[R, C]`, or None where it does not apply (see the
    module's docstring); the operators then run."""
    if (
        torch.is_grad_enabled()
        or model.training
        or not x.is_cpu
        or x.dtype not in _ACTIVATIONS
        or not 1 <= x.shape[0] <= matvec.MAX_ROWS
    ):
        return None
    key = (_generation, x.dtype)
    kept = _plans.get(model)
    if kept is None or kept[0] != key:
        kept = (key, _make_plan(model))
        _plans[model] = kept
    step = kept[1]
    if step is None or any(step.hooks):
        return None
    return step


def forget(model: GPT, dtype: torch.dtype) -> None:
    """Run the operators for `model` on `dtype` activations until its modules change (its plan
    failed; see `run_or_forget`)."""
    _plans[model] = ((_generation, dtype), None)


def _make_plan(model: GPT) -> BlockStep | None:
    built = matvec.module()
    if built is None or not built.has_decode_step():
        return None
    from gpt1.model.gpt import Block  # decoding imports this module; gpt imports neither

    config = model.config
    if config.afn not in ("gelu", "relu") or config.n_embd % config.n_head:
        return None
    tensors: list[torch.Tensor] = []
    hooks = [torch_module._global_forward_hooks, torch_module._global_forward_pre_hooks]
    eps = {block.ln_1.eps for block in model.h} | {block.ln_2.eps for block in model.h}
    if len(eps) != 1:  # the kernel takes one epsilon
        return None
    for block in model.h:
        if type(block) is not Block:
            return None
        norms = [block.ln_1, block.ln_2]
        layers = [block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj]
        if not all(_plain_norm(n, config.n_embd) for n in norms):
            return None
        for norm in norms:
            tensors += [norm.weight, norm.bias]
        for layer in layers:
            found = _linear_tensors(layer)
            if found is None:
                return None
            tensors += found
        for module in block.modules():
            hooks += [module._forward_hooks, module._forward_pre_hooks]
    return BlockStep(
        built.decode_step, tensors, hooks, config.n_head, float(eps.pop()), config.afn == "gelu"
    )


def _plain_norm(norm: nn.Module, width: int) -> bool:
    return (
        type(norm) is nn.LayerNorm
        and tuple(norm.normalized_shape) == (width,)
        and norm.weight is not None
        and norm.bias is not None
        and all(t.dtype in _ACTIVATIONS and t.is_cpu for t in (norm.weight, norm.bias))
    )


def _linear_tensors(layer: nn.Module) -> list[torch.Tensor] | None:
    """[weight, scale, bias] of a linear layer the kernel reads, or None."""
    if isinstance(layer, Int8Linear):
        weight, scale = layer.qweight, layer.scale
    elif type(layer) in (nn.Linear, PackedLinear):
        weight, scale = layer.weight, _ABSENT
    else:
        return None
    bias = layer.bias
    if (
        weight.dtype not in matvec.DTYPES
        or not weight.is_cpu
        or not weight.is_contiguous()
        or (bias is not None and (bias.dtype not in _ACTIVATIONS or not bias.is_cpu))
        or (scale is not _ABSENT and scale.dtype != torch.float32)
    ):
        return None
    return [weight, scale, _ABSENT if bias is None else bias]


def run_or_forget(step: BlockStep, model: GPT, *args) -> torch.Tensor | None:
    """`step.run(*args)`; where the kernel refuses what it is given (a weight changed in a way the
    plan cannot see, say), warns once, runs the operators for this model from now on and
    returns None (args: `BlockStep.run`'s). A refused step has written at most the new token's cache positions, which
    the operators overwrite."""
    try:
        return step.run(*args)
    except RuntimeError as e:
        warnings.warn(
            f"gpt1's decoding step refused this model ({str(e).splitlines()[0][:200]}); "
            "decoding runs torch's operators",
            RuntimeWarning,
            stacklevel=3,
        )
        forget(model, args[0].dtype)
        return None
