// y = x @ (w * scale[:, None]).T + bias for a few rows of x: the weight products of decoding.
//
// Decoding multiplies one row (or a few) by every weight matrix, so its speed is the speed of
// reading the weights from memory. This kernel reads each weight once for all the rows it is
// given (int8, bf16 or fp32 weights; int8 with one scale per output channel), widens it to fp32
// in registers and multiplies it by the activations in fp32 (int8 is weight-only: activations
// are never rounded to integers). R output channels are read side by side, and the kernel
// fetches the weights it will need kPrefetchBytes ahead of the multiply: R short rows that
// restart every block are streams the hardware prefetchers pick up too late. Work is split over output
// channels with ATen's parallel_for, so it runs on torch's own threads.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

// At least this many weight bytes per task: a smaller task costs more to hand to a thread than
// it saves.
constexpr int64_t kMinBytesPerTask = 64 * 1024;

// How far ahead of the multiply the weights are fetched. Measured on an AVX-512 server core
// (benchmarks/decode.py, docs/results.md): without it a step read at about half a plain read's
// bandwidth; 32 KB ahead suited int8 weights best, 4 KB bf16 and fp32 (farther, each step's
// several prefetches crowd the line-fill buffers).
template <typename W>
constexpr int64_t kPrefetchBytes = sizeof(W) == 1 ? 32768 : 4096;

#if defined(__AVX512F__)
// Sixteen weights, widened to fp32; `tail` loads only the first `mask` lanes.
inline __m512 widen16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 widen16(const at::BFloat16* p) {  // bf16 is fp32's upper half
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 widen16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 widen16(const int8_t* p, __mmask16 mask) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, p)));
}
inline __m512 widen16(const at::BFloat16* p, __mmask16 mask) {
  const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 widen16(const float* p, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, p); }
#endif

// Output channels [n0, n1) for M rows: y[m * N + n] = scale[n] * dot(x[m], w[n]) + bias[n].
// R channels at a time keep R * M independent accumulator chains in registers.
template <typename W, int M, int R>
void channels(const float* x, const W* w, const float* scale, const float* bias, float* y,
              int64_t K, int64_t N, int64_t n0, int64_t n1) {
  int64_t n = n0;
#if defined(__AVX512F__)
  constexpr int64_t kStepBytes = R * 16 * sizeof(W);  // weight bytes one step consumes
  const int64_t body = K - K % 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (K % 16)) - 1u);
  for (; n + R <= n1; n += R) {
    __m512 acc[R][M];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
    const W* rows[R];
    for (int r = 0; r < R; ++r) rows[r] = w + (n + r) * K;
    // The block's R rows are contiguous: walk its bytes ahead of the multiply at its own pace.
    const char* ahead = reinterpret_cast<const char*>(rows[0]) + kPrefetchBytes<W>;
    for (int64_t k = 0; k < body; k += 16, ahead += kStepBytes) {
      for (int64_t b = 0; b < kStepBytes; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
      __m512 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = widen16(rows[r] + k);
      for (int m = 0; m < M; ++m) {
        const __m512 xv = _mm512_loadu_ps(x + m * K + k);
        for (int r = 0; r < R; ++r) acc[r][m] = _mm512_fmadd_ps(wv[r], xv, acc[r][m]);
      }
    }
    if (tail) {
      for (int m = 0; m < M; ++m) {
        const __m512 xv = _mm512_maskz_loadu_ps(tail, x + m * K + body);
        for (int r = 0; r < R; ++r)
          acc[r][m] = _mm512_fmadd_ps(widen16(rows[r] + body, tail), xv, acc[r][m]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) {
        const float s = scale ? scale[n + r] : 1.0f;
        y[m * N + n + r] = _mm512_reduce_add_ps(acc[r][m]) * s + (bias ? bias[n + r] : 0.0f);
      }
  }
#endif
  // Channels left over (or every channel without AVX-512): plain loops the compiler vectorises.
  for (; n < n1; ++n) {
    const W* row = w + n * K;
    for (int m = 0; m < M; ++m) {
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) sum += x[m * K + k] * static_cast<float>(row[k]);
      y[m * N + n] = sum * (scale ? scale[n] : 1.0f) + (bias ? bias[n] : 0.0f);
    }
  }
}

template <typename W, int M>
void run(const float* x, const W* w, const float* scale, const float* bias, float* y,
         int64_t K, int64_t N) {
  // Four channels a step for one or two rows, two for more (the accumulators must stay in
  // the 32 vector registers).
  constexpr int R = M <= 2 ? 4 : 2;
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

// x [M, K] (any float dtype, 1 <= M <= 8), w [N, K] int8, bf16 or fp32 (contiguous), scale [N]
// (optional; int8 needs it), bias [N] (optional) -> [M, N] in x's dtype.
torch::Tensor matvec(const torch::Tensor& x, const torch::Tensor& w,
                     const c10::optional<torch::Tensor>& scale,
                     const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "matvec: shapes");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= 8, "matvec: 1 to 8 rows");
  TORCH_CHECK(w.is_contiguous() && w.device().is_cpu() && x.device().is_cpu(), "matvec: w");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  const auto as_float = [N](const c10::optional<torch::Tensor>& t, const char* what) {
    if (!t || !t->defined()) return torch::Tensor();
    TORCH_CHECK(t->numel() == N, "matvec: ", what, " [N]");
    return t->to(at::kFloat).contiguous();
  };
  const torch::Tensor s = as_float(scale, "scale"), b = as_float(bias, "bias");
  TORCH_CHECK(s.defined() || w.scalar_type() != at::kChar, "matvec: int8 weights need scales");
  const torch::Tensor xf = x.to(at::kFloat).contiguous();
  torch::Tensor y = torch::empty({M, N}, x.options().dtype(at::kFloat));
  const float* sp = s.defined() ? s.data_ptr<float>() : nullptr;
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  switch (w.scalar_type()) {
    case at::kChar:
      dispatch(M, xf.data_ptr<float>(), w.data_ptr<int8_t>(), sp, bp, y.data_ptr<float>(), K, N);
      break;
    case at::kBFloat16:
      dispatch(M, xf.data_ptr<float>(), w.data_ptr<at::BFloat16>(), sp, bp, y.data_ptr<float>(),
               K, N);
      break;
    case at::kFloat:
      dispatch(M, xf.data_ptr<float>(), w.data_ptr<float>(), sp, bp, y.data_ptr<float>(), K, N);
      break;
    default:
      TORCH_CHECK(false, "matvec: weights must be int8, bf16 or fp32");
  }
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("matvec", &matvec, "weight products for a few rows", pybind11::arg("x"),
        pybind11::arg("w"), pybind11::arg("scale") = pybind11::none(),
        pybind11::arg("bias") = pybind11::none());
}
