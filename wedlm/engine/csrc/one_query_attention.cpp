// wedlm_cpu::one_query_attention: softmax(scale * q k^T) v for one query per head over all keys
// (no mask), float32: the attention of a batch-1 `ar` step, whose keys are exactly the sequence's
// cached tokens. torch's CPU SDPA runs this through its flash kernel and BLAS calls sized for
// blocks of queries (~30 us a layer over 500 keys for the shipped model on a Zen 4 core).
//
// Each score is a dot product over the head dimension in 16-float vectors and one horizontal sum;
// the exponentials use a degree-6 polynomial (Cephes' expf, ~1 ulp) and the weighted sum of
// values keeps its accumulators in registers. Grouped-query heads: query head h reads KV head
// h / (Hq / Hkv). Results equal SDPA's within float32 rounding.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "heads.h"
#include "simd.h"

#include <vector>

namespace {

using namespace wedlm_heads;
using namespace wedlm_simd;

inline float horizontal_sum(v16 x) {
  x += __builtin_shuffle(x, i16{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
  x += __builtin_shuffle(x, i16{4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3});
  x += __builtin_shuffle(x, i16{2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1});
  x += __builtin_shuffle(x, i16{1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0});
  return x[0];
}

inline float dot(const float* a, const float* b, int64_t D) {
  v16 acc{};
  int64_t d = 0;
  for (; d + LANES <= D; d += LANES) acc += *(const v16*)(a + d) * *(const v16*)(b + d);
  float s = horizontal_sum(acc);
  for (; d < D; ++d) s += a[d] * b[d];
  return s;
}

// out[0 : 16 V] = inv * sum_j p[j] v_j[0 : 16 V] (v_j: value row j of sequence b, KV head g); the
// V accumulators stay in registers.
template <int V>
inline void weighted_row(const float* p, const KeyView& v, int64_t b, int64_t g, int64_t keys, float inv, float* out) {
  v16 acc[V];
  for (int u = 0; u < V; ++u) acc[u] = v16{};
  for (int64_t j = 0; j < keys; ++j) {
    const float* vj = v.at(b, g, j);
    for (int u = 0; u < V; ++u) acc[u] += p[j] * *(const v16*)(vj + u * LANES);
  }
  for (int u = 0; u < V; ++u) *(v16*)(out + u * LANES) = acc[u] * inv;
}

// Query head h of sequence b: out[0:D].
WEDLM_CLONES void attend_one(const HeadView& q, const KeyView& k, const KeyView& v, int64_t keys, int64_t dim,
                             int64_t group, int64_t b, int64_t h, float scale, float* scores, float* out) {
  const int64_t g = h / group;
  const float* qh = q.data + b * q.batch + h * q.head;
  float top = -__builtin_inff();
  for (int64_t j = 0; j < keys; ++j) {
    const float s = scale * dot(qh, k.at(b, g, j), dim);
    scores[j] = s;
    top = s > top ? s : top;
  }
  const int64_t full = keys / LANES * LANES;
  v16 sum{};
  for (int64_t j = 0; j < full; j += LANES) {
    const v16 p = exp_nonpositive(*(const v16*)(scores + j) - top);
    *(v16*)(scores + j) = p;
    sum += p;
  }
  float total = horizontal_sum(sum);
  for (int64_t j = full; j < keys; ++j) {
    v16 x{};
    x[0] = scores[j] - top;
    scores[j] = exp_nonpositive(x)[0];
    total += scores[j];
  }
  const float inv = 1.0f / total;
  switch (dim) {
    case 16: return weighted_row<1>(scores, v, b, g, keys, inv, out);
    case 32: return weighted_row<2>(scores, v, b, g, keys, inv, out);
    case 48: return weighted_row<3>(scores, v, b, g, keys, inv, out);
    case 64: return weighted_row<4>(scores, v, b, g, keys, inv, out);
    case 128: return weighted_row<8>(scores, v, b, g, keys, inv, out);
    default: break;
  }
  for (int64_t d = 0; d < dim; ++d) out[d] = 0.f;
  for (int64_t j = 0; j < keys; ++j) {
    const float* vj = v.at(b, g, j);
    for (int64_t d = 0; d < dim; ++d) out[d] += scores[j] * vj[d];
  }
  for (int64_t d = 0; d < dim; ++d) out[d] *= inv;
}

// q [B, Hq, 1, D], k/v [B, Hkv, Lk, D] with Lk >= 1 (any strides, last dimension contiguous), or
// with `slots` int64 [B, Lk] the paged caches [S, Hkv, D] whose rows slots[b] are sequence b's
// keys and values (`heads.h`, `KeyView`: read in place, no gathered copy). Returns [B, Hq, 1, D],
// contiguous.
at::Tensor one_query_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                               const std::optional<at::Tensor>& slots) {
  const auto kv = check_qkv("one_query_attention", q, k, v, slots);
  TORCH_CHECK(q.size(2) == 1 && kv[2] >= 1, "one_query_attention: q must be [B, Hq, 1, D] and k, v hold Lk >= 1 keys");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(3), Hkv = kv[1], Lk = kv[2];
  at::Tensor out = at::empty({B, Hq, 1, D}, q.options());
  const HeadView qs(q);
  const KeyView ks = key_view(k, slots), vs = key_view(v, slots);
  float* o = out.data_ptr<float>();
  at::parallel_for(0, B * Hq, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores((Lk + LANES - 1) / LANES * LANES);
    for (int64_t t = begin; t < end; ++t)
      attend_one(qs, ks, vs, Lk, D, Hq / Hkv, t / Hq, t % Hq, static_cast<float>(scale), scores.data(), o + t * D);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(wedlm_cpu, m) {
  m.def("one_query_attention(Tensor q, Tensor k, Tensor v, float scale, Tensor? slots=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(wedlm_cpu, CPU, m) { m.impl("one_query_attention", one_query_attention); }
