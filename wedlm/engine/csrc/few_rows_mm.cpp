// wedlm_cpu::few_rows_mm: x[M, K] @ W^T (+ bias) for the matmuls of decode windows and short
// prefills (M from 2 to a few hundred rows), on W [N, K] packed in column panels (`pack_panels`
// in fast_model.py): panel p holds columns 64p..64p+63 as K rows of 64 floats, one contiguous
// block (the last panel is N % 64 wide when N is not a multiple of 64). oneDNN's prepacked matmul
// ran the shipped model's 16-row step matmuls at 45-100 GFLOP/s on a Zen 4 core (a fixed cost of
// several microseconds per call, against 11 us of arithmetic for the 192x192 o_proj); this loop
// runs them at ~113, the core's FMA rate. Contiguous panels matter: the same loop reading a
// transposed [K, N] weight, whose rows are N floats apart, was no faster than oneDNN inside a step,
// where the model's 16 MB of weights come from L3 (one page per row read).
//
// Each tile keeps MR rows x NV 16-float vectors of y in registers (6 x 4 = 24 zmm with AVX-512,
// 6 x 1 = 12 ymm pairs with AVX2) and walks k = 0..K-1 once: load NV vectors of the panel's row k,
// broadcast x[r, k], one FMA per accumulator. Each y[m, n] is thus one FMA chain over k in order,
// the order oneDNN's brgemm kernel also uses when K fits one of its blocks (K <= 512 here):
// the shipped model's results are bit-identical to oneDNN's (`test_native.py`).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "simd.h"

namespace {

using namespace wedlm_simd;

constexpr int64_t PANEL = 64;  // columns of a full panel

// y[0:MR, n0:n0 + 16 NV] = x[0:MR, :] @ the panel columns at w (+ bias[n0:...]); rows of x are K
// floats apart, the panel's rows ldw floats, y's rows N floats.
template <int MR, int NV>
WEDLM_CLONES void tile(const float* x, int64_t K, const float* w, int64_t ldw, const float* bias, float* y,
                       int64_t N, int64_t n0) {
  v16 acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = splat(0.f);
  for (int64_t k = 0; k < K; ++k, w += ldw) {
    v16 b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = *(const v16*)(w + LANES * v);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const float a = x[r * K + k];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      v16 out = acc[r][v];
      if (bias) out += *(const v16*)(bias + n0 + LANES * v);
      *(v16*)(y + r * N + n0 + LANES * v) = out;
    }
}

// Columns n0..n0 + 16 NV (at w, rows ldw apart) of rows 0..M-1, in row blocks of at most 6 and as
// even as they go (16 rows: 6 + 5 + 5, 8 rows: 4 + 4), so that no block runs far below the FMA rate.
template <int NV>
void row_blocks(const float* x, int64_t M, int64_t K, const float* w, int64_t ldw, const float* bias, float* y,
                int64_t N, int64_t n0) {
  const int64_t blocks = (M + 5) / 6, base = M / blocks, longer = M % blocks;
  for (int64_t b = 0, m = 0; b < blocks; ++b) {
    const int64_t rows = base + (b < longer ? 1 : 0);
    const float* xb = x + m * K;
    float* yb = y + m * N;
    switch (rows) {
      case 1: tile<1, NV>(xb, K, w, ldw, bias, yb, N, n0); break;
      case 2: tile<2, NV>(xb, K, w, ldw, bias, yb, N, n0); break;
      case 3: tile<3, NV>(xb, K, w, ldw, bias, yb, N, n0); break;
      case 4: tile<4, NV>(xb, K, w, ldw, bias, yb, N, n0); break;
      case 5: tile<5, NV>(xb, K, w, ldw, bias, yb, N, n0); break;
      default: tile<6, NV>(xb, K, w, ldw, bias, yb, N, n0); break;
    }
    m += rows;
  }
}

// Panels [p0, p1): with `wide` (AVX-512) each full panel as one tile column, else (and for a
// narrower last panel) 16 columns at a time. Two tile widths keep the build short: each is
// instantiated for 1-6 rows and three instruction sets.
void panels(const float* x, int64_t M, int64_t K, const float* packed, int64_t N, const float* bias, float* y,
            int64_t p0, int64_t p1, bool wide) {
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * PANEL, width = std::min(PANEL, N - n0);
    const float* w = packed + n0 * K;
    if (wide && width == PANEL) {
      row_blocks<4>(x, M, K, w, width, bias, y, N, n0);
    } else {
      for (int64_t c = 0; c < width; c += LANES) row_blocks<1>(x, M, K, w + c, width, bias, y, N, n0 + c);
    }
  }
}

at::Tensor few_rows_mm(const at::Tensor& x, const at::Tensor& panels_w, int64_t N, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && panels_w.scalar_type() == at::kFloat,
              "few_rows_mm: x and panels must be float32");
  TORCH_CHECK(x.dim() == 2, "few_rows_mm: x must be [M, K], got ", x.sizes());
  const int64_t K = x.size(1);
  TORCH_CHECK(N > 0 && N % LANES == 0, "few_rows_mm: N must be a positive multiple of 16, got ", N);
  TORCH_CHECK(panels_w.is_contiguous() && panels_w.numel() == N * K,
              "few_rows_mm: panels must be a contiguous packing of N x K = ", N * K, " floats, got ", panels_w.numel());
  const float* bp = nullptr;
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == at::kFloat && b.numel() == N, "few_rows_mm: bias must be float32 [N = ", N, "]");
    bp = b.data_ptr<float>();
  }
  const at::Tensor rows = x.contiguous();
  const int64_t M = rows.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const float* xp = rows.data_ptr<float>();
  const float* wp = panels_w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // 24 accumulators need AVX-512's 32 registers; AVX2's 16 hold 6 x 1 (two ymm halves each)
  static const bool wide = __builtin_cpu_supports("avx512f");
  // threads (if any) take whole panels
  at::parallel_for(0, (N + PANEL - 1) / PANEL, 1, [&](int64_t begin, int64_t end) {
    panels(xp, M, K, wp, N, bp, yp, begin, end, wide);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(wedlm_cpu, m) { m.def("few_rows_mm(Tensor x, Tensor panels, int N, Tensor? bias) -> Tensor"); }

TORCH_LIBRARY_IMPL(wedlm_cpu, CPU, m) { m.impl("few_rows_mm", few_rows_mm); }
