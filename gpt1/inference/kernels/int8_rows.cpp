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

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "lanes.h"
#include "products.h"

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
  if (!quantize_rows(x, 0, M, K, static_cast<int8_t*>(qx.data_ptr()), scales.data(), w.u8)) {
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
  std::atomic<bool> finite{true};
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(K, 1));
  at::parallel_for(0, M, grain, [&](int64_t lo, int64_t hi) {
    const bool ok = x.scalar_type() == at::kFloat
                        ? quantize_rows(x.data_ptr<float>(), lo, hi, K, qp, sp, false)
                        : quantize_rows(x.data_ptr<at::BFloat16>(), lo, hi, K, qp, sp, false);
    if (!ok) finite = false;
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
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(N, 1));
  at::parallel_for(0, M, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const simd::Vec scale = simd::set1(xs[r]);
      for (int64_t n = 0; n < N; n += simd::kLanes) {
        const simd::Mask m = simd::lanes(n, N);
        simd::Vec v = simd::mul(simd::load(s + r * N + n, m), scale);
        if (b) v = simd::add(v, simd::load(b + n, m));
        if (!bf16) {
          simd::store(out.data_ptr<float>() + r * N + n, v, m);
        } else {
          simd::store(out.data_ptr<at::BFloat16>() + r * N + n, simd::round_bf16(v), m);
        }
      }
    }
  });
  return out;
}

bool has_int8_rows() { return true; }

#else  // neither AVX-512 (F, BW, VL) nor AVX2 with FMA: torch's operators quantise the rows

bool has_int8_rows() { return false; }

std::tuple<torch::Tensor, torch::Tensor> quantize_rows(const torch::Tensor&) {
  TORCH_CHECK(false, "quantize_rows: not compiled for this CPU");
}

torch::Tensor scale_rows(const torch::Tensor&, const torch::Tensor&,
                         const c10::optional<torch::Tensor>&, bool) {
  TORCH_CHECK(false, "scale_rows: not compiled for this CPU");
}

#endif
