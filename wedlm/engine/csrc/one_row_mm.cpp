// wedlm_cpu::one_row_mm: x[1, K] @ weight_t[K, N] for the one-row matmuls of a batch-1 `ar` step.
// Those are matrix-vector products bound by how fast the weights stream from memory; torch's BLAS
// (MKL) runs them on a 4-wide SSE kernel on AMD CPUs, which streamed the shipped model's weights
// at ~13 GB/s in an engine step on a Zen 4 core, about 2/3 of what this loop reaches.
//
// The loop reads weight_t row after row, four rows at a time, as four sequential streams, and
// accumulates into y (N floats, in L1 for N up to a few thousand). Each y[n] sums its K products
// in order k = 0..K-1, so the result is BLAS's within float32 summation order.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "simd.h"

namespace {

using namespace wedlm_simd;

// y[n0:n1] = x @ wt[:, n0:n1]
void rows_stream(const float* x, const float* wt, int64_t K, int64_t N, int64_t n0, int64_t n1, float* y) {
  for (int64_t n = n0; n < n1; ++n) y[n] = 0.f;
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    const float x0 = x[k], x1 = x[k + 1], x2 = x[k + 2], x3 = x[k + 3];
    const float* w0 = wt + k * N;
    const float* w1 = w0 + N;
    const float* w2 = w1 + N;
    const float* w3 = w2 + N;
    int64_t n = n0;
    for (; n + LANES <= n1; n += LANES) {
      vf acc = *(const vf*)(y + n);
      acc += x0 * *(const vf*)(w0 + n);
      acc += x1 * *(const vf*)(w1 + n);
      acc += x2 * *(const vf*)(w2 + n);
      acc += x3 * *(const vf*)(w3 + n);
      *(vf*)(y + n) = acc;
    }
    for (; n < n1; ++n) y[n] = (((y[n] + x0 * w0[n]) + x1 * w1[n]) + x2 * w2[n]) + x3 * w3[n];
  }
  for (; k < K; ++k) {
    const float* w = wt + k * N;
    for (int64_t n = n0; n < n1; ++n) y[n] += x[k] * w[n];
  }
}

at::Tensor one_row_mm(const at::Tensor& x, const at::Tensor& weight_t) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight_t.scalar_type() == at::kFloat,
              "one_row_mm: x and weight_t must be float32");
  TORCH_CHECK(weight_t.dim() == 2 && weight_t.is_contiguous(), "one_row_mm: weight_t must be a contiguous [K, N] matrix");
  const int64_t K = weight_t.size(0), N = weight_t.size(1);
  TORCH_CHECK(x.numel() == K, "one_row_mm: x must hold one row of K = ", K, " values, got ", x.numel());
  const at::Tensor row = x.contiguous();
  at::Tensor y = at::empty({1, N}, x.options());
  const float* xp = row.data_ptr<float>();
  const float* wp = weight_t.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // threads (if any) take column ranges of 256 or more: each streams its slice of every row
  constexpr int64_t COLUMNS = 256;
  at::parallel_for(0, (N + COLUMNS - 1) / COLUMNS, 1, [&](int64_t begin, int64_t end) {
    rows_stream(xp, wp, K, N, begin * COLUMNS, std::min(N, end * COLUMNS), yp);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(wedlm_cpu, m) { m.def("one_row_mm(Tensor x, Tensor weight_t) -> Tensor"); }

TORCH_LIBRARY_IMPL(wedlm_cpu, CPU, m) { m.impl("one_row_mm", one_row_mm); }
