// wedlm_cpu::one_query_attention: softmax(scale * q k^T) v for one query per head over all keys
// (no mask), float32: the attention of a batch-1 `ar` step, whose keys are exactly the sequence's
// cached tokens. torch's CPU SDPA runs this through its flash kernel and BLAS calls sized for
// blocks of queries (~30 us a layer over 500 keys for the shipped model on a Zen 4 core).
//
// Each score is a dot product over the head dimension in vectors and one horizontal sum;
// the exponentials use a degree-6 polynomial (Cephes' expf, ~1 ulp) and the weighted sum of
// values keeps its accumulators in registers. Grouped-query heads: query head h reads KV head
// h / (Hq / Hkv). Results equal SDPA's within float32 rounding.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include "heads.h"
#include "simd.h"

#include <algorithm>
#include <vector>

namespace {

using namespace wedlm_heads;
using namespace wedlm_simd;

inline float dot(const float* a, const float* b, int64_t D) {
  vf acc{};
  int64_t d = 0;
  for (; d + LANES <= D; d += LANES) acc += *(const vf*)(a + d) * *(const vf*)(b + d);
  float s = horizontal_sum(acc);
  for (; d < D; ++d) s += a[d] * b[d];
  return s;
}

// out[c0 : c0 + V LANES] = inv * sum_j p[j] v_j[c0 : ...] (v_j: value row j of sequence b, KV head g);
// the V accumulators stay in registers.
template <int V>
inline void weighted_row(const float* p, const KeyView& v, int64_t b, int64_t g, int64_t keys, int64_t c0, float inv,
                         float* out) {
  vf acc[V];
  for (int u = 0; u < V; ++u) acc[u] = vf{};
  for (int64_t j = 0; j < keys; ++j) {
    const float* vj = v.at(b, g, j) + c0;
    for (int u = 0; u < V; ++u) acc[u] += p[j] * *(const vf*)(vj + u * LANES);
  }
  for (int u = 0; u < V; ++u) *(vf*)(out + c0 + u * LANES) = acc[u] * inv;
}

// vectors of the head dimension per pass over the keys (at most 8; of 32 registers with AVX-512, 16 otherwise)
constexpr int64_t ROW_VECTORS = LANES == 16 ? 8 : 4;

// Query head h of sequence b: out[0:D].
void attend_one(const HeadView& q, const KeyView& k, const KeyView& v, int64_t keys, int64_t dim, int64_t group,
                int64_t b, int64_t h, float scale, float* scores, float* out) {
  const int64_t g = h / group;
  const float* qh = q.data + b * q.batch + h * q.head;
  float top = -__builtin_inff();
  for (int64_t j = 0; j < keys; ++j) {
    const float s = scale * dot(qh, k.at(b, g, j), dim);
    scores[j] = s;
    top = s > top ? s : top;
  }
  const int64_t full = keys / LANES * LANES;
  vf sum{};
  for (int64_t j = 0; j < full; j += LANES) {
    const vf p = exp_nonpositive(*(const vf*)(scores + j) - top);
    *(vf*)(scores + j) = p;
    sum += p;
  }
  float total = horizontal_sum(sum);
  for (int64_t j = full; j < keys; ++j) {
    vf x{};
    x[0] = scores[j] - top;
    scores[j] = exp_nonpositive(x)[0];
    total += scores[j];
  }
  const float inv = 1.0f / total;
  // passes of up to ROW_VECTORS vectors, then the last dim % LANES values one by one; each output
  // sums over the keys in order whatever the pass
  const int64_t vectors = dim / LANES;
  for (int64_t u = 0; u < vectors;) {
    const int64_t c = std::min(ROW_VECTORS, vectors - u);
    switch (c) {
      case 1: weighted_row<1>(scores, v, b, g, keys, u * LANES, inv, out); break;
      case 2: weighted_row<2>(scores, v, b, g, keys, u * LANES, inv, out); break;
      case 3: weighted_row<3>(scores, v, b, g, keys, u * LANES, inv, out); break;
      case 4: weighted_row<4>(scores, v, b, g, keys, u * LANES, inv, out); break;
      case 5: weighted_row<5>(scores, v, b, g, keys, u * LANES, inv, out); break;
      case 6: weighted_row<6>(scores, v, b, g, keys, u * LANES, inv, out); break;
      case 7: weighted_row<7>(scores, v, b, g, keys, u * LANES, inv, out); break;
      default: weighted_row<8>(scores, v, b, g, keys, u * LANES, inv, out); break;
    }
    u += c;
  }
  for (int64_t d = vectors * LANES; d < dim; ++d) {
    float sum = 0.f;
    for (int64_t j = 0; j < keys; ++j) sum += scores[j] * v.at(b, g, j)[d];
    out[d] = sum * inv;
  }
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

// `one_query_attention` as a C function with inductor's C-shim calling convention (`linear.cpp`'s
// `aoti_torch_cpu_bound_linear` says why).
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_one_query_attention(
    AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v, double scale, AtenTensorHandle* slots,
    AtenTensorHandle* ret0) {
  using torch::aot_inductor::tensor_handle_to_tensor_pointer;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    at::Tensor out = one_query_attention(*tensor_handle_to_tensor_pointer(q), *tensor_handle_to_tensor_pointer(k),
                                         *tensor_handle_to_tensor_pointer(v), scale,
                                         torch::aot_inductor::pointer_to_optional<at::Tensor>(slots));
    *ret0 = torch::aot_inductor::new_tensor_handle(std::move(out));
  });
}

TORCH_LIBRARY_FRAGMENT(wedlm_cpu, m) {
  m.def("one_query_attention(Tensor q, Tensor k, Tensor v, float scale, Tensor? slots=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(wedlm_cpu, CPU, m) { m.impl("one_query_attention", one_query_attention); }
