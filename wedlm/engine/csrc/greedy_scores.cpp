// wedlm_cpu::greedy_scores: for each row of float32 logits [n, V], the entropy (nats) of its
// softmax and the first index of its maximum: the fill rule's scores of a greedy request (paper
// section 5.2, Eq. 11) in two passes over the logits, where torch takes a softmax, a clamp, a log,
// a product, a sum and an argmax over [n, V] buffers (~200 us for 16 x 4096 on a Zen 4 core).
//
// With m the row's maximum, d_i = x_i - m <= 0, e_i = exp(d_i), Z = sum e_i and S = sum e_i d_i,
// the entropy is log Z - S / Z. The exponentials are the ~1 ulp polynomial of `simd.h`, and d_i
// is clamped at -87 (e^-87 ~ 1.6e-38: -inf logits add nothing measurable and no inf * 0). Z and S
// accumulate in float32 lanes over chunks of 64 vectors (16 terms a lane, all of one sign), in
// double across chunks. Error against the true entropy H: each term is off by a few float32
// roundings (~2^-24 each, relative) and each lane sum by at most 16 more, so S is within ~2e-6
// relative and Z within ~1e-6 absolute (the lane holding e^0 = 1 rounds at 2^-24 per term) plus
// ~2e-6 relative: the entropy is within ~1e-6 + 2e-6 * H nats, for any vocabulary size. torch's
// float32 softmax-and-entropy is within ~3e-7 + 1.3e-6 * H (a few roundings a term, cascade
// sums; 2.5e-6 * H over 49,152 columns on a Zen 3 core). The callers decide only where a score
// is farther than `decoders.fill.ENTROPY_RTOL` / `ENTROPY_ATOL` (2e-5 relative, 1e-5 absolute:
// ~3x the two bounds together) from a threshold, and take torch's path otherwise.
//
// The index is -1 where torch's argmax over softmax probabilities could differ from the first
// maximum of the logits: a row with NaN or a non-finite maximum, or a second logit within
// `tie` of the maximum (after float32 exp and normalisation, values that close can round to the
// same probability, and torch then returns the first of them). Beyond `tie` (the engine passes
// 1e-5: e^-1e-5 is 1 - 1e-5, 84 float32 ulps below 1) the maximum's probability is strictly the
// largest.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

#include "simd.h"

namespace {

using namespace wedlm_simd;

// values summed in float32 before the partial sums move to double: 16 terms in each of the 4 x
// LANES lanes (1024 values with AVX-512, 512 with AVX2)
constexpr int64_t CHUNK = 64 * LANES;

// The first index of the maximum of x[0:V], V > 0, or of its first NaN: each lane keeps its maximum
// and the first index it saw it at, and of equal lane maxima the earliest index wins.
int64_t first_max_index(const float* x, int64_t V) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  vf vmax = splat(neg_inf);
  vi where = vi{}, bad = vi{}, iota;
  for (int64_t l = 0; l < LANES; ++l) iota[l] = static_cast<int32_t>(l);
  int64_t i = 0;
  for (; i + LANES <= V; i += LANES) {
    const vf v = *(const vf*)(x + i);
    bad |= (v != v);
    const vi greater = v > vmax;
    vmax = greater ? v : vmax;
    where = greater ? iota + static_cast<int32_t>(i) : where;
  }
  float m = neg_inf;
  int64_t index = V;
  bool nan = false;
  for (int64_t l = 0; l < LANES; ++l) {
    nan |= bad[l] != 0;
    if (i > 0 && (vmax[l] > m || (vmax[l] == m && where[l] < index))) {
      m = vmax[l];
      index = where[l];
    }
  }
  for (; i < V; ++i) {
    nan |= x[i] != x[i];
    if (x[i] > m || index == V) {
      m = x[i];
      index = i;
    }
  }
  if (nan)
    for (index = 0; x[index] == x[index]; ++index) {
    }
  return index;
}

// x's lanes in double, the upper half added to the lower: one vector add per chunk and sum where
// a scalar loop over the lanes was a chain of 2 x 4 x LANES dependent double adds
typedef float half_vf __attribute__((vector_size(LANES * 2)));
typedef double vd __attribute__((vector_size(LANES * 4)));

inline vd widened(vf x) {
  half_vf low, high;
  __builtin_memcpy(&low, &x, sizeof(low));
  __builtin_memcpy(&high, reinterpret_cast<const char*>(&x) + sizeof(low), sizeof(high));
  return __builtin_convertvector(low, vd) + __builtin_convertvector(high, vd);
}

// (Z, S) of the row: sum exp(d_i) and sum exp(d_i) d_i with d_i = max(x_i - m, -87); returns
// the index of the one value >= `near` (m's), or -1 when there are several.
int64_t row_sums(const float* x, int64_t V, float m, float near, double* z, double* s) {
  vi count = vi{}, where = vi{};
  vi iota;
  for (int64_t l = 0; l < LANES; ++l) iota[l] = static_cast<int32_t>(l);
  const vf vm = splat(m), lo = splat(-87.0f), vnear = splat(near);
  vd zd = {}, sd = {};  // the chunks' float32 lane sums, in double lanes
  double zt = 0.0, st = 0.0;
  int64_t i = 0;
  while (i + 4 * LANES <= V) {
    // one chunk of up to CHUNK values: each float32 lane sums at most 16 terms
    vf zacc[4] = {}, sacc[4] = {};
    const int64_t stop = std::min(V, i + CHUNK);
    for (; i + 4 * LANES <= stop; i += 4 * LANES) {
      for (int u = 0; u < 4; ++u) {
        const vf v = *(const vf*)(x + i + u * LANES);
        const vi hit = v >= vnear;  // -1 where true
        count -= hit;
        where = hit ? iota + static_cast<int32_t>(i + u * LANES) : where;
        vf d = v - vm;
        d = d < lo ? lo : d;
        const vf e = exp_nonpositive(d);
        zacc[u] += e;
        sacc[u] += e * d;
      }
    }
    for (int u = 0; u < 4; ++u) {
      zd += widened(zacc[u]);
      sd += widened(sacc[u]);
    }
  }
  for (int64_t l = 0; l < LANES / 2; ++l) {
    zt += zd[l];
    st += sd[l];
  }
  int64_t hits = 0, index = -1;
  for (int64_t l = 0; l < LANES; ++l) {
    hits += count[l];
    index = count[l] ? where[l] : index;
  }
  for (; i < V; ++i) {
    if (x[i] >= near) {
      ++hits;
      index = i;
    }
    const float d = std::max(x[i] - m, -87.0f);
    const float e = std::exp(d);
    zt += e;
    st += static_cast<double>(e) * d;
  }
  *z = zt;
  *s = st;
  return hits == 1 ? index : -1;
}

std::tuple<at::Tensor, at::Tensor> greedy_scores(const at::Tensor& logits, double tie) {
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.dim() == 2,
              "greedy_scores: logits must be a float32 [n, V] matrix");
  TORCH_CHECK(tie >= 0.0, "greedy_scores: tie must be >= 0, got ", tie);
  const at::Tensor x = logits.contiguous();
  const int64_t n = x.size(0), V = x.size(1);
  at::Tensor entropy = at::empty({n}, x.options());
  at::Tensor argmax = at::empty({n}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  float* hp = entropy.data_ptr<float>();
  int64_t* ap = argmax.data_ptr<int64_t>();
  at::parallel_for(0, n, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xp + r * V;
      // the maximum, or NaN where the row has one
      const float m = V > 0 ? row[first_max_index(row, V)] : -std::numeric_limits<float>::infinity();
      if (!std::isfinite(m)) {
        hp[r] = std::numeric_limits<float>::quiet_NaN();
        ap[r] = -1;
        continue;
      }
      // a float32 just below m - tie: every value within tie of m counts as near
      const float near = std::nextafter(static_cast<float>(static_cast<double>(m) - tie),
                                        -std::numeric_limits<float>::infinity());
      double z = 0.0, s = 0.0;
      ap[r] = row_sums(row, V, m, near, &z, &s);
      hp[r] = static_cast<float>(std::log(z) - s / z);
    }
  });
  return {entropy, argmax};
}

// wedlm_cpu::row_argmax: torch.argmax(logits, -1) of float32 logits [n, V], the first index of
// each row's maximum (the first NaN where the row has one, as torch's): the forward's greedy ids.
// torch's argmax (eager and as inductor generates it) keeps a running index beside the running
// maximum one value at a time, ~85 us for 16 x 4096 on a Xeon core; here one vector pass.
at::Tensor row_argmax(const at::Tensor& logits) {
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.dim() == 2 && logits.size(1) > 0,
              "row_argmax: logits must be a float32 [n, V] matrix with V > 0");
  const at::Tensor x = logits.contiguous();
  const int64_t n = x.size(0), V = x.size(1);
  at::Tensor argmax = at::empty({n}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* ap = argmax.data_ptr<int64_t>();
  at::parallel_for(0, n, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      ap[r] = first_max_index(xp + r * V, V);
    }
  });
  return argmax;
}

}  // namespace

// `row_argmax` as a C function with inductor's C-shim calling convention (`linear.cpp`'s
// `aoti_torch_cpu_bound_linear` says why).
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_row_argmax(AtenTensorHandle logits,
                                                                                          AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    at::Tensor out = row_argmax(*torch::aot_inductor::tensor_handle_to_tensor_pointer(logits));
    *ret0 = torch::aot_inductor::new_tensor_handle(std::move(out));
  });
}

TORCH_LIBRARY_FRAGMENT(wedlm_cpu, m) {
  m.def("greedy_scores(Tensor logits, float tie) -> (Tensor, Tensor)");
  m.def("row_argmax(Tensor logits) -> Tensor");
}

TORCH_LIBRARY_IMPL(wedlm_cpu, CPU, m) {
  m.impl("greedy_scores", greedy_scores);
  m.impl("row_argmax", row_argmax);
}
