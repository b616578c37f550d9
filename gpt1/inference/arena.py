"""The weights a decoding step reads, moved into one storage, in the order it reads them, on huge
pages where the system has them: `gather(model)`. `for_inference` marks a CPU model's GPT for it
(`gather_when_decoding`), and `gpt1.inference.decoding.prepare_to_decode` moves it
(`gather_if_marked`) when it is about to decode enough tokens for the move to pay (a server:
always; a generation: `decoding.GATHER_FROM_TOKENS` or more). Commands that never decode
(classification) never pay the move.

Batch-1 decoding reads every weight once a token, so it runs at the speed the weights stream
from memory. Loaded as usual, each weight is an allocation of its own on 4 KiB pages: a TLB miss
every 4 KiB, hardware prefetchers that stop at each page's end, and a jump between products.
One storage, 2 MiB aligned and advised for transparent huge pages (`madvise(MADV_HUGEPAGE)`,
which Linux's default THP mode, `madvise`, honours), reads as one stream. Measured on an AMD
EPYC (Zen 4), one row through a GPT-1 decoding step's 49 products, one thread, alternating
(`python benchmarks/kernel_targets.py --storage --clock wall --repeats 7`, 2026-12-03), as loaded
against gathered: int8 17.4 -> 24.0 GB/s, bf16 19.0 -> 22.0, fp32 24.3 -> 26.6.

What a step streams moves first, in reading order: the weights, scales and biases of linear
layers (plain or int8), LayerNorm gains, and the output layer (the token table, or the int8
head's copy); every other tensor of the model follows. Values, dtypes, shapes, parameter objects
and names do not change; each moved parameter's `.data` (each buffer) becomes a view of the
storage. Elsewhere than Linux, or where THP is off, the storage is plain memory, still in
reading order. `GPT1_WEIGHT_ARENA=0` leaves every weight where it is.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading
import weakref

import torch
from torch import nn

from gpt1.inference.backend import huge_pages
from gpt1.inference.quantize import Int8Head, Int8Linear

HUGE_PAGE = 2 << 20  # x86-64's transparent huge page
_ALIGN = 64  # each tensor starts on a cache line
_MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux
_RETURN_BYTES = 1 << 20  # after moving a tensor this large, its old pages go back at once

# Modules whose own tensors a decoding step streams (`PackedLinear` is an `nn.Linear`).
_STREAMED = (nn.Linear, Int8Linear, nn.LayerNorm)


class Slot:
    """One tensor to move: module `owner`'s attribute `name` (a parameter or a buffer), or an
    object's plain tensor attribute (the int8 head's copy)."""

    def __init__(self, owner: object, name: str) -> None:
        self.owner, self.name = owner, name

    @property
    def tensor(self) -> torch.Tensor:
        return getattr(self.owner, self.name)

    def move_to(self, view: torch.Tensor) -> None:
        current = self.tensor
        with torch.no_grad():
            view.copy_(current)
        if isinstance(current, nn.Parameter):
            current.data = view  # the same Parameter object: optimisers and hooks keep it
        else:
            setattr(self.owner, self.name, view)


_marked: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # to gather at their first decoding
_marking = threading.Lock()


def gather_when_decoding(model: nn.Module) -> None:
    """Mark each GPT in `model` to be gathered when it first decodes (the LSTM baseline decodes
    by reading its window again, many rows a step: nothing to stream)."""
    from gpt1.model.gpt import GPT

    for module in model.modules():
        if isinstance(module, GPT):
            _marked.add(module)


def marked(model: nn.Module) -> bool:
    """Whether `model` waits to be gathered (cheap: decoding asks before every generation)."""
    return model in _marked


def gather_if_marked(model: nn.Module) -> bool:
    """Gather `model` if it is marked (then unmark it); whether it was."""
    if model not in _marked:
        return False
    with _marking:  # two threads' first steps: one moves the tensors
        if model not in _marked:
            return False
        _marked.discard(model)
        gather(model)
    return True


def streamed_slots(model: nn.Module) -> list[Slot]:
    """The tensors a decoding step of `model` streams, in the order it reads them: each block's
    layers in module order, then the output layer."""
    slots = [s for m in model.modules() if isinstance(m, _STREAMED) for s in _own_slots(m)]
    for module in model.modules():
        if not callable(getattr(module, "lm_weight", None)):
            continue
        head = getattr(module, "lm_head_kernel", None)
        if isinstance(head, Int8Head):  # int8: the head reads its own copy, not the table
            slots += [Slot(head, "q"), Slot(head, "scale")]
        elif isinstance(module.wte, nn.Embedding):  # the token table is the output layer
            slots.append(Slot(module.wte, "weight"))
    return slots


def gather(model: nn.Module) -> int:
    """Move the tensors `model`'s decoding streams into one storage (see the module's docstring),
    and after them every other tensor of the model: a checkpoint loaded from safetensors is one
    file mapping that any tensor left on it would keep whole. Returns the bytes moved (0:
    nothing to move). The model is changed in place; its values are not."""
    slots, seen = [], set()
    everything = [s for m in model.modules() for s in _own_slots(m)]
    for slot in streamed_slots(model) + everything:
        if id(slot.tensor) not in seen:  # a tensor two modules share moves once
            seen.add(id(slot.tensor))
            slots.append(slot)
    if not slots:
        return 0
    places = views([(s.tensor.dtype, s.tensor.shape) for s in slots])
    for slot, view in zip(slots, places):
        slot.move_to(view)
        if view.numel() * view.element_size() >= _RETURN_BYTES:
            _return_freed_memory()  # the old copy's pages, before the next copy is written
    total = sum(v.numel() * v.element_size() for v in places)
    for module in model.modules():
        head = getattr(module, "lm_head_kernel", None)
        if isinstance(head, Int8Head):
            head.table_moved(module.lm_weight())  # same values: its int8 copy still holds
    return total


def _own_slots(module: nn.Module) -> list[Slot]:
    """`module`'s own parameters and buffers (not its children's) on the CPU."""
    own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
    return [Slot(module, name) for name, t in own if t.is_cpu and t.numel() > 0]


def views(specs: list[tuple[torch.dtype, torch.Size]]) -> list[torch.Tensor]:
    """Uninitialised tensors of these (dtype, shape)s, one after another in one huge-page
    storage (`huge_page_bytes`), each on a cache line of its own."""
    sizes = [torch.Size(shape).numel() * dtype.itemsize for dtype, shape in specs]
    storage = huge_page_bytes(sum(-(-n // _ALIGN) * _ALIGN for n in sizes))
    out, offset = [], 0
    for (dtype, shape), n in zip(specs, sizes):
        out.append(storage[offset : offset + n].view(dtype).view(shape))
        offset += -(-n // _ALIGN) * _ALIGN
    return out


def huge_page_bytes(n: int) -> torch.Tensor:
    """n bytes (uint8, uninitialised) starting on a huge-page boundary, advised for huge pages
    before any page is touched (`gpt1 info --kernels` shows whether the system grants them)."""
    # Whole huge pages from the first aligned byte, inside the allocation.
    raw = torch.empty(-(-n // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    _advise_huge(raw.data_ptr() + start, n)
    return raw[start : start + n]


def _return_freed_memory() -> None:
    """Hand memory the allocator holds free back to the system (glibc's `malloc_trim`): the
    weights' old copies are freed into its heap, which would otherwise keep them resident."""
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)


@functools.cache
def _libc_function(name: str):
    """libc's function `name` on Linux, else None (musl has no malloc_trim)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None


def _advise_huge(address: int, length: int) -> None:
    """Ask Linux for huge pages over [address, address + length) rounded up to whole huge pages
    (`huge_page_bytes` allocates them); a no-op elsewhere, or where Linux refuses."""
    madvise = _libc_function("madvise")
    if madvise is None or huge_pages() in ("never", "unavailable"):
        return  # plain pages
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise(address, -(-length // HUGE_PAGE) * HUGE_PAGE, _MADV_HUGEPAGE)
