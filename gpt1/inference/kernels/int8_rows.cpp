// int8 x int8 products of many rows, each row with its own activation scale, for the decoding
// step of many sequences (`step.cpp`): the arithmetic of `gpt1/inference/int8_rows.py`.
//
// A row is quantised on its own (its largest magnitude to 127, divided and rounded to nearest
// even as `int8_rows.quantize` does, so both give the same integers), the product is oneDNN's
// int8 kernel (AMX, VNNI or AVX2, whichever the CPU has; called through torch's dispatcher,
// as `torch.ops.onednn.qlinear_pointwise`), which returns the int32 sums times the weight's
// per-channel scales in fp32, and the row's scale and the bias are applied after, in fp32:
//
//   y[m, n] = fp32(sum_k qx[m, k] q[n, k]) * w_scale[n] * x_scale[m] + bias[n]
//
// the order of `int8_rows.epilogue`, so both paths compute the same bits from the same sums.
#include <torch/extension.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <string>

#include "lanes.h"
#include "products.h"

#if defined(GPT1_SIMD)

namespace {

namespace simd = gpt1::simd;

// Row r of x [M, K] -> q (int8, or int8 + 128 as unsigned bytes where `u8`) and scales[r];
// false where a row holds an inf or a NaN (the float product keeps them).
bool quantize_rows(const float* x, int64_t M, int64_t K, int8_t* q, float* scales, bool u8) {
  for (int64_t r = 0; r < M; ++r) {
    const float* row = x + r * K;
    simd::Vec top = simd::zero();
    bool nan = false;
    for (int64_t i = 0; i < K; i += simd::kLanes) {
      const simd::Vec v = simd::load(row + i, simd::lanes(i, K));
      nan |= simd::any_nan(v);
      top = simd::max(top, simd::abs(v));
    }
    const float amax = simd::largest(top);
    if (nan || std::isinf(amax)) return false;
    const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;  // an all-zero row: all 0
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

}  // namespace

namespace gpt1 {

bool int8_rows_product(int64_t M, const float* x, const Int8Packed& w, const float* bias,
                       float* y) {
  const int64_t K = w.in, N = w.out;
  torch::Tensor qx = torch::empty({M, K}, torch::dtype(w.u8 ? at::kByte : at::kChar));
  std::vector<float> scales(M);
  if (!quantize_rows(x, M, K, static_cast<int8_t*>(qx.data_ptr()), scales.data(), w.u8)) {
    return false;
  }
  const torch::Tensor sums = onednn_product(qx, w.u8, *w.packed, *w.zero_points, *w.scale);
  TORCH_CHECK(sums.scalar_type() == at::kFloat && sums.is_contiguous() && sums.numel() == M * N,
              "int8 rows: oneDNN returned an unexpected product");
  const float* s = sums.data_ptr<float>();
  for (int64_t r = 0; r < M; ++r) {
    const simd::Vec xs = simd::set1(scales[r]);
    for (int64_t n = 0; n < N; n += simd::kLanes) {
      const simd::Mask m = simd::lanes(n, N);
      simd::Vec v = simd::mul(simd::load(s + r * N + n, m), xs);
      if (bias) v = simd::add(v, simd::load(bias + n, m));
      simd::store(y + r * N + n, v, m);
    }
  }
  return true;
}

}  // namespace gpt1

#endif
