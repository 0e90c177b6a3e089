// What the attention kernels share: the [B, H, L, D] float32 views they read (q, k and v, the
// head dimension contiguous) and the checks of those inputs.
#pragma once

#include <ATen/ATen.h>

namespace wedlm_heads {

// Data pointer and strides (in floats) of a [B, H, L, D] tensor whose last dimension is contiguous.
struct HeadView {
  const float* data;
  int64_t batch, head, row;
  explicit HeadView(const at::Tensor& t)
      : data(t.data_ptr<float>()), batch(t.stride(0)), head(t.stride(1)), row(t.stride(2)) {}
};

// q [B, Hq, Lq, D] and k, v [B, Hkv, Lk, D], float32, the head dimension contiguous, Hq a multiple
// of Hkv; errors name the operator.
inline void check_qkv(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat,
              op, ": q, k and v must be float32");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, ": q, k and v must be 4-D [B, H, L, D]");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              op, ": the head dimension of q, k and v must be contiguous");
  TORCH_CHECK(k.size(0) == q.size(0) && v.sizes() == k.sizes() && k.size(3) == q.size(3) && k.size(1) >= 1 &&
                  q.size(1) % k.size(1) == 0,
              op, ": k and v must be [B, Hkv, Lk, D] with Hq a multiple of Hkv");
}

}  // namespace wedlm_heads
