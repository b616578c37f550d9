// The choice of each next token from its row of logits, for every decoder (`gpt1.inference.
// generate`: `gpt1 sample`, the server's batched steps): the greedy choice, each row's first
// largest logit, and a draw from each row's softmax at a temperature, top-k and top-p, the
// kept ids' cumulative sum inverted at one uniform number. A step's logits have just been
// written (40,478 a row for GPT-1) and the weights it read have pushed everything else out of
// the CPU's caches; each row here is a few passes with its state near, where torch's operators
// for the same choice are a pass each with a temporary each (and Python between them).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "lanes.h"
#include "products.h"

// ------------------------------------------------------------------ the greedy choice
// Each row's next token at temperature 0: its first largest logit (as torch.max gives it), and
// whether every logit is finite (generation refuses NaN and infinite logits). One call instead
// of torch's three operators (the extremes that find a non-finite logit, then the arg-maximum).
namespace {

// Whether a row can be chosen from, and its largest logit: every logit finite where
// `finite_only` (a row straight from the model, as the greedy choice and `generate.draw_rows`
// read it), else -inf allowed (ids a caller has filtered out itself) but no NaN or +inf.
template <typename T>
bool row_top(const T* row, int64_t V, bool finite_only, float* top) {
  float largest = -INFINITY;
  bool ok = true;
  int64_t i = 0;
#if defined(GPT1_SIMD)
  namespace simd = gpt1::simd;
  // -inf -> -FLT_MAX where allowed (max returns its second operand, v, where v is NaN), then
  // v - v is NaN exactly where a number is NaN or infinite
  const simd::Vec floor = simd::set1(finite_only ? -INFINITY : -FLT_MAX);
  simd::Vec tops = simd::set1(-INFINITY), spread = simd::zero();
  for (; i + simd::kLanes <= V; i += simd::kLanes) {
    const simd::Vec v = simd::max(floor, simd::load(row + i));
    tops = simd::max(tops, v);
    spread = simd::add(spread, simd::sub(v, v));
  }
  largest = simd::largest(tops);
  ok = !simd::any_nan(spread);
#endif
  for (; i < V; ++i) {
    const float v = static_cast<float>(row[i]);
    ok = ok && !std::isnan(v) && v != INFINITY && (!finite_only || v != -INFINITY);
    largest = std::max(largest, v);
  }
  *top = largest;  // -FLT_MAX where every id was filtered out (then every weight is 0)
  return ok;
}

template <typename T>
bool first_largest(const T* row, int64_t V, int64_t* at) {
  float top;
  const bool finite = row_top(row, V, true, &top);
  if (!finite) return false;
  // Then the first position holding it, a vector at a time: where the largest lies is random,
  // and a number at a time this search took most of the call (half a row on average).
  int64_t i = 0;
#if defined(GPT1_SIMD)
  namespace simd = gpt1::simd;
  const simd::Vec wanted = simd::set1(top);
  for (; i + simd::kLanes <= V; i += simd::kLanes) {
    const unsigned hits = simd::equal_lanes(simd::load(row + i), wanted);
    if (hits != 0) {
      *at = i + __builtin_ctz(hits);
      return true;
    }
  }
#endif
  for (; i < V && static_cast<float>(row[i]) != top; ++i) {
  }
  *at = i;
  return true;
}

}  // namespace

std::tuple<torch::Tensor, bool> greedy_tokens(const torch::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0 && logits.is_contiguous() &&
                  logits.device().is_cpu() &&
                  (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16),
              "greedy_tokens: logits must be [rows, vocab], fp32 or bf16, contiguous, on the CPU");
  const int64_t B = logits.size(0), V = logits.size(1);
  torch::Tensor ids = torch::empty({B, 1}, logits.options().dtype(at::kLong));
  int64_t* out = ids.data_ptr<int64_t>();
  const float* fp32 = logits.scalar_type() == at::kFloat ? logits.data_ptr<float>() : nullptr;
  const at::BFloat16* bf16 = fp32 ? nullptr : logits.data_ptr<at::BFloat16>();
  // Rows split over the threads (a step of 64 sequences reads 64 x 40478 logits here).
  const bool finite = gpt1::rows_in_parallel(B, V, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      if (!(fp32 ? first_largest(fp32 + b * V, V, out + b)
                 : first_largest(bf16 + b * V, V, out + b))) {
        return false;
      }
    }
    return true;
  });
  return {ids, finite};
}

// ------------------------------------------------------------------ a draw at a temperature
// One id from softmax(x / T) over the row's top k logits (all of them where k is 0) and then its
// top-p nucleus (transformers' order), the row's probabilities e_i / sum_j e_j with
// e_i = exp((x_i - max x) / T) (the same distribution as softmax(x / T): the shift cancels, and
// x_i - max x cannot overflow where x / T would at a small T). u in [0, 1) picks the first id
// whose cumulative sum passes u * sum, as `generate.draw` does over torch's softmax: every id
// owns a share of [0, sum) equal to its probability, and an id of probability 0 owns none.
//
// The sums are float64, as `draw`'s are, taken over blocks of `kBlock` numbers and then within
// the one block that holds u * sum (a scan of every number would be one long chain of dependent
// additions). The two orders of adding may round a block's sum apart by about 1e-16 of it; where
// the scan of the block falls short of u * sum by so little, its last id of non-zero probability
// is drawn. A number below e^-88 (a logit more than 88 T under the largest) counts as 0: it is
// under fp32's normal numbers, and its share of a sum of at least 1 (the largest's own e^0)
// is under the 2^-53 steps of u.
namespace {

constexpr int64_t kBlock = 64;

// The k-th largest logit of a row (1 <= k < V): the least of a heap of the k largest seen so
// far. A vector of logits is looked at number by number only where one of them passes that
// least, about k ln(V / k) numbers of a random row, so the pass costs about one comparison a
// vector (torch's topk and the mask of `filter_logits` took about 0.4 ms a row of GPT-1's).
template <typename T>
float kth_largest(const T* row, int64_t V, int64_t k, std::vector<float>& heap) {
  heap.resize(k);
  for (int64_t i = 0; i < k; ++i) heap[i] = static_cast<float>(row[i]);
  const auto least_first = std::greater<float>();
  std::make_heap(heap.begin(), heap.end(), least_first);
  float least = heap.front();
  const auto offer = [&](float v) {
    if (v > least) {
      std::pop_heap(heap.begin(), heap.end(), least_first);
      heap.back() = v;
      std::push_heap(heap.begin(), heap.end(), least_first);
      least = heap.front();
    }
  };
  int64_t i = k;
#if defined(GPT1_SIMD)
  namespace simd = gpt1::simd;
  for (; i + simd::kLanes <= V; i += simd::kLanes) {
    if (simd::greater_lanes(simd::load(row + i), simd::set1(least)) != 0) {
      for (int j = 0; j < simd::kLanes; ++j) offer(static_cast<float>(row[i + j]));
    }
  }
#endif
  for (; i < V; ++i) offer(static_cast<float>(row[i]));
  return least;
}

// e [V] = the row's unnormalised probabilities (0 for a logit under `floor`, top-k's k-th
// largest: every id tied with it stays, as `filter_logits` keeps them).
template <typename T>
void row_weights(const T* row, int64_t V, float top, float temperature, float floor, float* e) {
  int64_t i = 0;
#if defined(GPT1_SIMD)
  namespace simd = gpt1::simd;
  const simd::Vec shift = simd::set1(top), t = simd::set1(temperature);
  const simd::Vec under = simd::set1(-88.0f), kept = simd::set1(floor);
  for (; i + simd::kLanes <= V; i += simd::kLanes) {
    const simd::Vec x = simd::load(row + i);
    const simd::Vec z = simd::div(simd::sub(x, shift), t);
    simd::Vec w = simd::within(simd::greater(z, under), simd::exponential(z));
    w = simd::select(simd::greater(kept, x), simd::zero(), w);
    simd::store(e + i, w, simd::lanes(0, simd::kLanes));
  }
#endif
  for (; i < V; ++i) {
    const float x = static_cast<float>(row[i]), z = (x - top) / temperature;
    e[i] = z > -88.0f && !(x < floor) ? std::exp(z) : 0.0f;
  }
}

// block [ceil(V / kBlock)] = the sums of the weights e [V] by blocks; returns their total.
double block_sums(const float* e, int64_t V, double* block) {
  double total = 0.0;
  for (int64_t b = 0; b * kBlock < V; ++b) {
    const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
    double part[4] = {0.0, 0.0, 0.0, 0.0};  // four independent sums: a vector of float64
    int64_t j = lo;
    for (; j + 4 <= hi; j += 4) {
      for (int k = 0; k < 4; ++k) part[k] += static_cast<double>(e[j + k]);
    }
    for (; j < hi; ++j) part[0] += static_cast<double>(e[j]);
    block[b] = (part[0] + part[1]) + (part[2] + part[3]);
    total += block[b];
  }
  return total;
}

// Top-p: zeroes the weights of e [V] (summing to `total`) that the nucleus drops. Ranked by
// weight, an id stays unless the ids ranked above it already hold `top_p` of the total; the
// likeliest always stays (`generate.nucleus`'s rule; ids of equal weight are ranked by id).
// Ranking the whole row is what costs, and only its head stays: each weight's float32 bits
// (a weight is at most 1, the largest logit's e^0) give it one of `kBuckets` buckets a
// sixteenth of an octave wide, the buckets' masses summed from the top show the one bucket the
// cut falls in, and only that bucket's ids are sorted.
constexpr int kBuckets = 2048;

int bucket_of(float w) {
  uint32_t bits;
  std::memcpy(&bits, &w, sizeof(bits));  // w > 0: larger weights have larger bits
  return static_cast<int>(std::min<uint32_t>(bits >> 19, kBuckets - 1));
}

void keep_nucleus(float* e, int64_t V, double total, double top_p, std::vector<double>& mass,
                  std::vector<std::pair<float, int64_t>>& boundary) {
  const double wanted = top_p * total;
  mass.assign(kBuckets, 0.0);
  for (int64_t i = 0; i < V; ++i) {
    if (e[i] > 0.0f) mass[bucket_of(e[i])] += static_cast<double>(e[i]);
  }
  double above = 0.0;  // the weight of the buckets wholly kept
  int cut = kBuckets - 1;
  for (; cut >= 0; --cut) {  // the cut falls in a bucket holding ids, the likeliest's at least
    if (mass[cut] > 0.0 && above + mass[cut] >= wanted) break;
    above += mass[cut];
  }
  if (cut < 0) return;  // the sums fell short of top_p by a rounding: every id stays
  boundary.clear();
  for (int64_t i = 0; i < V; ++i) {
    if (!(e[i] > 0.0f)) continue;
    const int b = bucket_of(e[i]);
    if (b < cut) {
      e[i] = 0.0f;
    } else if (b == cut) {
      boundary.emplace_back(e[i], i);
    }
  }
  std::sort(boundary.begin(), boundary.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  double ranked = above;  // the weight ranked above the next id
  size_t j = 0;
  for (; j < boundary.size(); ++j) {
    const bool likeliest = j == 0 && above == 0.0;
    if (ranked >= wanted && !likeliest) break;
    ranked += static_cast<double>(boundary[j].first);
  }
  for (; j < boundary.size(); ++j) e[boundary[j].second] = 0.0f;
}

// The id u picks from weights e [V] with block sums `block` summing to `total`.
int64_t inverse_at(const float* e, const double* block, int64_t V, double total, double u) {
  const int64_t blocks = (V + kBlock - 1) / kBlock;
  if (!(total > 0.0)) return -1;  // every id filtered out: nothing to draw
  const double target = u * total;
  double running = 0.0;
  int64_t b = 0;
  for (; b < blocks && running + block[b] <= target; ++b) running += block[b];
  if (b == blocks) b = blocks - 1;  // u * total rounded up to total: the last id that can be
  else {
    const int64_t hi = std::min(V, (b + 1) * kBlock);
    for (int64_t j = b * kBlock; j < hi; ++j) {
      running += static_cast<double>(e[j]);
      if (running > target) return j;
    }
  }
  for (; b >= 0; --b) {  // short by a rounding: the last id of non-zero probability up to here
    for (int64_t j = std::min(V, (b + 1) * kBlock) - 1; j >= b * kBlock; --j) {
      if (e[j] > 0.0f) return j;
    }
  }
  return -1;  // not reached: some weight is positive
}

// What a thread reuses from row to row.
struct Scratch {
  std::vector<float> e;
  std::vector<double> block, mass;
  std::vector<std::pair<float, int64_t>> boundary;
};

template <typename T>
int64_t draw_row(const T* row, int64_t V, float temperature, int64_t top_k, double top_p,
                 double u, bool finite_only, Scratch& s) {
  float top;
  if (!row_top(row, V, finite_only, &top)) return -1;
  const float floor = top_k > 0 && top_k < V ? kth_largest(row, V, top_k, s.e) : -INFINITY;
  s.e.resize(V);
  s.block.resize((V + kBlock - 1) / kBlock);
  row_weights(row, V, top, temperature, floor, s.e.data());
  double total = block_sums(s.e.data(), V, s.block.data());
  if (top_p < 1.0 && total > 0.0) {
    keep_nucleus(s.e.data(), V, total, top_p, s.mass, s.boundary);
    total = block_sums(s.e.data(), V, s.block.data());
  }
  return inverse_at(s.e.data(), s.block.data(), V, total, u);
}

}  // namespace

torch::Tensor draw_tokens(const torch::Tensor& logits, const torch::Tensor& rows,
                          const torch::Tensor& temperatures, const torch::Tensor& top_ks,
                          const torch::Tensor& top_ps, const torch::Tensor& uniforms,
                          int64_t vocab, bool finite_only) {
  TORCH_CHECK(logits.dim() == 2 && logits.device().is_cpu() && logits.stride(1) == 1 &&
                  (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16),
              "draw_tokens: logits must be [n, V], fp32 or bf16, on the CPU, each row contiguous");
  TORCH_CHECK(vocab >= 1 && vocab <= logits.size(1), "draw_tokens: vocab must be in [1, V]");
  const int64_t k = rows.numel();
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.is_contiguous() &&
                  temperatures.dim() == 1 && temperatures.numel() == k &&
                  temperatures.scalar_type() == at::kDouble && temperatures.is_contiguous() &&
                  uniforms.dim() == 1 && uniforms.numel() == k &&
                  uniforms.scalar_type() == at::kDouble && uniforms.is_contiguous() &&
                  top_ks.dim() == 1 && top_ks.numel() == k &&
                  top_ks.scalar_type() == at::kLong && top_ks.is_contiguous() &&
                  top_ps.dim() == 1 && top_ps.numel() == k &&
                  top_ps.scalar_type() == at::kDouble && top_ps.is_contiguous(),
              "draw_tokens: rows and top_ks (int64), temperatures, top_ps and uniforms (float64) "
              "must be [k] each");
  const int64_t* which = rows.data_ptr<int64_t>();
  const double* t = temperatures.data_ptr<double>();
  const double* u = uniforms.data_ptr<double>();
  const int64_t* top_k = top_ks.data_ptr<int64_t>();  // 0: no top-k
  const double* top_p = top_ps.data_ptr<double>();    // 1: no top-p
  for (int64_t r = 0; r < k; ++r) {
    TORCH_CHECK(which[r] >= 0 && which[r] < logits.size(0), "draw_tokens: a row out of range");
    const float temperature = static_cast<float>(t[r]);  // 0 or inf in fp32: torch's path
    TORCH_CHECK(temperature > 0.0f && std::isfinite(temperature),
                "draw_tokens: temperatures must be positive and finite in fp32");
    TORCH_CHECK(u[r] >= 0.0 && u[r] < 1.0, "draw_tokens: uniforms must be in [0, 1)");
    TORCH_CHECK(top_k[r] >= 0, "draw_tokens: top_ks must be >= 0 (0: none)");
    TORCH_CHECK(top_p[r] > 0.0 && top_p[r] <= 1.0, "draw_tokens: top_ps must be in (0, 1]");
  }
  torch::Tensor ids = torch::empty({k}, rows.options());
  int64_t* out = ids.data_ptr<int64_t>();
  const int64_t stride = logits.stride(0);
  const float* fp32 = logits.scalar_type() == at::kFloat ? logits.data_ptr<float>() : nullptr;
  const at::BFloat16* bf16 = fp32 ? nullptr : logits.data_ptr<at::BFloat16>();
  // Rows split over the threads (a step of 64 sampled sequences reads 64 x 40478 logits here).
  gpt1::rows_in_parallel(k, vocab, [&](int64_t lo, int64_t hi) {
    // Kept by each thread from call to call: a row's weights are 160 KB at GPT-1's vocabulary,
    // which malloc would map and unmap (and fault in page by page) on every call.
    thread_local Scratch scratch;
    for (int64_t r = lo; r < hi; ++r) {
      const float temperature = static_cast<float>(t[r]);
      out[r] = fp32 ? draw_row(fp32 + which[r] * stride, vocab, temperature, top_k[r], top_p[r],
                               u[r], finite_only, scratch)
                    : draw_row(bf16 + which[r] * stride, vocab, temperature, top_k[r], top_p[r],
                               u[r], finite_only, scratch);
    }
    return true;
  });
  return ids;
}
