// wedlm_cpu::few_rows_mm: x[M, K] @ W^T (+ bias) for the matmuls of decode windows and short
// prefills (M from 1 to a few hundred rows), on W [N, K] packed in column panels (`pack_panels`
// in fast_model.py): panel p holds columns PANEL p .. PANEL (p + 1) - 1 as K rows of PANEL floats,
// one contiguous block (the last panel is N % PANEL wide when N is not a multiple of PANEL).
// PANEL is 64 columns with AVX-512 and 16 otherwise (`panel_columns`): the tile's width, so that
// each tile reads its weights as one sequential stream. oneDNN's prepacked matmul ran the shipped
// model's 16-row step matmuls at 45-100 GFLOP/s on a Zen 4 core (a fixed cost of several
// microseconds per call, against 11 us of arithmetic for the 192x192 o_proj); this loop runs them
// at ~113, the core's FMA rate. Contiguous panels matter: the same loop reading a transposed
// [K, N] weight, whose rows are N floats apart, was no faster than oneDNN inside a step, where the
// model's 16 MB of weights come from L3 (one page per row read); on a Zen 3 core (AVX2), 16-column
// tiles reading 64-column panels (a cache line out of every four per row) took 1.4x the time of
// 16-column panels over the whole model's matmuls at 16 rows.
//
// Each tile keeps MR rows x NV vectors of y in registers (6 x 4 = 24 zmm, 64 columns, with AVX-512's
// 32 registers; 6 x 2 = 12 ymm, 16 columns, with AVX2's 16) and walks k = 0..K-1 once: load NV
// vectors of the panel's row k, broadcast x[r, k], one FMA per accumulator. One row reads 64
// columns at once (four 16-column panels with AVX2, as four streams): FMA chains enough to cover
// the FMA latency. Each y[m, n] is thus one FMA chain over k in order, the order oneDNN's brgemm
// kernel also uses when K fits one of its blocks (K <= 512 here): the shipped model's results are
// bit-identical to oneDNN's (`test_native.py`), on any vector width.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "simd.h"

namespace {

using namespace wedlm_simd;

constexpr int64_t PANEL = LANES == 16 ? 64 : 16;  // columns of a full panel
constexpr int64_t STRIP = 16;                        // every N is a multiple of 16
constexpr int PANEL_VECTORS = PANEL / LANES;
constexpr int STRIP_VECTORS = STRIP / LANES;
// columns of a one-row tile: 64 (32 with 4-float vectors, whose 16 registers hold 8 accumulators)
constexpr int64_t ROW_COLUMNS = LANES == 4 ? 32 : 64;
// The first tile over a panel (its first row block) asks for the panel's row k + AHEAD while it
// reads row k: the weights come from L3 or memory once per step, and on a Zen 3 core the hardware
// prefetcher left the first block waiting on them (the shipped model's matmuls at 16 rows took
// 1.16x the time without it, at 2 rows 1.37x; 32-96 rows ahead within 5%). AVX-512 builds, whose
// 64-column panel rows are four cache lines each, are not measured with it and do not ask.
constexpr bool PREFETCH = LANES < 16;
constexpr int64_t AHEAD = 64;

// y[0:MR, n0:n0 + NV LANES] = x[0:MR, :] @ the columns at w (+ bias[n0:...]): vector v of row k at
// w + k ldw + (v / PANEL_VECTORS) K PANEL + (v % PANEL_VECTORS) LANES, so NV vectors may span
// several panels. Rows of x are K floats apart, y's rows N floats.
template <int MR, int NV, bool FETCH>
void tile(const float* x, int64_t K, const float* w, int64_t ldw, const float* bias, float* y, int64_t N,
          int64_t n0) {
  vf acc[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = splat(0.f);
  for (int64_t k = 0; k < K; ++k, w += ldw) {
    if (FETCH && PREFETCH)  // one cache line (16 floats) of each panel the tile reads
#pragma GCC unroll 16
      for (int v = 0; v < NV; v += STRIP_VECTORS)
        __builtin_prefetch(w + AHEAD * ldw + (v / PANEL_VECTORS) * K * PANEL + (v % PANEL_VECTORS) * LANES);
    vf b[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v)
      b[v] = *(const vf*)(w + (v / PANEL_VECTORS) * K * PANEL + (v % PANEL_VECTORS) * LANES);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const float a = x[r * K + k];
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      vf out = acc[r][v];
      if (bias) out += *(const vf*)(bias + n0 + LANES * v);
      *(vf*)(y + r * N + n0 + LANES * v) = out;
    }
}

// One tile of 1 to 6 rows.
template <int NV, bool FETCH>
void tile_of(int64_t rows, const float* x, int64_t K, const float* w, int64_t ldw, const float* bias, float* y,
             int64_t N, int64_t n0) {
  switch (rows) {
    case 1: return tile<1, NV, FETCH>(x, K, w, ldw, bias, y, N, n0);
    case 2: return tile<2, NV, FETCH>(x, K, w, ldw, bias, y, N, n0);
    case 3: return tile<3, NV, FETCH>(x, K, w, ldw, bias, y, N, n0);
    case 4: return tile<4, NV, FETCH>(x, K, w, ldw, bias, y, N, n0);
    case 5: return tile<5, NV, FETCH>(x, K, w, ldw, bias, y, N, n0);
    default: return tile<6, NV, FETCH>(x, K, w, ldw, bias, y, N, n0);
  }
}

// Columns n0..n0 + NV LANES (at w, rows ldw apart) of rows 0..M-1, in row blocks of at most 6 and as
// even as they go (16 rows: 6 + 5 + 5, 8 rows: 4 + 4), so that no block runs far below the FMA rate;
// the first block prefetches (`PREFETCH`).
template <int NV>
void row_blocks(const float* x, int64_t M, int64_t K, const float* w, int64_t ldw, const float* bias, float* y,
                int64_t N, int64_t n0) {
  const int64_t blocks = (M + 5) / 6, base = M / blocks, longer = M % blocks;
  for (int64_t b = 0, m = 0; b < blocks; ++b) {
    const int64_t rows = base + (b < longer ? 1 : 0);
    if (b == 0) {
      tile_of<NV, true>(rows, x + m * K, K, w, ldw, bias, y + m * N, N, n0);
    } else {
      tile_of<NV, false>(rows, x + m * K, K, w, ldw, bias, y + m * N, N, n0);
    }
    m += rows;
  }
}

// Columns [c0, c1) (multiples of ROW_COLUMNS, or c1 = N): one row ROW_COLUMNS at a time while
// they are whole; else each panel as one tile column, a narrower last panel in 16-column strips.
void columns(const float* x, int64_t M, int64_t K, const float* packed, int64_t N, const float* bias, float* y,
             int64_t c0, int64_t c1) {
  int64_t n0 = c0;
  if (M == 1)
    for (; n0 + ROW_COLUMNS <= c1; n0 += ROW_COLUMNS)
      tile<1, ROW_COLUMNS / LANES, true>(x, K, packed + n0 * K, PANEL, bias, y, N, n0);
  for (; n0 < c1; n0 += PANEL) {
    const int64_t width = std::min(PANEL, N - n0);
    const float* w = packed + n0 * K;
    if (width == PANEL) {
      row_blocks<PANEL_VECTORS>(x, M, K, w, PANEL, bias, y, N, n0);
    } else {
      for (int64_t c = 0; c < width; c += STRIP) row_blocks<STRIP_VECTORS>(x, M, K, w + c, width, bias, y, N, n0 + c);
    }
  }
}

int64_t panel_columns() { return PANEL; }

at::Tensor few_rows_mm(const at::Tensor& x, const at::Tensor& panels_w, int64_t N, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && panels_w.scalar_type() == at::kFloat,
              "few_rows_mm: x and panels must be float32");
  TORCH_CHECK(x.dim() == 2, "few_rows_mm: x must be [M, K], got ", x.sizes());
  const int64_t K = x.size(1);
  TORCH_CHECK(N > 0 && N % STRIP == 0, "few_rows_mm: N must be a positive multiple of 16, got ", N);
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
  // threads (if any) take runs of ROW_COLUMNS columns (whole panels)
  at::parallel_for(0, (N + ROW_COLUMNS - 1) / ROW_COLUMNS, 1, [&](int64_t begin, int64_t end) {
    columns(xp, M, K, wp, N, bp, yp, begin * ROW_COLUMNS, std::min(N, end * ROW_COLUMNS));
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(wedlm_cpu, m) {
  m.def("few_rows_mm(Tensor x, Tensor panels, int N, Tensor? bias) -> Tensor");
  // the panel width `few_rows_mm` reads (`fast_model.pack_panels` packs with it)
  m.def("panel_columns() -> int", panel_columns);
}

TORCH_LIBRARY_IMPL(wedlm_cpu, CPU, m) { m.impl("few_rows_mm", few_rows_mm); }
