// 16-float vectors (GCC vector extensions) and the instruction-set variants of the engine's C++
// kernels: GCC builds each WEDLM_CLONES function for AVX-512, AVX2+FMA and plain x86-64 and picks
// one when the library loads (`target_clones`); `flatten` inlines the helpers a kernel calls into
// each variant, so they are built for its instruction set too.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define WEDLM_CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default"), flatten))
#else
#define WEDLM_CLONES
#endif

namespace wedlm_simd {

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int32_t i16 __attribute__((vector_size(64), aligned(4)));

constexpr int64_t LANES = 16;

}  // namespace wedlm_simd
