// A function of bf16 numbers applied by table: y[i] = table[bits of x[i]], where the table holds
// the function's value at each of the 65,536 bf16 numbers (`gpt1/inference/activations.py` fills
// it with torch's own results, so the lookup gives torch's bits).
//
// GELU is why: torch's bf16 GELU (tanh form) widens each number, calls a vectorised tanh accurate
// to 1 ulp and narrows again, about 3.4 ns a number on one core of the AMX Xeon; it was a fifth
// of a 2048-row prompt's time through the int8 model. The table (65,536 int32 entries, 256 KB)
// stays in L2, and one gather of 16 lanes replaces the arithmetic.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>

#include "products.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kGrain = 65536;  // numbers per task: less is not worth a thread

// table32 holds each bf16 result in the low half of a 32-bit entry: one gather a lane.
void lookup(const uint16_t* x, const int32_t* table32, uint16_t* y, int64_t lo, int64_t hi) {
  int64_t i = lo;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  for (; i + 16 <= hi; i += 16) {
    const __m512i at = _mm512_cvtepu16_epi32(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(x + i)));
    const __m512i got = _mm512_i32gather_epi32(at, table32, 4);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm512_cvtepi32_epi16(got));
  }
#elif defined(__AVX2__)
  const __m256i low = _mm256_set1_epi32(0xFFFF);
  for (; i + 16 <= hi; i += 16) {
    const __m128i* from = reinterpret_cast<const __m128i*>(x + i);
    const __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128(from));
    const __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128(from + 1));
    const __m256i ga = _mm256_and_si256(_mm256_i32gather_epi32(table32, a, 4), low);
    const __m256i gb = _mm256_and_si256(_mm256_i32gather_epi32(table32, b, 4), low);
    // packus keeps 128-bit lanes apart: put the halves back in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(ga, gb), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), packed);
  }
#endif
  for (; i < hi; ++i) y[i] = static_cast<uint16_t>(table32[x[i]]);
}

}  // namespace

// x (bf16, contiguous, on the CPU) -> table[x] elementwise; table32: int32 [65536], entry b the
// result's bf16 bits for the input whose bits are b.
torch::Tensor bf16_table(const torch::Tensor& x, const torch::Tensor& table32) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kBFloat16 && x.is_contiguous(),
              "bf16_table: x must be bf16, contiguous, on the CPU");
  TORCH_CHECK(table32.scalar_type() == at::kInt && table32.numel() == 65536 &&
                  table32.is_contiguous(),
              "bf16_table: the table must be int32 [65536]");
  torch::Tensor y = torch::empty_like(x);
  const uint16_t* from = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  uint16_t* to = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  const int32_t* table = table32.data_ptr<int32_t>();
  at::parallel_for(0, x.numel(), kGrain,
                   [&](int64_t lo, int64_t hi) { lookup(from, table, to, lo, hi); });
  return y;
}
