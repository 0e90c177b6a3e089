// wedlm_cpu::few_rows_mm: x[M, K] @ W^T (+ bias) for the matmuls of decode windows and short
// prefills (M from 1 to a few hundred rows), on W [N, K] packed in column panels (`pack_panels`
// in fast_model.py): panel p holds columns 16 p .. 16 p + 15 as K rows of 16 floats, one contiguous
// block, so that a tile reads its weights as one sequential stream of whole cache lines. oneDNN's
// prepacked matmul ran the shipped model's 16-row step matmuls at 45-100 GFLOP/s on a Zen 4 core (a
// fixed cost of several microseconds per call, against 11 us of arithmetic for the 192x192
// o_proj). Contiguous panels matter: the same loop reading a transposed [K, N] weight, whose rows
// are N floats apart, was no faster than oneDNN inside a step, where the model's 16 MB of weights
// come from L3; on a Zen 3 core (AVX2), 16-column tiles reading 64-column panels (a cache line out
// of every four per row) took 1.4x the time of 16-column panels over the model's matmuls.
//
// Each tile keeps MR rows x NV vectors of y in registers and walks k = 0..K-1 once: load NV vectors
// of the panel's row k, broadcast x[r, k], one FMA per accumulator. With AVX-512 a tile is up to 16
// rows x one zmm (16 accumulators of 32 registers, each weight vector loaded once for 16 FMAs with
// the row's value as an embedded broadcast), so a 16-row window streams each weight once per step;
// 6 rows x 4 zmm over 64-column panels read every weight three times (6 + 5 + 5 rows), the first
// pass waiting on L3 and the others on the FMA units, and took 1.4x the time of the whole model's
// matmuls at 16 rows on a Xeon with AMX (1.5x at 8). With AVX2's 16 registers a tile is 6 rows x
// 2 ymm (12 accumulators), so a panel is read in blocks of up to 6 rows; the blocks after the
// first, which read it from L1, bring the next panel into L2 meanwhile (`Fetch`). One row reads 64
// columns at once (four panels, as four streams): FMA chains enough to cover the FMA latency.
// Each y[m, n] is thus one FMA chain over k in order, the order oneDNN's brgemm kernel also uses
// when K fits one of its blocks (K <= 512 here): the shipped model's results are bit-identical to
// oneDNN's (`test_native.py`), on any vector width.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "simd.h"

namespace {

using namespace wedlm_simd;

constexpr int64_t PANEL = 16;  // columns of a panel; every N is a multiple of 16
constexpr int PANEL_VECTORS = PANEL / LANES;
// rows of a tile: 16 with AVX-512's 32 registers (one vector per row), 6 otherwise
constexpr int MAX_ROWS = LANES == 16 ? 16 : 6;
// AVX-512 tiles read x k-major (`pack_blocks`): 16 rows K floats apart would need 16 address
// registers, and GCC kept them in vector registers, moving each back before its FMA (one port-0
// uop per FMA). 6-row AVX2 tiles read x as it is (packing it cost 2-5% there).
constexpr bool PACK_X = MAX_ROWS > 6;
// columns of a one-row tile: 64 (32 with 4-float vectors, whose 16 registers hold 8 accumulators)
constexpr int64_t ROW_COLUMNS = LANES == 4 ? 32 : 64;
// The first tile over a panel (its first row block) asks for the panel's row k + AHEAD while it
// reads row k: the weights come from L3 or memory once per step, and the hardware prefetcher left
// the first block waiting on them (on a Zen 3 core the model's matmuls at 16 rows took 1.16x the
// time without it, at 2 rows 1.37x; on a Xeon with AMX 1.1x at 16 and 8 rows; 32-256 rows ahead
// within noise).
constexpr int64_t AHEAD = 64;

// What a tile asks the caches for while it reads its panel:
// - AHEAD_L1: the first block over a panel asks for row k + AHEAD of what it reads (into L1).
// - NEXT_L2: a later block, which reads the panel from L1, asks for one of its share of the next
//   panel's rows into L2 every `period` rows it reads (the blocks after the first split the next
//   panel's rows by remainder). With AVX2's 6-row tiles a 16-row window reads each panel in three
//   blocks; the first then found its panel in L2 instead of L3. The whole `wedlm` step on the
//   shipped model took 0.88-0.91x the time on a Zen 3 core (one answer per variant in turn, 200
//   answers). Two panels ahead: 0.93x; into L1: 0.89x where L2 gave 0.78x (a noisier run). AVX2
//   builds only (`row_blocks`).
enum class Fetch { NONE, AHEAD_L1, NEXT_L2 };

// y[0:MR, n0:n0 + NV LANES] = x[0:MR, :] @ the columns at w (+ bias[n0:...]): vector v of row k at
// w + k PANEL + (v / PANEL_VECTORS) K PANEL + (v % PANEL_VECTORS) LANES, so NV vectors may span
// several panels. x: the block's rows, x[k MR + r] when `PACK_X`, else x[r K + k]; y's rows are N
// floats apart.
// `next`, `period`: the first next-panel row this tile asks for, and every how many rows (NEXT_L2).
template <int MR, int NV, Fetch FETCH>
void tile(const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t N,
          int64_t n0, const float* next = nullptr, int64_t period = 1) {
  int64_t countdown = period, fetched = 0;  // next-panel rows past `next` asked for so far
  vf acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = splat(0.f);
  for (int64_t k = 0; k < K; ++k, w += PANEL) {
    if (FETCH == Fetch::AHEAD_L1)  // one cache line (16 floats) of each panel the tile reads
#pragma GCC unroll 16
      for (int v = 0; v < NV; v += PANEL_VECTORS) __builtin_prefetch(w + AHEAD * PANEL + (v / PANEL_VECTORS) * K * PANEL);
    if (FETCH == Fetch::NEXT_L2 && --countdown == 0) {  // one line of the next panel, into L2
      countdown = period;
      __builtin_prefetch(next + fetched * PANEL, 0, 2);  // a row < K: K / period prefetches, from row < period
      fetched += period;
    }
    vf b[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v)
      b[v] = *(const vf*)(w + (v / PANEL_VECTORS) * K * PANEL + (v % PANEL_VECTORS) * LANES);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const float a = PACK_X ? x[k * MR + r] : x[r * K + k];
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] += a * b[v];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      vf out = acc[r][v];
      if (bias) out += *(const vf*)(bias + n0 + LANES * v);
      *(vf*)(y + r * N + n0 + LANES * v) = out;
    }
}

// One tile of `rows` (1 to MAX_ROWS) rows: tile<MR> for MR = rows, found by counting up.
template <int NV, Fetch FETCH, int MR = 1>
void tile_of(int64_t rows, const float* x, int64_t K, const float* w, const float* bias, float* y, int64_t N,
             int64_t n0, const float* next = nullptr, int64_t period = 1) {
  if constexpr (MR < MAX_ROWS) {
    if (rows > MR) return tile_of<NV, FETCH, MR + 1>(rows, x, K, w, bias, y, N, n0, next, period);
  }
  tile<MR, NV, FETCH>(x, K, w, bias, y, N, n0, next, period);
}

// M rows go in blocks of at most `most` (MAX_ROWS for float32 tiles), as even as they go (16 rows
// with 6-row tiles: 6 + 5 + 5), so that no block runs far below the FMA rate.
int64_t block_count(int64_t M, int64_t most = MAX_ROWS) { return (M + most - 1) / most; }
int64_t block_rows(int64_t M, int64_t blocks, int64_t b) { return M / blocks + (b < M % blocks ? 1 : 0); }

#if defined(__AVX512F__)
// r[j] lane i <- r[i] lane j: the 16 x 16 block of 32-bit values in r transposed (moves only)
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {  // pairs of rows interleaved
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // then pairs of pairs, 64 bits at a time
    const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // then 128-bit quarters, twice
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
}
#endif

// x [M, K] (rows K values apart) as the tiles read it: block after block (of at most `most` rows),
// the block whose first row is m at out + m K, each as K groups of its rows' values (k-major). A
// value is a float, or for bf16 tiles a pair of bf16 (K pairs a row). With AVX-512, blocks of up
// to 16 rows go 16 values of k at a time through a transpose in registers: packed a value at a
// time, the shipped model's 16 x 1088 values a layer cost ~3% of its 16-row step (a 16-row call
// over K = 192 takes 2.8 us this way, 3.7 a value at a time, on a Xeon core).
template <typename T>
void pack_blocks(const T* x, int64_t M, int64_t K, T* out, int64_t most = MAX_ROWS) {
  static_assert(sizeof(T) == 4, "pack_blocks moves 32-bit values");
  const int64_t blocks = block_count(M, most);
  for (int64_t b = 0, m = 0; b < blocks; ++b) {
    const int64_t rows = block_rows(M, blocks, b);
    T* o = out + m * K;
    int64_t k0 = 0;
#if defined(__AVX512F__)
    if (rows <= 16) {
      const float* xf = reinterpret_cast<const float*>(x + m * K);
      float* of = reinterpret_cast<float*>(o);
      const __mmask16 lanes = static_cast<__mmask16>((1u << rows) - 1);
      for (; k0 + 16 <= K; k0 += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_loadu_ps(xf + i * K + k0) : _mm512_setzero_ps();
        transpose16(r);
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) _mm512_mask_storeu_ps(of + (k0 + j) * rows, lanes, r[j]);
      }
    }
#endif
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = k0; k < K; ++k) o[k * rows + r] = x[(m + r) * K + k];
    m += rows;
  }
}

// Where a call packs its rows: up to PACKED_KEPT values (1 MB) in a buffer the calling thread keeps
// from call to call (a decode window's rows: 16 x 192-512 floats for the shipped model), more in
// one of the call's own: a buffer per call costs a malloc and a free of 12-32 KB on every matmul.
// Each thread that calls the operator keeps at most one such buffer per value type.
constexpr int64_t PACKED_KEPT = int64_t{1} << 18;

template <typename T>
struct PackedRows {
  std::vector<T> own;
  T* get(int64_t n) {
    if (n > PACKED_KEPT) {
      own.resize(n);
      return own.data();
    }
    thread_local std::vector<T> kept;
    if (static_cast<int64_t>(kept.size()) < n) kept.resize(n);
    return kept.data();
  }
};

// Columns n0..n0 + NV LANES (at w) of rows 0..M-1 (x as `tile` reads it), a row block at a time:
// the first block prefetches ahead in its panel, the others the next panel (if any: `Fetch`).
template <int NV>
void row_blocks(const float* x, int64_t M, int64_t K, const float* w, const float* bias, float* y, int64_t N,
                int64_t n0) {
  const int64_t blocks = block_count(M);
  // NV LANES = PANEL: one panel a tile. Measured on an AVX2 core only: AVX-512 tiles take a 16-row
  // window in one block, and wider windows there (or 4-float vectors) keep the plain blocks.
  const bool next_panel = LANES == 8 && n0 + PANEL < N;
  for (int64_t b = 0, m = 0; b < blocks; ++b) {
    const int64_t rows = block_rows(M, blocks, b);
    if (b == 0) {
      tile_of<NV, Fetch::AHEAD_L1>(rows, x + m * K, K, w, bias, y + m * N, N, n0);
    } else if (next_panel) {
      tile_of<NV, Fetch::NEXT_L2>(rows, x + m * K, K, w, bias, y + m * N, N, n0, w + K * PANEL + (b - 1) * PANEL,
                                  blocks - 1);
    } else {
      tile_of<NV, Fetch::NONE>(rows, x + m * K, K, w, bias, y + m * N, N, n0);
    }
    m += rows;
  }
}

// Columns [c0, c1) (multiples of ROW_COLUMNS, or c1 = N): one row ROW_COLUMNS at a time while
// they are whole; else each panel as one tile column.
void columns(const float* x, int64_t M, int64_t K, const float* packed, int64_t N, const float* bias, float* y,
             int64_t c0, int64_t c1) {
  int64_t n0 = c0;
  if (M == 1)
    for (; n0 + ROW_COLUMNS <= c1; n0 += ROW_COLUMNS)
      tile<1, ROW_COLUMNS / LANES, Fetch::AHEAD_L1>(x, K, packed + n0 * K, bias, y, N, n0);
  for (; n0 < c1; n0 += PANEL) row_blocks<PANEL_VECTORS>(x, M, K, packed + n0 * K, bias, y, N, n0);
}


// bf16 panels (`pack_panels` of a bf16 weight): panel p holds columns 16 p .. 16 p + 15 as K / 2 rows
// of 16 column pairs (w[n, 2 j], w[n, 2 j + 1]), one zmm per row, for AVX512-BF16's `vdpbf16ps`,
// which adds the products of one such pair and a pair of x into each float32 accumulator. What
// `torch.autocast` makes of a float32 model's matmuls on a CPU with bf16 units (bf16 inputs and
// weights, float32 sums, bf16 outputs), reading half the bytes of float32 panels: oneDNN's
// one-row bf16 matmuls streamed SmolLM2-135M's weights at ~9 GB/s on a Xeon with AMX, slower than
// the float32 panels, and took 82% of its bf16 `ar` step. Tiles are those of the float32 kernel
// with a k-pair in place of a k, over four panels at once for up to 4 rows, two for up to 8 (a
// 16-row tile over one panel left the core half idle there), one for up to 16. Sums are
// float32 in another order than oneDNN's, so an output may differ from torch's by one bf16 unit.
//
// Compilers before GCC 10 and Clang 9 know no AVX512-BF16: there the operator refuses bf16 panels
// (`fast_model.bf16_panels_supported` tries it) and the float32 operators build as before.
#if defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 9 : __GNUC__ >= 10)
#define WEDLM_BF16_KERNEL 1
#define WEDLM_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

// Out: uint16_t (bf16 outputs, rounded to nearest even) or float (the float32 sums as they are)
template <int MR, int NP, bool FETCH, typename Out>
WEDLM_BF16 void tile_bf16(const uint32_t* x, int64_t KP, const uint16_t* w, const float* bias, Out* y,
                          int64_t N, int64_t n0) {
  __m512 acc[MR][NP];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NP; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < KP; ++kp, w += 2 * PANEL) {
    __m512i b[NP];
#pragma GCC unroll 16
    for (int v = 0; v < NP; ++v) {
      if (FETCH) __builtin_prefetch(w + AHEAD * 2 * PANEL + v * KP * 2 * PANEL);
      b[v] = _mm512_loadu_si512(w + v * KP * 2 * PANEL);
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512i a = _mm512_set1_epi32((int)(MR > 1 ? x[kp * MR + r] : x[kp]));
#pragma GCC unroll 16
      for (int v = 0; v < NP; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)a, (__m512bh)b[v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NP; ++v) {
      __m512 out = acc[r][v];
      if (bias) out = _mm512_add_ps(out, _mm512_loadu_ps(bias + n0 + PANEL * v));
      if constexpr (std::is_same_v<Out, float>) {
        _mm512_storeu_ps(y + r * N + n0 + PANEL * v, out);
      } else {
        _mm256_storeu_si256((__m256i*)(y + r * N + n0 + PANEL * v), (__m256i)_mm512_cvtneps_pbh(out));
      }
    }
}

template <int NP, bool FETCH, typename Out, int MR = 1>
WEDLM_BF16 void tile_bf16_of(int64_t rows, const uint32_t* x, int64_t KP, const uint16_t* w, const float* bias,
                             Out* y, int64_t N, int64_t n0) {
  if constexpr (MR < 16 / NP) {
    if (rows > MR) return tile_bf16_of<NP, FETCH, Out, MR + 1>(rows, x, KP, w, bias, y, N, n0);
  }
  tile_bf16<MR, NP, FETCH, Out>(x, KP, w, bias, y, N, n0);
}

// rows in blocks of at most 16 / NP (as even as they go), each block over NP panels at a time
template <int NP, typename Out>
WEDLM_BF16 void columns_bf16(const uint32_t* x, int64_t M, int64_t KP, const uint16_t* packed, int64_t N,
                             const float* bias, Out* y, int64_t c0, int64_t c1) {
  const int64_t blocks = block_count(M, 16 / NP);
  for (int64_t n0 = c0; n0 < c1; n0 += NP * PANEL)
    for (int64_t b = 0, m = 0; b < blocks; ++b) {
      const int64_t rows = block_rows(M, blocks, b);
      const uint16_t* w = packed + n0 * KP * 2;
      if (b == 0) {
        tile_bf16_of<NP, true, Out>(rows, x + m * KP, KP, w, bias, y + m * N, N, n0);
      } else {
        tile_bf16_of<NP, false, Out>(rows, x + m * KP, KP, w, bias, y + m * N, N, n0);
      }
      m += rows;
    }
}
#endif

// x [M, K] @ the bf16 panels: x bf16 -> bf16 [M, N] (autocast's matmul); x float32 -> x rounded to
// bf16 (nearest even, as torch casts), float32 [M, N] (bf16 weights with float32 activations: the
// sums are not rounded)
at::Tensor few_rows_mm_bf16(const at::Tensor& x, const at::Tensor& panels_w, int64_t N, const float* bias) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              "few_rows_mm: bf16 panels need a bf16 or float32 x, got ", x.scalar_type());
  const int64_t K = x.size(1);
  TORCH_CHECK(K % 2 == 0, "few_rows_mm: bf16 panels need an even K, got ", K);
#if defined(WEDLM_BF16_KERNEL)
  TORCH_CHECK(__builtin_cpu_supports("avx512bf16"), "few_rows_mm: bf16 panels need a CPU with AVX512-BF16");
  const bool float_out = x.scalar_type() == at::kFloat;
  const at::Tensor rows = x.to(at::kBFloat16).contiguous();
  const int64_t M = rows.size(0), KP = K / 2;
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(rows.data_ptr());
  // panels a tile reads at once: every row block of M <= 16 / NP rows is then one block, so the
  // leftover panels (one at a time, blocks of up to 16 rows) read the same packing
  const int NP = M <= 4 ? 4 : M <= 8 ? 2 : 1;
  PackedRows<uint32_t> packed_x;  // k-pair-major blocks of the tiles' rows
  if (M > 1) {
    uint32_t* out = packed_x.get(M * KP);
    pack_blocks(xp, M, KP, out, 16 / NP);
    xp = out;
  }
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(panels_w.data_ptr());
  auto run = [&](auto* yp) {
    // N is a multiple of 16 but maybe not of 4 panels: the last run of columns takes the leftover
    // panels one at a time with the same rows
    at::parallel_for(0, (N + 4 * PANEL - 1) / (4 * PANEL), 1, [&](int64_t begin, int64_t end) {
      const int64_t c0 = begin * 4 * PANEL, c1 = std::min(N, end * 4 * PANEL), whole = c0 + (c1 - c0) / (NP * PANEL) * NP * PANEL;
      if (NP == 4) columns_bf16<4>(xp, M, KP, wp, N, bias, yp, c0, whole);
      if (NP == 2) columns_bf16<2>(xp, M, KP, wp, N, bias, yp, c0, whole);
      if (NP == 1) columns_bf16<1>(xp, M, KP, wp, N, bias, yp, c0, whole);
      columns_bf16<1>(xp, M, KP, wp, N, bias, yp, whole, c1);
    });
  };
  if (float_out) {
    run(y.data_ptr<float>());
  } else {
    run(reinterpret_cast<uint16_t*>(y.data_ptr()));
  }
  return y;
#else
  TORCH_CHECK(false, "few_rows_mm: bf16 panels need an x86-64 CPU with AVX512-BF16 and a compiler that knows it");
#endif
}

at::Tensor few_rows_mm(const at::Tensor& x, const at::Tensor& panels_w, int64_t N, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(panels_w.scalar_type() == at::kFloat || panels_w.scalar_type() == at::kBFloat16,
              "few_rows_mm: panels must be float32 or bfloat16, got ", panels_w.scalar_type());
  TORCH_CHECK(x.scalar_type() == panels_w.scalar_type() || (x.scalar_type() == at::kFloat && panels_w.scalar_type() == at::kBFloat16),
              "few_rows_mm: x (", x.scalar_type(), ") must have the panels' dtype (", panels_w.scalar_type(),
              "), or be float32 with bf16 panels");
  TORCH_CHECK(x.dim() == 2, "few_rows_mm: x must be [M, K], got ", x.sizes());
  const int64_t K = x.size(1);
  TORCH_CHECK(N > 0 && N % PANEL == 0, "few_rows_mm: N must be a positive multiple of 16, got ", N);
  TORCH_CHECK(panels_w.is_contiguous() && panels_w.numel() == N * K,
              "few_rows_mm: panels must be a contiguous packing of N x K = ", N * K, " values, got ", panels_w.numel());
  const float* bp = nullptr;
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->numel() == N, "few_rows_mm: bias must be ",
                x.scalar_type() == at::kFloat ? "float32" : "bfloat16", " [N = ", N, "] (x's dtype)");
    b = bias->to(at::kFloat).contiguous();  // bf16 outputs add the bias to the float32 sums
    bp = b.data_ptr<float>();
  }
  if (panels_w.scalar_type() == at::kBFloat16) return few_rows_mm_bf16(x, panels_w, N, bp);
  const at::Tensor rows = x.contiguous();
  const int64_t M = rows.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0) return y;
  const float* xp = rows.data_ptr<float>();
  PackedRows<float> packed_x;  // one row is its own packing
  if (PACK_X && M > 1) {
    float* out = packed_x.get(M * K);
    pack_blocks(xp, M, K, out);
    xp = out;
  }
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
}

TORCH_LIBRARY_IMPL(wedlm_cpu, CPU, m) { m.impl("few_rows_mm", few_rows_mm); }
