// What the attention kernels share: the [B, H, L, D] float32 views they read (q, k and v, the
// head dimension contiguous) and the checks of those inputs.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <optional>

namespace wedlm_heads {

// Data pointer and strides (in floats) of a [B, H, L, D] tensor whose last dimension is contiguous.
struct HeadView {
  const float* data;
  int64_t batch, head, row;
  explicit HeadView(const at::Tensor& t)
      : data(t.data_ptr<float>()), batch(t.stride(0)), head(t.stride(1)), row(t.stride(2)) {}
};

// Where the keys (or values) of sequence b and KV head g lie: a [B, Hkv, Lk, D] tensor, or the rows
// of a paged cache [S, Hkv, D] named by a slot table [B, Lk] (key j of sequence b is cache row
// slots[b, j]), read in place instead of gathered into a [B, Hkv, Lk, D] copy first.
struct KeyView {
  const float* data;
  int64_t batch, head, row;
  const int64_t* slots = nullptr;
  int64_t keys = 0;
  explicit KeyView(const at::Tensor& t)
      : data(t.data_ptr<float>()), batch(t.stride(0)), head(t.stride(1)), row(t.stride(2)) {}
  KeyView(const at::Tensor& cache, const at::Tensor& table)
      : data(cache.data_ptr<float>()), batch(0), head(cache.stride(1)), row(cache.stride(0)),
        slots(table.data_ptr<int64_t>()), keys(table.size(1)) {}
  const float* at(int64_t b, int64_t g, int64_t j) const {
    return slots != nullptr ? data + slots[b * keys + j] * row + g * head : data + b * batch + g * head + j * row;
  }
};

// `t` (k or v, checked by `key_shape`) as a `KeyView`: read through `slots` when given, else as a
// [B, Hkv, Lk, D] tensor.
inline KeyView key_view(const at::Tensor& t, const std::optional<at::Tensor>& slots) {
  return slots.has_value() && slots->defined() ? KeyView(t, *slots) : KeyView(t);
}

// k and v as `KeyView`s: [B, Hkv, Lk, D] tensors (`slots` none), or caches [S, Hkv, D] (float32,
// the head dimension contiguous, the same shape) read through `slots` (int64 [B, Lk], contiguous,
// every entry in 0..S-1); errors name the operator. Returns (B, Hkv, Lk, D) of the keys.
inline std::array<int64_t, 4> key_shape(const char* op, const at::Tensor& k, const at::Tensor& v,
                                        const std::optional<at::Tensor>& slots) {
  TORCH_CHECK(k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat, op, ": k and v must be float32");
  if (!slots.has_value() || !slots->defined()) {
    TORCH_CHECK(k.dim() == 4 && v.sizes() == k.sizes() && k.stride(3) == 1 && v.stride(3) == 1,
                op, ": k and v must be [B, Hkv, Lk, D] with the head dimension contiguous");
    return {k.size(0), k.size(1), k.size(2), k.size(3)};
  }
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes() && k.stride(2) == 1 && v.stride(2) == 1 && k.stride(0) == v.stride(0) &&
                  k.stride(1) == v.stride(1),
              op, ": with slots, k and v must be caches [S, Hkv, D] laid out alike, the head dimension contiguous");
  TORCH_CHECK(slots->scalar_type() == at::kLong && slots->dim() == 2 && slots->is_contiguous() && slots->size(1) >= 1,
              op, ": slots must be a contiguous int64 [B, Lk] table with Lk >= 1");
  const int64_t* s = slots->data_ptr<int64_t>();
  const int64_t n = slots->numel(), rows = k.size(0);
  bool inside = true;
  for (int64_t i = 0; i < n; ++i) inside = inside && s[i] >= 0 && s[i] < rows;
  TORCH_CHECK(inside, op, ": every slot must name a cache row in 0..", rows - 1);
  return {slots->size(0), k.size(1), slots->size(1), k.size(2)};
}

// q [B, Hq, Lq, D] (float32, the head dimension contiguous) against keys and values as `key_shape`
// takes them, Hq a multiple of Hkv; errors name the operator. Returns (B, Hkv, Lk, D) of the keys.
inline std::array<int64_t, 4> check_qkv(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const std::optional<at::Tensor>& slots = std::nullopt) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.dim() == 4 && q.stride(3) == 1,
              op, ": q must be float32 [B, Hq, Lq, D] with the head dimension contiguous");
  const auto kv = key_shape(op, k, v, slots);
  TORCH_CHECK(kv[0] == q.size(0) && kv[3] == q.size(3) && kv[1] >= 1 && q.size(1) % kv[1] == 0,
              op, ": k and v must hold [B, Hkv, Lk, D] keys with Hq a multiple of Hkv");
  return kv;
}

}  // namespace wedlm_heads
