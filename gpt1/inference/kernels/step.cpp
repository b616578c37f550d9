// One decoding step through every block of GPT-1 in one call: R rows (one new token each of R
// sequences), each attending over its own key/value cache.
//
// Written out in torch operators, a step of the 117M model is about 150 small operators and
// the Python between them, 2.7-4 ms a token: as long as reading all of a step's int8 weights.
// Here the same maths runs in C++ on plain float arrays: the weight products are the kernel of
// `matvec.cpp`, and LayerNorm, attention over the cache and GELU are short vector loops over a
// few thousand numbers. The block is GPT-1's post-LN block (`gpt1/model/gpt.py`):
//
//   qkv = x Wqkv + b;  a = attention(qkv, cache) Wo + b;  x = LN1(x + a)
//   m = act(x Wfc + b) Wmp + b;  x = LN2(x + m)
//
// With bf16 activations every intermediate is rounded to bf16 where the torch operators would
// round it (each operator's output), so both paths compute the same numbers up to the order of
// summation; everything is computed in fp32. Written once over the vectors of `lanes.h` (AVX-512
// or AVX2 with FMA); compiled for no other CPU (`has_decode_step`): there decoding runs the torch
// operators.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "lanes.h"
#include "products.h"

#if defined(GPT1_SIMD)

namespace {

// ------------------------------------------------------------------ a vector at a time
namespace simd = gpt1::simd;
using simd::lanes;
using simd::load;
using simd::Mask;
using simd::round_bf16;
using simd::store;
using simd::Vec;
constexpr int64_t kLanes = simd::kLanes;

using simd::exponential;

// Rounds x [n] to bf16 in place where the activations are bf16.
void round_all(float* x, int64_t n, bool bf16) {
  if (!bf16) return;
  for (int64_t i = 0; i < n; i += kLanes) {
    const Mask m = lanes(i, n);
    store(x + i, round_bf16(load(x + i, m)), m);
  }
}

// ------------------------------------------------------------------ the position-wise parts
// x = LayerNorm(x + a) over C numbers, fp32 statistics as torch's; the sum x + a is rounded
// first where the activations are bf16 (torch adds in bf16, then normalises).
void add_layer_norm(float* x, const float* a, const float* g, const float* b, int64_t C,
                    float eps, bool bf16) {
  Vec sum = simd::zero();
  for (int64_t i = 0; i < C; i += kLanes) {
    const Mask m = lanes(i, C);
    Vec v = simd::add(load(x + i, m), load(a + i, m));
    if (bf16) v = round_bf16(v);
    store(x + i, v, m);
    sum = simd::add(sum, v);
  }
  const float mean = simd::sum(sum) / static_cast<float>(C);
  const Vec mu = simd::set1(mean);
  Vec sq = simd::zero();
  for (int64_t i = 0; i < C; i += kLanes) {
    const Mask m = lanes(i, C);
    const Vec d = simd::within(m, simd::sub(load(x + i, m), mu));
    sq = simd::fmadd(d, d, sq);
  }
  const float inv = 1.0f / std::sqrt(simd::sum(sq) / static_cast<float>(C) + eps);
  const Vec s = simd::set1(inv);
  for (int64_t i = 0; i < C; i += kLanes) {
    const Mask m = lanes(i, C);
    const Vec d = simd::mul(simd::sub(load(x + i, m), mu), s);
    const Vec y = simd::fmadd(d, load(g + i, m), load(b + i, m));
    store(x + i, bf16 ? round_bf16(y) : y, m);
  }
}

// GELU (tanh approximation) or ReLU in place: 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)),
// u = sqrt(2 / pi) (x + 0.044715 x^3).
void activation(float* h, int64_t n, bool gelu, bool bf16) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const Mask m = lanes(i, n);
    const Vec x = load(h + i, m);
    Vec y;
    if (gelu) {
      const Vec x3 = simd::mul(simd::mul(x, x), x);
      const Vec u = simd::mul(simd::set1(0.7978845608028654f),
                              simd::fmadd(simd::set1(0.044715f), x3, x));
      const Vec e = exponential(simd::mul(u, simd::set1(-2.0f)));
      y = simd::div(x, simd::add(simd::set1(1.0f), e));
    } else {
      y = simd::max(x, simd::zero());
    }
    store(h + i, bf16 ? round_bf16(y) : y, m);
  }
}

// `row(r)` for r in [0, R), rows of `numbers` each: split across threads where the step has
// enough rows (the many-row int8 step; on one core of a Zen 3, LayerNorm and GELU were about a
// twentieth of a 64-row step, done on one thread while the other waited).
template <typename Row>
void each_row(int64_t R, int64_t numbers, const Row& row) {
  gpt1::rows_in_parallel(R, numbers, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) row(r);
    return true;
  });
}

// ------------------------------------------------------------------ attention over a cache
// Each step reads every cached key and value from memory (the weights streamed since the last
// step have pushed them out of the caches), so the loops are written for the reads: the scores
// of four positions at a time (four independent sums), the keys and values fetched
// `kCacheAheadBytes` ahead, and the values read once, row by row. Each number is still summed
// in the order of the plain loops (a position's dot product over D, then a lane's sum over the
// positions in order), so the results are the same bits. Measured on an AVX-512 server core
// (Zen 4), one thread, 12 layers x 12 heads: 1.3-1.45x the plain loops at 64-400 positions.
constexpr int64_t kCacheAheadBytes = 2048;

// Fetches bytes [from, to) of `rows` into L2, a cache line at a time.
template <typename T>
inline void fetch(const T* rows, int64_t from, int64_t to) {
  const char* p = reinterpret_cast<const char*>(rows);
  for (int64_t b = from; b < to; b += 64) _mm_prefetch(p + b, _MM_HINT_T1);
}

// One position's score: dot(q, key) over D, one vector of sums, as each of the four-at-a-time
// sums is formed.
template <typename T>
inline float score(const float* q, const T* key, int64_t D) {
  Vec acc = simd::zero();
  for (int64_t d = 0; d < D; d += kLanes) {
    const Mask m = lanes(d, D);
    acc = simd::fmadd(load(q + d, m), load(key + d, m), acc);
  }
  return simd::sum(acc);
}

// ------------------------------------------------------------------ an int8 cache
// A cache row of an int8 cache (`SlotPool`'s dtype int8: `gpt1/inference/decoding.py`,
// `quantize_cache_rows`) is one head's D numbers of one position as int8, then two floats: the
// row holds x ~ q scale + bias, 255 steps of scale = (max - min) / 255 from the row's smallest
// number to its largest, on a grid holding 0 (bias = (128 - zero) scale). Nearly half the bytes
// of bf16 (D + 8 where bf16 takes 2 D), and a step of many sequences reads every cached key and
// value at the memory's rate.
constexpr int64_t kInt8RowExtra = 2 * int64_t(sizeof(float));

// A row's scale and bias (copied: a row of a width off 4 bytes leaves them unaligned).
struct RowScale {
  float scale, bias;
};
inline RowScale row_scale(const int8_t* row, int64_t D) {
  RowScale s;
  std::memcpy(&s, row + D, sizeof s);
  return s;
}
inline void set_row_scale(int8_t* row, int64_t D, RowScale s) {
  std::memcpy(row + D, &s, sizeof s);
}

// Writes x [D] as an int8 cache row, the bytes `quantize_cache_rows_reference` writes (the
// same operations in fp32, each rounded once; ties to even). A row holding an inf or a NaN gets
// a NaN scale, so what reads it is NaN too (generation then refuses the logits) rather than
// quietly finite.
inline void quantize_row(const float* x, int64_t D, int8_t* row) {
  Vec lo = simd::set1(INFINITY), hi = simd::set1(-INFINITY), spread = simd::zero();
  for (int64_t d = 0; d < D; d += kLanes) {
    const Mask m = lanes(d, D);
    const Vec v = load(x + d, m);
    const Vec kept = simd::select(m, v, simd::set1(x[0]));  // a short step's other lanes: x[0]
    lo = simd::min(lo, kept);
    hi = simd::max(hi, kept);
    spread = simd::add(spread, simd::sub(v, v));  // 0 while finite; NaN from then on
  }
  const float low = simd::smallest(lo), scale = (simd::largest(hi) - low) / 255.0f;
  const bool finite = !simd::any_nan(spread);
  // A spread below 255 times the least normal float (or none): every number is stored as the
  // row's smallest, exactly (1 / scale would overflow).
  const bool normal = scale >= FLT_MIN;
  const float inv = normal ? 1.0f / scale : 0.0f;
  const float zero = std::nearbyint(-low * inv);  // the step 0 falls on; ties to even
  for (int64_t d = 0; d < D; d += kLanes) {
    const Mask m = lanes(d, D);
    Vec steps = simd::add(simd::round_even(simd::mul(load(x + d, m), simd::set1(inv))),
                          simd::set1(zero));
    steps = simd::min(simd::max(steps, simd::zero()), simd::set1(255.0f));
    simd::store_int8(row + d, simd::sub(steps, simd::set1(128.0f)), m);
  }
  const float bias = normal ? (128.0f - zero) * scale : low;  // one rounding, as torch's
  set_row_scale(row, D, {finite ? (normal ? scale : 0.0f) : NAN, bias});
}

// One head of one row: out = softmax(q K^T / sqrt(D)) V over positions 0..len of the cache
// (`keys`, `values`: that head's [capacity, D] rows), the row's own new key and value already
// written at position `len`. `kD`: the head's width D where it is known when compiling (0: it
// is `head_dim`); see `attend`. Over int8 rows (D + 8 bytes apart, `RowScale`) a score is
// dot(q, k8) scale + sum(q) bias, and the output sum_p (w_p scale_p) v8_p + sum_p w_p bias_p
// (`weights` holds the w_p scale_p), so each row's int8 numbers are widened once and never
// scaled number by number.
template <typename T, int64_t kD>
void attend_head(const float* q, const T* keys, const T* values, int64_t len, int64_t head_dim,
                 float* scores, float* weights, float* out, bool bf16) {
  constexpr bool kInt8 = std::is_same_v<T, int8_t>;
  const int64_t D = kD > 0 ? kD : head_dim, W = kInt8 ? D + kInt8RowExtra : D;
  const int64_t n = len + 1, row_bytes = W * int64_t(sizeof(T));
  const int64_t bytes = n * row_bytes;  // nothing past the positions held is fetched
  fetch(keys, 0, std::min(kCacheAheadBytes, bytes));
  fetch(values, 0, std::min(kCacheAheadBytes, bytes));
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  float q_sum = 0.0f;  // int8 rows: what each score's bias multiplies
  if constexpr (kInt8) {
    Vec total = simd::zero();
    for (int64_t d = 0; d < D; d += kLanes) total = simd::add(total, load(q + d, lanes(d, D)));
    q_sum = simd::sum(total);
  }
  const auto scored = [&](float dot, const T* key) {
    if constexpr (kInt8) {
      const RowScale s = row_scale(key, D);
      return (dot * s.scale + q_sum * s.bias) * scale;
    } else {
      return dot * scale;
    }
  };
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const int64_t from = j * row_bytes + kCacheAheadBytes;
    const int64_t to = std::min(from + 4 * row_bytes, bytes);
    fetch(keys, from, to);  // the values too: their pass comes next
    fetch(values, from, to);
    Vec acc[4] = {simd::zero(), simd::zero(), simd::zero(), simd::zero()};
    for (int64_t d = 0; d < D; d += kLanes) {
      const Mask m = lanes(d, D);
      const Vec qv = load(q + d, m);
      for (int i = 0; i < 4; ++i)
        acc[i] = simd::fmadd(qv, load(keys + (j + i) * W + d, m), acc[i]);
    }
    for (int i = 0; i < 4; ++i) scores[j + i] = scored(simd::sum(acc[i]), keys + (j + i) * W);
  }
  for (; j < n; ++j) scores[j] = scored(score(q, keys + j * W, D), keys + j * W);
  float top = -INFINITY;
  for (int64_t i = 0; i < n; ++i) top = std::max(top, scores[i]);
  Vec total = simd::zero();
  for (int64_t i = 0; i < n; i += kLanes) {
    const Mask m = lanes(i, n);
    const Vec e = simd::within(m, exponential(simd::sub(load(scores + i, m), simd::set1(top))));
    store(scores + i, e, m);
    total = simd::add(total, e);
  }
  const float norm = 1.0f / simd::sum(total);
  float shared = 0.0f;  // int8 rows: sum_p w_p bias_p, the part every lane of the output shares
  const float* w = scores;
  if constexpr (kInt8) {
    for (int64_t p = 0; p < n; ++p) {
      const RowScale s = row_scale(values + p * W, D);
      weights[p] = scores[p] * s.scale;
      shared += scores[p] * s.bias;
    }
    w = weights;
  }
  // out = w V, up to kChunk vectors of D at a time, each value row read once.
  constexpr int kChunk = 8;
  for (int64_t d0 = 0; d0 < D; d0 += kChunk * kLanes) {
    const int vectors = static_cast<int>(std::min<int64_t>(kChunk, (D - d0 + kLanes - 1) / kLanes));
    Vec acc[kChunk];
    Mask m[kChunk];
    for (int v = 0; v < vectors; ++v) {
      acc[v] = simd::zero();
      m[v] = lanes(d0 + v * kLanes, D);
    }
    for (int64_t p = 0; p < n; ++p) {
      const Vec s = simd::set1(w[p]);
      const T* row = values + p * W + d0;
      for (int v = 0; v < vectors; ++v)
        acc[v] = simd::fmadd(s, load(row + v * kLanes, m[v]), acc[v]);
    }
    for (int v = 0; v < vectors; ++v) {
      Vec r = acc[v];
      if constexpr (kInt8) r = simd::add(r, simd::set1(shared));
      r = simd::mul(r, simd::set1(norm));
      store(out + d0 + v * kLanes, bf16 ? round_bf16(r) : r, m[v]);
    }
  }
}

// `attend_head` for GPT-1's heads of 64 numbers with that width a constant: the loops over a
// key or value row then unroll into whole vectors and their sums stay in registers. The same
// operations in the same order, so the same bits as for a width known only when running. With
// the fetching ahead stopped at the positions a head holds (not run on into the buffer's unused
// room), a GPT-1 step of 8 / 16 / 64 int8 sequences over 64 cached positions ran 1.03 / 1.02 /
// 1.07x as fast as the loops for any width, and 64 over 200 positions 1.05x, the same bits
// (paired in one process, one thread, the AMX Xeon, 2026-12-06).
template <typename T>
void attend(const float* q, const T* keys, const T* values, int64_t len, int64_t D,
            float* scores, float* weights, float* out, bool bf16) {
  if (D == 64) {
    attend_head<T, 64>(q, keys, values, len, D, scores, weights, out, bf16);
  } else {
    attend_head<T, 0>(q, keys, values, len, D, scores, weights, out, bf16);
  }
}

// ------------------------------------------------------------------ one block's tensors
struct Linear {
  const torch::Tensor* w = nullptr;
  const float* scale = nullptr;
  const float* bias = nullptr;
  std::vector<float> scale_buf, bias_buf;

  Linear(const torch::Tensor& weight, const torch::Tensor& s, const torch::Tensor& b, int64_t in,
         const char* what) {
    TORCH_CHECK(weight.dim() == 2 && weight.size(1) == in && weight.is_contiguous() &&
                    weight.device().is_cpu(),
                what, " weight must be [out, ", in, "], contiguous, on the CPU");
    const auto type = weight.scalar_type();
    TORCH_CHECK(type == at::kChar || type == at::kBFloat16 || type == at::kFloat, what,
                " weight must be int8, bf16 or fp32");
    w = &weight;
    scale = gpt1::float_values(s, weight.size(0), scale_buf, what, "scale");
    bias = gpt1::float_values(b, weight.size(0), bias_buf, what, "bias");
    TORCH_CHECK(scale || type != at::kChar, what, " int8 weight needs scales");
  }

  // The int8 product of many rows (`int8_rows.cpp`), where the step was given this layer's
  // packed copy.
  gpt1::Int8Packed rows_int8;

  // y [M, out] = x [M, in] through this layer, rounded to bf16 where the activations are: the
  // int8 product of many rows where the layer has one (a row holding an inf or a NaN sends
  // the product to the kernel below, which keeps them), else the few-row kernel, up to 8 rows
  // a call.
  void apply(int64_t M, const float* x, std::vector<at::BFloat16>& x16, float* y,
             bool bf16) const {
    if (!(rows_int8.packed || rows_int8.vnni) ||
        !gpt1::int8_rows_product(M, x, rows_int8, bias, y)) {
      const int64_t in = w->size(1), out = w->size(0);
      for (int64_t lo = 0; lo < M; lo += 8) {
        const int64_t rows = std::min<int64_t>(8, M - lo);
        few_rows(rows, x + lo * in, x16, y + lo * out, bf16);
      }
    }
    round_all(y, M * w->size(0), bf16);
  }

 private:
  void few_rows(int64_t M, const float* x, std::vector<at::BFloat16>& x16, float* y,
                bool bf16) const {
    const at::BFloat16* pairs = nullptr;
    if (bf16 && w->scalar_type() == at::kBFloat16 && !scale) {  // bf16 x bf16: the pairs as they are
      const int64_t n = M * w->size(1);
      x16.resize(n);
      for (int64_t i = 0; i < n; i += kLanes) {  // exact: x holds bf16 values already
        const Mask m = lanes(i, n);
        store(x16.data() + i, load(x + i, m), m);
      }
      pairs = x16.data();
    }
    gpt1::weight_product(M, x, pairs, *w, scale, bias, y);
  }
};

template <typename T>
void attention_rows(int64_t R, int64_t H, int64_t D, const float* qkv, float* out,
                    const torch::Tensor* keys, const torch::Tensor* values,
                    const std::vector<int64_t>& rows, const std::vector<int64_t>& lengths,
                    bool bf16) {
  constexpr bool kInt8 = std::is_same_v<T, int8_t>;
  const int64_t C = H * D, W = kInt8 ? D + kInt8RowExtra : D;  // a cache row's numbers
  int64_t longest = 0;
  for (int64_t r = 0; r < R; ++r) longest = std::max(longest, lengths[r] + 1);
  // Each row's head 0 in its buffers, asked once: `data_ptr<T>` checks the dtype and storage
  // on every call, and 64 rows x 12 heads asked it twice a head.
  std::vector<T*> row_keys(R), row_values(R);
  std::vector<int64_t> capacity(R);
  for (int64_t r = 0; r < R; ++r) {
    capacity[r] = keys[r].size(2);
    row_keys[r] = keys[r].data_ptr<T>() + rows[r] * H * capacity[r] * W;
    row_values[r] = values[r].data_ptr<T>() + rows[r] * H * capacity[r] * W;
  }
  const auto head_offset = [&](int64_t r, int64_t h) { return h * capacity[r] * W; };
  // Every row's new key and value are written before any row attends: rows may share a cache
  // (one sequence's consecutive positions, as a verifying pass of drafted tokens has them),
  // and a row then attends to the positions of the rows before it.
  // A bf16 cache under fp32 activations stores them rounded to nearest even, as torch's
  // conversion writes a prompt's (rounding bf16 activations again changes nothing); an int8
  // cache, as `quantize_row`.
  const auto kept = [](Vec v) { return std::is_same_v<T, float> ? v : round_bf16(v); };
  for (int64_t r = 0; r < R; ++r) {
    const float* row = qkv + r * 3 * C;
    for (int64_t h = 0; h < H; ++h) {
      T* k = row_keys[r] + head_offset(r, h) + lengths[r] * W;
      T* v = row_values[r] + head_offset(r, h) + lengths[r] * W;
      if constexpr (kInt8) {
        quantize_row(row + C + h * D, D, k);
        quantize_row(row + 2 * C + h * D, D, v);
      } else {
        for (int64_t d = 0; d < D; d += kLanes) {
          const Mask m = lanes(d, D);
          store(k + d, kept(load(row + C + h * D + d, m)), m);
          store(v + d, kept(load(row + 2 * C + h * D + d, m)), m);
        }
      }
    }
  }
  // A task's work is about 4 D numbers per cached position; small steps stay on one thread.
  const int64_t grain = std::max<int64_t>(1, 16384 / (4 * D * longest));
  at::parallel_for(0, R * H, grain, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(longest), weights(kInt8 ? longest : 0);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = t / H, h = t % H, offset = head_offset(r, h);
      const float* q = qkv + r * 3 * C + h * D;
      float* y = out + r * C + h * D;
      attend<T>(q, row_keys[r] + offset, row_values[r] + offset, lengths[r], D, scores.data(),
                weights.data(), y, bf16);
    }
  });
}

}  // namespace

bool has_decode_step() { return true; }

// GELU (tanh form) of fp32 x as the decoding step computes it (`activation`), for the rows an
// int8 model with fp32 activations reads outside the step (prompts, classification batches):
// their GELU is then the step's, and torch's vectorised tanh took about a tenth of a 2048-row
// prompt's time on a Zen 3 core.
torch::Tensor gelu_fp32(const torch::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "gelu_fp32: x must be fp32, on the CPU");
  const torch::Tensor xc = x.contiguous();
  torch::Tensor out = torch::empty_like(xc);
  const float* from = xc.data_ptr<float>();
  float* to = out.data_ptr<float>();
  const int64_t n = xc.numel();
  constexpr int64_t kPiece = 4096;  // numbers a piece: whole vectors, in L1 while they are done
  gpt1::rows_in_parallel((n + kPiece - 1) / kPiece, kPiece, [&](int64_t lo, int64_t hi) {
    const int64_t begin = lo * kPiece, end = std::min(n, hi * kPiece);
    std::copy(from + begin, from + end, to + begin);
    activation(to + begin, end - begin, true, false);
    return true;
  });
  return out;
}

// x [..., D] (fp32 or bf16) as the rows of an int8 cache: [..., D + 8] int8 (`quantize_row`),
// for the keys and values of prompts, written outside the step (`decoding.quantize_cache_rows`).
// One layer's keys of a burst of 64 prompts of 32 tokens at GPT-1's size took 0.95 ms here and
// 21.7 in torch's operators (`quantize_cache_rows_reference`; one thread, medians of 21,
// 2026-12-07, the Zen 3 EPYC): a whole burst's keys and values, 23 ms against 0.52 s.
torch::Tensor quantize_cache_rows(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) >= 1 && x.device().is_cpu() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "quantize_cache_rows: x must be [..., D], fp32 or bf16, on the CPU");
  const torch::Tensor xc = x.to(at::kFloat).contiguous();
  const int64_t D = xc.size(-1), n = xc.numel() / D, W = D + kInt8RowExtra;
  std::vector<int64_t> shape(xc.sizes().begin(), xc.sizes().end());
  shape.back() = W;
  torch::Tensor out = torch::empty(shape, xc.options().dtype(at::kChar));
  const float* from = xc.data_ptr<float>();
  int8_t* to = out.data_ptr<int8_t>();
  gpt1::rows_in_parallel(n, D, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) quantize_row(from + r * D, D, to + r * W);
    return true;
  });
  return out;
}

// x [R, C] (fp32 or bf16, 1 <= R <= 8): the embedded new tokens. params: 16 tensors per block
// (ln_1 weight, bias, ln_2 weight, bias, then for c_attn, attn.c_proj, c_fc and mlp.c_proj
// each: weight, scale, bias; an empty tensor where a layer has no scale or bias). keys and
// values: per block, per row, that row's cache buffer [B, H, capacity, D] in x's dtype (or all
// in bf16, or all int8 rows of D + 8 bytes: `quantize_row`); rows[r] is the row's index in its
// buffer and lengths[r] the positions it holds (the new token goes at lengths[r]); rows of one
// sequence share its buffer row with consecutive lengths, each attending to the ones before
// it. Returns the last block's output [R, C] in x's
// dtype; the caches hold the new tokens' keys and values (the caller advances their lengths).
torch::Tensor decode_step(const torch::Tensor& x, const std::vector<torch::Tensor>& params,
                          const std::vector<torch::Tensor>& keys,
                          const std::vector<torch::Tensor>& values,
                          const std::vector<int64_t>& rows, const std::vector<int64_t>& lengths,
                          int64_t n_head, double eps, bool gelu,
                          const std::vector<torch::Tensor>& packed, bool u8) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu(), "decode_step: x must be [rows, n_embd]");
  const int64_t R = x.size(0), C = x.size(1), H = n_head, D = C / H;
  const int64_t L = static_cast<int64_t>(params.size()) / 16;
  const bool integer = !packed.empty();
  TORCH_CHECK(R >= 1 && (integer || R <= 8) && H >= 1 && C % H == 0,
              "decode_step: 1 to 8 rows (any number with packed int8 weights), C % H == 0");
  TORCH_CHECK(params.size() == size_t(16 * L) && L >= 1, "decode_step: 16 tensors per block");
  TORCH_CHECK(!integer || packed.size() == size_t(12 * L),
              "decode_step: per int8 layer its packed weight, zero points and few-row copy");
  TORCH_CHECK(keys.size() == size_t(L * R) && values.size() == keys.size() &&
                  rows.size() == size_t(R) && lengths.size() == size_t(R),
              "decode_step: a cache per block and row");
  const auto type = x.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kBFloat16, "decode_step: x must be fp32 or bf16");
  const bool bf16 = type == at::kBFloat16;
  // The caches hold x's dtype, or bf16 under fp32 x (`SlotPool`'s dtype): attention widens
  // what it reads either way.
  const auto cached = keys.empty() ? type : keys[0].scalar_type();
  TORCH_CHECK(cached == type || cached == at::kBFloat16 || cached == at::kChar,
              "decode_step: the caches must hold x's dtype, bf16 or int8");
  const int64_t width = cached == at::kChar ? D + kInt8RowExtra : D;  // int8: scale and bias too
  for (size_t i = 0; i < keys.size(); ++i) {
    const int64_t r = static_cast<int64_t>(i) % R;
    for (const torch::Tensor* t : {&keys[i], &values[i]}) {
      TORCH_CHECK(t->dim() == 4 && t->size(1) == H && t->size(3) == width &&
                      t->is_contiguous() && t->scalar_type() == cached && t->device().is_cpu(),
                  "decode_step: a cache must be [B, H, capacity, D] (int8: D + 8 bytes a row), "
                  "contiguous, all of one dtype: x's, bf16 or int8");
      TORCH_CHECK(rows[r] >= 0 && rows[r] < t->size(0) && lengths[r] >= 0 &&
                      lengths[r] < t->size(2),
                  "decode_step: a cache has no room for the new position");
    }
  }
  std::vector<float> h(R * C), qkv, att(R * C), a(R * C), inner;
  std::vector<at::BFloat16> x16;
  // Read and written here rather than with tensor operators (`to`, `copy_`): a step's few
  // operators run with torch's own state pushed out of the CPU's caches by the weights just
  // read, and each cost tens of microseconds there.
  const torch::Tensor xc = x.is_contiguous() ? x : x.contiguous();
  if (bf16) {
    const at::BFloat16* p = xc.data_ptr<at::BFloat16>();
    std::copy(p, p + R * C, h.begin());
  } else {
    std::copy(xc.data_ptr<float>(), xc.data_ptr<float>() + R * C, h.begin());
  }
  std::vector<float> g1, b1, g2, b2;
  for (int64_t l = 0; l < L; ++l) {
    const torch::Tensor* p = params.data() + 16 * l;
    const float* ln1_w = gpt1::float_values(p[0], C, g1, "decode_step:", "ln_1 weight");
    const float* ln1_b = gpt1::float_values(p[1], C, b1, "decode_step:", "ln_1 bias");
    const float* ln2_w = gpt1::float_values(p[2], C, g2, "decode_step:", "ln_2 weight");
    const float* ln2_b = gpt1::float_values(p[3], C, b2, "decode_step:", "ln_2 bias");
    TORCH_CHECK(ln1_w && ln1_b && ln2_w && ln2_b, "decode_step: LayerNorms need weight and bias");
    Linear qkv_layer(p[4], p[5], p[6], C, "decode_step: c_attn");
    Linear out_layer(p[7], p[8], p[9], C, "decode_step: attn.c_proj");
    Linear fc_layer(p[10], p[11], p[12], C, "decode_step: c_fc");
    const int64_t F = fc_layer.w->size(0);
    Linear proj_layer(p[13], p[14], p[15], F, "decode_step: mlp.c_proj");
    if (integer) {
      Linear* layers[4] = {&qkv_layer, &out_layer, &fc_layer, &proj_layer};
      for (int i = 0; i < 4; ++i) {
        Linear& layer = *layers[i];
        TORCH_CHECK(layer.w->scalar_type() == at::kChar, "decode_step: packed weights are int8");
        const torch::Tensor* s_tensor = &p[5 + 3 * i];
        const torch::Tensor* mine = &packed[12 * l + 3 * i];
        const auto given = [](const torch::Tensor& t) { return t.defined() && t.numel() > 0; };
        const torch::Tensor* vnni = given(mine[2]) ? &mine[2] : nullptr;
        const torch::Tensor* onednn = given(mine[0]) ? &mine[0] : nullptr;
        TORCH_CHECK(vnni || onednn, "decode_step: an int8 layer without a packed copy");
        layer.rows_int8 = {onednn, &mine[1], s_tensor, vnni, layer.w->size(0), layer.w->size(1),
                           u8};
      }
    }
    TORCH_CHECK(qkv_layer.w->size(0) == 3 * C && out_layer.w->size(0) == C &&
                    proj_layer.w->size(0) == C,
                "decode_step: block shapes");
    qkv.resize(R * 3 * C);
    inner.resize(R * F);
    qkv_layer.apply(R, h.data(), x16, qkv.data(), bf16);
    if (cached == at::kBFloat16) {
      attention_rows<at::BFloat16>(R, H, D, qkv.data(), att.data(), keys.data() + l * R,
                                   values.data() + l * R, rows, lengths, bf16);
    } else if (cached == at::kChar) {
      attention_rows<int8_t>(R, H, D, qkv.data(), att.data(), keys.data() + l * R,
                             values.data() + l * R, rows, lengths, bf16);
    } else {
      attention_rows<float>(R, H, D, qkv.data(), att.data(), keys.data() + l * R,
                            values.data() + l * R, rows, lengths, bf16);
    }
    out_layer.apply(R, att.data(), x16, a.data(), bf16);
    each_row(R, C, [&](int64_t r) {
      add_layer_norm(h.data() + r * C, a.data() + r * C, ln1_w, ln1_b, C, eps, bf16);
    });
    fc_layer.apply(R, h.data(), x16, inner.data(), bf16);
    each_row(R, F, [&](int64_t r) { activation(inner.data() + r * F, F, gelu, bf16); });
    proj_layer.apply(R, inner.data(), x16, a.data(), bf16);
    each_row(R, C, [&](int64_t r) {
      add_layer_norm(h.data() + r * C, a.data() + r * C, ln2_w, ln2_b, C, eps, bf16);
    });
  }
  torch::Tensor out = torch::empty({R, C}, x.options());
  if (bf16) {  // exact: h holds bf16 values
    std::copy(h.begin(), h.end(), out.data_ptr<at::BFloat16>());
  } else {
    std::copy(h.begin(), h.end(), out.data_ptr<float>());
  }
  return out;
}

#else  // neither AVX-512 (F, BW, VL) nor AVX2 with FMA: decoding runs the torch operators

bool has_decode_step() { return false; }

torch::Tensor gelu_fp32(const torch::Tensor&) {
  TORCH_CHECK(false, "gelu_fp32: not compiled for this CPU (it needs AVX-512 or AVX2 with FMA)");
}

torch::Tensor quantize_cache_rows(const torch::Tensor&) {
  TORCH_CHECK(false, "quantize_cache_rows: not compiled for this CPU (it needs AVX-512 or AVX2 "
                     "with FMA)");
}

torch::Tensor decode_step(const torch::Tensor&, const std::vector<torch::Tensor>&,
                          const std::vector<torch::Tensor>&, const std::vector<torch::Tensor>&,
                          const std::vector<int64_t>&, const std::vector<int64_t>&, int64_t,
                          double, bool, const std::vector<torch::Tensor>&, bool) {
  TORCH_CHECK(false, "decode_step: not compiled for this CPU (it needs AVX-512 or AVX2 with FMA)");
}

#endif
