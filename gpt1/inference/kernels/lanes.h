// The vector operations the kernels are written in, for the two instruction sets they are
// compiled for: sixteen fp32 lanes of AVX-512 (F, BW, VL) or eight of AVX2 with FMA. The
// kernels' maths is written once over `simd::Vec`; this header is all that differs between the
// two. Elsewhere (`GPT1_SIMD` undefined: other CPUs, ARM) the kernels use plain loops.
//
// Arrays of any length are walked `kLanes` numbers at a time: `lanes(i, n)` is the mask of a
// step at i, which the last, short step of a loop needs (masked lanes load as zero and are
// never stored). `load` widens bf16 (fp32's upper half) and int8 to fp32; `store` narrows
// values that already hold bf16 numbers.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <cstring>

#if (defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)) || \
    (defined(__AVX2__) && defined(__FMA__))
#define GPT1_SIMD 1
#include <immintrin.h>
#endif

#if defined(GPT1_SIMD) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
namespace gpt1::simd {

constexpr int kLanes = 16;
constexpr int kRegisters = 32;  // vector registers: how many accumulators a loop may keep
using Vec = __m512;
using Mask = __mmask16;

inline Mask lanes(int64_t i, int64_t n) {
  return n - i >= 16 ? static_cast<Mask>(0xFFFF) : static_cast<Mask>((1u << (n - i)) - 1u);
}

inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec set1(float a) { return _mm512_set1_ps(a); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline Vec min(Vec a, Vec b) { return _mm512_min_ps(a, b); }
inline Vec abs(Vec a) { return _mm512_abs_ps(a); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }    // a b + c
inline Vec fnmadd(Vec a, Vec b, Vec c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b
inline Vec within(Mask m, Vec a) { return _mm512_maskz_mov_ps(m, a); }        // 0 outside m
inline Vec select(Mask m, Vec a, Vec b) { return _mm512_mask_blend_ps(m, b, a); }  // a in m, else b
inline float sum(Vec a) { return _mm512_reduce_add_ps(a); }
inline float largest(Vec a) { return _mm512_reduce_max_ps(a); }
inline float smallest(Vec a) { return _mm512_reduce_min_ps(a); }
inline bool any_nan(Vec a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) != 0; }
inline Mask greater(Vec a, Vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }  // a > b
inline unsigned greater_lanes(Vec a, Vec b) { return greater(a, b); }  // bit j: a_j > b_j
inline unsigned equal_lanes(Vec a, Vec b) {  // bit j: lane j of a == lane j of b
  return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ);
}
inline Vec round_even(Vec a) {  // to the nearest integer, ties to even
  return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline Vec times_pow2(Vec p, Vec n) { return _mm512_scalef_ps(p, n); }  // p 2^n, n integral

inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec load(const at::BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline Vec load(const int8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline Vec load(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
inline Vec load(const at::BFloat16* p, Mask m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline Vec load(const int8_t* p, Mask m) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

inline void store(float* p, Vec v, Mask m) { _mm512_mask_storeu_ps(p, m, v); }
inline void store(at::BFloat16* p, Vec v, Mask m) {  // v already holds bf16 values
  _mm256_mask_storeu_epi16(
      p, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
}
// q = v rounded to the nearest integer (ties to even), saturated to int8.
inline void store_int8(int8_t* q, Vec v, Mask m) {
  const __m512i n = _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm_mask_storeu_epi8(q, m, _mm512_cvtsepi32_epi8(n));
}

// fp32 -> bf16 -> fp32, rounding to nearest even (what at::BFloat16 does).
inline Vec round_bf16(Vec v) {
#if defined(__AVX512BF16__)
  const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
#else
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  const __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(up, 16));
#endif
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

}  // namespace gpt1::simd

#elif defined(GPT1_SIMD)  // AVX2 + FMA
namespace gpt1::simd {

constexpr int kLanes = 8;
constexpr int kRegisters = 16;
using Vec = __m256;

// AVX2 has masked loads and stores for 32-bit lanes only: a mask holds both the lanes' bits and
// their count, and narrower numbers (bf16, int8) of a short step go through a small buffer.
struct Mask {
  __m256i bits;
  int count;
};

inline Mask lanes(int64_t i, int64_t n) {
  const int count = n - i >= 8 ? 8 : static_cast<int>(n - i);
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return {_mm256_cmpgt_epi32(_mm256_set1_epi32(count), index), count};
}

inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec set1(float a) { return _mm256_set1_ps(a); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
inline Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec min(Vec a, Vec b) { return _mm256_min_ps(a, b); }
inline Vec abs(Vec a) {
  return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
}
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec fnmadd(Vec a, Vec b, Vec c) { return _mm256_fnmadd_ps(a, b, c); }
inline Vec within(Mask m, Vec a) { return _mm256_and_ps(_mm256_castsi256_ps(m.bits), a); }
inline Vec select(Mask m, Vec a, Vec b) {  // a in m, else b
  return _mm256_blendv_ps(b, a, _mm256_castsi256_ps(m.bits));
}
inline float sum(Vec a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float largest(Vec a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
inline float smallest(Vec a) {
  __m128 s = _mm_min_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_min_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_min_ss(s, _mm_movehdup_ps(s)));
}
inline bool any_nan(Vec a) { return _mm256_movemask_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q)) != 0; }
inline Mask greater(Vec a, Vec b) {  // a > b: the lanes' bits (for within and select)
  return {_mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_GT_OQ)), 8};
}
inline unsigned greater_lanes(Vec a, Vec b) {  // bit j: lane j of a > lane j of b
  return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ)));
}
inline unsigned equal_lanes(Vec a, Vec b) {  // bit j: lane j of a == lane j of b
  return static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)));
}
inline Vec round_even(Vec a) {
  return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
// p 2^n for integral |n| <= 128: 2^n as two factors, each a normal number built from its
// exponent bits (scalef's job on AVX-512).
inline Vec times_pow2(Vec p, Vec n) {
  const Vec half = _mm256_floor_ps(_mm256_mul_ps(n, _mm256_set1_ps(0.5f)));
  const auto pow2 = [](Vec e) {
    const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(e), _mm256_set1_epi32(127));
    return _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23));
  };
  return _mm256_mul_ps(_mm256_mul_ps(p, pow2(half)), pow2(_mm256_sub_ps(n, half)));
}

inline Vec widen_bf16(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline Vec widen_int8(__m128i q) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)); }

inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline Vec load(const at::BFloat16* p) {
  return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline Vec load(const int8_t* p) {  // vpmovsxbd straight from memory
  return widen_int8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline Vec load(const float* p, Mask m) {
  return m.count == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m.bits);
}
inline Vec load(const at::BFloat16* p, Mask m) {
  if (m.count == 8) return load(p);
  __m128i h = _mm_setzero_si128();
  std::memcpy(&h, p, 2 * m.count);
  return widen_bf16(h);
}
inline Vec load(const int8_t* p, Mask m) {
  if (m.count == 8) return load(p);
  __m128i q = _mm_setzero_si128();
  std::memcpy(&q, p, m.count);
  return widen_int8(q);
}

inline void store(float* p, Vec v, Mask m) {
  if (m.count == 8) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, m.bits, v);
  }
}
inline void store(at::BFloat16* p, Vec v, Mask m) {  // v already holds bf16 values
  const __m256i high = _mm256_srli_epi32(_mm256_castps_si256(v), 16);  // 0..0xFFFF: packs exactly
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(high, high), 0x08);
  const __m128i h = _mm256_castsi256_si128(packed);
  if (m.count == 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
  } else {
    std::memcpy(p, &h, 2 * m.count);
  }
}
inline void store_int8(int8_t* q, Vec v, Mask m) {
  const __m256i n = _mm256_cvtps_epi32(v);  // the default rounding: nearest, ties to even
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(n, n), n);  // saturating
  // Each 128-bit half now starts with its four numbers.
  const __m128i both = _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes),
                                          _mm256_extracti128_si256(bytes, 1));
  if (m.count == 8) {  // one 8-byte store: a memcpy of a variable count is a call into libc
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q), both);
  } else {
    std::memcpy(q, &both, m.count);
  }
}

inline Vec round_bf16(Vec v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i up = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
  return _mm256_castsi256_ps(_mm256_and_si256(up, _mm256_set1_epi32(int32_t(0xFFFF0000u))));
}

}  // namespace gpt1::simd
#endif

#if defined(GPT1_SIMD)
namespace gpt1::simd {

// e^x: x = n ln2 + r with |r| <= ln2 / 2, e^r by its Taylor polynomial to r^6 (relative error
// below 2e-7), times 2^n. Inputs are clamped to +-88 (e^88 is near fp32's largest).
inline Vec exponential(Vec x) {
  x = simd::max(simd::min(x, simd::set1(88.0f)), simd::set1(-88.0f));
  const Vec n = simd::round_even(simd::mul(x, simd::set1(1.44269504088896341f)));
  Vec r = simd::fnmadd(n, simd::set1(0.693359375f), x);  // ln2 in two parts: exact
  r = simd::fnmadd(n, simd::set1(-2.12194440e-4f), r);   // n * ln2 for |n| < 128
  Vec p = simd::set1(1.0f / 720.0f);
  for (const float c : {1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f})
    p = simd::fmadd(p, r, simd::set1(c));
  return simd::times_pow2(p, n);
}

}  // namespace gpt1::simd
#endif
