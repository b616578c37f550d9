// How fast one core can stream int8 weights through a one-row product, against a plain read of
// the same memory: the ceiling a batch-1 int8 decoding step works under. Built and run by
// `benchmarks/read_ceiling.py` (which documents the cases); AVX-512 only.
//
// Usage: read_ceiling MIB K ROUNDS. Prints one line per case: its name and the median of its
// ROUNDS rates in bytes/s, the cases taking turns within each round.
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// `bytes` on 2 MiB boundaries, advised for transparent huge pages (as gpt1 stores the weights
// a step streams), written once so every page exists before anything is timed.
void* huge_pages(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  void* p = std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge);
  if (!p) {
    std::fprintf(stderr, "read_ceiling: cannot allocate %zu bytes\n", bytes);
    std::exit(2);
  }
  madvise(p, bytes, MADV_HUGEPAGE);
  std::memset(p, 1, bytes);
  return p;
}

volatile float g_sink;  // results the compiler must not drop

// A plain read: fp32 numbers summed in four chains, no fetching ahead (the hardware's
// prefetchers only), or each cache line fetched `ahead` bytes early into L2.
float plain_read(const float* x, size_t n, size_t ahead) {
  __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
  const char* bytes = reinterpret_cast<const char*>(x);
  for (size_t i = 0; i < n; i += 64) {
    if (ahead) _mm_prefetch(bytes + i * 4 + ahead, _MM_HINT_T1);
    a = _mm512_add_ps(a, _mm512_loadu_ps(x + i));
    b = _mm512_add_ps(b, _mm512_loadu_ps(x + i + 16));
    c = _mm512_add_ps(c, _mm512_loadu_ps(x + i + 32));
    d = _mm512_add_ps(d, _mm512_loadu_ps(x + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
}

// 16 int8 weights widened to fp32.
inline __m512 widen(const int8_t* w) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
}

// One row x [K] through w [N, K] (row-major) as gpt1's kernel reads it: four output channels
// side by side, each widened to fp32 and multiplied in fp32, the block's bytes fetched `ahead`
// bytes early into L2 as one stream (0: none).
void product_side_by_side(const int8_t* w, const float* x, float* y, size_t N, size_t K,
                          size_t ahead) {
  for (size_t n = 0; n + 4 <= N; n += 4) {
    const int8_t* rows = w + n * K;
    const char* stream = reinterpret_cast<const char*>(rows) + ahead;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    for (size_t k = 0; k < K; k += 16, stream += 64) {
      if (ahead) _mm_prefetch(stream, _MM_HINT_T1);
      const __m512 xv = _mm512_loadu_ps(x + k);
      for (int r = 0; r < 4; ++r) acc[r] = _mm512_fmadd_ps(widen(rows + r * K + k), xv, acc[r]);
    }
    for (int r = 0; r < 4; ++r) y[n + r] = _mm512_reduce_add_ps(acc[r]);
  }
}

// The same arithmetic, in the same order, with the weights stored in the order it reads them
// (each block of four channels as 16-byte pieces taken in turn): one forward stream, which the
// hardware's prefetchers follow. A layout gpt1 does not use (its int8 weights are row-major,
// shared with the other products); this is the best int8 loop found on the CPUs measured.
void product_in_reading_order(const int8_t* w, const float* x, float* y, size_t N, size_t K) {
  const int8_t* p = w;
  for (size_t n = 0; n + 4 <= N; n += 4) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    for (size_t k = 0; k < K; k += 16, p += 64) {
      const __m512 xv = _mm512_loadu_ps(x + k);
      for (int r = 0; r < 4; ++r) acc[r] = _mm512_fmadd_ps(widen(p + 16 * r), xv, acc[r]);
    }
    for (int r = 0; r < 4; ++r) y[n + r] = _mm512_reduce_add_ps(acc[r]);
  }
}

#if defined(__AVX512VNNI__)
// Least arithmetic per byte: the row as three planes of unsigned bytes (a 24-bit fixed-point
// activation) against the weights as they are, `vpdpbusd` (64 products an instruction, nothing
// widened), one channel at a time: one forward stream.
void integer_dot_one_channel(const int8_t* w, const uint8_t* planes, int32_t* y, size_t N,
                             size_t K) {
  for (size_t n = 0; n < N; ++n) {
    const int8_t* row = w + n * K;
    __m512i a = _mm512_setzero_si512(), b = a, c = a;
    for (size_t k = 0; k < K; k += 64) {
      const __m512i wv = _mm512_loadu_si512(row + k);
      a = _mm512_dpbusd_epi32(a, _mm512_loadu_si512(planes + k), wv);
      b = _mm512_dpbusd_epi32(b, _mm512_loadu_si512(planes + K + k), wv);
      c = _mm512_dpbusd_epi32(c, _mm512_loadu_si512(planes + 2 * K + k), wv);
    }
    y[n] = _mm512_reduce_add_epi32(a) + (_mm512_reduce_add_epi32(b) << 8) +
           (_mm512_reduce_add_epi32(c) << 16);
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: read_ceiling MIB K ROUNDS\n");
    return 2;
  }
  const size_t mib = std::strtoull(argv[1], nullptr, 10);
  const size_t K = std::strtoull(argv[2], nullptr, 10);
  const int rounds = std::atoi(argv[3]);
  if (mib < 16 || mib > 4096 || K < 64 || K % 64 || rounds < 1 || rounds > 1000) {
    std::fprintf(stderr, "read_ceiling: MIB 16..4096, K a multiple of 64, ROUNDS 1..1000\n");
    return 2;
  }
  const size_t read_bytes = mib << 20;
  const size_t N = (read_bytes / 4) / K / 4 * 4;  // int8 weights: a quarter of the read's bytes
  const size_t weight_bytes = N * K;
  auto* plain = static_cast<float*>(huge_pages(read_bytes));
  auto* w = static_cast<int8_t*>(huge_pages(weight_bytes));
  std::vector<float> x(K, 0.5f), y(N);
  std::vector<uint8_t> planes(3 * K, 1);
  std::vector<int32_t> yi(N);

  struct Case {
    std::string name;
    size_t bytes;
    std::function<void()> run;
    std::vector<double> rates;
  };
  std::vector<Case> cases = {
      {"plain read", read_bytes, [&] { g_sink = plain_read(plain, read_bytes / 4, 0); }, {}},
      {"plain read, fetched 1 KB ahead", read_bytes,
       [&] { g_sink = plain_read(plain, read_bytes / 4, 1024); }, {}},
      {"int8 product, side by side, 32 KB ahead (gpt1)", weight_bytes,
       [&] { product_side_by_side(w, x.data(), y.data(), N, K, 32768); }, {}},
      {"int8 product, side by side, not fetched", weight_bytes,
       [&] { product_side_by_side(w, x.data(), y.data(), N, K, 0); }, {}},
      {"int8 product, in reading order", weight_bytes,
       [&] { product_in_reading_order(w, x.data(), y.data(), N, K); }, {}},
#if defined(__AVX512VNNI__)
      {"int8 integer dot, one channel at a time", weight_bytes,
       [&] { integer_dot_one_channel(w, planes.data(), yi.data(), N, K); }, {}},
#endif
  };
  for (auto& c : cases) c.run();  // warm: code, pages and the first miss of each
  for (int round = 0; round < rounds; ++round) {
    for (auto& c : cases) {
      const double start = seconds();
      c.run();
      c.rates.push_back(c.bytes / (seconds() - start));
    }
  }
  for (auto& c : cases) {
    std::sort(c.rates.begin(), c.rates.end());
    std::printf("%s\t%.6g\n", c.name.c_str(), c.rates[c.rates.size() / 2]);
  }
  return 0;
}
