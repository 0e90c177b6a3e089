// Float vectors of the build's native width (GCC vector extensions) and their exponential.
// `native.py` builds the library once per instruction set (-mavx512f, -mavx2 -mfma, or none) and
// loads the build the CPU can run, so a vector here is always a register of that set: 16 floats
// with AVX-512, 8 with AVX2, 4 otherwise (SSE2, NEON). A vector wider than the registers (GCC
// lowers a 64-byte vector on AVX2 to two halves kept in memory) ran `few_rows_mm` at 7.5
// GFLOP/s on a Zen 3 core, against ~90 at the native width.
#pragma once

#include <cstdint>

// -DWEDLM_LANES=16 on a smaller instruction set builds the AVX-512 layouts with GCC's lowered
// vectors: slow, but it runs the AVX-512 code paths on any CPU (`test_native.py`)
#if !defined(WEDLM_LANES)
#if defined(__AVX512F__)
#define WEDLM_LANES 16
#elif defined(__AVX__)
#define WEDLM_LANES 8
#else
#define WEDLM_LANES 4
#endif
#endif

namespace wedlm_simd {

// aligned(4): loads and stores through a cast pointer need no 64-byte alignment
typedef float vf __attribute__((vector_size(WEDLM_LANES * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(WEDLM_LANES * 4), aligned(4)));

constexpr int64_t LANES = WEDLM_LANES;

inline vf splat(float x) { return vf{} + x; }

// The sum of x's lanes: lane l + LANES / 2 added to lane l, then the upper quarter, and so on.
inline float horizontal_sum(vf x) {
#if WEDLM_LANES == 16
  x += __builtin_shuffle(x, vi{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
  x += __builtin_shuffle(x, vi{4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3});
  x += __builtin_shuffle(x, vi{2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1});
  x += __builtin_shuffle(x, vi{1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0});
#elif WEDLM_LANES == 8
  x += __builtin_shuffle(x, vi{4, 5, 6, 7, 0, 1, 2, 3});
  x += __builtin_shuffle(x, vi{2, 3, 0, 1, 2, 3, 0, 1});
  x += __builtin_shuffle(x, vi{1, 0, 1, 0, 1, 0, 1, 0});
#else
  x += __builtin_shuffle(x, vi{2, 3, 0, 1});
  x += __builtin_shuffle(x, vi{1, 0, 1, 0});
#endif
  return x[0];
}

// exp(x) for x <= 0 (scores minus their maximum), Cephes' expf polynomial (degree 6, ~1 ulp);
// below -87 it returns ~0.
inline vf exp_nonpositive(vf x) {
  x = x < splat(-87.0f) ? splat(-87.0f) : x;
  const vf t = x * 1.44269504088896341f + 0.5f;  // n = floor(x * log2(e) + 0.5)
  vf n = __builtin_convertvector(__builtin_convertvector(t, vi), vf);
  n = n > t ? n - 1.0f : n;
  vf r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  vf scale;
  __builtin_memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

}  // namespace wedlm_simd
