// What the kernels share: the weight product of `matvec.cpp`, used by `matvec()` itself and by
// the decoding step of `step.cpp`.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <tuple>
#include <vector>

namespace gpt1 {

// A vector of n parameters (a bias, scales, LayerNorm gains) as fp32: the tensor's own data, or
// a converted copy in `buf` (a bf16 bias is converted here, not by a tensor operation per
// call); nullptr for an undefined or empty tensor (absent). `who` and `what` name it in errors.
const float* float_values(const torch::Tensor& t, int64_t n, std::vector<float>& buf,
                          const char* who, const char* what);

// y [M, N] (fp32) = x [M, K] @ (w * scale[:, None]).T + bias, for 1 <= M <= 8 rows and w [N, K]
// contiguous, int8 (with scale), bf16 or fp32; scale and bias optional (nullptr). x holds the
// activations in fp32; x_bf16, where given, the same activations in bf16, and then bf16 weights
// without scales multiply the bf16 pairs as they are (x may be nullptr in that case).
void weight_product(int64_t M, const float* x, const at::BFloat16* x_bf16, const torch::Tensor& w,
                    const float* scale, const float* bias, float* y);

// Runs `part(lo, hi)` over rows [0, rows) of `numbers` each, split across ATen's threads in tasks
// of at least `kRowGrain` numbers (fewer rows than that stay on the calling thread: a task costs
// a few microseconds to hand out); true unless some part returned false. Each row is computed as
// on one thread, so its results do not depend on the split.
constexpr int64_t kRowGrain = 32768;
template <typename Part>
bool rows_in_parallel(int64_t rows, int64_t numbers, const Part& part) {
  std::atomic<bool> ok{true};
  const int64_t grain = std::max<int64_t>(1, kRowGrain / std::max<int64_t>(numbers, 1));
  at::parallel_for(0, rows, grain, [&](int64_t lo, int64_t hi) {
    if (!part(lo, hi)) ok = false;
  });
  return ok;
}

// An int8 weight [out, in] as oneDNN's int8 kernel takes it: its packed copy and zero points
// (`backend.pack_int8`), its per-channel fp32 scales, and whether the activations go over as
// unsigned bytes with zero point 128 (`backend.int8_many_rows`'s "u8").
// `vnni`, where given, is the weight in the few-row kernel's layout (`pack_vnni`), which up to
// `int8_rows_limit` rows take where it is compiled (AVX-512 VNNI, AMX, AVX2).
struct Int8Packed {
  const torch::Tensor* packed = nullptr;
  const torch::Tensor* zero_points = nullptr;
  const torch::Tensor* scale = nullptr;
  const torch::Tensor* vnni = nullptr;
  int64_t out = 0, in = 0;
  bool u8 = false;
};
constexpr int kFewRows = 16;

// y [M, N] (fp32) = x [M, K] @ (q * scale[:, None]).T + bias, any M >= 1, each row of x
// quantised to int8 with its own scale (`int8_rows.cpp`), written to `y`, or rounded to bf16
// into `y_bf16` where that is given (y then unused); false, nothing written, where a row of x
// holds an inf or a NaN.
bool int8_rows_product(int64_t M, const float* x, const Int8Packed& w, const float* bias,
                       float* y, at::BFloat16* y_bf16 = nullptr);

}  // namespace gpt1

// The Python-facing functions (`module.cpp` binds them).
torch::Tensor matvec(const torch::Tensor& x, const torch::Tensor& w,
                     const c10::optional<torch::Tensor>& scale,
                     const c10::optional<torch::Tensor>& bias);
// One row against fp32 weights, or bf16 pairs (`bf16_pairs`): a channel at a time (true) or
// several side by side (false); returns the previous setting.
bool set_one_row_stream(bool bf16_pairs, bool on);
bool has_decode_step();
torch::Tensor decode_step(const torch::Tensor& x, const std::vector<torch::Tensor>& params,
                          const std::vector<torch::Tensor>& keys,
                          const std::vector<torch::Tensor>& values,
                          const std::vector<int64_t>& rows, const std::vector<int64_t>& lengths,
                          int64_t n_head, double eps, bool gelu,
                          const std::vector<torch::Tensor>& packed, bool u8);
std::tuple<torch::Tensor, bool> greedy_tokens(const torch::Tensor& logits);
// ids [k] (int64) drawn from rows `rows` [k] of logits [n, V] (their first `vocab` ids), each at
// its temperature, among its top-k logits (0: all) and its top-p nucleus (1: all), at its
// uniform number in [0, 1); -1 for a row with a NaN or +inf logit, or -inf where `finite_only`,
// or no id left (`choice.cpp`).
torch::Tensor draw_tokens(const torch::Tensor& logits, const torch::Tensor& rows,
                          const torch::Tensor& temperatures, const torch::Tensor& top_ks,
                          const torch::Tensor& top_ps, const torch::Tensor& uniforms,
                          int64_t vocab, bool finite_only);
// GELU (tanh form) of fp32 x as decode_step computes it; compiled where decode_step is.
torch::Tensor gelu_fp32(const torch::Tensor& x);
// Keys or values [..., D] as the rows of an int8 cache [..., D + 8]; compiled where
// decode_step is.
torch::Tensor quantize_cache_rows(const torch::Tensor& x);
bool has_int8_rows();
torch::Tensor pack_vnni(const torch::Tensor& q);
bool has_few_rows_int8();
// The most rows whose int8 products, of `in_features` inputs, take gpt1's kernel rather than
// oneDNN's: 64 where AMX multiplies them, `vnni_rows_limit` on VNNI, else kFewRows.
int64_t int8_rows_limit(int64_t in_features);
// On AVX-512 VNNI without AMX: the most rows gpt1's int8 kernel takes before oneDNN's, set to
// `rows` unless it is 0 (kFewRows..64, else refused); returns the limit before. 0 where there
// is no such choice (AMX, AVX2, no kernel).
int64_t vnni_rows_limit(int64_t rows);
torch::Tensor rows_product(const torch::Tensor& x, const torch::Tensor& vnni,
                           const torch::Tensor& scale, const c10::optional<torch::Tensor>& bias,
                           int64_t out);
std::tuple<torch::Tensor, torch::Tensor> quantize_rows(const torch::Tensor& x);
// How gpt1's int8 kernel quantises each row of activations: "s8" (signed 8-bit, one scale) or
// "u7" (unsigned 7-bit with a zero point, the AVX2 kernel): `int8_rows.quantize`'s `form`.
std::string int8_rows_form();
torch::Tensor scale_rows(const torch::Tensor& sums, const torch::Tensor& x_scale,
                         const c10::optional<torch::Tensor>& bias, bool bf16);
bool has_quantize_per_tensor();
std::tuple<torch::Tensor, double> quantize_per_tensor(const torch::Tensor& x);
// y = table[x] elementwise for bf16 x: `table.cpp`.
torch::Tensor bf16_table(const torch::Tensor& x, const torch::Tensor& table32);
