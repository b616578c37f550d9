"""Which implementation runs each kind of weight product, and the decoding step, on this CPU: the
one place that decides.

The kinds (`KINDS`) and their candidates:

- `few rows` (up to `matvec.MAX_ROWS` rows: decoding, fp32/bf16/int8 weights): gpt1's compiled
  kernel (`gpt1.inference.matvec`), else torch's (oneDNN's packed product or `F.linear`,
  whichever is faster here, or `_weight_int8pack_mm` for int8);
- `many rows fp32/bf16` (prompts, classification batches): oneDNN's prepacked product
  (`prepack.PackedWeight`) where it is faster here than `F.linear`, else `F.linear`;
- `many rows int8`: oneDNN's int8 product (`quantize.PackedInt8`) with the activations as signed
  or as unsigned bytes (whichever this CPU has a real kernel for), else one float product over
  the int8 values;
- `decoding step`: every block of a step in one call (`gpt1.inference.block_step`), else the blocks
  as torch operators.

What the process can use is found out once and kept: the kernel's build (`kernel_module`),
oneDNN's kernels (`onednn_packs`, `onednn_has_int8`, `int8_probe`), the CPU's instruction sets
(`isa`), the environment's switches (`switch`, all checked by `check_environment` when a model
is prepared); what failed is remembered once (`fail`), and is not tried again. oneDNN ships a reference int8 kernel, about a thousand times slower than its
real ones, that it runs where it has no real one for the operands (signed activations on a CPU
with VNNI but no AMX): `int8_many_rows` times one small product of each candidate against the
float path, once per CPU and torch (kept beside the kernel's builds), and takes only what is not
slower. oneDNN's packed float product is checked the same way (`float_probe`): on some CPUs
`F.linear` multiplies one row by an fp32 weight faster than the packed copy does; and so is how
gpt1's kernel reads one row of fp32 weights or bf16 pairs (`OneRowProbe`: a channel at a time
or several side by side, the same sums, whichever this CPU reads faster). A check's
record is taken again where it is stale or was taken on a busier machine than this one is now
(`gpt1.inference.timings`), or on demand (`probe_again`: `gpt1 kernels probe`).

The kernel is built (minutes, once per machine and environment; `gpt1 kernels build`)
only by processes that decode (`expect_decoding`); elsewhere it is used where a build is
already there. Switches (each takes 0/1/off/on/false/true, in any case; unset: decide here):
`GPT1_MATVEC` (also `torch`: torch's kernels, nothing built), `GPT1_INT8_MATMUL` (on: oneDNN's
int8 product even where it is slower than the float path), `GPT1_PREPACK` (on: the packed float
product even where `F.linear` is faster), `GPT1_WEIGHT_ARENA` (off: each weight stays where it was
loaded, not gathered into one huge-page storage by `gpt1.inference.arena`).
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt1.errors import ConfigError
from gpt1.inference import int8_rows, kernel_build, timings

_THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
KINDS = ("few rows", "many rows fp32/bf16", "many rows int8", "decoding step", "weight storage")
_ON, _OFF = ("1", "on", "true"), ("0", "off", "false")
# name -> whether `torch` is accepted (meaning torch's kernels: off)
SWITCHES = {
    "GPT1_MATVEC": True,
    "GPT1_INT8_MATMUL": False,
    "GPT1_PREPACK": False,
    "GPT1_WEIGHT_ARENA": False,
}


def switch(name: str) -> bool | None:
    """The environment switch `name` (one of `SWITCHES`): True (on), False (off) or None
    (unset: the backend decides). Raises ConfigError, in one line naming the variable and
    what it takes, for any other value."""
    raw = os.environ.get(name, "").strip()
    value = raw.lower()
    if not value:
        return None
    if value in _ON:
        return True
    if value in _OFF or (value == "torch" and SWITCHES[name]):
        return False
    accepted = "0/1/off/on/false/true" + ("/torch" if SWITCHES[name] else "")
    raise ConfigError(f"{name}={raw!r} is not a switch: use one of {accepted}")


def check_environment() -> None:
    """Refuse (ConfigError, one line) a misspelt switch or build target before any work."""
    for name in SWITCHES:
        switch(name)
    kernel_build.build_target()


# ------------------------------------------------------------------------ one failure memory
_failures: dict[str, str] = {}  # kind -> the first error's first line, in this process


def fail(kind: str, what: str, error: BaseException, instead: str) -> None:
    """Remember that `kind`'s implementation failed, so it is not tried again in this process,
    and warn once: `what` failed (the error's first line); `instead` runs."""
    if kind in _failures:
        return
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    _failures[kind] = first
    warnings.warn(f"{what} ({first}); {instead}", RuntimeWarning, stacklevel=4)


def failure(kind: str) -> str | None:
    """The first failure remembered for `kind` in this process, or None."""
    return _failures.get(kind)


# ------------------------------------------------------------------------ the kernel's build
_decoding = False  # set by the first decoding cache: this process may build the kernel


def expect_decoding() -> None:
    """This process decodes: the few-row products and the step may build the kernel."""
    global _decoding
    _decoding = True


def kernel_module():
    """gpt1's compiled module, or None: off (`GPT1_MATVEC`), failed, or not built and this
    process does not decode (it then uses torch's kernels rather than wait for a build)."""
    wanted = switch("GPT1_MATVEC")
    if wanted is False or failure("kernel"):
        return None
    try:
        built = kernel_build.module() if _decoding or wanted else kernel_build.module_if_built()
        if built is not None:
            _read_one_row_as_timed(built)
        return built
    except ConfigError:
        raise
    except Exception as e:  # no compiler, no ninja, a failed build: torch's kernels still work
        fail(
            "kernel",
            "gpt1 could not build its decoding kernel",
            e,
            "decoding uses torch's kernels, about half as fast (GPT1_MATVEC=torch silences this)",
        )
        return None


def kernel() -> Callable[..., torch.Tensor] | None:
    """`few_rows_kernel()` in a process that means to decode: built here if need be.
    `matvec(x [M, K], w [N, K], scale [N] or None, bias [N] or None)` -> `[M, N]` in x's
    dtype (1 <= M <= MAX_ROWS, w contiguous in one of `matvec.DTYPES`, int8 with scales)."""
    expect_decoding()
    return few_rows_kernel()


def few_rows_kernel() -> Callable[..., torch.Tensor] | None:
    """gpt1's kernel for products of up to `matvec.MAX_ROWS` rows, or None (torch's)."""
    built = kernel_module()
    return None if built is None else built.matvec


def decode_step_op() -> Callable[..., torch.Tensor] | None:
    """The one-call decoding step's op, or None (the blocks run as torch operators)."""
    built = kernel_module()
    if built is None or not built.has_decode_step():
        return None
    return built.decode_step


def int8_row_kernels():
    """gpt1's compiled module where it has the per-row int8 passes (`int8_rows.quantize` and
    `epilogue` take it), else None (torch's operators do them)."""
    built = kernel_module()
    return built if built is not None and built.has_int8_rows() else None


def greedy_op() -> Callable[..., tuple[torch.Tensor, bool]] | None:
    """The kernel's greedy choice (`greedy_tokens(logits [B, V]) -> (ids [B, 1], all
    finite)`), or None (torch's operators choose)."""
    built = kernel_module()
    return None if built is None else built.greedy_tokens


def draw_op() -> Callable[..., torch.Tensor] | None:
    """The kernel's draw at a temperature (`draw_tokens(logits [n, V], rows [k], temperatures
    [k], uniforms [k], vocab, finite_only) -> ids [k]`, `kernels/choice.cpp`), or None (torch's
    operators draw)."""
    built = kernel_module()
    return None if built is None else built.draw_tokens


# --------------------------------------------------------------------------- oneDNN's products
def prepacks(dtype: torch.dtype) -> bool:
    """Whether `dtype` weights may be packed for oneDNN here: this torch and CPU can, and
    GPT1_PREPACK does not say off. Which products then use the packed copy: `packed_is_faster`."""
    return switch("GPT1_PREPACK") is not False and onednn_packs(dtype)


def packed_is_faster(dtype: torch.dtype, few_rows: bool) -> bool:
    """Whether a product of a few rows (`few_rows`, decoding without gpt1's kernel) or of many
    rows with packable `dtype` weights runs on oneDNN's packed copy rather than `F.linear`: where
    `float_probe` found it not slower here, or GPT1_PREPACK says on."""
    return switch("GPT1_PREPACK") is True or float_probe().packed_faster(dtype, few_rows)


@functools.cache
def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether this torch build prepacks `dtype` weights on this CPU (fp32; bf16 where native)."""
    if dtype not in (torch.float32, torch.bfloat16) or not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_linear_pointwise") and hasattr(ops, "_reorder_linear_weight")):
        return False
    return dtype != torch.bfloat16 or cpu_has_bf16()


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (oneDNN says so); elsewhere bf16 is emulated and
    slower than fp32."""
    mkldnn = torch.ops.mkldnn
    return bool(
        torch.backends.mkldnn.is_available()
        and hasattr(mkldnn, "_is_mkldnn_bf16_supported")
        and mkldnn._is_mkldnn_bf16_supported()
    )


@functools.cache
def onednn_has_int8() -> bool:
    """Whether this torch build has oneDNN's int8 linear kernels."""
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.onednn
    return hasattr(ops, "qlinear_prepack") and hasattr(ops, "qlinear_pointwise")


def int8_per_row() -> bool:
    """Whether many-row int8 products take one activation scale per row where the caller did not
    ask for it (`gpt1.inference.int8_rows.per_row`): where the int8 check found it not slower."""
    return int8_many_rows() is not None and int8_probe().per_row


def int8_many_rows() -> str | None:
    """How int8 products of many rows run: `s8` or `u8` (oneDNN's int8 kernel, activations as
    signed bytes, or as unsigned bytes with zero point 128), or None (the float path)."""
    encoding = _onednn_encoding()
    return encoding if encoding is None or onednn_int8_exact(encoding) else None


def _onednn_int8_usable() -> bool:
    """oneDNN's int8 kernel is here, not switched off (GPT1_INT8_MATMUL) and has not failed."""
    return (
        switch("GPT1_INT8_MATMUL") is not False
        and not failure("many rows int8")
        and onednn_has_int8()
    )


def _onednn_encoding() -> str | None:
    """The encoding oneDNN's int8 kernel would take here, its exactness not asked: the faster
    one where GPT1_INT8_MATMUL forces the kernel, else the one not slower than the float path."""
    if not _onednn_int8_usable():
        return None
    probe = int8_probe()
    return probe.fastest if switch("GPT1_INT8_MATMUL") else probe.choice


@functools.cache
def onednn_int8_exact(encoding: str) -> bool:
    """Whether oneDNN's int8 kernel sums exactly here: on CPUs without VNNI or AMX it multiplies
    with `vpmaddubsw`, whose 16-bit pair sums saturate (oneDNN documents it), so a product of
    large activations and weights comes out wrong; gpt1's own kernel (`few_rows_int8`) then
    takes the int8 products. Asked with one product built to saturate: 64 x 127 x 127."""
    q = torch.full((16, 64), 127, dtype=torch.int8)
    x = torch.full((1, 64), 127, dtype=torch.int8)
    try:
        got = onednn_int8_product(
            x, 1.0, pack_int8(q), torch.ones(16), None, torch.float32, encoding
        )
    except RuntimeError:
        return False
    return bool((got == 64 * 127 * 127).all())


def onednn_int8_saturates() -> bool:
    """Whether oneDNN's int8 kernel here (its faster encoding, timed or not against the float
    path) sums inexactly (`onednn_int8_exact`): the many-row int8 products then take gpt1's own
    kernel where it is built, faster there than the float path (`PackedInt8.linear`). False
    where GPT1_INT8_MATMUL switches oneDNN's int8 off, it failed, or this torch lacks it."""
    return _onednn_int8_usable() and not onednn_int8_exact(int8_probe().fastest)


def few_rows_int8() -> bool:
    """Whether gpt1's compiled module has its own int8 x int8 kernel (AVX-512 VNNI or AVX2:
    `kernels/int8_rows.cpp`), exact in every case; on VNNI without AMX, the rows it takes
    before oneDNN's are set here as timed (`VnniRowsProbe`), once per module."""
    built = kernel_module()
    if built is None or not built.has_few_rows_int8():
        return False
    _set_vnni_rows_as_timed(built)
    return True


def own_int8_form() -> str:
    """How gpt1's own int8 kernel quantises a row of activations (`int8_rows.FORMS`): "u7" on
    AVX2 without VNNI, else "s8" (also where that kernel is not built)."""
    return kernel_module().int8_rows_form() if few_rows_int8() else "s8"


def own_int8_rows(in_features: int) -> int:
    """The most rows of a decoding step's int8 products (of `in_features` inputs) that take
    gpt1's own kernel rather than oneDNN's: 64 where AMX multiplies, 16 to 64 on VNNI as timed
    (`VnniRowsProbe`), 16 on AVX2; 0 where that kernel is not built."""
    return kernel_module().int8_rows_limit(in_features) if few_rows_int8() else 0


# --------------------------------------------------------------------- the int8 speed check
@dataclass(frozen=True)
class Int8Probe:
    """One small product timed on each path (seconds; inf where it failed): `choice` is the
    encoding at least as fast as the float path, `fastest` the faster encoding."""

    float_path: float
    s8: float
    u8: float
    rows_s8: float  # one scale per row (`gpt1.inference.int8_rows`): quantising and scaling
    rows_u8: float  # included, against the others' kernel alone

    @property
    def fastest(self) -> str:
        return "s8" if self.s8 <= self.u8 else "u8"

    @property
    def choice(self) -> str | None:
        best = self.fastest
        return best if getattr(self, best) <= self.float_path else None

    @property
    def per_row(self) -> bool:
        """Whether one scale per row, all its work counted, is not slower than the kernel
        alone with one scale per tensor: then many-row products take it everywhere."""
        best = self.choice
        return best is not None and getattr(self, f"rows_{best}") <= getattr(self, best)


# A product large enough that the work, not the call, takes the time (a real int8 kernel: about
# 0.1 ms; the float path about 1 ms; oneDNN's reference kernel, at about 0.05 GMAC/s, 1 s), so
# a smaller one screens for the reference kernel first (about 40 ms there, 0.1 ms elsewhere).
_PROBE_SHAPE = (64, 768, 768)  # rows, in, out
_SCREEN_SHAPE = (32, 256, 256)
_SCREEN = "x".join(map(str, _SCREEN_SHAPE))
_REFERENCE_FACTOR = 10.0  # a screen this much slower than the float path is the reference
# The layout hint for oneDNN's packed int8 weight: any number of rows works with it, and 64 or
# 1024 gave the same speed on GPT-1's layers at 800 rows.
_INT8_PACK_ROWS = 1024


def _onednn_per_row(
    x: torch.Tensor,
    packed: tuple[torch.Tensor, torch.Tensor],
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    encoding: str,
    kernels,
) -> torch.Tensor:
    """oneDNN's int8 product of `x` with one activation scale per row, quantising and scaling
    included (`gpt1.inference.int8_rows`), as the speed checks time it: `x`'s dtype out."""
    qx, x_scale = int8_rows.quantize(x, kernels)
    sums = onednn_int8_product(qx, 1.0, packed, scale, None, torch.float32, encoding)
    return int8_rows.epilogue(sums, x_scale, bias, x.dtype, kernels)


@functools.cache
def int8_probe() -> Int8Probe:
    """The int8 speed check's times: kept per CPU and torch in the build folder (so every run
    on a machine takes the same path, and pays for the check once), else measured now; taken
    again where the record is stale or was taken on a busier machine (`gpt1.inference.timings`)."""
    return timings.kept("int8", Int8Probe, lambda: _measure_int8())


def _measure_int8() -> Int8Probe:
    """Time oneDNN's int8 product (signed and unsigned activations) against the float path on
    random operands in the activations' dtype, on one thread: the kernel's quality is the
    question, and threads contending with other processes for the cores make every path slow
    alike. An encoding oneDNN runs on its reference kernel keeps its screening time."""
    dtype = torch.bfloat16 if cpu_has_bf16() else torch.float32
    generator = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            screen = timings.interleaved_best(
                _int8_products(_SCREEN_SHAPE, dtype, generator), rounds=2, budget=0
            )
            full = _int8_products(_PROBE_SHAPE, dtype, generator)
            reference = [
                e for e in ("s8", "u8") if screen[e] > _REFERENCE_FACTOR * screen["float_path"]
            ]
            reference += [f"rows_{e}" for e in reference]
            times = screen | timings.interleaved_best(
                {path: fn for path, fn in full.items() if path not in reference}
            )
            rows = {f"rows_{e}": times[f"rows_{e}"] for e in ("s8", "u8")}
            return Int8Probe(times["float_path"], times["s8"], times["u8"], **rows)
    finally:
        torch.set_num_threads(threads)


def _int8_products(
    shape: tuple[int, int, int], dtype: torch.dtype, generator: torch.Generator
) -> dict[str, Callable[[], torch.Tensor]]:
    """One product of random operands of `shape` (rows, in, out) in `dtype` on each path: the
    float path (`float_path`: the int8 weight widened, then `F.linear`, as `quantize` runs it
    without the kernel) and oneDNN's int8 kernel with each encoding of the activations (`s8`,
    `u8`, already quantised), which raises RuntimeError where oneDNN cannot pack the weight."""
    rows, k, n = shape
    x = torch.randn(rows, k, generator=generator).to(dtype)
    q = torch.randint(-127, 128, (n, k), generator=generator, dtype=torch.int8)
    scale = torch.rand(n, generator=generator) * 1e-2 + 1e-3
    bias = torch.randn(n, generator=generator).to(dtype)
    qx = torch.randint(-127, 128, (rows, k), generator=generator, dtype=torch.int8)
    try:
        packed = pack_int8(q)
    except RuntimeError as e:
        packed = e

    def float_path() -> torch.Tensor:
        return torch.nn.functional.linear(x, q.to(dtype)) * scale.to(dtype) + bias

    def on_int8(encoding: str) -> Callable[[], torch.Tensor]:
        def product() -> torch.Tensor:
            if isinstance(packed, RuntimeError):
                raise packed
            return onednn_int8_product(qx, 0.01, packed, scale, bias, dtype, encoding)

        return product

    def per_row(encoding: str) -> Callable[[], torch.Tensor]:
        def product() -> torch.Tensor:
            if isinstance(packed, RuntimeError):
                raise packed
            return _onednn_per_row(x, packed, scale, bias, encoding, int8_row_kernels())

        return product

    return {"float_path": float_path} | {
        f"{kind}{e}": make(e)
        for kind, make in (("", on_int8), ("rows_", per_row))
        for e in ("s8", "u8")
    }


def pack_int8(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """oneDNN's packed copy of the int8 weight `q` `[N, K]` and its zero points (all 0)."""
    weight = torch.ops.onednn.qlinear_prepack(q.detach(), [_INT8_PACK_ROWS, q.shape[1]])
    return weight, torch.zeros(q.shape[0], dtype=torch.long)


def onednn_int8_product(
    qx: torch.Tensor,
    x_scale: float,
    packed: tuple[torch.Tensor, torch.Tensor],
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    dtype: torch.dtype,
    encoding: str,
) -> torch.Tensor:
    """oneDNN's int8 product of activations `qx` (int8 `[M, K]`, one `x_scale`) and a weight
    packed by `pack_int8` (per-channel `scale`), bias applied, in `dtype`. `u8` hands the
    activations over as unsigned bytes with zero point 128 (the same integers: flipping the top
    bit of v gives v + 128), which CPUs with VNNI but no AMX multiply with a real kernel where
    signed ones get the reference kernel."""
    zero_point = 0
    if encoding == "u8":
        qx, zero_point = qx.view(torch.uint8).bitwise_xor(128), 128
    weight, zero_points = packed
    return torch.ops.onednn.qlinear_pointwise(
        qx, x_scale, zero_point, weight, scale.float(), zero_points,
        bias, 1.0, 0, dtype, "none", [], "",
    )  # fmt: skip


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """The shortest of `repeats` timed calls of `fn` after one untimed call (inf if it raises)."""
    try:
        fn()
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
        return best
    except RuntimeError:
        return float("inf")


# ------------------------------------------------------------------- the float speed check
@dataclass(frozen=True)
class FloatProbe:
    """Best times in seconds of a set of products with oneDNN's packed weights and with
    `F.linear`: `times[dtype name]["few" | "many"] == [packed, plain]` (`_FLOAT_PRODUCTS`)."""

    times: dict[str, dict[str, list[float]]]

    def packed_faster(self, dtype: torch.dtype, few_rows: bool) -> bool:
        found = self.times.get(str(dtype).removeprefix("torch."), {}).get(_rows(few_rows))
        return found is None or found[0] <= found[1]  # unmeasured: packing is the default


# Decoding's most frequent product (one row through a block's fused q|k|v layer) and a prompt's
# (64 rows through a 768 x 768 layer): GPT-1's own shapes, rows x in x out.
# The products timed, as (rows, in, out) shapes. Decoding reads every weight from memory, once a
# token, and each block has four of different shapes, which oneDNN's packed layout and
# `F.linear` do not rank alike: the few-row check multiplies one row by the weights of four
# GPT-1 blocks (113 MB in fp32, beyond a CPU's last-level cache), where one weight read again
# from the cache favoured the packed product that decodes slower in fp32 on an AMD EPYC. A
# prompt's product is bound by arithmetic, not memory: 64 rows through one weight, three times.
_BLOCK = ((1, 768, 2304), (1, 768, 768), (1, 768, 3072), (1, 3072, 768))
_FLOAT_PRODUCTS = {"few": _BLOCK * 4, "many": ((64, 768, 768),) * 3}


def _rows(few_rows: bool) -> str:
    return "few" if few_rows else "many"


@functools.cache
def float_probe() -> FloatProbe:
    """The packed-against-plain times, kept per CPU and torch beside the int8 check's."""
    return timings.kept("float", FloatProbe, lambda: _measure_float())


def _measure_float() -> FloatProbe:
    """Time each packable dtype's product on both paths, in interleaved rounds (a burst of load
    then slows both alike), on one thread as `_measure_int8` does."""
    generator = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    times: dict[str, dict[str, list[float]]] = {}
    try:
        with torch.no_grad():
            for dtype in (torch.float32, torch.bfloat16):
                if onednn_packs(dtype):
                    name = str(dtype).removeprefix("torch.")
                    times[name] = {
                        k: _packed_vs_plain(k, dtype, generator) for k in _FLOAT_PRODUCTS
                    }
    finally:
        torch.set_num_threads(threads)
    return FloatProbe(times)


def _packed_vs_plain(rows: str, dtype: torch.dtype, generator: torch.Generator) -> list[float]:
    """[packed, plain]: the time of the `_FLOAT_PRODUCTS[rows]` products (each with a weight of
    its own, but for `many`), each path's best of `timings.ROUNDS` interleaved rounds."""
    products = _FLOAT_PRODUCTS[rows]
    inputs = {k: torch.randn(m, k, generator=generator).to(dtype) for m, k, _ in products}
    weights: list[torch.Tensor] = []
    for _, k, n in products:
        fresh = rows == "few" or not weights
        weights.append(torch.randn(n, k, generator=generator).to(dtype) if fresh else weights[0])
    try:
        packs = [torch.ops.mkldnn._reorder_linear_weight(w, 64) for w in weights]
    except RuntimeError:
        return [float("inf"), 0.0]
    linear = torch.ops.mkldnn._linear_pointwise

    def on_packed() -> None:
        for w, p in zip(weights, packs):
            linear(inputs[w.shape[1]], p, None, "none", [], "")

    def on_plain() -> None:
        for w in weights:
            torch.nn.functional.linear(inputs[w.shape[1]], w)

    best = timings.interleaved_best({"packed": on_packed, "plain": on_plain})
    return [best["packed"], best["plain"]]


# ------------------------------------------------------- one row of fp32 or bf16 on the kernel
@dataclass(frozen=True)
class OneRowProbe:
    """Best times in seconds of one row through four GPT-1 blocks' weights (`_BLOCK` * 4) on
    gpt1's kernel: `times[dtype name] == [a channel at a time, channels side by side]` (fp32
    weights; bf16 weights times bf16 activations)."""

    times: dict[str, list[float]]

    def stream(self, name: str) -> bool:
        found = self.times.get(name)
        return found is None or found[0] <= found[1]  # unmeasured: the kernel's default

    def way(self, name: str) -> str:
        """The reading chosen for `name`'s dtype, in words."""
        return _ONE_ROW_WAYS[self.stream(name)]


_ONE_ROW_WAYS = {True: "a channel at a time", False: "channels side by side"}


def _one_row_record() -> str:
    """The one-row check's record: per build target too (a build for another target, as the
    benchmarks' tiers make, runs other loops)."""
    return f"one_row_{kernel_build.build_target()}"


_one_row_read: set[int] = set()  # the modules whose one-row reads are set


def _read_one_row_as_timed(built, again: bool = False) -> OneRowProbe | None:
    """Set how `built` reads one row of fp32 weights and of bf16 pairs, as the record of
    `_measure_one_row` found faster (timed now where it is missing or stale, or `again`), and
    return that record; once per module (the setting is the module's) unless `again`."""
    if id(built) in _one_row_read and not again:
        return None
    _one_row_read.add(id(built))  # first: the probe itself runs the module
    measure = functools.partial(_measure_one_row, built)
    probe = timings.kept(_one_row_record(), OneRowProbe, measure, again=again)
    built.set_one_row_stream(False, probe.stream("float32"))
    built.set_one_row_stream(True, probe.stream("bfloat16"))
    return probe


def _measure_one_row(built) -> OneRowProbe:
    """Time one row through four blocks' weights both ways, per dtype, in interleaved rounds on
    one thread. The sums are the same either way (`kernels/matvec.cpp`)."""
    generator = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    times: dict[str, list[float]] = {}
    try:
        for dtype in (torch.float32, torch.bfloat16):
            if dtype == torch.bfloat16 and not cpu_has_bf16():
                continue
            weights = [torch.randn(n, k, generator=generator).to(dtype) for _, k, n in _BLOCK * 4]
            inputs = {k: torch.randn(1, k, generator=generator).to(dtype) for _, k, _ in _BLOCK}

            def reading(stream: bool, dtype: torch.dtype = dtype, weights=weights, inputs=inputs):
                def run() -> None:
                    built.set_one_row_stream(dtype == torch.bfloat16, stream)
                    for w in weights:
                        built.matvec(inputs[w.shape[1]], w)

                return run

            best = timings.interleaved_best({"stream": reading(True), "side": reading(False)})
            times[str(dtype).removeprefix("torch.")] = [best["stream"], best["side"]]
    finally:
        torch.set_num_threads(threads)
    return OneRowProbe(times)


# ---------------------------------------------- many int8 rows on VNNI: gpt1's kernel or oneDNN's
@dataclass(frozen=True)
class VnniRowsProbe:
    """Best times in seconds of one GPT-1 block's four int8 products (`_BLOCK`'s shapes) of
    many rows, one activation scale per row, quantising and scaling included, on one thread:
    `times[str(rows)] == [gpt1's VNNI kernel, oneDNN's int8 product]`. Both give the same
    bits; up to `_VNNI_FEW_ROWS` rows gpt1's kernel always runs (oneDNN's reads the weights
    at about half the rate there: `kernels/int8_rows.cpp`)."""

    times: dict[str, list[float]]

    def pair(self, rows: int) -> tuple[float, float] | None:
        """The two times of `rows` rows, or None where the record lacks them or holds anything
        but two numbers there (a damaged file)."""
        found = self.times.get(str(rows)) if isinstance(self.times, dict) else None
        if not isinstance(found, list) or len(found) != 2:
            return None
        if not all(type(t) in (int, float) for t in found):
            return None
        return found[0], found[1]

    def limit(self) -> int:
        """The most rows gpt1's kernel takes: the largest count of `_VNNI_ROWS_TIMED` up to
        which it was never slower than oneDNN's, else `_VNNI_FEW_ROWS`. A count missing from
        the record ends the search there."""
        limit = _VNNI_FEW_ROWS
        for rows in _VNNI_ROWS_TIMED:
            found = self.pair(rows)
            if found is None or not found[0] <= found[1]:  # missing, slower, or NaN
                break
            limit = rows
        return limit


_VNNI_FEW_ROWS = 16  # the kernels' kFewRows
_VNNI_ROWS_TIMED = (32, 64)  # the kernels' largest limit is 64
_vnni_rows_set: set[int] = set()  # the modules whose VNNI row limit is set


def _vnni_rows_record() -> str:
    return f"vnni_rows_{kernel_build.build_target()}"


def _set_vnni_rows_as_timed(built, again: bool = False) -> VnniRowsProbe | None:
    """Set how many rows `built`'s VNNI int8 kernel takes before oneDNN's, as the record of
    `_measure_vnni_rows` found faster (timed now where it is missing or stale, or `again`),
    and return that record; None where there is no such choice (AMX or AVX2 builds, no exact
    oneDNN int8 product). Once per module unless `again`."""
    if id(built) in _vnni_rows_set and not again:
        return None
    _vnni_rows_set.add(id(built))  # first: the checks below may ask for the module again
    if not built.vnni_rows_limit():
        return None  # asked first: AVX2 and AMX builds need no int8 check for it
    encoding = int8_many_rows()
    if encoding is None:
        return None
    measure = functools.partial(_measure_vnni_rows, built, encoding)
    probe = timings.kept(_vnni_rows_record(), VnniRowsProbe, measure, again=again)
    built.vnni_rows_limit(probe.limit())
    return probe


def _measure_vnni_rows(built, encoding: str) -> VnniRowsProbe:
    """Time one GPT-1 block's products of each count in `_VNNI_ROWS_TIMED` rows on gpt1's VNNI
    kernel and on oneDNN's (`encoding`), in interleaved rounds on one thread, random operands."""
    generator = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    layers = []
    for _, k, n in _BLOCK:
        q = torch.randint(-127, 128, (n, k), generator=generator, dtype=torch.int8)
        scale = torch.rand(n, generator=generator) * 1e-2 + 1e-3
        bias = torch.randn(n, generator=generator)
        layers.append((q, built.pack_vnni(q), pack_int8(q), scale, bias))
    times: dict[str, list[float]] = {}
    try:
        for rows in _VNNI_ROWS_TIMED:
            xs = [torch.randn(rows, q.shape[1], generator=generator) for q, *_ in layers]

            def own(xs=xs) -> None:
                for x, (q, vnni, _, scale, bias) in zip(xs, layers):
                    built.rows_product(x, vnni, scale, bias, q.shape[0])

            def onednn(xs=xs) -> None:
                for x, (_, _, packed, scale, bias) in zip(xs, layers):
                    _onednn_per_row(x, packed, scale, bias, encoding, built)

            best = timings.interleaved_best({"own": own, "onednn": onednn})
            times[str(rows)] = [best["own"], best["onednn"]]
    finally:
        torch.set_num_threads(threads)
    return VnniRowsProbe(times)


# ---------------------------------------------------------------------- timed again on demand
@dataclass(frozen=True)
class Timed:
    """One product's paths with their best times in seconds, and the path the timing chooses."""

    product: str
    times: dict[str, float]
    chosen: str


def probe_again() -> tuple[timings.Conditions, list[Timed]]:
    """Time every speed check this torch and CPU have again now and record it (`gpt1 kernels
    probe`): the conditions the timing began under, and each product's paths and choice."""
    check_environment()
    current = timings.now()
    floats = ints = None
    if any(onednn_packs(d) for d in (torch.float32, torch.bfloat16)):
        floats = timings.kept("float", FloatProbe, _measure_float, again=True)
    if onednn_has_int8():
        ints = timings.kept("int8", Int8Probe, _measure_int8, again=True)
    float_probe.cache_clear()  # the next use reads the new record
    int8_probe.cache_clear()
    built = kernel_module()
    one_row = _read_one_row_as_timed(built, again=True) if built is not None else None
    vnni_rows = _set_vnni_rows_as_timed(built, again=True) if built is not None else None
    return current, timed(floats, ints, one_row, vnni_rows)


def timed(
    floats: FloatProbe | None,
    ints: Int8Probe | None,
    one_row: OneRowProbe | None = None,
    vnni_rows: VnniRowsProbe | None = None,
) -> list[Timed]:
    """Each product the probes `floats`, `ints`, `one_row` and `vnni_rows` timed: its paths'
    times and the choice."""
    found = []
    for name, by_rows in (floats.times if floats else {}).items():
        for rows, (packed, plain) in by_rows.items():
            chosen = "oneDNN packed" if packed <= plain else "F.linear"
            times = {"oneDNN packed": packed, "F.linear": plain}
            found.append(Timed(f"{_NAMES[name]}, {_SHAPES[rows]}", times, chosen))
    if ints is not None:
        paths = {"s8": "signed", "u8": "unsigned"}
        for encoding in paths:
            if _REFERENCE_FACTOR * ints.float_path < getattr(ints, encoding) < float("inf"):
                paths[encoding] += f" (oneDNN's reference kernel, on {_SCREEN})"
        times = {paths["s8"]: ints.s8, paths["u8"]: ints.u8, "float path": ints.float_path}
        times |= {f"{paths[e]}, one scale per row": getattr(ints, f"rows_{e}") for e in paths}
        chosen = {**paths, None: "float path"}[ints.choice]
        if ints.per_row:
            chosen += ", one scale per row"
        shape = "x".join(map(str, _PROBE_SHAPE))
        found.append(Timed(f"int8 activations, one {shape} product", times, chosen))
    for name, both in (one_row.times if one_row else {}).items():
        times = dict(zip(_ONE_ROW_WAYS.values(), both))
        chosen = one_row.way(name)
        found.append(Timed(f"gpt1's kernel, {_NAMES[name]}, {_SHAPES['few']}", times, chosen))
    limit = vnni_rows.limit() if vnni_rows else 0
    for rows in _VNNI_ROWS_TIMED if vnni_rows else ():
        if (pair := vnni_rows.pair(rows)) is None:
            continue
        times = {"gpt1's VNNI kernel": pair[0], "oneDNN": pair[1]}
        chosen = "gpt1's VNNI kernel" if rows <= limit else "oneDNN"
        found.append(Timed(f"int8, one GPT-1 block's products of {rows} rows", times, chosen))
    return found


_NAMES = {"float32": "fp32", "bfloat16": "bf16"}
_SHAPES = {"few": "one row through four GPT-1 blocks", "many": "three 64x768x768 products"}


# ------------------------------------------------------------------------------ the report
@dataclass(frozen=True)
class Choice:
    """What runs a kind of product here, and why."""

    kind: str
    implementation: str
    why: str


def report() -> list[Choice]:
    """For `gpt1 info --kernels`: which implementation each product kind and the decoding step
    use on this CPU, and why. Builds nothing; times the int8 product once."""
    check_environment()
    return [_few_rows(), _many_rows_float(), _many_rows_int8(), _step(), _storage()]


def _kernel_state() -> tuple[bool, str]:
    if switch("GPT1_MATVEC") is False:
        return False, "GPT1_MATVEC switches it off"
    if failure("kernel"):
        return False, f"its build failed: {failure('kernel')}"
    if not kernel_build.is_built():
        return False, (
            f"not built yet in {kernel_build.build_folder()} (decoding builds it; gpt1 kernels build)"
        )
    return True, f"built for -march={kernel_build.build_target()} in {kernel_build.build_folder()}"


def _few_rows() -> Choice:
    usable, why = _kernel_state()
    if usable:
        found = timings.read(_one_row_record(), OneRowProbe)
        if found is not None:
            probe = found[0]
            reads = [f"{_NAMES[name]} {probe.way(name)}" for name in probe.times]
            why += f"; one row reads {', '.join(reads)} (timed faster here)"
        return Choice(KINDS[0], "gpt1's kernel (matvec)", why)
    floats, timed = _float_choices(few_rows=True)
    return Choice(KINDS[0], f"torch's: {floats}, _weight_int8pack_mm (int8)", f"{why}; {timed}")


def _many_rows_float() -> Choice:
    if prepacks(torch.float32):
        return Choice(KINDS[1], *_float_choices(few_rows=False))
    why = "GPT1_PREPACK switches it off" if switch("GPT1_PREPACK") is False else "no oneDNN"
    return Choice(KINDS[1], "F.linear", why)


def _float_choices(few_rows: bool) -> tuple[str, str]:
    """Which float product each packable dtype takes for this many rows, and the times why."""
    dtypes = [d for d in (torch.float32, torch.bfloat16) if prepacks(d)]
    if not dtypes:
        return "F.linear (fp32, bf16)", "no oneDNN packing here"
    names = {torch.float32: "fp32", torch.bfloat16: "bf16"}
    chosen = ", ".join(
        ("oneDNN packed" if packed_is_faster(d, few_rows) else "F.linear") + f" ({names[d]})"
        for d in dtypes
    )
    if switch("GPT1_PREPACK") is True:
        return chosen, "GPT1_PREPACK switches packing on"
    probe, rows = float_probe(), _rows(few_rows)
    shape = _SHAPES[rows]
    timed = "; ".join(
        f"{names[d]} packed {_ms(t[0])}, F.linear {_ms(t[1])}"
        for d in dtypes
        if (t := probe.times.get(str(d).removeprefix("torch."), {}).get(rows))
    )
    return chosen, f"{shape}, one thread{_when('float')}: {timed or 'not measured'}"


def _many_rows_int8() -> Choice:
    chosen = int8_many_rows()
    if not onednn_has_int8():
        return Choice(KINDS[2], "float path", "this torch has no oneDNN int8 kernel")
    if switch("GPT1_INT8_MATMUL") is False:
        return Choice(KINDS[2], "float path", "GPT1_INT8_MATMUL switches oneDNN's int8 off")
    if onednn_int8_saturates():
        why = "oneDNN's int8 sums saturate on this CPU (no VNNI or AMX: onednn_int8_exact)"
        if few_rows_int8():
            form = "7-bit rows with a zero point" if own_int8_form() == "u7" else "8-bit rows"
            return Choice(
                KINDS[2], f"gpt1's int8 kernel, {form}, one scale per row (exact sums)", why
            )
        return Choice(KINDS[2], "float path", why)
    probe = int8_probe()
    shape = "x".join(map(str, _PROBE_SHAPE))
    timed = (
        f"{_timed(probe.s8, probe)} signed, {_timed(probe.u8, probe)} unsigned, float path "
        f"{_ms(probe.float_path)} (a {shape} product, one thread{_when('int8')})"
    )
    if chosen is None:
        return Choice(KINDS[2], "float path", f"oneDNN's int8 is slower here ({timed})")
    name = {"s8": "signed", "u8": "unsigned (zero point 128)"}[chosen]
    scales = "one scale per row" if probe.per_row else "one scale per tensor"
    rows = getattr(probe, f"rows_{chosen}")
    timed += f"; one scale per row {_ms(rows)}"
    implementation = f"oneDNN int8, {name} activations, {scales}"
    found = timings.read(_vnni_rows_record(), VnniRowsProbe) if kernel_build.is_built() else None
    pairs = {r: found[0].pair(r) for r in _VNNI_ROWS_TIMED} if found is not None else {}
    if any(pairs.values()):
        implementation = f"gpt1's VNNI kernel up to {found[0].limit()} rows, then {implementation}"
        timed += "; " + ", ".join(
            f"a block's {rows} rows {_ms(pair[0])} on gpt1's kernel, {_ms(pair[1])} on oneDNN's"
            for rows, pair in pairs.items()
            if pair is not None
        )
    return Choice(KINDS[2], implementation, timed)


def _step() -> Choice:
    usable, why = _kernel_state()
    if usable and decode_step_op() is not None:
        return Choice(KINDS[3], "one call for all blocks (block_step)", why)
    if usable:
        why = "the kernel was built without the step (no AVX-512 for this build target)"
    return Choice(KINDS[3], "torch operators", why)


def gathers_weights() -> bool:
    """Whether `for_inference` gathers a CPU model's streamed weights into one storage
    (`gpt1.inference.arena`): unless GPT1_WEIGHT_ARENA says off."""
    return switch("GPT1_WEIGHT_ARENA") is not False


def _storage() -> Choice:
    if not gathers_weights():
        return Choice(
            KINDS[4], "each weight where it was loaded", "GPT1_WEIGHT_ARENA switches it off"
        )
    mode = huge_pages()
    pages = {
        "always": "huge pages (transparent huge pages: always)",
        "madvise": "huge pages (transparent huge pages: madvise, asked for)",
    }.get(mode, f"4 KiB pages (transparent huge pages: {mode})")
    return Choice(KINDS[4], "one storage in reading order", pages)


def _timed(seconds: float, probe: Int8Probe) -> str:
    if seconds > _REFERENCE_FACTOR * probe.float_path and seconds < float("inf"):
        return f"oneDNN's reference kernel ({_ms(seconds)} on {_SCREEN})"
    return _ms(seconds)


def _when(check: str) -> str:
    """When and under what load the `check`'s recorded times were taken, if they were."""
    found = timings.read(check, dict)
    return f", timed at {found[1].describe()}" if found else ""


def _ms(seconds: float) -> str:
    return "failed" if seconds == float("inf") else f"{seconds * 1e3:.3g} ms"


def huge_pages() -> str:
    """Linux's transparent huge page mode (`always`, `madvise`, `never`), or `unavailable`."""
    try:
        text = _THP_MODE.read_text()
    except OSError:
        return "unavailable"
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else "unavailable"


def isa() -> str:
    """This CPU's instruction sets that matter here, as torch and /proc/cpuinfo name them."""
    flags = set(kernel_build.cpu_flags().split())
    wanted = ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8"]
    present = [f for f in wanted if f in flags]
    return f"torch: {torch.backends.cpu.get_cpu_capability()}; CPU: {' '.join(present) or '-'}"


def reset() -> None:
    """Forget what was probed and failed (tests; a process changing its environment)."""
    _failures.clear()
    _one_row_read.clear()
    int8_probe.cache_clear()
    float_probe.cache_clear()
    kernel_build.forget()
    global _decoding
    _decoding = False
