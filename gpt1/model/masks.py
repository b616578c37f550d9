"""CPU dropout masks: exact-rate keep masks drawn in bulk, on every intra-op thread.

torch's CPU samplers (`bernoulli_`, `randint`) draw one Mersenne-Twister number per element on one
thread; at the mini model's shapes that made mask drawing a tenth of a training step. Here:

- one 62-bit seed per mask comes from torch's default generator, so `torch.manual_seed`, saved RNG
  states and exact resume decide every mask as before;
- the mask is cut into fixed chunks of `CHUNK` elements; chunk i gets its own SFC64 stream seeded
  with (seed, i), and the chunks are filled by a small thread pool (numpy releases the GIL in these
  loops). The chunking does not depend on the thread count, so neither does the mask;
- a 16-bit random value drops when it falls in the first `num` of `den` equal buckets of
  `65536 // den` values; the few values past the last whole bucket are redrawn exactly, so the
  drop rate is exactly num/den, not a rounded threshold.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

# Elements per independently seeded chunk (2 MiB of random bits).
CHUNK = 1 << 20

# The bit patterns of 1.0 in the 16-bit float types: a mask made directly in the activations'
# dtype multiplies about 4x faster on CPU than a uint8 one (which is converted on the fly).
_ONE_BITS = {torch.bfloat16: 0x3F80, torch.float16: 0x3C00}

_pools: dict[int, ThreadPoolExecutor] = {}  # one per thread count torch has been set to


def _workers() -> ThreadPoolExecutor:
    n = torch.get_num_threads()
    if n not in _pools:
        _pools[n] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="gpt1-masks")
    return _pools[n]


def _fill(out: np.ndarray, seed: int, index: int, num: int, den: int, one: int | None) -> None:
    """Write chunk `index`'s keep values into `out` (uint8 0/1, or int16 0/`one` bit patterns)."""
    n = out.size
    bits = np.random.SFC64(np.random.SeedSequence([seed, index]))
    u = bits.random_raw((n + 3) // 4).view(np.int16)[:n]  # [n] uniform
    bucket = 65536 // den
    keep = u >= num * bucket - 32768  # numpy: its int16 compares are ~3x torch's here
    leftover = np.flatnonzero(u >= bucket * den - 32768)
    if leftover.size:
        keep[leftover] = np.random.Generator(bits).integers(0, den, leftover.size) >= num
    if one is None:
        out[...] = keep.view(np.uint8)
    else:
        np.multiply(keep, np.int16(one), out=out)


def keep_mask(
    shape: torch.Size | tuple[int, ...], num: int, den: int, dtype: torch.dtype = torch.uint8
) -> torch.Tensor:
    """A CPU dropout mask of `shape`: 0 with probability exactly num/den, else 1.

    The mask is bf16/fp16 when `dtype` is one of those (same bytes as the activations it
    multiplies), else uint8 (0/1).
    """
    n = math.prod(shape)
    seed = int(torch.randint(0, 1 << 62, (1,), dtype=torch.int64))
    one = _ONE_BITS.get(dtype)
    out = np.empty(n, dtype=np.uint8 if one is None else np.int16)
    starts = range(0, n, CHUNK)
    jobs = [(out[s : s + CHUNK], seed, i, num, den, one) for i, s in enumerate(starts)]
    if len(jobs) > 1 and torch.get_num_threads() > 1:
        list(_workers().map(lambda job: _fill(*job), jobs))  # list(): wait, re-raise errors
    else:
        for job in jobs:
            _fill(*job)
    mask = torch.from_numpy(out)
    return (mask if one is None else mask.view(dtype)).view(shape)
