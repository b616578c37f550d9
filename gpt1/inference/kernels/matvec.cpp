// y = x @ (w * scale[:, None]).T + bias for a few rows of x: the weight products of decoding.
//
// Decoding multiplies one row (or a few) by every weight matrix, so its speed is the speed of
// reading the weights from memory. This kernel reads each weight once for all the rows it is
// given (int8, bf16 or fp32 weights; int8 with one scale per output channel), widens it to fp32
// in registers and multiplies it by the activations in fp32 (bf16 weights times bf16 activations:
// the CPU's bf16 dot-product instruction, fp32 sums) (int8 is weight-only: activations
// are never rounded to integers). R output channels are read side by side, and the kernel
// fetches the weights it will need ahead of the multiply: R short rows that restart every block
// are streams the hardware prefetchers pick up too late. One row against fp32 weights, or bf16
// pairs, reads a channel at a time instead: the matrix is then one forward stream. Every path
// sums a channel in the same order, so a row's result is the same bits whichever rows share
// the product. Work is split over output channels with ATen's parallel_for, so it runs on
// torch's own threads. Written once over the vectors of `lanes.h`: sixteen lanes of AVX-512 or
// eight of AVX2 (int8 widened by `vpmovsxbd`, bf16 by a shift), plain loops on other CPUs.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <vector>

#include "lanes.h"
#include "products.h"

namespace {

// At least this many weight bytes per task: a smaller task costs more to hand to a thread than
// it saves.
constexpr int64_t kMinBytesPerTask = 64 * 1024;

// How the weights are fetched ahead of the multiply. Measured on an AVX-512 server core (Zen 4),
// the 49 products of a GPT-1 decoding step with cold weights, in one huge-page storage
// (`gpt1/inference/arena.py`; `benchmarks/kernel_targets.py`): int8 weights read fastest as one
// stream, the block's bytes fetched 32 KB ahead into L2 (a block of four int8 rows is short, and
// the stream runs on into the next). fp32 and bf16 blocks are longer (eight fp32 rows of 768 are
// 24 KB), so a stream ahead of the block's first row has not reached its last rows when they are
// read: each row is fetched where it will be read a few blocks later, at least 48 KB ahead, into
// L2 (fp32 24.5 GB/s against 21.8 as one stream; bf16 22.9 against 21.1).
constexpr int64_t kStreamAheadBytes = 32768;
constexpr int64_t kRowsAheadBytes = 49152;
// One row of activations against fp32 weights (or bf16 weights times bf16 activations): each
// output channel is read on its own, so the whole matrix is one forward stream, fetched this far
// ahead into L2. Measured as above (`benchmarks/kernel_targets.py --against`), the 49 products
// read 1.15x faster this way than eight channels side by side (fp32; 1.20x in the AVX2 build)
// and 1.41x than four (bf16 pairs); a fetch 4 KB or more ahead was slower. int8 keeps its
// channels side by side: widening its bytes is the longer chain, and one channel at a time read
// 0.95x with one accumulator; with two, its many-row products (which must sum alike) ran
// 0.84-0.88x at four and eight rows.
constexpr int64_t kOneRowAheadBytes = 1024;

// Whether one row against fp32 weights ([0]) or bf16 pairs ([1]) reads a channel at a time (one
// forward stream) or R channels side by side as more rows do: the same sums either way, and
// which reads faster depends on the CPU (`set_one_row_stream`, timed by
// `gpt1.inference.backend`). One row of a step through GPT-1's blocks: the stream read 1.15x
// (fp32) and 1.41x (bf16) faster on an AMD EPYC (Zen 4), and 0.75x and 0.7x on an AMX Xeon.
std::atomic<bool> one_row_stream[2] = {true, true};

// How many output channels ahead each row of a block of R channels is fetched (whole blocks).
inline int64_t channels_ahead(int R, int64_t row_bytes) {
  return R * std::max<int64_t>(2, kRowsAheadBytes / (R * row_bytes));
}

#if defined(GPT1_SIMD)
namespace simd = gpt1::simd;

// Output channels read side by side for M rows: R * M accumulators, R weight vectors and one of
// activations must stay in the vector registers. With AVX-512's 32: four channels for one or
// two rows, two for more. With AVX2's 16: four, two from three rows, one from five. (One row of
// fp32 weights is read a channel at a time: `channels_one_row`.)
template <typename W>
constexpr int channels_per_step(int M) {
  if (simd::kRegisters >= 32) return M <= 2 ? 4 : 2;
  return M <= 2 ? 4 : (M <= 4 ? 2 : 1);
}
#else
template <typename W>
constexpr int channels_per_step(int) { return 1; }
#endif

#if defined(GPT1_SIMD)
// y = scale * dot + bias, rounded twice wherever it is computed: the kernel is built with
// `-ffp-contract=off` (`gpt1.inference.matvec`), because a compiler free to fuse `a * s + b`
// fuses it in some instantiations and not others, and a row's result must not depend on which
// one (how many rows) computed it. (`std::fma` here instead made three rows of fp32 0.86x.)
inline float finish(float dot, const float* scale, const float* bias, int64_t n) {
  return dot * (scale ? scale[n] : 1.0f) + (bias ? bias[n] : 0.0f);
}

// dot(x, row) over K numbers as every path sums one channel of one row: one accumulator, L
// lanes at a time in order, then the masked tail, then the lanes' sum. `Fetch`: the weights
// `kOneRowAheadBytes` further on are fetched into L2, once a cache line.
template <typename W, bool Fetch>
inline float dot_one(const float* x, const W* row, int64_t K) {
  constexpr int64_t L = simd::kLanes;
  const int64_t body = K - K % L;
  const char* ahead = reinterpret_cast<const char*>(row) + kOneRowAheadBytes;
  simd::Vec acc = simd::zero();
  for (int64_t k = 0; k < body; k += L) {
    if constexpr (Fetch) {
      if ((k * int64_t(sizeof(W))) % 64 == 0) _mm_prefetch(ahead + k * sizeof(W), _MM_HINT_T1);
    }
    acc = simd::fmadd(simd::load(row + k), simd::load(x + k), acc);
  }
  if (body < K) {
    const simd::Mask tail = simd::lanes(body, K);
    acc = simd::fmadd(simd::load(row + body, tail), simd::load(x + body, tail), acc);
  }
  return simd::sum(acc);
}
#endif

#if defined(GPT1_SIMD)
// Output channels [n, n + R) for M rows, each summing as `dot_one` does: R * M independent
// accumulator chains in registers. `Tail`: K has a last, short step (K % kLanes numbers). With
// the tail's masked code in every block (GPT-1's rows never have one), GCC kept the sums in
// memory across it; compiled without it where K has none, one row through a step's int8
// products read 1.01-1.04x as fast (seven runs, one process against the previous build; the
// AVX2 build 1.02-1.07x), other row counts and fp32 within the runs' 3% spread. Inlined:
// as a function of its own it cost 0.6x (a call, a stack realignment and the sums' spills
// per block).
template <typename W, int M, int R, bool Tail>
__attribute__((always_inline)) inline void block(const float* x, const W* w, const float* scale,
                                                 const float* bias, float* y, int64_t K,
                                                 int64_t N, int64_t n) {
  constexpr int64_t L = simd::kLanes;
  constexpr int64_t kStepBytes = R * L * sizeof(W);  // weight bytes one step consumes
  const int64_t body = K - K % L;
  simd::Vec acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m) acc[r][m] = simd::zero();
  const W* rows[R];
  for (int r = 0; r < R; ++r) rows[r] = w + (n + r) * K;
  // int8: the block's R rows are contiguous; walk its bytes ahead of the multiply at its own
  // pace. Wider weights: each row where it is read `ahead` channels later.
  const char* stream = reinterpret_cast<const char*>(rows[0]) + kStreamAheadBytes;
  const int64_t ahead = channels_ahead(R, K * int64_t(sizeof(W))) * K;
  for (int64_t k = 0; k < body; k += L, stream += kStepBytes) {
    if constexpr (sizeof(W) == 1) {
      for (int64_t b = 0; b < kStepBytes; b += 64) _mm_prefetch(stream + b, _MM_HINT_T1);
    } else if ((k * int64_t(sizeof(W))) % 64 == 0) {  // one fetch per cache line of each row
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + k), _MM_HINT_T1);
    }
    simd::Vec wv[R];
    for (int r = 0; r < R; ++r) wv[r] = simd::load(rows[r] + k);
    for (int m = 0; m < M; ++m) {
      const simd::Vec xv = simd::load(x + m * K + k);
      for (int r = 0; r < R; ++r) acc[r][m] = simd::fmadd(wv[r], xv, acc[r][m]);
    }
  }
  if constexpr (Tail) {
    const simd::Mask tail = simd::lanes(body, K);
    for (int m = 0; m < M; ++m) {
      const simd::Vec xv = simd::load(x + m * K + body, tail);
      for (int r = 0; r < R; ++r)
        acc[r][m] = simd::fmadd(simd::load(rows[r] + body, tail), xv, acc[r][m]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < M; ++m)
      y[m * N + n + r] = finish(simd::sum(acc[r][m]), scale, bias, n + r);
}
#endif

// Output channels [n0, n1) for M rows: y[m * N + n] = scale[n] * dot(x[m], w[n]) + bias[n],
// R channels at a time (`block`).
template <typename W, int M, int R>
void channels(const float* x, const W* w, const float* scale, const float* bias, float* y,
              int64_t K, int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
#if defined(GPT1_SIMD)
  if (K % simd::kLanes) {
    for (; n + R <= n1; n += R) block<W, M, R, true>(x, w, scale, bias, y, K, N, n);
  } else {
    for (; n + R <= n1; n += R) block<W, M, R, false>(x, w, scale, bias, y, K, N, n);
  }
  for (; n < n1; ++n)  // channels left over: one at a time, the same sums
    for (int m = 0; m < M; ++m)
      y[m * N + n] = finish(dot_one<W, false>(x + m * K, w + n * K, K), scale, bias, n);
#else
  // Without vector instructions: plain loops the compiler vectorises.
  for (; n < n1; ++n) {
    const W* row = w + n * K;
    for (int m = 0; m < M; ++m) {
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) sum += x[m * K + k] * static_cast<float>(row[k]);
      y[m * N + n] = sum * (scale ? scale[n] : 1.0f) + (bias ? bias[n] : 0.0f);
    }
  }
#endif
}

#if defined(GPT1_SIMD)
// Output channels [n0, n1) for one row, one channel at a time: the weights are read as one
// forward stream. The sums are `channels`'s, so a row's result does not depend on how many
// rows share the product.
template <typename W>
void channels_one_row(const float* x, const W* w, const float* scale, const float* bias,
                      float* y, int64_t K, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    y[n] = finish(dot_one<W, true>(x, w + n * K, K), scale, bias, n);
}
#endif

#if defined(__AVX512BF16__)
// The bf16 lanes of a row of K numbers left after its whole vectors of 32 (none: 0).
inline __mmask32 pairs_tail(int64_t K) {
  return static_cast<__mmask32>((1ull << (K % 32)) - 1ull);
}

// dot(x, row) of bf16 pairs as every path sums one channel of one row (see `dot_one`).
template <bool Fetch>
inline float dot_pairs(const at::BFloat16* x, const at::BFloat16* row, int64_t K) {
  const int64_t body = K - K % 32;
  const __mmask32 tail = pairs_tail(K);
  const char* ahead = reinterpret_cast<const char*>(row) + kOneRowAheadBytes;
  __m512 acc = _mm512_setzero_ps();
  for (int64_t k = 0; k < body; k += 32) {
    if constexpr (Fetch) _mm_prefetch(ahead + k * 2, _MM_HINT_T1);
    acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(row + k),
                           (__m512bh)_mm512_loadu_si512(x + k));
  }
  if (tail)
    acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(tail, row + body),
                           (__m512bh)_mm512_maskz_loadu_epi16(tail, x + body));
  return _mm512_reduce_add_ps(acc);
}

// bf16 weights and bf16 activations: _mm512_dpbf16_ps multiplies 32 pairs and adds them into
// 16 fp32 lanes, so the weights need no widening at all.
template <int M, int R>
void channels_bf16(const at::BFloat16* x, const at::BFloat16* w, const float* bias, float* y,
                   int64_t K, int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
  const int64_t body = K - K % 32;
  const __mmask32 tail = pairs_tail(K);
  for (; n + R <= n1; n += R) {
    __m512 acc[R][M];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
    const at::BFloat16* rows[R];
    for (int r = 0; r < R; ++r) rows[r] = w + (n + r) * K;
    const int64_t ahead = channels_ahead(R, K * 2) * K;  // each row, as `channels` fetches it
    for (int64_t k = 0; k < body; k += 32) {
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + ahead + k), _MM_HINT_T1);
      __m512bh wv[R];
      for (int r = 0; r < R; ++r) wv[r] = (__m512bh)_mm512_loadu_si512(rows[r] + k);
      for (int m = 0; m < M; ++m) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * K + k);
        for (int r = 0; r < R; ++r) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], wv[r], xv);
      }
    }
    if (tail) {
      for (int m = 0; m < M; ++m) {
        const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(tail, x + m * K + body);
        for (int r = 0; r < R; ++r)
          acc[r][m] = _mm512_dpbf16_ps(
              acc[r][m], (__m512bh)_mm512_maskz_loadu_epi16(tail, rows[r] + body), xv);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m)
        y[m * N + n + r] = _mm512_reduce_add_ps(acc[r][m]) + (bias ? bias[n + r] : 0.0f);
  }
  for (; n < n1; ++n)  // channels left over: one at a time, the same sums
    for (int m = 0; m < M; ++m)
      y[m * N + n] = dot_pairs<false>(x + m * K, w + n * K, K) + (bias ? bias[n] : 0.0f);
}
#endif


#if defined(__AVX512BF16__)
// One row of bf16 pairs, one channel at a time (see `channels_one_row`).
void channels_bf16_one_row(const at::BFloat16* x, const at::BFloat16* w, const float* bias,
                           float* y, int64_t K, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    y[n] = dot_pairs<true>(x, w + n * K, K) + (bias ? bias[n] : 0.0f);
}

template <int M>
void run_bf16(const at::BFloat16* x, const at::BFloat16* w, const float* bias, float* y,
              int64_t K, int64_t N) {
  if (M == 1 && one_row_stream[1].load(std::memory_order_relaxed)) {
    const int64_t grain = std::max<int64_t>(1, kMinBytesPerTask / (K * 2));
    at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
      channels_bf16_one_row(x, w, bias, y, K, n0, n1);
    });
    return;
  }
  constexpr int R = M <= 2 ? 4 : 2;
  const int64_t blocks = (N + R - 1) / R;
  const int64_t grain = std::max<int64_t>(1, kMinBytesPerTask / (R * K * 2));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    channels_bf16<M, R>(x, w, bias, y, K, N, b0 * R, std::min(N, b1 * R));
  });
}

void dispatch_bf16(int64_t M, const at::BFloat16* x, const at::BFloat16* w, const float* bias,
                   float* y, int64_t K, int64_t N) {
  using Runner = void (*)(const at::BFloat16*, const at::BFloat16*, const float*, float*,
                          int64_t, int64_t);
  static constexpr Runner runners[] = {run_bf16<1>, run_bf16<2>, run_bf16<3>, run_bf16<4>,
                                       run_bf16<5>, run_bf16<6>, run_bf16<7>, run_bf16<8>};
  runners[M - 1](x, w, bias, y, K, N);
}
#endif

template <typename W, int M>
void run(const float* x, const W* w, const float* scale, const float* bias, float* y,
         int64_t K, int64_t N) {
#if defined(GPT1_SIMD)
  if (M == 1 && std::is_same_v<W, float> && one_row_stream[0].load(std::memory_order_relaxed)) {
    const int64_t grain = std::max<int64_t>(1, kMinBytesPerTask / (K * int64_t(sizeof(W))));
    at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
      channels_one_row(x, w, scale, bias, y, K, n0, n1);
    });
    return;
  }
#endif
  constexpr int R = channels_per_step<W>(M);
  const int64_t blocks = (N + R - 1) / R;
  const int64_t grain = std::max<int64_t>(1, kMinBytesPerTask / (R * K * int64_t(sizeof(W))));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    channels<W, M, R>(x, w, scale, bias, y, K, N, b0 * R, std::min(N, b1 * R));
  });
}

template <typename W>
void dispatch(int64_t M, const float* x, const W* w, const float* scale, const float* bias,
              float* y, int64_t K, int64_t N) {
  using Runner = void (*)(const float*, const W*, const float*, const float*, float*, int64_t,
                          int64_t);
  static constexpr Runner runners[] = {run<W, 1>, run<W, 2>, run<W, 3>, run<W, 4>,
                                       run<W, 5>, run<W, 6>, run<W, 7>, run<W, 8>};
  runners[M - 1](x, w, scale, bias, y, K, N);
}

}  // namespace

bool set_one_row_stream(bool bf16_pairs, bool on) {
  return one_row_stream[bf16_pairs].exchange(on);
}

namespace gpt1 {

const float* float_values(const torch::Tensor& t, int64_t n, std::vector<float>& buf,
                          const char* who, const char* what) {
  if (!t.defined() || t.numel() == 0) return nullptr;  // absent
  TORCH_CHECK(t.numel() == n && t.is_contiguous() && t.device().is_cpu(), who, " ", what,
              " must hold ", n, " numbers, contiguous, on the CPU");
  if (t.scalar_type() == at::kFloat) return t.data_ptr<float>();
  if (t.scalar_type() == at::kBFloat16) {
    buf.assign(t.data_ptr<at::BFloat16>(), t.data_ptr<at::BFloat16>() + n);
  } else {
    const torch::Tensor f = t.to(at::kFloat);
    buf.assign(f.data_ptr<float>(), f.data_ptr<float>() + n);
  }
  return buf.data();
}

void weight_product(int64_t M, const float* x, const at::BFloat16* x_bf16, const torch::Tensor& w,
                    const float* scale, const float* bias, float* y) {
  const int64_t K = w.size(1), N = w.size(0);
  switch (w.scalar_type()) {
    case at::kChar:
      dispatch(M, x, w.data_ptr<int8_t>(), scale, bias, y, K, N);
      break;
    case at::kBFloat16:
#if defined(__AVX512BF16__)
      if (x_bf16 && !scale) {
        dispatch_bf16(M, x_bf16, w.data_ptr<at::BFloat16>(), bias, y, K, N);
        break;
      }
#endif
      dispatch(M, x, w.data_ptr<at::BFloat16>(), scale, bias, y, K, N);
      break;
    case at::kFloat:
      dispatch(M, x, w.data_ptr<float>(), scale, bias, y, K, N);
      break;
    default:
      TORCH_CHECK(false, "matvec: weights must be int8, bf16 or fp32");
  }
}

}  // namespace gpt1

// x [M, K] (any float dtype, 1 <= M <= 8), w [N, K] int8, bf16 or fp32 (contiguous), scale [N]
// (optional; int8 needs it), bias [N] (optional) -> [M, N] in x's dtype.
torch::Tensor matvec(const torch::Tensor& x, const torch::Tensor& w,
                     const c10::optional<torch::Tensor>& scale,
                     const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "matvec: shapes");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= 8, "matvec: 1 to 8 rows");
  TORCH_CHECK(w.is_contiguous() && w.device().is_cpu() && x.device().is_cpu(), "matvec: w");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  std::vector<float> s_buf, b_buf;
  const float* sp = scale ? gpt1::float_values(*scale, N, s_buf, "matvec:", "scale") : nullptr;
  const float* bp = bias ? gpt1::float_values(*bias, N, b_buf, "matvec:", "bias") : nullptr;
  TORCH_CHECK(sp || w.scalar_type() != at::kChar, "matvec: int8 weights need scales");
  const torch::Tensor xc = x.contiguous();
  const bool fp32 = x.scalar_type() == at::kFloat;
#if defined(__AVX512BF16__)
  // bf16 weights times bf16 activations: the pairs multiply as they are, no fp32 copy of x.
  const bool bf16_pairs =
      w.scalar_type() == at::kBFloat16 && x.scalar_type() == at::kBFloat16 && !sp;
#else
  const bool bf16_pairs = false;
#endif
  // Other activations as fp32: their own data, or a converted copy (a plain buffer for bf16,
  // cheaper than a tensor operation per call).
  std::vector<float> x_buf, y_buf;
  torch::Tensor x_other;
  const float* xp = nullptr;
  if (fp32) {
    xp = xc.data_ptr<float>();
  } else if (x.scalar_type() != at::kBFloat16) {
    x_other = xc.to(at::kFloat);
    xp = x_other.data_ptr<float>();
  } else if (!bf16_pairs) {
    x_buf.assign(xc.data_ptr<at::BFloat16>(), xc.data_ptr<at::BFloat16>() + M * K);
    xp = x_buf.data();
  }
  torch::Tensor y = torch::empty({M, N}, x.options());
  float* yp = fp32 ? y.data_ptr<float>() : (y_buf.resize(M * N), y_buf.data());
  gpt1::weight_product(M, xp, bf16_pairs ? xc.data_ptr<at::BFloat16>() : nullptr, w, sp, bp, yp);
  if (!fp32) {
    if (y.scalar_type() == at::kBFloat16) {
      at::BFloat16* out = y.data_ptr<at::BFloat16>();
      for (int64_t i = 0; i < M * N; ++i) out[i] = at::BFloat16(y_buf[i]);  // round to nearest even
    } else {
      y.copy_(torch::from_blob(y_buf.data(), {M, N}, at::kFloat));
    }
  }
  return y;
}
