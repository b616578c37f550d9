"""Incremental decoding: key/value caches, one sequence at a time or many together.

Exact for GPT-1: with causal attention, a position's keys and values depend only on the tokens up
to it, and post-LN changes nothing about that. Two passes of the model use the caches, both
running `GPT`'s own blocks with a layout (`gpt1.model.layouts`) whose attention reads the cache:

- `forward_cached(model, ids, cache)`: ids `[B, T]` continue the positions a `KVCache` holds, and
  the cache grows by T (a prompt, or the next token of one sequence);
- `decode(model, ids, caches)`: the next token of each of n independent sequences, each with its
  own cache, in one pass; `decode_step(caches)` decides how their attention runs:
  - caches from one `SlotPool` (what `gpt1.inference.batched.BatchedDecoder` uses): every
    sequence's keys and values live in one `[slots, H, capacity, D]` buffer pair per layer, so
    the new keys are written with one indexed copy and attention over all the sequences, of
    different lengths, is one call with a padding mask (`PooledStep`);
  - any other caches: one call per sequence over its own cache (`LoopStep`).

Every attention call goes through the model's one seam (`gpt1.model.attention.attention`). Both
steps give the per-sequence results up to the summation order of the attention kernel
(`tests/test_decoding.py`).

A pass of one new token per row (every step after the prompt, in both passes) first offers the
rows to `gpt1.inference.block_step`: where it applies (inference, AVX2 or AVX-512; see there),
all blocks run in one C++ call that reads and writes the same cache buffers, and the layers
above do not run. Its results equal theirs up to summation order (`tests/test_block_step.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from gpt1.inference import arena, backend, block_step, int8_rows, matvec
from gpt1.model.attention import attention, merge_heads, split_heads

if TYPE_CHECKING:
    from gpt1.model.gpt import GPT

_MIN_CAPACITY = 64  # positions allocated at first: short runs never regrow


def _capacity(end: int, max_length: int | None) -> int:
    """Room for at least `end` positions: doubled, at least `_MIN_CAPACITY`, at most
    `max_length` (the model's n_positions) unless `end` itself is larger."""
    capacity = max(2 * end, _MIN_CAPACITY)
    return capacity if max_length is None else max(end, min(capacity, max_length))


# An int8 cache (`SlotPool`'s `dtype` int8) stores each head's D numbers of a position as one
# row of D int8 numbers and then its scale and bias as two fp32 numbers: x ~ q scale + bias.
INT8_ROW_EXTRA = 8  # bytes: the scale and the bias


def quantize_cache_rows(x: torch.Tensor) -> torch.Tensor:
    """Keys or values `[..., D]` as an int8 cache stores them: `[..., D + INT8_ROW_EXTRA]` int8.

    Per row (one position of one head): 255 steps of scale = (max - min) / 255 on a grid that
    holds 0, zero = round(-min / scale) the step 0 falls on, q = clamp(round(x / scale) + zero,
    0, 255) - 128 and bias = (128 - zero) scale, so x ~ q scale + bias within half a step (ties
    to even; 1 / scale is taken once; a row whose spread is below 255 times the least normal
    float stores every number as its smallest, scale 0). The grid holding 0 moved a trained
    model's top token less often than one starting at the row's smallest
    (`benchmarks/int8_rows_numerics.py`, docs/commands/kernels.md). A row holding an inf or a
    NaN gets a NaN scale: what reads it is NaN, as it would be unquantised, never quietly
    finite.

    The compiled module's `quantize_cache_rows` (what the decoding step writes too:
    `kernels/step.cpp`, `quantize_row`) gives the same bytes, faster, on the CPU; elsewhere
    `quantize_cache_rows_reference`, which `tests/test_block_step.py` holds it to."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16):
        built = backend.kernel_module()
        if built is not None and built.has_decode_step():
            return built.quantize_cache_rows(x)
    return quantize_cache_rows_reference(x)


def quantize_cache_rows_reference(x: torch.Tensor) -> torch.Tensor:
    """`quantize_cache_rows` in torch's operators."""
    x = x.float()
    low = x.amin(-1, keepdim=True)
    scale = (x.amax(-1, keepdim=True) - low) / 255
    # A spread below 255 times the least normal float (or none): every number is stored as the
    # row's smallest, exactly (1 / scale would overflow).
    normal = scale >= torch.finfo(torch.float32).tiny
    inv = torch.where(normal, 1 / scale, torch.zeros_like(scale))
    zero = (-low * inv).round()  # the step 0 falls on
    steps = ((x * inv).round() + zero).nan_to_num_(0).clamp_(0, 255)
    q = steps.sub_(128).to(torch.int8)
    bias = torch.where(normal, (128 - zero) * scale, low)
    scale = torch.where(normal, scale, torch.zeros_like(scale))
    scale = torch.where(torch.isfinite(x).all(-1, keepdim=True), scale, float("nan"))
    extra = torch.cat([scale, bias], -1).view(torch.int8)  # [..., 8]
    return torch.cat([q, extra], -1)


def cache_row_scales(rows: torch.Tensor) -> torch.Tensor:
    """Each of `quantize_cache_rows`'s rows' scale and bias: `[..., 2]` fp32."""
    extra = rows[..., rows.shape[-1] - INT8_ROW_EXTRA :]
    if rows.shape[-1] % 4:  # rows of a width off 4 bytes: their floats are not aligned for a view
        extra = extra.clone(memory_format=torch.contiguous_format)
    return extra.view(torch.float32)


def dequantize_cache_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`quantize_cache_rows`'s rows `[..., D + INT8_ROW_EXTRA]` as numbers of `dtype`:
    `[..., D]`."""
    extra = cache_row_scales(rows)
    return (rows[..., :-INT8_ROW_EXTRA].float() * extra[..., :1] + extra[..., 1:]).to(dtype)


def stored(buffer: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cached keys or values as activations of `dtype` read them: the buffer itself, or a
    widened copy where the pool stores them narrower (`SlotPool`'s `dtype`)."""
    if buffer.dtype == torch.int8:
        return dequantize_cache_rows(buffer, dtype)
    return buffer if buffer.dtype == dtype else buffer.to(dtype)


def written(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """New keys or values `[..., D]` as a buffer of `dtype` stores them (`stored` reads them)."""
    return quantize_cache_rows(x) if dtype == torch.int8 else x.to(dtype)


def row_width(like: torch.Tensor, dtype: torch.dtype) -> int:
    """The last size of a cache buffer of `dtype` for keys shaped like `like` (new keys
    `[..., D]`, or a buffer of that dtype already): D, or D + INT8_ROW_EXTRA for int8."""
    if dtype != torch.int8 or like.dtype == torch.int8:
        return like.shape[-1]
    return like.shape[-1] + INT8_ROW_EXTRA


def readable(buffer: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether the one-call step can read and write `buffer` for activations of `dtype`: it holds
    that dtype, or bf16 under fp32 activations, or int8 (`SlotPool`'s `dtype`)."""
    return (
        buffer.dtype == dtype
        or buffer.dtype == torch.int8
        or (buffer.dtype == torch.bfloat16 and dtype == torch.float32)
    )


class LayerCache:
    """One layer's keys and values of the positions seen so far (one sequence, or a batch of
    sequences of equal length).

    The keys and values live in buffers with room to spare (doubled when full), written in place:
    concatenating a fresh `[B, H, past + T, D]` pair per layer and step costs an allocation and
    a copy of the whole cache every token. Attention reads views of the filled part, the same
    numbers the concatenated tensors held.
    """

    def __init__(self, max_length: int | None = None, dtype: torch.dtype | None = None) -> None:
        self.k: torch.Tensor | None = None  # [B, H, capacity, D] buffers
        self.v: torch.Tensor | None = None
        self.length = 0  # filled positions
        self.max_length = max_length  # the model's n_positions: never grow the buffers past it
        self.dtype = dtype  # what the buffers store (None: the keys' own dtype; see SlotPool)

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new keys/values `[B, H, T, D]`; return all of them `[B, H, past + T, D]`."""
        end = self.length + k.shape[2]
        if self.k is None or end > self.k.shape[2]:
            capacity = _capacity(end, self.max_length)
            self.k = self._grown(self.k, k, capacity)
            self.v = self._grown(self.v, v, capacity)
        self.k[:, :, self.length : end] = written(k, self.k.dtype)
        self.v[:, :, self.length : end] = written(v, self.v.dtype)
        self.length = end
        return stored(self.k[:, :, :end], k.dtype), stored(self.v[:, :, :end], k.dtype)

    def room(self, end: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The key and value buffers `[B, H, capacity, D]`, grown to hold at least `end`
        positions (None before the first `extend`: their shape is not known yet)."""
        if self.k is None or self.v is None:
            return None
        if end > self.k.shape[2]:
            capacity = _capacity(end, self.max_length)
            self.k = self._grown(self.k, self.k, capacity)
            self.v = self._grown(self.v, self.v, capacity)
        return self.k, self.v

    def _grown(self, old: torch.Tensor | None, like: torch.Tensor, capacity: int) -> torch.Tensor:
        B, H = like.shape[:2]
        dtype = self.dtype or like.dtype
        buf = like.new_empty(B, H, capacity, row_width(like, dtype), dtype=dtype)
        if old is not None:
            buf[:, :, : self.length] = old[:, :, : self.length]
        return buf


class KVCache:
    """Per-layer `LayerCache`s of one decoding run; `len(cache)` is the number of cached positions.
    `dtype`: what their buffers store, as `SlotPool`'s."""

    def __init__(
        self, n_layer: int, max_length: int | None = None, dtype: torch.dtype | None = None
    ) -> None:
        self.layers = [LayerCache(max_length, dtype) for _ in range(n_layer)]

    def __len__(self) -> int:
        return self.layers[0].length

    @property
    def row(self) -> int:
        """The sequence's index in its layers' buffers (a plain cache of one sequence: 0)."""
        return 0

    def release(self) -> None:
        """Done with this cache (a pooled one gives its slot back; a plain one is just freed)."""

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions (drafted tokens that were rejected are dropped:
        the buffers keep their numbers, and the next write overwrites them)."""
        if not 0 <= length <= len(self):
            raise ValueError(f"cannot truncate a cache of {len(self)} positions to {length}")
        for layer in self.layers:
            layer.length = length


# ------------------------------------------------------------------ many sequences, one pool
class SlotPool:
    """Key/value buffers shared by the sequences of one model: per layer one `[slots, H,
    capacity, D]` pair, each sequence in a slot of its own (`cache()` hands one out, the cache's
    `release()` gives it back). Slots are handed out lowest first, so live sequences stay
    packed at the front; both sizes grow by doubling (capacity up to `max_length`), and the
    buffers are freed when the last slot is given back. Buffers start zeroed: attention over a
    pool may read unused positions (masked out), and they must hold finite numbers.

    `dtype`: what the buffers store; None, the keys' own dtype. Narrower than the activations
    (`int8_step.cache_dtype`: bf16 or int8 for the int8 model), it cuts what a step of many
    sequences reads: keys and values are rounded (bf16) or quantised a row at a time (int8:
    `quantize_cache_rows`, buffers `[slots, H, capacity, D + INT8_ROW_EXTRA]`) as they are
    written, and read back widened to the activations' dtype (`stored`)."""

    def __init__(
        self, n_layer: int, max_length: int | None = None, dtype: torch.dtype | None = None
    ) -> None:
        self.n_layer, self.max_length, self.dtype = n_layer, max_length, dtype
        self.k: list[torch.Tensor | None] = [None] * n_layer  # [slots, H, capacity, D]
        self.v: list[torch.Tensor | None] = [None] * n_layer
        self.taken: list[bool] = []
        self.expected = 0  # the most positions a slot said it will need (`expect`) since empty

    def expect(self, end: int) -> None:
        """A sequence of this pool will fill at most `end` positions (its prompt and the new
        tokens it asks for; the context at most): the buffers, when they next grow, grow to
        hold that at once. Growing by doubling on the way costs a copy of every buffer and the
        system's first touch of the new pages each time: a step of 64 sequences that grew took
        about three steps' time."""
        if self.max_length is not None:
            end = min(end, self.max_length)  # never more than the context
        self.expected = max(self.expected, end)

    def cache(self) -> PooledKVCache:
        """A fresh cache in the lowest free slot."""
        slot = self.taken.index(False) if False in self.taken else len(self.taken)
        if slot == len(self.taken):
            self.taken.append(True)
        self.taken[slot] = True
        return PooledKVCache(self, slot)

    def release(self, slot: int) -> None:
        self.taken[slot] = False
        while self.taken and not self.taken[-1]:
            self.taken.pop()
        if not self.taken:  # nothing live: free the memory
            self.k, self.v = [None] * self.n_layer, [None] * self.n_layer
            self.expected = 0

    def reserve(self, layer: int, slots: int, end: int, like: torch.Tensor) -> None:
        """Make layer `layer`'s buffers hold at least `slots` slots of `end` positions (keys
        shaped like `like` `[*, H, *, D]`), keeping what they hold."""
        old = self.k[layer]
        if old is not None and slots <= old.shape[0] and end <= old.shape[2]:
            return
        have_slots, have_len = (0, 0) if old is None else (old.shape[0], old.shape[2])
        new_slots = max(slots, 2 * have_slots, 1) if slots > have_slots else have_slots
        new_len = have_len
        if end > have_len:
            new_len = max(_capacity(end, self.max_length), self.expected)
        dtype = self.dtype or like.dtype
        H, width = like.shape[1], row_width(like, dtype)
        for bufs in (self.k, self.v):
            buf = like.new_zeros(new_slots, H, new_len, width, dtype=dtype)
            if bufs[layer] is not None:
                buf[:have_slots, :, :have_len] = bufs[layer]
            bufs[layer] = buf


class PooledLayerCache:
    """One layer of a `PooledKVCache`: `LayerCache.extend` on the sequence's slot of the pool."""

    def __init__(self, pool: SlotPool, layer: int, slot: int) -> None:
        self.pool, self.layer, self.slot = pool, layer, slot
        self.length = 0

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new keys/values `[1, H, T, D]`; return all of them `[1, H, past + T, D]`."""
        if k.shape[0] != 1:
            raise ValueError(f"a pooled cache holds one sequence; got a batch of {k.shape[0]}")
        end = self.length + k.shape[2]
        self.pool.reserve(self.layer, self.slot + 1, end, k)
        keys, values = self.pool.k[self.layer], self.pool.v[self.layer]
        keys[self.slot, :, self.length : end] = written(k[0], keys.dtype)
        values[self.slot, :, self.length : end] = written(v[0], values.dtype)
        self.length = end
        here = slice(self.slot, self.slot + 1)
        return stored(keys[here, :, :end], k.dtype), stored(values[here, :, :end], k.dtype)

    @staticmethod
    def one_pool(layers: list) -> SlotPool | None:
        """The pool whose slots `layers` all are, each the same layer of it; else None."""
        first = layers[0]
        if all(
            isinstance(layer, PooledLayerCache)
            and layer.pool is first.pool
            and layer.layer == first.layer
            for layer in layers
        ):
            return first.pool
        return None

    @staticmethod
    def extend_fresh(layers: list, k: torch.Tensor, v: torch.Tensor) -> bool:
        """`extend` of several empty caches by keys/values `[G, H, T, D]` (row g: layers[g]'s)
        with one indexed write per buffer, where they are one layer of one pool's slots; False
        (nothing written) for any other caches."""
        pool = PooledLayerCache.one_pool(layers)
        if pool is None or any(layer.length for layer in layers):
            return False
        end, index = k.shape[2], layers[0].layer
        pool.reserve(index, max(layer.slot for layer in layers) + 1, end, k)
        slots = PooledLayerCache._slots(layers) or torch.tensor(
            [layer.slot for layer in layers], device=k.device
        )
        pool.k[index][slots, :, :end] = written(k, pool.k[index].dtype)  # indexed: no casting
        pool.v[index][slots, :, :end] = written(v, pool.v[index].dtype)
        for layer in layers:
            layer.length = end
        return True

    @staticmethod
    def _slots(layers: list) -> slice | None:
        """The slots of `layers` as a slice where they are consecutive, in order (a burst of
        new requests takes the lowest free slots): a copy into a slice, where an indexed write
        of 64 prompts' keys and values took nearly twice as long."""
        first = layers[0].slot
        if all(layer.slot == first + g for g, layer in enumerate(layers)):
            return slice(first, first + len(layers))
        return None

    def room(self, end: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The pool's key and value buffers `[slots, H, capacity, D]` of this layer, grown to
        hold this slot and at least `end` positions (None before the pool's first write)."""
        like = self.pool.k[self.layer]
        if like is None:
            return None
        self.pool.reserve(self.layer, self.slot + 1, end, like)
        return self.pool.k[self.layer], self.pool.v[self.layer]


class PooledKVCache(KVCache):
    """A `KVCache` of one sequence whose keys and values live in a slot of a `SlotPool`."""

    def __init__(self, pool: SlotPool, slot: int) -> None:
        self.pool, self.slot = pool, slot
        self.layers = [PooledLayerCache(pool, i, slot) for i in range(pool.n_layer)]
        self.released = False

    @property
    def row(self) -> int:
        return self.slot

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.pool.release(self.slot)


# ------------------------------------------------------------------ one decoding step
class LoopStep:
    """Attention for one new token of each of n sequences, one sequence at a time."""

    def __init__(self, caches: list[KVCache]) -> None:
        self.caches = caches

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float
    ) -> torch.Tensor:
        """q, k, v `[n, H, 1, D]` (row r: sequence r's new token) -> `[n, H, 1, D]`."""
        rows = []
        for r, cache in enumerate(self.caches):
            keys, values = cache.layers[layer].extend(k[r : r + 1], v[r : r + 1])
            rows.append(attention(q[r : r + 1], keys, values, dropout_p=dropout_p))
        return torch.cat(rows)


class PooledStep:
    """Attention for one new token of each of n sequences of one `SlotPool`: per layer, one
    indexed write of the new keys and values and one SDPA call over the pool's slots
    `lo..hi-1`, each slot masked to its own length (a slot in that range that is not in this
    step attends to its first position only, and its row is dropped)."""

    def __init__(self, caches: list[PooledKVCache]) -> None:
        self.caches, self.pool = caches, caches[0].pool
        slots = [c.slot for c in caches]
        lengths = [len(c) for c in caches]
        self.lo, self.hi = min(slots), max(slots) + 1
        self.end = max(lengths) + 1  # positions attended to, new token included
        like = next(t for t in self.pool.k if t is not None)
        device = like.device
        self.slots = torch.tensor(slots, device=device)
        self.positions = torch.tensor(lengths, device=device)
        self.rows = None if slots == list(range(self.lo, self.hi)) else self.slots - self.lo
        seen = torch.ones(self.hi - self.lo, dtype=torch.long, device=device)  # holes: 1 position
        seen[self.slots - self.lo] = self.positions + 1
        self.visible = torch.arange(self.end, device=device) < seen[:, None]  # [hi - lo, end]
        self.mask: torch.Tensor | None = None  # made at the first layer, in the queries' dtype

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float
    ) -> torch.Tensor:
        """q, k, v `[n, H, 1, D]` (row r: sequence r's new token) -> `[n, H, 1, D]`."""
        self.pool.reserve(layer, self.hi, self.end, k)
        keys, values = self.pool.k[layer], self.pool.v[layer]
        keys[self.slots, :, self.positions] = written(k[:, :, 0], keys.dtype)  # indexed: no casting
        values[self.slots, :, self.positions] = written(v[:, :, 0], values.dtype)
        for cache in self.caches:
            cache.layers[layer].length += 1
        if self.rows is not None:  # scatter the queries into the slot range
            q = q.new_zeros(self.hi - self.lo, *q.shape[1:]).index_copy_(0, self.rows, q)
        window = slice(self.lo, self.hi)
        keys = stored(keys[window, :, : self.end], q.dtype)
        values = stored(values[window, :, : self.end], q.dtype)
        if self.mask is None or self.mask.dtype != q.dtype:
            # Additive (0 / -inf) rather than bool: SDPA's CPU kernel runs about 1.4x faster.
            mask = torch.zeros(self.visible.shape, dtype=q.dtype, device=q.device)
            self.mask = mask.masked_fill_(~self.visible, float("-inf"))[:, None, None, :]
        y = attention(q, keys, values, attn_mask=self.mask, dropout_p=dropout_p)
        return y if self.rows is None else y.index_select(0, self.rows)


def decode_step(caches: list[KVCache]) -> LoopStep | PooledStep:
    """How to attend for one new token of each cache's sequence: in one call where two or more
    caches share a `SlotPool` (and have been filled at least once) and fill at least half of
    the slot range they span (each slot in it costs a row of attention), else one by one (a
    lone sequence needs no mask, index tensors or scattered writes)."""
    first = caches[0] if caches else None
    if (
        len(caches) > 1
        and isinstance(first, PooledKVCache)
        and all(isinstance(c, PooledKVCache) and c.pool is first.pool for c in caches)
        and any(t is not None for t in first.pool.k)
        and len({c.slot for c in caches}) == len(caches)
    ):
        slots = [c.slot for c in caches]
        if max(slots) - min(slots) + 1 <= 2 * len(caches):
            return PooledStep(caches)
    return LoopStep(caches)


# ------------------------------------------------------------------ the passes
class CachedTokens:
    """The layout of `forward_cached` (see `gpt1.model.layouts`): new tokens `[B, T, C]` after
    the positions one layer's cache holds; they attend to every cached position and to the new
    ones up to their own.

    `last_only`: the last block of a pass whose caller reads the last position alone (a prompt
    before its first token). Every new key and value is still cached, but only the last
    position queries, and the block's rest runs on that row: `[B, 1, C]`."""

    writes_cache = True

    def __init__(self, cache: LayerCache, last_only: bool = False) -> None:
        self.cache, self.last_only = cache, last_only

    def attend(self, qkv: torch.Tensor, n_head: int, dropout_p: float) -> torch.Tensor:
        q, k, v = split_heads(qkv, n_head)  # [B, H, T, D]
        T, fresh = q.shape[2], self.cache.length == 0
        keys, values = self.cache.extend(k, v)  # [B, H, past + T, D], as the cache stores them
        # A fresh prompt attends over its keys and values as computed, as `PromptRows`'s groups
        # do; tokens after cached positions, over what the cache stores (bf16, int8 rows).
        if not fresh:
            k, v = keys, values
        if self.last_only:  # the last position sees every key: no mask
            return merge_heads(attention(q[:, :, -1:], k, v, dropout_p=dropout_p))  # [B, 1, C]
        past = k.shape[2] - T
        mask = None
        if past and T > 1:
            # New queries see every cached key and the new keys up to their own position.
            mask = torch.ones(T, past + T, dtype=torch.bool, device=q.device).tril(past)
        y = attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=not past)
        return merge_heads(y)  # [B, T, C]

    def query_rows(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, -1:] if self.last_only else x


class PromptRows:
    """The layout of `prefill` for one layer: x `[N, C]`, the new tokens of several sequences
    one after another (`lengths[i]` of sequence i), each attending as `CachedTokens` does over
    its own cache (`layers[i]`) and its own new tokens; fresh prompts of one length attend in
    one call together. `last_only`: as `CachedTokens`'s, each sequence's last row alone queries
    and goes on (`[n, C]`)."""

    writes_cache = True

    def __init__(self, layers: list[LayerCache], lengths: list[int], last_only: bool = False):
        self.layers, self.lengths, self.last_only = layers, lengths, last_only

    def attend(self, qkv: torch.Tensor, n_head: int, dropout_p: float) -> torch.Tensor:
        parts = qkv.split(self.lengths)
        self._reserve(qkv, n_head)
        out: list[torch.Tensor | None] = [None] * len(parts)
        # Fresh prompts of one length (a server's burst of new requests) attend in one call:
        # each (sequence, head) pair is its own problem to SDPA's kernel, so the rows are the
        # bits the per-sequence calls give (`tests/test_decoding.py`), without a call apiece.
        for group in self._fresh_groups():
            whole = len(group) == len(parts)  # every prompt, in order: qkv as it lies
            rows = qkv.reshape(len(group), -1, qkv.shape[-1]) if whole else None
            if rows is None:
                rows = torch.stack([parts[i] for i in group])
            q, k, v = split_heads(rows, n_head)  # [G, H, T, D]
            layers = [self.layers[i] for i in group]
            if not PooledLayerCache.extend_fresh(layers, k, v):
                for g, layer in enumerate(layers):
                    layer.extend(k[g : g + 1], v[g : g + 1])
            if self.last_only:  # the last position sees every key: no mask
                y = merge_heads(attention(q[:, :, -1:], k, v, dropout_p=dropout_p))  # [G, 1, C]
            else:
                y = merge_heads(attention(q, k, v, dropout_p=dropout_p, is_causal=True))
            if whole:
                return y.reshape(-1, y.shape[-1])
            for g, i in enumerate(group):
                out[i] = y[g]
        for i, (layer, part) in enumerate(zip(self.layers, parts)):
            if out[i] is None:
                layout = CachedTokens(layer, self.last_only)
                out[i] = layout.attend(part[None], n_head, dropout_p)[0]
        return torch.cat(out)

    def _fresh_groups(self) -> list[list[int]]:
        """Indices of the sequences with empty caches, grouped by prompt length (groups of two
        or more; the rest attend one by one)."""
        by_length: dict[int, list[int]] = {}
        for i, (layer, length) in enumerate(zip(self.layers, self.lengths)):
            if layer.length == 0 and length > 1:
                by_length.setdefault(length, []).append(i)
        return [group for group in by_length.values() if len(group) > 1]

    def _reserve(self, qkv: torch.Tensor, n_head: int) -> None:
        """Slots of one pool: grow its buffers once for every prompt of this call, not by
        doubling as each sequence writes (a copy of the buffers per doubling)."""
        layers = self.layers
        pool = PooledLayerCache.one_pool(layers)
        if pool is None:
            return
        slots = max(layer.slot for layer in layers) + 1
        end = max(layer.length + length for layer, length in zip(layers, self.lengths))
        D = qkv.shape[-1] // (3 * n_head)
        pool.reserve(layers[0].layer, slots, end, qkv.new_empty(1, n_head, 0, D))

    def query_rows(self, x: torch.Tensor) -> torch.Tensor:
        return self.last_rows(x) if self.last_only else x

    def last_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Each sequence's last row of x `[N, ...]`: `[n, ...]`."""
        return x[torch.tensor(self.lengths, device=x.device).cumsum(0) - 1]


class StepTokens:
    """The layout of `decode` for one layer: x `[n, C]`, one new token of each of n sequences,
    attending over its own cache through a `LoopStep` or `PooledStep`."""

    writes_cache = True

    def __init__(self, step: LoopStep | PooledStep, layer: int) -> None:
        self.step, self.layer = step, layer

    def attend(self, qkv: torch.Tensor, n_head: int, dropout_p: float) -> torch.Tensor:
        n = qkv.shape[0]
        q, k, v = qkv.view(n, 3, n_head, 1, -1).unbind(1)  # 3 x [n, H, 1, D]
        return self.step.attend(self.layer, q, k, v, dropout_p).reshape(n, -1)  # [n, C]

    def query_rows(self, x: torch.Tensor) -> torch.Tensor:
        return x


# Gathering a model's weights into one storage (`arena`) costs a one-time move and the system's
# first touch of the new pages, and saves time on every token after. Measured at GPT-1's size on
# an AMD EPYC VM, one thread (2026-12-03): the move took 1.3 s (fp32), 0.55 s (bf16), 0.5 s
# (int8); a token then took 2.6-4.5 ms less (fp32), 1-1.6 (bf16), 0.9-2.4 (int8), so the move
# pays for itself after about 300-450 tokens. A generation asking for fewer leaves the weights
# where they are; a server (`BatchedDecoder`) gathers at once.
GATHER_FROM_TOKENS = 384


def prepare_to_decode(model: GPT, new_tokens: int | None = None) -> None:
    """Before `model` decodes `new_tokens` tokens (None: an open-ended number, as a server
    does): this process may build the kernel (`backend.expect_decoding`); a model that
    `for_inference` marked, decoding at least `GATHER_FROM_TOKENS`, has its weights gathered
    into one storage now (once), its step planned again over them."""
    backend.expect_decoding()
    if new_tokens is not None and new_tokens < GATHER_FROM_TOKENS:
        return
    if arena.marked(model):
        block_step.drop(model)  # its plan holds the tensors about to move
        if arena.gather_if_marked(model):
            block_step.prepare(model)


def _check_room(model: GPT, tokens: int) -> None:
    if tokens > model.config.n_positions:
        raise ValueError(
            f"sequence of {tokens} tokens is longer than n_positions={model.config.n_positions}"
        )


def forward_cached(
    model: GPT, ids: torch.Tensor, cache: KVCache, last_only: bool = False
) -> torch.Tensor:
    """`model(ids)` for ids `[B, T]` that continue the positions `cache` holds: hidden states
    `[B, T, n_embd]`; the cache grows by T (inference). `last_only`: the last position's alone,
    `[B, 1, n_embd]`, what choosing the next token reads; the last block then runs everything
    after its keys and values on that position only (a T-token prompt saves about a twelfth
    of its products at GPT-1's 12 blocks)."""
    backend.expect_decoding()  # this process decodes: the kernel may be built
    past, T = len(cache), ids.shape[-1]
    _check_room(model, past + T)
    x, _ = model.embed(ids, torch.arange(past, past + T, device=ids.device))
    if T == 1:  # one new token a row: the blocks in one call, where the kernel applies
        rows = [cache.row + b for b in range(ids.shape[0])]  # a pooled cache: its slot
        hidden = _one_call_step(model, x[:, 0], [cache] * ids.shape[0], rows)
        if hidden is not None:
            return hidden[:, None]
    elif past > 0 and ids.shape[0] == 1 and T <= matvec.MAX_ROWS:
        # A few new positions continuing one sequence (a verifying pass of drafted tokens):
        # one call too, each position a row of the sequence's cache attending to the ones
        # before it, each row's result the same bits as the position decoded alone. A prompt
        # (nothing cached) always takes the blocks below, whatever cache it fills.
        lengths = list(range(past, past + T))
        hidden = _one_call_step(model, x[0], [cache] * T, [cache.row] * T, lengths=lengths)
        if hidden is not None:
            return hidden[None, -1:] if last_only else hidden[None]
    last = len(model.h) - 1
    for i, (block, layer) in enumerate(zip(model.h, cache.layers)):
        x = block(x, CachedTokens(layer, last_only and i == last))
    return x


def prefill(
    model: GPT, prompts: list[torch.Tensor], caches: list[KVCache], last_only: bool = True
) -> torch.Tensor:
    """The new tokens of several sequences (`prompts[i]` `[1, T_i]` continuing `caches[i]`)
    through the model at once: the last position's hidden state of each, `[n, n_embd]`; each
    cache grows by its T_i. The weight products run on all their rows together (a prompt of a
    few rows alone reads every weight for them); attention runs per sequence, as
    `forward_cached` runs it, and the int8 products take one activation scale per row
    (`int8_rows.per_row`), so a sequence's result does not depend on the others'. The last
    block runs past its keys and values on those last rows alone (`last_only=False`: on every
    row, the last ones picked after it; `benchmarks/many_rows.py` compares the two)."""
    backend.expect_decoding()
    lengths = [int(p.shape[1]) for p in prompts]
    for length, cache in zip(lengths, caches):
        _check_room(model, len(cache) + length)
    ids = torch.cat([p[0] for p in prompts])  # [N]
    positions = torch.cat(
        [torch.arange(len(c), len(c) + t, device=ids.device) for c, t in zip(caches, lengths)]
    )
    x, _ = model.embed(ids, positions)  # [N, C]
    last = len(model.h) - 1
    with int8_rows.per_row():
        for i, block in enumerate(model.h):
            layout = PromptRows([c.layers[i] for c in caches], lengths, last_only and i == last)
            x = block(x, layout)
    return x if last_only else layout.last_rows(x)


def decode(
    model: GPT, ids: torch.Tensor, caches: list[KVCache], one_call: bool = True
) -> torch.Tensor:
    """The next token of each of n independent sequences: ids `[n]` -> hidden `[n, n_embd]`.

    Sequence r continues `caches[r]` (filled by earlier `forward_cached` calls, of any lengths)
    by `ids[r]`, and its cache grows by one. This is continuous batching: the weights are read
    once for all n sequences instead of once each, and with caches from one `SlotPool` attention
    is one call per layer for all of them. The result for sequence r is what
    `forward_cached(model, ids[r].view(1, 1), caches[r])[0, -1]` gives, up to the summation
    order of the larger matrix products.

    Where the one-call step applies (`gpt1.inference.block_step`), rows go through it in groups of
    up to `matvec.MAX_ROWS`, each group reading the weights once: each row's result is then the
    same bits whichever rows share its step (int8 never takes the many-row product, which
    quantises the activations of all the rows with one scale). `one_call=False` runs all the rows
    at once with int8 x int8 products, one activation scale per row: the many-row int8 step
    (`gpt1.inference.int8_step`), in the one-call step where it applies, else through the blocks
    as modules.
    """
    backend.expect_decoding()
    if ids.dim() != 1 or len(caches) != ids.shape[0]:
        raise ValueError(f"decode needs ids [n] and n caches; got {list(ids.shape)}, {len(caches)}")
    positions = torch.tensor([len(c) for c in caches], device=ids.device)
    if bool((positions >= model.config.n_positions).any()):
        raise ValueError(
            f"a cache already holds n_positions={model.config.n_positions} tokens: no room"
        )
    x, _ = model.embed(ids, positions)  # [n, C]
    group = matvec.MAX_ROWS
    if not one_call:
        return _decode_rows(model, x, caches, one_call=False)
    if x.shape[0] <= group or block_step.plan(model, x[:group]) is None:
        return _decode_rows(model, x, caches)
    return torch.cat(
        [
            _decode_rows(model, x[lo : lo + group], caches[lo : lo + group])
            for lo in range(0, x.shape[0], group)
        ]
    )


def _decode_rows(
    model: GPT, x: torch.Tensor, caches: list[KVCache], one_call: bool = True
) -> torch.Tensor:
    """`decode` on embedded rows x `[n, C]`: the one-call step where it applies (with int8
    products of one scale per row where not `one_call`), else the blocks as modules."""
    rows = [c.row for c in caches]
    hidden = _one_call_step(model, x, caches, rows, integer=not one_call)
    if hidden is not None:
        return hidden
    step = decode_step(caches)  # one attention call per layer for pooled caches
    for i, block in enumerate(model.h):
        x = block(x, StepTokens(step, i))
    return x


_ROOMY = (LayerCache, PooledLayerCache)  # the caches whose buffers the one-call step can write


def _one_call_step(
    model: GPT,
    x: torch.Tensor,
    caches: list[KVCache],
    rows: list[int],
    integer: bool = False,
    lengths: list[int] | None = None,
) -> torch.Tensor | None:
    """x `[R, C]`, one new token of each row (row r at index `rows[r]` of `caches[r]`'s buffers,
    at position `lengths[r]`, by default the positions the cache holds; a cache may hold several
    rows: a batch's at one position, or one sequence's at consecutive ones) through every block
    in one call (`gpt1.inference.block_step`), each cache growing to hold its rows' positions;
    None, with the caches unchanged, where that does not apply. `integer`: the int8 layers
    multiply int8 x int8 with a scale per row, any number of rows."""
    step = block_step.plan(model, x, integer)
    packed = block_step.integer_weights(model) if step is not None and integer else None
    if step is None or (integer and packed is None):
        return None
    lengths = [len(c) for c in caches] if lengths is None else lengths
    distinct = {id(c): c for c in caches}  # a cache may hold several rows
    ends = dict.fromkeys(distinct, 0)  # each cache's length after the step: past its last row
    for cache, end in zip(caches, lengths):
        ends[id(cache)] = max(ends[id(cache)], end + 1)
    found = _one_pools_buffers(model, caches, distinct, ends, x.dtype)
    if found is None:
        found = _each_caches_buffers(model, caches, distinct, ends, x.dtype)
    if found is None:
        return None
    keys, values = found
    hidden = block_step.run_or_forget(step, model, x, keys, values, rows, lengths, packed)
    if hidden is not None:
        for key, cache in distinct.items():
            for layer in cache.layers:
                layer.length = ends[key]
    return hidden


_Buffers = tuple[list[torch.Tensor], list[torch.Tensor]]


def _each_caches_buffers(
    model: GPT, caches: list[KVCache], distinct: dict, ends: dict, dtype: torch.dtype
) -> _Buffers | None:
    """Per block, per row, the key and value buffers of the row's cache, grown to hold the
    cache's `ends` positions; None where a cache is not one the step can write, holds nothing
    yet, or holds another dtype."""
    keys, values = [], []
    for i in range(len(model.h)):
        layers = {key: cache.layers[i] for key, cache in distinct.items()}
        if not all(isinstance(layer, _ROOMY) for layer in layers.values()):
            return None  # not a cache of this module's
        # Every cache's room first, then the buffers: growing a pool's buffers for one cache
        # replaces them for all its slots, and a row given the old ones would write its new
        # key and value where the pool no longer reads.
        for key, layer in layers.items():
            if layer.room(ends[key]) is None:
                return None
        buffers = {key: layer.room(ends[key]) for key, layer in layers.items()}  # all grown
        for cache in caches:
            k, v = buffers[id(cache)]
            if not readable(k, dtype):
                return None
            keys.append(k)
            values.append(v)
    return keys, values


def _one_pools_buffers(
    model: GPT, caches: list[KVCache], distinct: dict, ends: dict, dtype: torch.dtype
) -> _Buffers | None:
    """`_each_caches_buffers` where every cache is a slot of one `SlotPool` (what
    `BatchedDecoder` decodes): per block, the pool grows once to hold its highest slot and
    longest end, and every row takes its buffers. None where that is not the case (the caller
    then asks each cache), or where the pool holds nothing yet or another dtype."""
    if any(type(c) is not PooledKVCache for c in distinct.values()):
        return None
    pool = caches[0].pool
    if any(c.pool is not pool for c in distinct.values()):
        return None
    slots = max(c.slot for c in distinct.values()) + 1
    end = max(ends.values())
    keys, values = [], []
    for i in range(len(model.h)):
        like = pool.k[i]
        if like is None or not readable(like, dtype):
            return None
        pool.reserve(i, slots, end, like)
        keys += [pool.k[i]] * len(caches)
        values += [pool.v[i]] * len(caches)
    return keys, values
