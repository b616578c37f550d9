// int8 x int8 products of many rows, each row with its own activation scale, for the decoding
// step of many sequences (`step.cpp`): the arithmetic of `gpt1/inference/int8_rows.py`.
//
// A row is quantised on its own: with VNNI, AMX and oneDNN its largest magnitude to 127,
// divided and rounded to nearest even as `int8_rows.quantize` does (so both give the same
// integers); in the AVX2 kernel as unsigned 7-bit numbers with a zero point
// (`int8_rows.quantize_u7`, below). The int32 sums are exact, and they are multiplied by the
// weight's per-channel scales in fp32, then by the row's scale, and the bias is added, in fp32.
// The sums come from gpt1's kernel below for the rows of a decoding step (VNNI up to 64 rows as
// timed, or up to 4 where AMX tiles take 5 to 64; AVX2 at any count) or from oneDNN's int8
// kernel (called through torch's dispatcher, as `torch.ops.onednn.qlinear_pointwise`) for more
// rows where its sums are exact:
//
//   y[m, n] = fp32(sum_k qx[m, k] q[n, k]) * w_scale[n] * x_scale[m] + bias[n]
//
// the order of `int8_rows.epilogue`, so both paths compute the same bits from the same sums.
#include <torch/extension.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <string>
#include <tuple>
#include <memory>
#include <vector>

#include "lanes.h"
#include "products.h"

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define GPT1_AMX 1
#endif

// How many 64-byte lines of column sums `pack_vnni` stores after each block of 16 channels'
// weights: the AVX2 kernel's zero-point correction reads 16 int32 sums there; VNNI and AMX,
// whose activations are signed, need none.
#if defined(__AVX512VNNI__)
constexpr int64_t kColumnSumQuads = 0;
#else
constexpr int64_t kColumnSumQuads = 1;
#endif

#if defined(GPT1_SIMD)

namespace {

namespace simd = gpt1::simd;

// Rows [lo, hi) of x [M, K] -> q (int8, or int8 + 128 as unsigned bytes where `u8`) and
// scales[r]; false where a row holds an inf or a NaN (the float product keeps them).
template <typename T>
bool quantize_rows(const T* x, int64_t lo, int64_t hi, int64_t K, int8_t* q, float* scales,
                   bool u8) {
  for (int64_t r = lo; r < hi; ++r) {
    const T* row = x + r * K;
    simd::Vec top = simd::zero();
    bool nan = false;
    for (int64_t i = 0; i < K; i += simd::kLanes) {
      const simd::Vec v = simd::load(row + i, simd::lanes(i, K));
      nan |= simd::any_nan(v);
      top = simd::max(top, simd::abs(v));
    }
    const float amax = simd::largest(top);
    if (nan || std::isinf(amax)) return false;
    float scale = amax / 127.0f;
    if (!(scale > 0.0f)) scale = 1.0f;  // an all-zero row, or one too small to scale: all 0
    scales[r] = scale;
    const simd::Vec s = simd::set1(scale);
    int8_t* out = q + r * K;
    for (int64_t i = 0; i < K; i += simd::kLanes) {
      const simd::Mask m = simd::lanes(i, K);
      simd::store_int8(out + i, simd::div(simd::load(row + i, m), s), m);
    }
    if (u8) {  // flipping the top bit of v gives v + 128 as an unsigned byte
      uint8_t* bytes = reinterpret_cast<uint8_t*>(out);
      for (int64_t i = 0; i < K; ++i) bytes[i] ^= 0x80;
    }
  }
  return true;
}

// y[r, n] = sums[r, n] * x_scales[r] + bias[n] (bias optional) over rows [0, M), split over
// the threads: `int8_rows.epilogue`'s arithmetic, into fp32 (`to_fp32`) or rounded to bf16
// (`to_bf16`), one of them given.
void scale_sums(int64_t M, int64_t N, const float* sums, const float* x_scales, const float* bias,
                float* to_fp32, at::BFloat16* to_bf16) {
  gpt1::rows_in_parallel(M, N, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const simd::Vec scale = simd::set1(x_scales[r]);
      for (int64_t n = 0; n < N; n += simd::kLanes) {
        const simd::Mask m = simd::lanes(n, N);
        simd::Vec v = simd::mul(simd::load(sums + r * N + n, m), scale);
        if (bias) v = simd::add(v, simd::load(bias + n, m));
        if (to_fp32) {
          simd::store(to_fp32 + r * N + n, v, m);
        } else {
          simd::store(to_bf16 + r * N + n, simd::round_bf16(v), m);
        }
      }
    }
    return true;
  });
}

// fp32 [M, N] -> bf16, rounded to nearest even as torch rounds, split over the threads by rows.
void round_to_bf16(int64_t M, int64_t N, const float* from, at::BFloat16* to) {
  gpt1::rows_in_parallel(M, N, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo * N; i < hi * N; i += simd::kLanes) {
      const simd::Mask m = simd::lanes(i, hi * N);
      simd::store(to + i, simd::round_bf16(simd::load(from + i, m)), m);
    }
    return true;
  });
}

// oneDNN's product of qx [M, K] (scale 1, zero point 128 where u8) and a packed int8 weight
// with per-channel scales: fp32 [M, N] = sums * w_scale.
torch::Tensor onednn_product(const torch::Tensor& qx, bool u8, const torch::Tensor& packed,
                             const torch::Tensor& zero_points, const torch::Tensor& w_scale) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("onednn::qlinear_pointwise", "");
  torch::jit::Stack stack;
  stack.reserve(13);
  stack.emplace_back(qx);
  stack.emplace_back(1.0);
  stack.emplace_back(int64_t(u8 ? 128 : 0));
  stack.emplace_back(packed);
  stack.emplace_back(w_scale);
  stack.emplace_back(zero_points);
  stack.emplace_back(c10::IValue());  // no bias: added after the row scale
  stack.emplace_back(1.0);
  stack.emplace_back(int64_t(0));
  stack.emplace_back(at::kFloat);
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<std::optional<at::Scalar>>());
  stack.emplace_back(std::string(""));
  op.callBoxed(&stack);
  return stack.back().toTensor();
}

#if defined(__AVX512VNNI__)
// ------------------------------------------------------------------ rows on VNNI
// oneDNN's int8 kernel reads the weights at about 10 GB/s for a few rows (it fetches nothing
// ahead), well under what the decoding kernel of one row reaches, so a decoding step's rows take
// this kernel instead: the weights, in the layout `pack_vnni` makes, stream once through
// `vpdpbusd` (four int8 products summed into each 32-bit lane) for every row, fetched ahead.
// Each lane holds one output channel; a row's four activations at a time are broadcast, so no
// sum is ever reduced across lanes. The weights go over as unsigned bytes (w + 128) and the
// activations as signed ones; the exact int32 sums are then corrected by 128 * sum_k x[m, k]:
//
//   sum_k (w[n, k] + 128) x[m, k] - 128 sum_k x[m, k] = sum_k w[n, k] x[m, k]
//
// (|sums| < 255 * 127 * K: no overflow below K = 66,000). The sums are the same integers as
// oneDNN's, and the scales are applied in the same order after. The weights are fetched 32 KB
// ahead into L2, as the decoding kernel's stream is (`matvec.cpp`): against 4 KB into L1, 5-7%
// less time for a step of 2 to 8 rows (2026-12-06, AMX Xeon, one thread).
constexpr int64_t kVnniAheadBytes = 32768;

// acc[m] += the sums of row m over inputs [4 q0, 4 q1) for the 16 channels of the block `w`.
template <int M, bool kFetch>
void vnni_block(const uint8_t* w, const int8_t* x, int64_t K, int64_t q0, int64_t q1,
                __m512i* acc) {
  for (int64_t g = q0; g < q1; ++g) {
    if (kFetch) {
      _mm_prefetch(reinterpret_cast<const char*>(w + g * 64 + kVnniAheadBytes), _MM_HINT_T1);
    }
    const __m512i lanes = _mm512_loadu_si512(w + g * 64);
    for (int m = 0; m < M; ++m) {
      int32_t four;
      std::memcpy(&four, x + m * K + 4 * g, 4);
      acc[m] = _mm512_dpbusd_epi32(acc[m], lanes, _mm512_set1_epi32(four));
    }
  }
}

// A product's operands on VNNI, with x, x_sums, x_scales, the output and `partial` at the first
// row of a group of rows (`vnni_rows`). The output is fp32 (`y`) or rounded to bf16 (`y_bf16`).
struct VnniGroup {
  const uint8_t* packed;
  int64_t block_bytes;
  const int8_t* x;
  const int32_t* x_sums;
  const float* x_scales;
  const float* w_scale;
  const float* bias;
  int64_t K, N;
  float* y;
  at::BFloat16* y_bf16;
  int32_t* partial;
};

// Blocks [b0, b1) of 16 output channels for the group's M rows over the inputs [4 q0, 4 q1):
// the sums so far come from `partial` where q0 > 0; they go back there where inputs remain after
// q1 (one block at a time, then), else they are corrected, scaled in `int8_rows.epilogue`'s
// order and written out. `kFetch`: the blocks' weights come from memory (the first group of
// rows), so the stream ahead is fetched.
template <int M, bool kFetch>
void vnni_rows(const VnniGroup& p, int64_t b0, int64_t b1, int64_t q0, int64_t q1) {
  const int64_t K = p.K, N = p.N;
  for (int64_t b = b0; b < b1; ++b) {
    __m512i acc[M];
    for (int m = 0; m < M; ++m) {
      acc[m] = q0 == 0 ? _mm512_setzero_si512() : _mm512_loadu_si512(p.partial + 16 * m);
    }
    vnni_block<M, kFetch>(p.packed + b * p.block_bytes, p.x, K, q0, q1, acc);
    if (q1 < K / 4) {
      for (int m = 0; m < M; ++m) _mm512_storeu_si512(p.partial + 16 * m, acc[m]);
      continue;
    }
    const int64_t n0 = b * 16;
    const __mmask16 mask = N - n0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (N - n0)) - 1);
    const __m512 ws = _mm512_maskz_loadu_ps(mask, p.w_scale + n0);
    const __m512 bs = p.bias ? _mm512_maskz_loadu_ps(mask, p.bias + n0) : _mm512_setzero_ps();
    for (int m = 0; m < M; ++m) {
      const __m512i sums = _mm512_sub_epi32(acc[m], _mm512_set1_epi32(128 * p.x_sums[m]));
      __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), ws);
      v = _mm512_mul_ps(v, _mm512_set1_ps(p.x_scales[m]));
      if (p.bias) v = _mm512_add_ps(v, bs);
      if (p.y_bf16) {
        simd::store(p.y_bf16 + m * N + n0, simd::round_bf16(v), mask);
      } else {
        _mm512_mask_storeu_ps(p.y + m * N + n0, mask, v);
      }
    }
  }
}

// The most rows of a product that take this kernel rather than oneDNN's (where oneDNN's sums
// are exact): `int8_rows_limit`, as `vnni_rows_limit` sets it, from kFewRows to
// kVnniRowsLimit (`gpt1.inference.backend` times both kernels on a GPT-1 block's products of
// 32 and 64 rows); the largest until then.
constexpr int64_t kVnniRowsLimit = 64;
std::atomic<int64_t> vnni_rows_limit_now{kVnniRowsLimit};
// Where groups of rows share a block, they go over it this many inputs at a time.
constexpr int64_t kSpanInputs = 768;

using VnniRows = void (*)(const VnniGroup&, int64_t, int64_t, int64_t, int64_t);

// vnni_rows<rows, fetch> for rows 1..kFewRows: [fetch][rows - 1].
template <int... Ms>
constexpr std::array<std::array<VnniRows, sizeof...(Ms)>, 2> vnni_table(
    std::integer_sequence<int, Ms...>) {
  return {{{&vnni_rows<Ms + 1, false>...}, {&vnni_rows<Ms + 1, true>...}}};
}
constexpr auto kVnniRows = vnni_table(std::make_integer_sequence<int, gpt1::kFewRows>());

// Any number of rows on VNNI. Up to `kFewRows` rows share each weight vector read (their sums
// fill 16 of the 32 vector registers); more rows go in as few groups as that allows, of sizes
// differing by at most one (24 rows: two of 12), and every group passes over a block of 16
// channels' weights while it stays in cache, so the weights are read from memory once whatever
// the rows. oneDNN's int8 product, which took more than 16 rows before, was slower on every
// GPT-1 product of 16 to 64 rows (quantising and scaling included both ways, one thread,
// 2026-12-07, the Zen 4 EPYC): 768 -> 768 at 32 rows 0.151 ms against this loop's 0.100,
// 768 -> 3072 at 64 rows 0.84 against 0.76, the output layer at 64 rows 18.8 against 12.9.
void vnni_product(int64_t M, const uint8_t* packed, const int8_t* x, const int32_t* x_sums,
                  const float* x_scales, const float* w_scale, const float* bias, int64_t K,
                  int64_t N, float* y, at::BFloat16* y_bf16) {
  constexpr int64_t kGroupRows = gpt1::kFewRows;
  const int64_t blocks = (N + 15) / 16, block_bytes = K / 4 * 64, quads = K / 4;
  // A task is a run of output blocks, its weights read in order: at least 64 KB of them.
  const int64_t grain = std::max<int64_t>(1, 65536 / block_bytes);
  // Rows beyond a decoding step's (a prompt, where oneDNN is absent) go a slice at a time, the
  // slice's activations (at most about 256 KB) staying in L2 while every block passes over
  // them; the weights are read again per slice.
  const int64_t slice = std::max<int64_t>(kVnniRowsLimit, 262144 / K / kGroupRows * kGroupRows);
  // Where more than one group shares a block, the groups go over it a span of inputs at a
  // time, so that the span's weights and one group's activations stay in L1 together (12 KB
  // each at 768 inputs a span; a block of 3072 inputs is 48 KB); the sums in between wait in
  // `partial`. At 3072 -> 768 and 64 rows on two threads (2026-12-07, the Zen 4 EPYC), the
  // groups over whole blocks matched oneDNN's product (0.54 ms each); in spans, 1.07x it.
  const int64_t spans = M > kGroupRows ? (K + kSpanInputs - 1) / kSpanInputs : 1;
  for (int64_t lo = 0; lo < M; lo += slice) {
    const int64_t rows_here = std::min(slice, M - lo);
    const int64_t groups = (rows_here + kGroupRows - 1) / kGroupRows;
    at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
      std::vector<int32_t> partial(groups > 1 ? rows_here * 16 : 0);
      VnniGroup group{packed, block_bytes, nullptr, nullptr, nullptr, w_scale, bias, K, N,
                      nullptr, nullptr, nullptr};
      auto run = [&](int64_t g, int64_t m0, int64_t rows, int64_t c0, int64_t c1, int64_t q0,
                     int64_t q1) {
        group.x = x + m0 * K;
        group.x_sums = x_sums + m0;
        group.x_scales = x_scales + m0;
        group.y = y ? y + m0 * N : nullptr;
        group.y_bf16 = y_bf16 ? y_bf16 + m0 * N : nullptr;
        group.partial = partial.data() + (m0 - lo) * 16;
        kVnniRows[g == 0][rows - 1](group, c0, c1, q0, q1);
      };
      if (groups == 1) {  // one group: the task's blocks in one call, every input at once
        run(0, lo, rows_here, b0, b1, 0, quads);
        return;
      }
      for (int64_t b = b0; b < b1; ++b) {
        for (int64_t span = 0; span < spans; ++span) {
          const int64_t q0 = quads * span / spans, q1 = quads * (span + 1) / spans;
          for (int64_t g = 0, m0 = lo; g < groups; ++g) {
            const int64_t rows = rows_here / groups + (g < rows_here % groups ? 1 : 0);
            run(g, m0, rows, b, b + 1, q0, q1);
            m0 += rows;
          }
        }
      }
    });
  }
}

#if defined(GPT1_AMX)
// ------------------------------------------------------------------ many rows on AMX
// The same layout, read by AMX's tile products: 16 output channels of `pack_vnni`'s layout over
// 64 inputs are 1 KB of consecutive bytes, exactly a B tile (16 rows of 4 inputs x 16
// channels), and `tdpbsud` sums signed activations times unsigned weights (w + 128) into a
// 16 x 16 tile of exact int32 sums, corrected by 128 * sum_k x[m, k] as the VNNI kernel's are.
// Up to `kAmxRows` rows (four 16-row tiles) share each weight tile read, so a step of that many
// rows reads the weights once and stays bound by reading them (oneDNN's product, which packs the
// activations anew each call, took 16 ms of a 22.5 ms 32-row step's blocks where reading the
// weights takes about 7: one thread, the AMX Xeon, 2026-12-06).
constexpr int kAmxTiles = 4;
constexpr int64_t kAmxRows = 16 * kAmxTiles;
// Up to this many rows the VNNI loop stays: a tile of 16 rows is then mostly padding, and VNNI's
// arithmetic still hides behind the weights' read. From 5 rows on VNNI's multiply-adds (one
// instruction per row per 64 weight bytes) outlast the read and one tile product per 1 KB wins.
// The whole integer step of GPT-1 size, 64 positions cached, paired in one process, one
// thread, AMX against VNNI (medians of 21, 2026-12-06, the AMX Xeon, memory at ~11 GB/s):
// 10.47 / 11.23 ms at 5 rows, 11.34 / 12.27 at 6, 12.39 / 13.77 at 8; at 2-3 rows AMX was 3%
// slower, and 4 rows, where hours disagreed (1.06x faster that day, 3.5% slower on another), stays
// on VNNI. The step's blocks at 12 / 16 rows (another hour): 9.75 / 10.44, 11.33 / 13.46.
constexpr int64_t kVnniBeforeAmx = 4;

// Linux hands AMX's tile registers to a thread only on request (arch_prctl); asked once.
bool amx_allowed() {
  static const bool allowed = [] {
    constexpr int kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return allowed;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: sums of 16 rows each; 4: activations (16 rows x 64 inputs); 5: weights.
void amx_configure() {
  TileConfig config;
  for (int t = 0; t < 6; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
}

template <int T>
void amx_block(const uint8_t* w, const int8_t* x, int64_t K, int32_t* sums) {
  _tile_zero(0);
  if (T > 1) _tile_zero(1);
  if (T > 2) _tile_zero(2);
  if (T > 3) _tile_zero(3);
  for (int64_t c = 0; c < K / 64; ++c) {
    const uint8_t* tile = w + c * 1024;
    for (int line = 0; line < 1024; line += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(tile + line + kVnniAheadBytes), _MM_HINT_T1);
    }
    _tile_loadd(5, tile, 64);
    _tile_loadd(4, x + c * 64, K);
    _tile_dpbsud(0, 4, 5);
    if (T > 1) {
      _tile_loadd(4, x + 16 * K + c * 64, K);
      _tile_dpbsud(1, 4, 5);
    }
    if (T > 2) {
      _tile_loadd(4, x + 32 * K + c * 64, K);
      _tile_dpbsud(2, 4, 5);
    }
    if (T > 3) {
      _tile_loadd(4, x + 48 * K + c * 64, K);
      _tile_dpbsud(3, 4, 5);
    }
  }
  _tile_stored(0, sums, 64);
  if (T > 1) _tile_stored(1, sums + 256, 64);
  if (T > 2) _tile_stored(2, sums + 512, 64);
  if (T > 3) _tile_stored(3, sums + 768, 64);
}

// x [M, K] (M a multiple of 16, at most kAmxRows; K a multiple of 64): y as vnni_product's.
void amx_product(int64_t M, int64_t rows, const uint8_t* packed, const int8_t* x,
                 const int32_t* x_sums, const float* x_scales, const float* w_scale,
                 const float* bias, int64_t K, int64_t N, float* y) {
  const int64_t blocks = (N + 15) / 16, block_bytes = K / 4 * 64;
  const int64_t grain = std::max<int64_t>(1, 65536 / block_bytes);
  const int tiles = static_cast<int>(M / 16);
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    amx_configure();  // per thread: the configuration is a thread's state
    alignas(64) int32_t sums[kAmxRows * 16];
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* w = packed + b * block_bytes;
      switch (tiles) {
        case 1: amx_block<1>(w, x, K, sums); break;
        case 2: amx_block<2>(w, x, K, sums); break;
        case 3: amx_block<3>(w, x, K, sums); break;
        default: amx_block<4>(w, x, K, sums); break;
      }
      const int64_t n0 = b * 16;
      const __mmask16 mask = N - n0 >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (N - n0)) - 1);
      const __m512 ws = _mm512_maskz_loadu_ps(mask, w_scale + n0);
      const __m512 bs = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
      for (int64_t m = 0; m < rows; ++m) {
        const __m512i row = _mm512_load_si512(sums + m * 16);
        const __m512i exact = _mm512_sub_epi32(row, _mm512_set1_epi32(128 * x_sums[m]));
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), ws);
        v = _mm512_mul_ps(v, _mm512_set1_ps(x_scales[m]));
        if (bias) v = _mm512_add_ps(v, bs);
        _mm512_mask_storeu_ps(y + m * N + n0, mask, v);
      }
    }
    _tile_release();
  });
}
#endif
#elif defined(__AVX2__)
// ------------------------------------------------------------------ many rows on AVX2
// Without VNNI, int8 products go through `vpmaddubsw`, which multiplies unsigned bytes by signed
// ones and adds each pair into a 16-bit lane that saturates. Two signed 8-bit numbers of up to
// 127 would overflow it (x + 128 as the unsigned operand: 2 * 255 * 127 > 32767), and keeping
// 8-bit activations exact costs a `vpsignb` per product, which on a Zen 3 core shares the two
// pipes that multiply: 8 operations per 64 multiply-adds of a row, where this loop issues 6.
// So each row goes over as unsigned 7-bit numbers u in [0, 127] with its own zero point z
// (`quantize_rows_u7`, `int8_rows.quantize_u7`): a pair is then at most 2 * 127 * 128, inside
// 16 bits, `vpmaddwd` by ones sums the pairs into 32-bit lanes, and
//
//   sum_k (u[m, k] - z[m]) w[n, k] = sum_k u[m, k] w[n, k] - z[m] sum_k w[n, k]
//
// are exact int32 sums, the column sums stored by `pack_vnni` after each block's weights. The
// scales are then applied as for the other forms. Activations lose one bit against the 8-bit
// form where their signs are balanced (a row spanning [-a, a] rounds in steps of 2a / 127); a
// row of one sign, as GELU's outputs nearly are, keeps the same step. Against the exact 8-bit
// loop, paired in one process on a Zen 3 core, one thread: 1.20-1.39x as fast through GPT-1's
// layers at 8 to 256 rows (docs/commands/kernels.md, "Why 7 bits on AVX2").
//
// Each lane holds one output channel and a row's four activations at a time are broadcast, so
// no sum is reduced across lanes. Rows go in groups of `kGroup` (their sums live in registers:
// two 8-lane halves of a 16-channel block each); the block's weights come from memory for the
// first group and from the caches after.
constexpr int64_t kVnniAheadBytes = 32768;
constexpr int kGroup = 4;

// Rows [lo, hi) of x [M, K] -> u (unsigned 7-bit), scales[r] and zero points zeros[r], with
// x[r, k] ~= (u[r, k] - zeros[r]) * scales[r]: the range [min(x, 0), max(x, 0)] in 127 steps;
// false where a row holds an inf or a NaN, or spans more than fp32 holds.
bool quantize_rows_u7(const float* x, int64_t lo, int64_t hi, int64_t K, uint8_t* u,
                      float* scales, int32_t* zeros) {
  for (int64_t r = lo; r < hi; ++r) {
    const float* row = x + r * K;
    simd::Vec top = simd::zero(), bottom = simd::zero();
    bool nan = false;
    for (int64_t i = 0; i < K; i += simd::kLanes) {
      const simd::Mask m = simd::lanes(i, K);
      const simd::Vec v = simd::load(row + i, m);  // 0 past K: inside [min, max] already
      nan |= simd::any_nan(v);
      top = simd::max(top, v);
      bottom = simd::min(bottom, v);
    }
    const float high = simd::largest(top), low = simd::smallest(bottom);
    const float span = high - low;
    if (nan || !std::isfinite(span)) return false;
    float scale = span / 127.0f;
    if (!(scale > 0.0f)) scale = 1.0f;  // an all-zero row, or one too small to scale: all 0
    const float zero = std::nearbyint(-low / scale);  // nearest, ties to even
    scales[r] = scale;
    zeros[r] = static_cast<int32_t>(zero);
    const simd::Vec s = simd::set1(scale), z = simd::set1(zero);
    const simd::Vec floor = simd::zero(), ceiling = simd::set1(127.0f);
    int8_t* out = reinterpret_cast<int8_t*>(u + r * K);  // 0..127: the same bytes either way
    for (int64_t i = 0; i < K; i += simd::kLanes) {
      const simd::Mask m = simd::lanes(i, K);
      const simd::Vec steps =
          simd::add(simd::round_even(simd::div(simd::load(row + i, m), s)), z);
      simd::store_int8(out + i, simd::min(simd::max(steps, floor), ceiling), m);
    }
  }
  return true;
}

template <int G>
void avx2_block(const int8_t* w, const uint8_t* u, int64_t K, int32_t* sums) {
  __m256i acc[G][2];
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t q = 0; q < K / 4; ++q) {
    _mm_prefetch(reinterpret_cast<const char*>(w + q * 64 + kVnniAheadBytes), _MM_HINT_T1);
    const __m256i* line = reinterpret_cast<const __m256i*>(w + q * 64);
    const __m256i half[2] = {_mm256_loadu_si256(line), _mm256_loadu_si256(line + 1)};
    for (int g = 0; g < G; ++g) {
      int32_t four;
      std::memcpy(&four, u + g * K + 4 * q, 4);
      const __m256i us = _mm256_set1_epi32(four);
      for (int h = 0; h < 2; ++h) {
        const __m256i pairs = _mm256_maddubs_epi16(us, half[h]);
        acc[g][h] = _mm256_add_epi32(acc[g][h], _mm256_madd_epi16(pairs, ones));
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + g * 16), acc[g][0]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + g * 16 + 8), acc[g][1]);
  }
}

void avx2_product(int64_t M, const int8_t* packed, const uint8_t* u, const int32_t* zeros,
                  const float* x_scales, const float* w_scale, const float* bias, int64_t K,
                  int64_t N, float* y) {
  const int64_t blocks = (N + 15) / 16, block_bytes = (K / 4 + kColumnSumQuads) * 64;
  const int64_t grain = std::max<int64_t>(1, 65536 / block_bytes);
  // Many rows (a prompt, a classification batch) go a slice at a time, each slice's u (about
  // 128 KB) staying in L2 while every weight block passes over it: without the slices,
  // 8192 rows x 3072 read x from memory once per block and took 562 ms against the fp32
  // product's 538; the weights are read again per slice instead, a few % of the time.
  const int64_t slice = std::max<int64_t>(64, 131072 / K / kGroup * kGroup);  // whole groups
  for (int64_t lo = 0; lo < M; lo += slice) {
    const int64_t hi = std::min(M, lo + slice);
    at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
      int32_t sums[kGroup * 16];
      for (int64_t b = b0; b < b1; ++b) {
        const int8_t* w = packed + b * block_bytes;
        int32_t column_sums[16];
        std::memcpy(column_sums, w + K / 4 * 64, sizeof(column_sums));
        const int64_t n0 = b * 16, width = std::min<int64_t>(16, N - n0);
        for (int64_t m0 = lo; m0 < hi; m0 += kGroup) {
          const int G = static_cast<int>(std::min<int64_t>(kGroup, hi - m0));
          const uint8_t* us = u + m0 * K;
          switch (G) {
            case 1: avx2_block<1>(w, us, K, sums); break;
            case 2: avx2_block<2>(w, us, K, sums); break;
            case 3: avx2_block<3>(w, us, K, sums); break;
            default: avx2_block<4>(w, us, K, sums); break;
          }
          for (int g = 0; g < G; ++g) {  // the scales in int8_rows.epilogue's order
            const int32_t z = zeros[m0 + g];
            float* out = y + (m0 + g) * N + n0;
            if (width == 16) {  // two 8-lane halves; a scalar loop for the last partial block
              for (int h = 0; h < 2; ++h) {
                const __m256i raw = _mm256_loadu_si256(
                    reinterpret_cast<const __m256i*>(sums + g * 16 + 8 * h));
                const __m256i col = _mm256_loadu_si256(
                    reinterpret_cast<const __m256i*>(column_sums + 8 * h));
                const __m256i exact =
                    _mm256_sub_epi32(raw, _mm256_mullo_epi32(col, _mm256_set1_epi32(z)));
                const __m256 ws = _mm256_loadu_ps(w_scale + n0 + 8 * h);
                __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(exact), ws);
                v = _mm256_mul_ps(v, _mm256_set1_ps(x_scales[m0 + g]));
                if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n0 + 8 * h));
                _mm256_storeu_ps(out + 8 * h, v);
              }
              continue;
            }
            for (int64_t j = 0; j < width; ++j) {
              float v = float(sums[g * 16 + j] - z * column_sums[j]) * w_scale[n0 + j];
              v = v * x_scales[m0 + g];
              if (bias) v = v + bias[n0 + j];
              out[j] = v;
            }
          }
        }
      }
    });
  }
}
#endif

}  // namespace

namespace gpt1 {

#if defined(GPT1_AMX)
// AMX's tiles take 64 inputs at a time; the thread must be allowed them.
bool amx_applies(int64_t K) { return K % 64 == 0 && amx_allowed(); }
#endif

bool int8_rows_product(int64_t M, const float* x, const Int8Packed& w, const float* bias,
                       float* y, at::BFloat16* y_bf16) {
  const int64_t K = w.in, N = w.out;
#if defined(__AVX512VNNI__) || defined(__AVX2__)
  // gpt1's kernel up to int8_rows_limit(K) rows, and for every row count where oneDNN's copy
  // is absent (no int8 kernel there, or one whose sums saturate: `backend.int8_many_rows`).
  if (w.vnni && (M <= int8_rows_limit(K) || !w.packed)) {
#if defined(__AVX512VNNI__)
    // Zero rows past M fill AMX's last 16-row tile (their results are not written).
    std::vector<int8_t> q((M + 15) / 16 * 16 * K, 0);
    std::vector<float> scales(M);
    std::vector<int32_t> sums(M);
    const bool finite = rows_in_parallel(M, K, [&](int64_t lo, int64_t hi) {
      if (!quantize_rows(x, lo, hi, K, q.data(), scales.data(), false)) return false;
      for (int64_t m = lo; m < hi; ++m) {
        int32_t total = 0;
        for (int64_t k = 0; k < K; ++k) total += q[m * K + k];
        sums[m] = total;
      }
      return true;
    });
    if (!finite) return false;
#if defined(GPT1_AMX)
    if (M > kVnniBeforeAmx && amx_applies(K)) {
      // AMX writes fp32, rounded after; left uninitialised, as every number is written.
      const std::unique_ptr<float[]> widened(y_bf16 ? new float[M * N] : nullptr);
      float* out = y_bf16 ? widened.get() : y;
      for (int64_t m0 = 0; m0 < M; m0 += kAmxRows) {  // more rows: the weights read again
        const int64_t rows = std::min<int64_t>(kAmxRows, M - m0);
        amx_product((rows + 15) / 16 * 16, rows, w.vnni->data_ptr<uint8_t>(), q.data() + m0 * K,
                    sums.data() + m0, scales.data() + m0, w.scale->data_ptr<float>(), bias, K,
                    N, out + m0 * N);
      }
      if (y_bf16) round_to_bf16(M, N, out, y_bf16);
      return true;
    }
#endif
    vnni_product(M, w.vnni->data_ptr<uint8_t>(), q.data(), sums.data(), scales.data(),
                 w.scale->data_ptr<float>(), bias, K, N, y, y_bf16);
#else
    // Left uninitialised: every byte is written by the quantising (a vector's zeroing cost a
    // pass over 6 MB per product of a 2048-row prompt).
    const std::unique_ptr<uint8_t[]> u(new uint8_t[M * K]);
    std::vector<float> scales(M);
    std::vector<int32_t> zeros(M);
    const bool finite = rows_in_parallel(M, K, [&](int64_t lo, int64_t hi) {
      return quantize_rows_u7(x, lo, hi, K, u.get(), scales.data(), zeros.data());
    });
    if (!finite) return false;
    // This loop writes fp32, rounded after; left uninitialised, as every number is written.
    const std::unique_ptr<float[]> widened(y_bf16 ? new float[M * N] : nullptr);
    float* out = y_bf16 ? widened.get() : y;
    avx2_product(M, reinterpret_cast<const int8_t*>(w.vnni->data_ptr<uint8_t>()), u.get(),
                 zeros.data(), scales.data(), w.scale->data_ptr<float>(), bias, K, N, out);
    if (y_bf16) round_to_bf16(M, N, out, y_bf16);
#endif
    return true;
  }
#endif
  TORCH_CHECK(w.packed, "int8 rows: no kernel for this product");
  torch::Tensor qx = torch::empty({M, K}, torch::dtype(w.u8 ? at::kByte : at::kChar));
  std::vector<float> scales(M);
  int8_t* qp = static_cast<int8_t*>(qx.data_ptr());
  if (!rows_in_parallel(M, K, [&](int64_t lo, int64_t hi) {
        return quantize_rows(x, lo, hi, K, qp, scales.data(), w.u8);
      })) {
    return false;
  }
  const torch::Tensor sums = onednn_product(qx, w.u8, *w.packed, *w.zero_points, *w.scale);
  TORCH_CHECK(sums.scalar_type() == at::kFloat && sums.is_contiguous() && sums.numel() == M * N,
              "int8 rows: oneDNN returned an unexpected product");
  scale_sums(M, N, sums.data_ptr<float>(), scales.data(), bias, y_bf16 ? nullptr : y, y_bf16);
  return true;
}

}  // namespace gpt1

// x [M, K] (fp32 or bf16, contiguous) -> (int8 [M, K], fp32 scales [M, 1]) with row r of x ~=
// q[r] * scales[r]: `int8_rows.quantize`'s integers in two passes over each row; undefined
// tensors where a row holds an inf or a NaN.
std::tuple<torch::Tensor, torch::Tensor> quantize_rows(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.device().is_cpu() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "quantize_rows: x must be [rows, n], fp32 or bf16, contiguous, on the CPU");
  const int64_t M = x.size(0), K = x.size(1);
  torch::Tensor q = torch::empty({M, K}, x.options().dtype(at::kChar));
  torch::Tensor scales = torch::empty({M, 1}, x.options().dtype(at::kFloat));
  int8_t* qp = q.data_ptr<int8_t>();
  float* sp = scales.data_ptr<float>();
  const bool finite = gpt1::rows_in_parallel(M, K, [&](int64_t lo, int64_t hi) {
    return x.scalar_type() == at::kFloat
               ? quantize_rows(x.data_ptr<float>(), lo, hi, K, qp, sp, false)
               : quantize_rows(x.data_ptr<at::BFloat16>(), lo, hi, K, qp, sp, false);
  });
  if (!finite) return {torch::Tensor(), torch::Tensor()};
  return {q, scales};
}

// sums [M, N] fp32 (the int32 sums times the weight scales) -> sums * x_scale[m] + bias[n] in
// bf16 (else fp32), one pass: `int8_rows.epilogue`'s arithmetic and roundings.
torch::Tensor scale_rows(const torch::Tensor& sums, const torch::Tensor& x_scale,
                         const c10::optional<torch::Tensor>& bias, bool bf16) {
  TORCH_CHECK(sums.dim() == 2 && sums.is_contiguous() && sums.scalar_type() == at::kFloat &&
                  x_scale.numel() == sums.size(0) && x_scale.is_contiguous() &&
                  x_scale.scalar_type() == at::kFloat,
              "scale_rows: fp32 sums [M, N], fp32 scales [M]");
  const int64_t M = sums.size(0), N = sums.size(1);
  std::vector<float> bias_buf;
  const float* b = bias.has_value()
                       ? gpt1::float_values(*bias, N, bias_buf, "scale_rows:", "bias")
                       : nullptr;
  torch::Tensor out = torch::empty({M, N}, sums.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  const float* s = sums.data_ptr<float>();
  const float* xs = x_scale.data_ptr<float>();
  // Asked once: `data_ptr<T>` checks the dtype on every call, a quarter of this loop's time
  // when it sat in the inner loop (a 2048-row prompt of the int8 model).
  float* to_fp32 = bf16 ? nullptr : out.data_ptr<float>();
  at::BFloat16* to_bf16 = bf16 ? out.data_ptr<at::BFloat16>() : nullptr;
  scale_sums(M, N, s, xs, b, to_fp32, to_bf16);
  return out;
}

bool has_int8_rows() { return true; }

bool has_few_rows_int8() {
#if defined(__AVX512VNNI__) || defined(__AVX2__)
  return true;
#else
  return false;
#endif
}

// x [M, K] (fp32 or bf16) through an int8 weight in `pack_vnni`'s layout (`out` channels, fp32
// per-channel `scale`, optional bias), each row of x its own scale, on gpt1's kernel: [M, out]
// in x's dtype; an undefined tensor where a row of x holds an inf or a NaN.
torch::Tensor rows_product(const torch::Tensor& x, const torch::Tensor& vnni,
                           const torch::Tensor& scale, const c10::optional<torch::Tensor>& bias,
                           int64_t out) {
  TORCH_CHECK(has_few_rows_int8(), "rows_product: not compiled for this CPU");
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                  vnni.scalar_type() == at::kByte && vnni.dim() == 4 &&
                  vnni.size(0) == (out + 15) / 16 &&
                  (vnni.size(1) - kColumnSumQuads) * 4 == x.size(1) &&
                  scale.scalar_type() == at::kFloat && scale.numel() == out,
              "rows_product: x [M, K] fp32/bf16, a packed weight of [out, K], fp32 scales");
  const int64_t M = x.size(0), K = x.size(1);
  const torch::Tensor xf = x.to(at::kFloat).contiguous();
  const torch::Tensor sc = scale.contiguous();
  std::vector<float> bias_buf;
  const float* b = bias.has_value()
                       ? gpt1::float_values(*bias, out, bias_buf, "rows_product:", "bias")
                       : nullptr;
  gpt1::Int8Packed w;
  w.vnni = &vnni;
  w.scale = &sc;
  w.out = out;
  w.in = K;
  // Written in x's dtype by the kernel itself: a 64-row output layer's logits are 10 MB of
  // fp32, which a conversion after would read again.
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  torch::Tensor y = torch::empty({M, out}, x.options());
  if (!gpt1::int8_rows_product(M, xf.data_ptr<float>(), w, b, bf16 ? nullptr : y.data_ptr<float>(),
                               bf16 ? y.data_ptr<at::BFloat16>() : nullptr)) {
    return torch::Tensor();
  }
  return y;
}

// q [N, K] int8 (K a multiple of 4) -> the few-row kernel's layout: [ceil(N / 16), K / 4 + S,
// 16, 4] bytes, lane j of block b holding channel 16 b + j's four weights, as w + 128 for VNNI
// and AMX (absent channels past N hold 128: weight 0), as w itself for AVX2, whose S = 1 last
// line of each block holds its 16 channels' sums of w as int32 (S = 0 elsewhere); an undefined
// tensor where that kernel is not compiled.
torch::Tensor pack_vnni(const torch::Tensor& q) {
#if defined(__AVX512VNNI__) || defined(__AVX2__)
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar && q.is_contiguous() &&
                  q.size(1) % 4 == 0 && q.device().is_cpu(),
              "pack_vnni: q must be [N, K] int8, contiguous, K a multiple of 4");
  const int64_t N = q.size(0), K = q.size(1), blocks = (N + 15) / 16;
#if defined(__AVX512VNNI__)
  constexpr int kOffset = 128;  // VNNI and AMX multiply unsigned weights by signed activations
#else
  constexpr int kOffset = 0;  // AVX2's loop multiplies unsigned activations by signed weights
#endif
  const int64_t quads = K / 4 + kColumnSumQuads;
  torch::Tensor out = torch::full({blocks, quads, 16, 4}, kOffset, q.options().dtype(at::kByte));
  const int8_t* w = q.data_ptr<int8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int32_t column_sums[16] = {};
      for (int64_t lane = 0; lane < 16 && b * 16 + lane < N; ++lane) {
        const int8_t* row = w + (b * 16 + lane) * K;
        for (int64_t k = 0; k < K; ++k) {
          o[((b * quads + k / 4) * 16 + lane) * 4 + k % 4] = uint8_t(int(row[k]) + kOffset);
          if (kColumnSumQuads > 0) column_sums[lane] += row[k];  // AVX2's line of sums only
        }
      }
      if (kColumnSumQuads > 0) std::memcpy(o + (b * quads + K / 4) * 64, column_sums, 64);
    }
  });
  return out;
#else
  return torch::Tensor();
#endif
}

#else  // neither AVX-512 (F, BW, VL) nor AVX2 with FMA: torch's operators quantise the rows

bool has_int8_rows() { return false; }

bool has_few_rows_int8() { return false; }

torch::Tensor rows_product(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                           const c10::optional<torch::Tensor>&, int64_t) {
  TORCH_CHECK(false, "rows_product: not compiled for this CPU");
}

torch::Tensor pack_vnni(const torch::Tensor&) { return torch::Tensor(); }

std::tuple<torch::Tensor, torch::Tensor> quantize_rows(const torch::Tensor&) {
  TORCH_CHECK(false, "quantize_rows: not compiled for this CPU");
}

torch::Tensor scale_rows(const torch::Tensor&, const torch::Tensor&,
                         const c10::optional<torch::Tensor>&, bool) {
  TORCH_CHECK(false, "scale_rows: not compiled for this CPU");
}

#endif

int64_t int8_rows_limit(int64_t in_features) {
#if defined(GPT1_SIMD) && defined(GPT1_AMX)
  if (gpt1::amx_applies(in_features)) return kAmxRows;
#endif
  (void)in_features;
#if defined(GPT1_SIMD) && defined(__AVX512VNNI__)
  return vnni_rows_limit_now.load(std::memory_order_relaxed);
#else
  return gpt1::kFewRows;
#endif
}

int64_t vnni_rows_limit(int64_t rows) {
#if defined(GPT1_SIMD) && defined(__AVX512VNNI__)
#if defined(GPT1_AMX)
  if (amx_allowed()) return 0;  // AMX tiles take GPT-1's widths: nothing to choose here
#endif
  if (rows != 0) {
    TORCH_CHECK(rows >= gpt1::kFewRows && rows <= kVnniRowsLimit,
                "vnni_rows_limit: between ", gpt1::kFewRows, " and ", kVnniRowsLimit, " rows");
    return vnni_rows_limit_now.exchange(rows);
  }
  return vnni_rows_limit_now.load();
#else
  (void)rows;
  return 0;
#endif
}

std::string int8_rows_form() {
#if defined(GPT1_SIMD) && !defined(__AVX512VNNI__) && defined(__AVX2__)
  return "u7";  // the AVX2 kernel's unsigned 7-bit activations with a zero point per row
#else
  return "s8";  // signed 8-bit activations: VNNI, AMX and oneDNN's kernels
#endif
}
