// wedlm_cpu::window_attention: softmax(scale * q k^T, masked) v for a run of queries per head (a
// decode window, several sequences, a prefill) over the cached keys, float32, with a boolean mask
// (True = visible) or the number of leading keys each query sees. torch's CPU SDPA runs each query
// head's block through BLAS calls, which on AMD CPUs take MKL's generic kernel (~114 us a layer for
// the shipped model's 16-slot window over 500 keys on a Zen 4 core, about half the core's FMA rate).
//
// Per (sequence, KV head) the query rows of every head that reads it are transposed into 32-row
// (AVX-512) or 16-row columns of two vectors, so each score column S[rows, j] is a sum over
// the head dimension of k[j, d] times those vectors: keys are read in place, no horizontal sums.
// The softmax runs across keys for a tile's rows at once (one lane per row) and the weighted values
// accumulate a few rows at a time in registers. Tiles of 8 rows on AVX2 read every key twice as
// often: the shipped model's 16-query window took 1.2x the time over 100-1000 keys on a Zen 3 core
// (107 against 128 us over 500). Exponentials: a degree-6 polynomial (Cephes' expf, ~1 ulp).
// Results equal SDPA's within float32 rounding.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
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

// Query rows per tile: the lanes of QV vectors (two with AVX-512 or AVX2, four with SSE), and keys
// scored at a time (KEYS x QV accumulators). Each row's sums run in the same order whatever the
// tile, so the tile changes no value: 32-row AVX-512 tiles read each key once for the shipped
// model's 32 rows per KV head (2 heads x 16 queries), where 16-row ones read it twice and fed 4
// FMA chains per loaded query vector instead of 8: the 16-query window took 0.86-0.88x the time
// over 128-1000 keys on a Xeon core.
constexpr int64_t TILE = LANES == 16 ? 32 : 16;
constexpr int QV = TILE / LANES;
constexpr int KEYS = QV <= 2 ? 4 : 2;

// Weighted values of R rows: dest[l][c0 : c0 + C LANES] = inv[l] * sum_j p[j * TILE + l] v_j[c0 : ...]
// for l < n (p: the rows' lanes of the score columns); the R x C accumulators stay in registers.
template <int R, int C>
inline void weighted_values(const float* p, const float* const* vrows, int64_t span, int64_t n, int64_t c0,
                            const float* inv, float* const* dest) {
  vf acc[R][C];
  for (int l = 0; l < R; ++l)
    for (int u = 0; u < C; ++u) acc[l][u] = vf{};
  for (int64_t j = 0; j < span; ++j, p += TILE) {
    const float* vb = vrows[j] + c0;
    for (int u = 0; u < C; ++u) {
      const vf vv = *(const vf*)(vb + u * LANES);
      for (int l = 0; l < R; ++l) acc[l][u] += p[l] * vv;
    }
  }
  for (int64_t l = 0; l < n; ++l)
    for (int u = 0; u < C; ++u) *(vf*)(dest[l] + c0 + u * LANES) = acc[l][u] * inv[l];
}

// Rows per block of weighted values, and vectors of the head dimension per pass over the keys: 8 x 4
// accumulators with AVX-512's 32 registers, 4 x 2 with AVX2's (and SSE's) 16.
constexpr int64_t VALUE_ROWS = LANES == 16 ? 8 : 4;
constexpr int VALUE_VECTORS = LANES == 16 ? 4 : 2;

// dest[l][0:D] for l < n <= VALUE_ROWS: passes over the keys of up to VALUE_VECTORS vectors each, then
// the last D % LANES values one by one. Each output sums over the keys in order whatever the pass.
inline void weighted_rows(const float* p, const float* const* vrows, int64_t span, int64_t n, int64_t D,
                          const float* inv, float* const* dest) {
  constexpr int R = VALUE_ROWS;
  const int64_t vectors = D / LANES;
  for (int64_t u = 0; u < vectors;) {
    const int64_t c = std::min<int64_t>(VALUE_VECTORS, vectors - u);
    switch (c) {
      case 1: weighted_values<R, 1>(p, vrows, span, n, u * LANES, inv, dest); break;
      case 2: weighted_values<R, 2>(p, vrows, span, n, u * LANES, inv, dest); break;
      case 3: weighted_values<R, 3>(p, vrows, span, n, u * LANES, inv, dest); break;
      default: weighted_values<R, VALUE_VECTORS>(p, vrows, span, n, u * LANES, inv, dest); break;
    }
    u += c;
  }
  for (int64_t l = 0; l < n; ++l) {
    float* o = dest[l];
    for (int64_t d = vectors * LANES; d < D; ++d) {
      float sum = 0.f;
      for (int64_t j = 0; j < span; ++j) sum += p[j * TILE + l] * vrows[j][d];
      o[d] = sum * inv[l];
    }
  }
}

// One (sequence b, KV head g) and one tile of up to TILE of its query rows (row r = head offset *
// Lq + query), whose heads all read KV head g. Each row sees keys 0..key_ends[b * Lq + query]-1
// when `key_ends` is given, else the mask's visible keys.
void attend_tile(const HeadView& q, const KeyView& k, const KeyView& v, const bool* mask, int64_t mask_b,
                 const int64_t* key_ends, int64_t Lq, int64_t Lk, int64_t D, int64_t group, int64_t b, int64_t g,
                 int64_t r0, int64_t rows, float scale, float* st, float* qt, const float** krows,
                 const float** vrows, float* out, int64_t Hq) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // qt[d][lane] = q of row r0 + lane (zeros in unused lanes)
  for (int64_t d = 0; d < D; ++d)
    for (int64_t l = 0; l < TILE; ++l) qt[d * TILE + l] = 0.f;
  int64_t end[TILE];
  bool holes = false;
  for (int64_t l = 0; l < rows; ++l) {
    const int64_t r = r0 + l, h = g * group + r / Lq, i = r % Lq;
    const float* qr = q.data + b * q.batch + h * q.head + i * q.row;
    for (int64_t d = 0; d < D; ++d) qt[d * TILE + l] = qr[d];
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
  vf endv[QV];
  for (int64_t l = 0; l < TILE; ++l) {
    const int64_t e = l < rows ? end[l] : 0;
    endv[l / LANES][l % LANES] = static_cast<float>(e);
    span = e > span ? e : span;
  }
  // where each key and value row of the span lies (in place in a paged cache, or in a [B, Hkv, Lk, D] view)
  for (int64_t j = 0; j < span; ++j) {
    krows[j] = k.at(b, g, j);
    vrows[j] = v.at(b, g, j);
  }
  // scores, one TILE-row column per key: st[j][lane]; a key beyond a row's end scores -inf
  vf top[QV];
  for (int u = 0; u < QV; ++u) top[u] = splat(neg_inf);
  auto keep = [&](const vf* s, int64_t key) {
    for (int u = 0; u < QV; ++u) {
      vf x = s[u] * scale;
      x = splat(static_cast<float>(key)) < endv[u] ? x : splat(neg_inf);
      *(vf*)(st + key * TILE + u * LANES) = x;
      top[u] = x > top[u] ? x : top[u];
    }
  };
  int64_t j = 0;
  // KEYS keys at a time: each load of a query column feeds KEYS x QV independent FMA chains
  for (; j + KEYS <= span; j += KEYS) {
    vf s[KEYS][QV] = {};
    for (int64_t d = 0; d < D; ++d) {
      vf qd[QV];
#pragma GCC unroll 4
      for (int u = 0; u < QV; ++u) qd[u] = *(const vf*)(qt + d * TILE + u * LANES);
#pragma GCC unroll 4
      for (int c = 0; c < KEYS; ++c) {
        const float kd = krows[j + c][d];
#pragma GCC unroll 4
        for (int u = 0; u < QV; ++u) s[c][u] += kd * qd[u];
      }
    }
    for (int c = 0; c < KEYS; ++c) keep(s[c], j + c);
  }
  for (; j < span; ++j) {
    const float* kj = krows[j];
    vf s[QV] = {};
    for (int64_t d = 0; d < D; ++d)
      for (int u = 0; u < QV; ++u) s[u] += kj[d] * *(const vf*)(qt + d * TILE + u * LANES);
    keep(s, j);
  }
  if (holes) {
    for (int64_t l = 0; l < rows; ++l) {
      const bool* m = mask + b * mask_b + ((r0 + l) % Lq) * Lk;
      for (int64_t j = 0; j < end[l]; ++j)
        if (!m[j]) st[j * TILE + l] = neg_inf;
    }
    for (int u = 0; u < QV; ++u) {
      top[u] = splat(neg_inf);
      for (int64_t j = 0; j < span; ++j) {
        const vf s = *(const vf*)(st + j * TILE + u * LANES);
        top[u] = s > top[u] ? s : top[u];
      }
    }
  }
  // a lane with no visible key (an unused lane, or a fully masked row) weighs every key 0; its
  // total stays 0 and the row comes out 0, as SDPA's on a CPU
  float total[TILE];
  for (int u = 0; u < QV; ++u) {
    const vf t = top[u] == splat(neg_inf) ? splat(0.f) : top[u];
    vf sum{};
    for (int64_t j = 0; j < span; ++j) {
      float* sj = st + j * TILE + u * LANES;
      const vf x = *(const vf*)sj - t;
      vf p = exp_nonpositive(x);
      p = x == splat(neg_inf) ? splat(0.f) : p;
      *(vf*)sj = p;
      sum += p;
    }
    for (int64_t l = 0; l < LANES; ++l) total[u * LANES + l] = sum[l];
  }
  // weighted values, VALUE_ROWS rows at a time: out[row] = sum_j p[j][row] v[j] / total[row]
  for (int64_t l0 = 0; l0 < rows; l0 += VALUE_ROWS) {
    const int64_t n = std::min(rows - l0, VALUE_ROWS);
    float* dest[VALUE_ROWS];
    float inv[VALUE_ROWS];
    for (int64_t l = 0; l < n; ++l) {
      const int64_t r = r0 + l0 + l, h = g * group + r / Lq, i = r % Lq;
      dest[l] = out + ((b * Lq + i) * Hq + h) * D;
      inv[l] = total[l0 + l] > 0.f ? 1.0f / total[l0 + l] : 0.f;
    }
    weighted_rows(st + l0, vrows, span, n, D, inv, dest);
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
  const int64_t group = Hq / Hkv, rows = group * Lq, tiles = (rows + TILE - 1) / TILE;
  float* o = out.data_ptr<float>();
  at::parallel_for(0, B * Hkv * tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> st(Lk * TILE + TILE), qt(D * TILE);
    std::vector<const float*> krows(Lk), vrows(Lk);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t tile = t % tiles, bg = t / tiles, b = bg / Hkv, g = bg % Hkv;
      const int64_t r0 = tile * TILE, n = rows - r0 < TILE ? rows - r0 : TILE;
      attend_tile(qv, kv, vv, m, mask_b, e, Lq, Lk, D, group, b, g, r0, n, static_cast<float>(scale), st.data(),
                  qt.data(), krows.data(), vrows.data(), o, Hq);
    }
  });
  return out.transpose(1, 2);
}

}  // namespace

// `window_attention` as a C function with inductor's C-shim calling convention (`linear.cpp`'s
// `aoti_torch_cpu_bound_linear` says why): optional tensors as handle pointers, null for None.
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_window_attention(
    AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v, AtenTensorHandle* mask, double scale,
    AtenTensorHandle* slots, AtenTensorHandle* key_ends, AtenTensorHandle* ret0) {
  using torch::aot_inductor::pointer_to_optional;
  using torch::aot_inductor::tensor_handle_to_tensor_pointer;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    at::Tensor out = window_attention(*tensor_handle_to_tensor_pointer(q), *tensor_handle_to_tensor_pointer(k),
                                      *tensor_handle_to_tensor_pointer(v), pointer_to_optional<at::Tensor>(mask),
                                      scale, pointer_to_optional<at::Tensor>(slots),
                                      pointer_to_optional<at::Tensor>(key_ends));
    *ret0 = torch::aot_inductor::new_tensor_handle(std::move(out));
  });
}

TORCH_LIBRARY_FRAGMENT(wedlm_cpu, m) {
  m.def("window_attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, Tensor? slots=None, "
        "Tensor? key_ends=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(wedlm_cpu, CPU, m) { m.impl("window_attention", window_attention); }
