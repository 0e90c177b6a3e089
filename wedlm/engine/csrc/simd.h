// 16-float vectors (GCC vector extensions), their exponential, and the instruction-set variants
// of the engine's C++ kernels: GCC builds each WEDLM_CLONES function for AVX-512, AVX2+FMA and
// plain x86-64 and picks one when the library loads (`target_clones`); `flatten` inlines the
// helpers a kernel calls into each variant, so they are built for its instruction set too.
#pragma once

#include <cstdint>

// -DWEDLM_VARIANT=2 (AVX2+FMA) or =0 (plain) builds one variant alone (`test_native.py` checks the
// variants a CPU with AVX-512 never runs).
#if defined(WEDLM_VARIANT) && WEDLM_VARIANT == 2
#define WEDLM_CLONES __attribute__((target("avx2,fma"), flatten))
#elif defined(WEDLM_VARIANT)
#define WEDLM_CLONES __attribute__((flatten))
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WEDLM_CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default"), flatten))
#else
#define WEDLM_CLONES
#endif

namespace wedlm_simd {

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t i16 __attribute__((vector_size(64), aligned(4)));

constexpr int64_t LANES = 16;

inline v16 splat(float x) { return v16{} + x; }

// exp(x) for x <= 0 (scores minus their maximum), Cephes' expf polynomial (degree 6, ~1 ulp);
// below -87 it returns ~0.
inline v16 exp_nonpositive(v16 x) {
  x = x < splat(-87.0f) ? splat(-87.0f) : x;
  const v16 t = x * 1.44269504088896341f + 0.5f;  // n = floor(x * log2(e) + 0.5)
  v16 n = __builtin_convertvector(__builtin_convertvector(t, i16), v16);
  n = n > t ? n - 1.0f : n;
  v16 r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  v16 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const i16 bits = (__builtin_convertvector(n, i16) + 127) << 23;
  v16 scale;
  __builtin_memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

}  // namespace wedlm_simd
