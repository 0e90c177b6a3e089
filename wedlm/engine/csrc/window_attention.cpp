// wedlm_cpu::window_attention: softmax(scale * q k^T, masked) v for a run of queries per head (a
// decode window, several sequences, a prefill) over the cached keys, float32, with a boolean mask
// (True = visible) or the number of leading keys each query sees. torch's CPU SDPA runs each query
// head's block through BLAS calls, which on AMD CPUs take MKL's generic kernel (~114 us a layer for
// the shipped model's 16-slot window over 500 keys on a Zen 4 core, about half the core's FMA rate).
//
// Per (sequence, KV head) the query rows of every head that reads it are transposed into 16-row
// columns, so each score column S[rows, j] is a sum over the head dimension of k[j, d] times a
// 16-float vector: keys are read in place, no horizontal sums. The softmax runs across keys for 16
// rows at once (one lane per row) and the weighted values accumulate 8 rows at a time in
// registers. Exponentials: a degree-6 polynomial (Cephes' expf, ~1 ulp). Results equal SDPA's
// within float32 rounding.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "heads.h"
#include "simd.h"

namespace {

using namespace wedlm_heads;
using namespace wedlm_simd;

// dest[l][0 : 16 V] = inv[l] * sum_j p[j * 16 + l] v[j] for l < n (p: the score columns, 16 apart);
// the 8 x V accumulators stay in registers.
template <int V>
inline void weighted_values(const float* p, const float* const* vrows, int64_t span, int64_t n, const float* inv,
                            float* const* dest) {
  v16 acc[8][V];
  for (int l = 0; l < 8; ++l)
    for (int u = 0; u < V; ++u) acc[l][u] = v16{};
  for (int64_t j = 0; j < span; ++j, p += LANES) {
    const float* vb = vrows[j];
    for (int u = 0; u < V; ++u) {
      const v16 vv = *(const v16*)(vb + u * LANES);
      for (int l = 0; l < 8; ++l) acc[l][u] += p[l] * vv;
    }
  }
  for (int64_t l = 0; l < n; ++l)
    for (int u = 0; u < V; ++u) *(v16*)(dest[l] + u * LANES) = acc[l][u] * inv[l];
}

// One (sequence b, KV head g) and one tile of up to 16 of its query rows (row r = head offset *
// Lq + query), whose heads all read KV head g. Each row sees keys 0..key_ends[b * Lq + query]-1
// when `key_ends` is given, else the mask's visible keys.
WEDLM_CLONES void attend_tile(const HeadView& q, const KeyView& k, const KeyView& v, const bool* mask, int64_t mask_b,
                              const int64_t* key_ends, int64_t Lq, int64_t Lk, int64_t D, int64_t group, int64_t b,
                              int64_t g, int64_t r0, int64_t rows, float scale, float* st, float* qt,
                              const float** krows, const float** vrows, float* out, int64_t Hq) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // qt[d][lane] = q of row r0 + lane (zeros in unused lanes)
  for (int64_t d = 0; d < D; ++d)
    for (int64_t l = 0; l < LANES; ++l) qt[d * LANES + l] = 0.f;
  int64_t end[LANES];
  bool holes = false;
  for (int64_t l = 0; l < rows; ++l) {
    const int64_t r = r0 + l, h = g * group + r / Lq, i = r % Lq;
    const float* qr = q.data + b * q.batch + h * q.head + i * q.row;
    for (int64_t d = 0; d < D; ++d) qt[d * LANES + l] = qr[d];
    int64_t e = Lk;
    if (key_ends != nullptr) {
      e = std::min(std::max(key_ends[b * Lq + i], int64_t{0}), Lk);
    } else if (mask != nullptr) {
      const bool* m = mask + b * mask_b + i * Lk;
      while (e > 0 && !m[e - 1]) --e;
      holes = holes || (e > 0 && std::memchr(m, 0, e) != nullptr);
    }
    end[l] = e;
  }
  int64_t span = 0;
  v16 endv;
  for (int64_t l = 0; l < LANES; ++l) {
    const int64_t e = l < rows ? end[l] : 0;
    endv[l] = static_cast<float>(e);
    span = e > span ? e : span;
  }
  // where each key and value row of the span lies (in place in a paged cache, or in a [B, Hkv, Lk, D] view)
  for (int64_t j = 0; j < span; ++j) {
    krows[j] = k.at(b, g, j);
    vrows[j] = v.at(b, g, j);
  }
  // scores, one 16-row column per key: st[j][lane]
  v16 top = splat(neg_inf);
  int64_t j = 0;
  // four keys at a time: each load of a query column feeds four independent FMA chains
  for (; j + 4 <= span; j += 4) {
    v16 s0{}, s1{}, s2{}, s3{};
    const float *k0 = krows[j], *k1 = krows[j + 1], *k2 = krows[j + 2], *k3 = krows[j + 3];
    for (int64_t d = 0; d < D; ++d) {
      const v16 qd = *(const v16*)(qt + d * LANES);
      s0 += k0[d] * qd;
      s1 += k1[d] * qd;
      s2 += k2[d] * qd;
      s3 += k3[d] * qd;
    }
    const v16 sc[4] = {s0, s1, s2, s3};
    for (int u = 0; u < 4; ++u) {
      v16 x = sc[u] * scale;
      x = splat(static_cast<float>(j + u)) < endv ? x : splat(neg_inf);
      *(v16*)(st + (j + u) * LANES) = x;
      top = x > top ? x : top;
    }
  }
  for (; j < span; ++j) {
    const float* kj = krows[j];
    v16 s0{};
    for (int64_t d = 0; d < D; ++d) s0 += kj[d] * *(const v16*)(qt + d * LANES);
    v16 x = s0 * scale;
    x = splat(static_cast<float>(j)) < endv ? x : splat(neg_inf);
    *(v16*)(st + j * LANES) = x;
    top = x > top ? x : top;
  }
  if (holes) {
    for (int64_t l = 0; l < rows; ++l) {
      const bool* m = mask + b * mask_b + ((r0 + l) % Lq) * Lk;
      for (int64_t j = 0; j < end[l]; ++j)
        if (!m[j]) st[j * LANES + l] = neg_inf;
    }
    top = splat(neg_inf);
    for (int64_t j = 0; j < span; ++j) {
      const v16 s = *(const v16*)(st + j * LANES);
      top = s > top ? s : top;
    }
  }
  // a lane with no visible key (an unused lane, or a fully masked row) weighs every key 0; its
  // total stays 0 and the row comes out 0, as SDPA's on a CPU
  top = top == splat(neg_inf) ? splat(0.f) : top;
  v16 total{};
  for (int64_t j = 0; j < span; ++j) {
    const v16 x = *(const v16*)(st + j * LANES) - top;
    v16 p = exp_nonpositive(x);
    p = x == splat(neg_inf) ? splat(0.f) : p;
    *(v16*)(st + j * LANES) = p;
    total += p;
  }
  // weighted values, 8 rows at a time: out[row] = sum_j p[j][row] v[j] / total[row]
  for (int64_t l0 = 0; l0 < rows; l0 += 8) {
    const int64_t n = rows - l0 < 8 ? rows - l0 : 8;
    float* dest[8];
    float inv[8];
    for (int64_t l = 0; l < n; ++l) {
      const int64_t r = r0 + l0 + l, h = g * group + r / Lq, i = r % Lq;
      dest[l] = out + ((b * Lq + i) * Hq + h) * D;
      inv[l] = total[l0 + l] > 0.f ? 1.0f / total[l0 + l] : 0.f;
    }
    switch (D) {
      case 16: weighted_values<1>(st + l0, vrows, span, n, inv, dest); break;
      case 32: weighted_values<2>(st + l0, vrows, span, n, inv, dest); break;
      case 48: weighted_values<3>(st + l0, vrows, span, n, inv, dest); break;
      case 64: weighted_values<4>(st + l0, vrows, span, n, inv, dest); break;
      default:
        for (int64_t l = 0; l < n; ++l) {
          float* o = dest[l];
          for (int64_t d = 0; d < D; ++d) o[d] = 0.f;
          for (int64_t j = 0; j < span; ++j) {
            const float p = st[j * LANES + l0 + l];
            const float* vj = vrows[j];
            for (int64_t d = 0; d < D; ++d) o[d] += p * vj[d];
          }
          for (int64_t d = 0; d < D; ++d) o[d] *= inv[l];
        }
    }
  }
}

// q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D] (last dimension contiguous) or, with `slots` int64 [B, Lk],
// the paged caches [S, Hkv, D] whose rows slots[b] are sequence b's keys and values (read in place,
// `KeyView`), mask bool [B or 1, 1, Lq, Lk] or none; or, instead of the mask, `key_ends` int64
// [B, Lq]: query i of sequence b sees keys 0..key_ends[b, i]-1 (a causal mask as prefix lengths, no
// [Lq, Lk] array to build and scan). Returns [B, Hq, Lq, D] laid out [B, Lq, Hq, D] (its
// transpose(1, 2) is contiguous).
at::Tensor window_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& mask, double scale, const std::optional<at::Tensor>& slots,
                            const std::optional<at::Tensor>& key_ends) {
  const auto kvs = check_qkv("window_attention", q, k, v, slots);
  const int64_t B = q.size(0), Hq = q.size(1), Lq = q.size(2), D = q.size(3), Hkv = kvs[1], Lk = kvs[2];
  at::Tensor flat_mask;
  int64_t mask_b = 0;
  if (mask.has_value() && mask->defined()) {
    TORCH_CHECK(mask->scalar_type() == at::kBool && mask->dim() == 4 && mask->size(1) == 1 && mask->size(2) == Lq &&
                    mask->size(3) == Lk && (mask->size(0) == 1 || mask->size(0) == B),
                "window_attention: mask must be bool [B or 1, 1, Lq, Lk]");
    flat_mask = mask->contiguous();
    mask_b = mask->size(0) == 1 ? 0 : Lq * Lk;
  }
  at::Tensor ends;
  if (key_ends.has_value() && key_ends->defined()) {
    TORCH_CHECK(!flat_mask.defined(), "window_attention: give a mask or key_ends, not both");
    TORCH_CHECK(key_ends->scalar_type() == at::kLong && key_ends->dim() == 2 && key_ends->size(0) == B &&
                    key_ends->size(1) == Lq,
                "window_attention: key_ends must be int64 [B, Lq]");
    ends = key_ends->contiguous();
  }
  at::Tensor out = at::empty({B, Lq, Hq, D}, q.options());
  const HeadView qv(q);
  const KeyView kv = key_view(k, slots), vv = key_view(v, slots);
  const bool* m = flat_mask.defined() ? flat_mask.data_ptr<bool>() : nullptr;
  const int64_t* e = ends.defined() ? ends.data_ptr<int64_t>() : nullptr;
  const int64_t group = Hq / Hkv, rows = group * Lq, tiles = (rows + LANES - 1) / LANES;
  float* o = out.data_ptr<float>();
  at::parallel_for(0, B * Hkv * tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> st(Lk * LANES + LANES), qt(D * LANES);
    std::vector<const float*> krows(Lk), vrows(Lk);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t tile = t % tiles, bg = t / tiles, b = bg / Hkv, g = bg % Hkv;
      const int64_t r0 = tile * LANES, n = rows - r0 < LANES ? rows - r0 : LANES;
      attend_tile(qv, kv, vv, m, mask_b, e, Lq, Lk, D, group, b, g, r0, n, static_cast<float>(scale), st.data(),
                  qt.data(), krows.data(), vrows.data(), o, Hq);
    }
  });
  return out.transpose(1, 2);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(wedlm_cpu, m) {
  m.def("window_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, Tensor? slots=None, "
        "Tensor? key_ends=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(wedlm_cpu, CPU, m) { m.impl("window_attention", window_attention); }
