// Activations to int8 with one scale for the whole tensor (symmetric, the largest magnitude to
// 127), for int8 x int8 products of many rows (`gpt1/inference/quantize.py`).
//
// Written out in torch operators this is four passes over the activations (the largest
// magnitude, the scaling, the rounding, the conversion), 0.3-1.4 ms for a product of GPT-1's
// classification batches, much of what the int8 product saves. Here it is two: the largest
// magnitude, then scale, round to nearest even and narrow in one pass, both on torch's threads.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "lanes.h"
#include "products.h"

#if defined(GPT1_SIMD)

namespace {

constexpr int64_t kGrain = 32768;  // numbers per task: less is not worth a thread

namespace simd = gpt1::simd;

// The largest magnitude of x[lo, hi), or NaN where a NaN is among them.
template <typename T>
float largest(const T* x, int64_t lo, int64_t hi) {
  simd::Vec top = simd::zero();
  bool nan = false;
  for (int64_t i = lo; i < hi; i += simd::kLanes) {
    const simd::Vec v = simd::load(x + i, simd::lanes(i, hi));
    nan |= simd::any_nan(v);
    top = simd::max(top, simd::abs(v));
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : simd::largest(top);
}

// q[i] = round(x[i] * factor), nearest even, for x[lo, hi); |x| * factor <= 127 up to rounding,
// and the narrowing saturates.
template <typename T>
void narrow(const T* x, int8_t* q, float factor, int64_t lo, int64_t hi) {
  const simd::Vec f = simd::set1(factor);
  for (int64_t i = lo; i < hi; i += simd::kLanes) {
    const simd::Mask m = simd::lanes(i, hi);
    simd::store_int8(q + i, simd::mul(simd::load(x + i, m), f), m);
  }
}

template <typename T>
std::tuple<torch::Tensor, double> per_tensor(const torch::Tensor& x) {
  const T* data = x.data_ptr<T>();
  const int64_t n = x.numel();
  const float amax = at::parallel_reduce(
      0, n, kGrain, 0.0f, [&](int64_t lo, int64_t hi, float) { return largest(data, lo, hi); },
      [](float a, float b) { return (std::isnan(a) || std::isnan(b)) ? NAN : std::max(a, b); });
  if (!(amax > 0.0f) || std::isinf(amax)) return {torch::Tensor(), 0.0};  // zeros, inf, NaN
  torch::Tensor q = torch::empty(x.sizes(), x.options().dtype(at::kChar));
  int8_t* out = q.data_ptr<int8_t>();
  const float factor = static_cast<float>(127.0 / amax);  // as torch rounds 127 / amax
  at::parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) { narrow(data, out, factor, lo, hi); });
  return {q, static_cast<double>(amax) / 127.0};
}

}  // namespace

bool has_quantize_per_tensor() { return true; }

// x (fp32 or bf16, contiguous, on the CPU) -> (int8 of x's shape, scale) with x ~= q * scale;
// (an undefined tensor, 0) where x has no finite non-zero largest magnitude.
std::tuple<torch::Tensor, double> quantize_per_tensor(const torch::Tensor& x) {
  TORCH_CHECK(x.is_contiguous() && x.device().is_cpu() && x.numel() > 0,
              "quantize_per_tensor: x must be contiguous, on the CPU, not empty");
  if (x.scalar_type() == at::kFloat) return per_tensor<float>(x);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "quantize_per_tensor: x must be fp32 or bf16");
  return per_tensor<at::BFloat16>(x);
}

#else  // neither AVX-512 (F, BW, VL) nor AVX2 with FMA: torch's operators quantise

bool has_quantize_per_tensor() { return false; }

std::tuple<torch::Tensor, double> quantize_per_tensor(const torch::Tensor&) {
  TORCH_CHECK(false, "quantize_per_tensor: not compiled for this CPU (it needs AVX-512 or AVX2 with FMA)");
}

#endif
