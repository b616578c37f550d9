"""Every block of one decoding step in one call (`kernels/step.cpp`, built with `gpt1.inference.kernel_build`).

Decoding one token of the 117M model through the blocks as torch operators is about 150 small
operators and the Python between them: 2.7-4 ms a token on a 2-core server, as long as reading
all of a step's int8 weights (docs/results.md). `decode_step` runs the same maths in C++: the
weight products on the decoding kernel, LayerNorm, attention over each row's key/value cache and
GELU as vector loops, one call for all blocks. With bf16 activations it rounds every intermediate
to bf16 where the operators would, so it computes the operators' numbers up to the order of
summation (`tests/test_block_step.py`).

`plan(model, x)` says whether it applies and holds what it needs: `gpt1.inference.backend` offers the
step (the kernel is built, for AVX-512 or AVX2 with FMA; else `None`: the operators run), no autograd, eval mode,
fp32 or bf16 activations, up to `matvec.MAX_ROWS` rows, GPT-1's own blocks with plain,
prepacked or int8 linear layers, and no forward hooks on the blocks or their layers (a hook
would not see the step). A model's plan is made when `for_inference` prepares it (`prepare`; or
on first use) and kept while it is current: every module and tensor it took is still where it
took it from (the same object registered under the same name) and still the tensor it was
(`prepack.MadeFrom`: the same storage, dtype and shape). Otherwise it is remade: swapping a
layer, as quantising does, or assigning a new weight is seen at the next step (an identity test
per entry), and a tensor whose storage was swapped underneath (`model.to(...)`) when the kernel
refuses it, without any process-wide hook. Weights changed in place are read as they are.
"""

from __future__ import annotations

import operator
import warnings
import weakref
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from gpt1.inference import backend, matvec
from gpt1.inference.prepack import MadeFrom, PackedLinear, version_of
from gpt1.inference.quantize import Int8Linear

if TYPE_CHECKING:
    from gpt1.model.gpt import GPT

_ABSENT = torch.empty(0)  # "this layer has no scale / bias" in the kernel's tensor list
_ACTIVATIONS = (torch.float32, torch.bfloat16)
_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> Plan


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
        packed: tuple[list[torch.Tensor], bool] | None = None,
    ) -> torch.Tensor:
        """x `[R, C]`, the embedded new tokens -> the last block's output `[R, C]`. keys and
        values: per block, per row, the row's cache buffer `[B, H, capacity, D]` with room at
        position `lengths[r]`, where the new token's keys and values are written; `rows[r]` is
        the row's index in its buffer. The caller advances the caches' lengths. `packed`
        (`integer_weights`): the int8 layers' products are int8 x int8 with one activation
        scale per row, any number of rows."""
        extra = () if packed is None else packed
        return self.op(
            x, self.tensors, keys, values, rows, lengths, self.n_head, self.eps, self.gelu, *extra
        )


class Plan:
    """What the step takes from one model (`layout`: its tensors, hooks and shape, or None where
    the step cannot take it) and where each piece came from, to tell whether it still holds."""

    def __init__(self, model: GPT) -> None:
        self.entries: list[tuple[dict, str, object]] = []  # (registry, name, what it held)
        self.layout = _layout(model, self.entries)
        self.stamps = [(MadeFrom(t), t) for _, _, t in self.entries if isinstance(t, torch.Tensor)]
        self.refused: set[torch.dtype] = set()  # activations the kernel refused for this model
        self._cached_columns: tuple[list, list, list] | None = None
        self._int8: list | None | bool = False  # `_int8_weights`, once (False: not asked yet)
        self.integer: tuple[tuple, tuple[list[torch.Tensor], bool]] | None = None

    def int8_weights(self, model: GPT) -> list[tuple[Int8Linear, torch.Tensor]] | None:
        """`_int8_weights(model)`, found once: while the plan is current its layers and weights
        are the ones registered."""
        if self._int8 is False:
            self._int8 = _int8_weights(model)
        return self._int8

    def current(self) -> bool:
        """Whether every module and tensor the plan took is still registered where it was (one
        identity test each, at C speed: it runs every step)."""
        registries, names, held = self._columns
        return all(map(operator.is_, map(dict.get, registries, names), held))

    def unchanged(self) -> bool:
        """`current`, and every tensor is still the tensor it was (`MadeFrom`: the storage,
        dtype and shape; slower, asked when the kernel refuses the step)."""
        return self.current() and all(stamp.matches(t) for stamp, t in self.stamps)

    @property
    def _columns(self) -> tuple[list, list, list]:
        if self._cached_columns is None:
            self._cached_columns = tuple(map(list, zip(*self.entries))) or ([], [], [])
        return self._cached_columns


def prepare(model: nn.Module) -> None:
    """Plan the step for every GPT in `model` (`for_inference` calls it; nothing is built)."""
    from gpt1.model.gpt import GPT  # decoding imports this module; gpt imports neither

    for module in model.modules():
        if isinstance(module, GPT):
            _plans[module] = Plan(module)


def drop(model: nn.Module) -> None:
    """Forget the plans of every GPT in `model` (they hold its tensors) until `prepare` or the
    next step makes them again: before its tensors move (`arena.gather`), so each old copy is
    freed as soon as it has moved."""
    for module in model.modules():
        _plans.pop(module, None)


def plan(model: GPT, x: torch.Tensor, integer: bool = False) -> BlockStep | None:
    """The step for `model`'s blocks on `x` `[R, C]`, or None where it does not apply (see the
    module's docstring); the operators then run. `integer`: for the int8 products of many rows
    (`integer_weights`), which take any number of rows."""
    if (
        torch.is_grad_enabled()
        or model.training
        or not x.is_cpu
        or x.dtype not in _ACTIVATIONS
        or not 1 <= x.shape[0] <= (x.shape[0] if integer else matvec.MAX_ROWS)
    ):
        return None
    kept = _plans.get(model)
    if kept is None or not kept.current():
        kept = _plans[model] = Plan(model)
    step = kept.layout
    if step is None or x.dtype in kept.refused or any(step.hooks):
        return None
    op = backend.decode_step_op()
    if op is None:
        return None
    if step.op is None:
        step.op = op
    return step


def integer_weights(model: GPT) -> tuple[list[torch.Tensor], bool] | None:
    """What the step takes to multiply `model`'s int8 layers int8 x int8, a scale per row
    (`kernels/int8_rows.cpp`): each layer's oneDNN copy and zero points (empty where oneDNN's
    int8 kernel is missing or inexact here) and its copy for gpt1's own kernel (empty where that
    is not compiled), made or remade by its `PackedInt8`, and whether the activations go over as
    unsigned bytes; None where a layer is not int8 or neither kernel is here.

    Asked every step: kept on the model's plan while each weight is where it was and not
    written in place (its storage and version), so a step does not ask 48 layers' copies."""
    encoding = backend.int8_many_rows()
    own = backend.few_rows_int8()
    if encoding is None and not own:
        return None
    kept = _plans.get(model)
    weights = _int8_weights(model) if kept is None else kept.int8_weights(model)
    if weights is None:
        return None
    key = (encoding, own, [(q.data_ptr(), version_of(q)) for _, q in weights])
    if kept is not None and kept.integer is not None and kept.integer[0] == key:
        return kept.integer[1]
    packed: list[torch.Tensor] = []
    for layer, q in weights:
        packed += layer._packed.packed(q) if encoding else [_ABSENT, _ABSENT]
        packed.append(layer._packed.few_rows(q) if own else _ABSENT)
    found = (packed, encoding == "u8")
    if kept is not None:
        kept.integer = (key, found)
    return found


def _int8_weights(model: GPT) -> list[tuple[Int8Linear, torch.Tensor]] | None:
    """Every block's four layers and their int8 weights, in the step's order; None where one is
    not int8."""
    layers = [
        layer
        for block in model.h
        for layer in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj)
    ]
    if not all(isinstance(layer, Int8Linear) for layer in layers):
        return None
    return [(layer, layer.qweight) for layer in layers]


def forget(model: GPT, dtype: torch.dtype) -> None:
    """Run the operators for `model` on `dtype` activations until its plan is remade (its
    step failed; see `run_or_forget`)."""
    kept = _plans.get(model)
    if kept is not None:
        kept.refused.add(dtype)


def _layout(model: GPT, entries: list) -> BlockStep | None:
    """The step's view of `model`'s blocks, noting in `entries` each (registry, name, object)
    it read; None where the step does not take them."""
    from gpt1.model.gpt import Block

    config = model.config
    if config.afn not in ("gelu", "relu") or config.n_embd % config.n_head:
        return None
    tensors: list[torch.Tensor] = []
    hooks = [torch_module._global_forward_hooks, torch_module._global_forward_pre_hooks]
    blocks = _child(model, "h", entries)
    eps = {block.ln_1.eps for block in blocks} | {block.ln_2.eps for block in blocks}
    if len(eps) != 1:  # the kernel takes one epsilon
        return None
    for i in range(len(blocks)):
        block = _child(blocks, str(i), entries)
        if type(block) is not Block:
            return None
        attn, mlp = _child(block, "attn", entries), _child(block, "mlp", entries)
        norms = [_child(block, "ln_1", entries), _child(block, "ln_2", entries)]
        layers = [_child(attn, "c_attn", entries), _child(attn, "c_proj", entries)]
        layers += [_child(mlp, "c_fc", entries), _child(mlp, "c_proj", entries)]
        if not all(_plain_norm(n, config.n_embd) for n in norms):
            return None
        for norm in norms:
            tensors += [_tensor(norm, "weight", entries), _tensor(norm, "bias", entries)]
        for layer in layers:
            found = _linear_tensors(layer, entries)
            if found is None:
                return None
            tensors += found
        for module in block.modules():
            hooks += [module._forward_hooks, module._forward_pre_hooks]
    return BlockStep(None, tensors, hooks, config.n_head, float(eps.pop()), config.afn == "gelu")


def _child(parent: nn.Module, name: str, entries: list) -> nn.Module:
    child = parent._modules.get(name)
    entries.append((parent._modules, name, child))
    return child


def _tensor(module: nn.Module, name: str, entries: list) -> torch.Tensor | None:
    registry = module._parameters if name in module._parameters else module._buffers
    found = registry.get(name)
    entries.append((registry, name, found))
    return found


def _plain_norm(norm: nn.Module, width: int) -> bool:
    return (
        type(norm) is nn.LayerNorm
        and tuple(norm.normalized_shape) == (width,)
        and norm.weight is not None
        and norm.bias is not None
        and all(t.dtype in _ACTIVATIONS and t.is_cpu for t in (norm.weight, norm.bias))
    )


def _linear_tensors(layer: nn.Module, entries: list) -> list[torch.Tensor] | None:
    """[weight, scale, bias] of a linear layer the kernel reads, or None."""
    if isinstance(layer, Int8Linear):
        weight, scale = _tensor(layer, "qweight", entries), _tensor(layer, "scale", entries)
    elif type(layer) in (nn.Linear, PackedLinear):
        weight, scale = _tensor(layer, "weight", entries), _ABSENT
    else:
        return None
    bias = _tensor(layer, "bias", entries)
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
    """`step.run(*args)`. Where the kernel refuses what it is given: if a tensor of the plan was
    replaced since it was made (another storage, dtype or shape: `Plan.unchanged`), the plan is
    remade and the step tried once more; otherwise warns once, runs the operators for this model
    on these activations until its plan is remade and returns None (args: `BlockStep.run`'s).
    A refused step has written at most the new token's cache positions, which the operators
    overwrite."""
    try:
        return step.run(*args)
    except RuntimeError as e:
        kept = _plans.get(model)
        if kept is not None and not kept.unchanged():
            _plans[model] = Plan(model)
            again = plan(model, args[0], args[-1] is not None)
            if again is not None:
                return run_or_forget(again, model, *args)
            return None
        warnings.warn(
            f"gpt1's decoding step refused this model ({str(e).splitlines()[0][:200]}); "
            "decoding runs torch's operators",
            RuntimeWarning,
            stacklevel=3,
        )
        forget(model, args[0].dtype)
        return None
