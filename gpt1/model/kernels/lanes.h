// Sixteen fp32 lanes at a time over fp32 or bf16 arrays of any length, for the kernels compiled
// for AVX-512 (F, BW, VL): `lanes` masks the last, short step of a loop, `load` widens bf16 to
// fp32 (bf16 is fp32's upper half), `store` narrows values that already hold bf16 numbers.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

#include <torch/extension.h>

namespace gpt1 {

inline __mmask16 lanes(int64_t i, int64_t n) {
  return n - i >= 16 ? static_cast<__mmask16>(0xFFFF)
                     : static_cast<__mmask16>((1u << (n - i)) - 1u);
}

inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load(const at::BFloat16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline void store(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
inline void store(at::BFloat16* p, __m512 v, __mmask16 m) {  // v already holds bf16 values
  _mm256_mask_storeu_epi16(
      p, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
}

}  // namespace gpt1

#endif
