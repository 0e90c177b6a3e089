// wedlm_cpu::linear: the compiled CPU graph's float32 matmul of two or more rows (and, with bf16
// panels, the bf16 matmul of `fast_model.bf16_panel_linear`, eager or compiled), as a C++ kernel:
// `few_rows_mm` on the weight's column panels for up to `few_rows_max` rows, else oneDNN on a prepacked
// weight where that pays, else at::linear. The oneDNN part in Python (`fast_model._onednn_linear_cpu`,
// what compiled graphs call where this library cannot be built) costs a call from inductor's C++
// wrapper back into the interpreter for each of a step's matmuls.
//
// A prepacked weight (oneDNN's blocked layout) cannot be a graph input, since fake tensors have no
// such layout, so the graph passes an int key; `remember` maps the key to the packed tensor
// without owning it: the module that holds the packed tensor keeps it alive, and a key whose
// tensor is gone resolves to none (the matmul then reads the plain weight).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <unordered_map>

namespace {

using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

std::mutex keys_mutex;

std::unordered_map<int64_t, WeakTensor>& keys() {
  static std::unordered_map<int64_t, WeakTensor> table;
  return table;
}

int64_t remember(const at::Tensor& packed, int64_t key) {
  std::lock_guard<std::mutex> lock(keys_mutex);
  keys().insert_or_assign(key, WeakTensor(packed.getIntrusivePtr()));
  return key;
}

at::Tensor packed_tensor(int64_t key) {
  if (key == 0) return at::Tensor();
  std::lock_guard<std::mutex> lock(keys_mutex);
  auto found = keys().find(key);
  if (found == keys().end()) return at::Tensor();
  auto strong = found->second.lock();
  if (!strong) {
    keys().erase(found);
    return at::Tensor();
  }
  return at::Tensor(std::move(strong));
}

at::Tensor linear_pointwise(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                         c10::string_view, c10::List<std::optional<at::Scalar>>,
                                         std::optional<c10::string_view>)>();
  return op.call(x, weight, bias, "none", c10::List<std::optional<at::Scalar>>(), "");
}

at::Tensor few_rows_mm(const at::Tensor& x, const at::Tensor& panels, int64_t N, const std::optional<at::Tensor>& bias);

// F.linear(x, weight, bias) by `fast_model`'s rule, whose thresholds come in as arguments:
// `few_rows_mm` on `panels` (the weight packed by `fast_model.pack_panels`, when the model has
// them) for 1 to `few_rows_max` rows (fast_model.FEW_ROWS_MAX), else oneDNN where it pays
// (`min_macs` and `min_rows`: fast_model.PACKED_MIN_MACS and ONEDNN_MIN_ROWS), else at::linear.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  const std::optional<at::Tensor>& panels, int64_t packed_key, int64_t min_macs, int64_t min_rows,
                  int64_t few_rows_max) {
  const int64_t features = x.size(-1);
  const int64_t rows = features == 0 ? 0 : x.numel() / features;
  const bool few = panels.has_value() && panels->defined() && rows >= 1 && rows <= few_rows_max;
  const at::Tensor packed = few ? at::Tensor() : packed_tensor(packed_key);
  const bool onednn = packed.defined() ? rows >= 2 && rows * weight.numel() >= min_macs : rows >= min_rows;
  if (!few && !onednn) return at::linear(x, weight, bias);
  const at::Tensor flat = x.dim() == 2 ? x : x.reshape({rows, features});
  at::Tensor out = few ? few_rows_mm(flat, *panels, weight.size(0), bias)
                       : linear_pointwise(flat, packed.defined() ? packed : weight, bias);
  if (x.dim() == 2) return out;
  auto shape = x.sizes().vec();
  shape.back() = weight.size(0);
  return out.view(shape);
}

// Matmuls bound to a key (`fast_model.bind_linears`): `bound_linear(x, key, n)` is `linear` with the
// weight, bias, panels and thresholds bound to `key`. A compiled graph then takes none of them as
// inputs: every input of inductor's C++ wrapper costs a tensor handle made, converted and freed on
// each call, and each matmul would pass three.
// The table holds its tensors until `unbind_linear`, which the owning module's finalizer calls: a
// key is unbound only once no graph of that module can run.
struct BoundLinear {
  at::Tensor weight;
  std::optional<at::Tensor> bias, panels;
  int64_t packed_key, min_macs, min_rows, few_rows_max;
};

std::mutex bound_mutex;

// entries are shared and immutable: a call keeps the entry it found, so rebinding or unbinding its
// key meanwhile (another thread) frees nothing the call reads
std::unordered_map<int64_t, std::shared_ptr<const BoundLinear>>& bound() {
  static std::unordered_map<int64_t, std::shared_ptr<const BoundLinear>> table;
  return table;
}

void bind_linear(int64_t key, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                 const std::optional<at::Tensor>& panels, int64_t packed_key, int64_t min_macs, int64_t min_rows,
                 int64_t few_rows_max) {
  TORCH_CHECK(key != 0 && weight.dim() == 2, "wedlm_cpu::bind_linear: a nonzero key and a 2-D weight");
  auto entry = std::make_shared<const BoundLinear>(
      BoundLinear{weight, bias, panels, packed_key, min_macs, min_rows, few_rows_max});
  std::lock_guard<std::mutex> lock(bound_mutex);
  bound().insert_or_assign(key, std::move(entry));
}

void unbind_linear(int64_t key) {
  std::lock_guard<std::mutex> lock(bound_mutex);
  bound().erase(key);
}

// `linear` on the matmul bound to `key`, whose weight must have `n` rows (out_features) and x's
// last size as columns: a graph cached on disk by another process names keys and sizes, not tensors.
at::Tensor bound_linear(const at::Tensor& x, int64_t key, int64_t n) {
  std::shared_ptr<const BoundLinear> b;
  {
    std::lock_guard<std::mutex> lock(bound_mutex);
    auto found = bound().find(key);
    TORCH_CHECK(found != bound().end(), "wedlm_cpu::bound_linear: no matmul is bound to key ", key);
    b = found->second;
  }
  TORCH_CHECK(b->weight.size(0) == n && b->weight.size(1) == x.size(-1), "wedlm_cpu::bound_linear: key ", key,
              " holds a [", b->weight.size(0), ", ", b->weight.size(1), "] weight, the call asks for [", n, ", ",
              x.size(-1), "]");
  return linear(x, b->weight, b->bias, b->panels, b->packed_key, b->min_macs, b->min_rows, b->few_rows_max);
}

}  // namespace

// `bound_linear` as a C function with inductor's C-shim calling convention (borrowed input handle,
// a new output handle), which compiled graphs call directly (`native.C_SHIMS`) instead of through
// the dispatcher: a boxed call looks the operator up by name, boxes its arguments into a stack and
// unboxes them again, each of the step's matmuls. Exported for the graphs' libraries, which the
// dynamic linker resolves against this one (`native.load` makes its symbols global).
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_bound_linear(
    AtenTensorHandle x, int64_t key, int64_t n, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    at::Tensor out = bound_linear(*torch::aot_inductor::tensor_handle_to_tensor_pointer(x), key, n);
    *ret0 = torch::aot_inductor::new_tensor_handle(std::move(out));
  });
}

TORCH_LIBRARY(wedlm_cpu, m) {
  // catch-all kernels: the packed tensor's dispatch key is oneDNN's, not the CPU's
  m.def("remember(Tensor packed, int key) -> int", remember);
  m.def(
      "linear(Tensor x, Tensor weight, Tensor? bias, Tensor? panels, int packed_key, int min_macs, int min_rows, "
      "int few_rows_max) -> Tensor");
  m.def(
      "bind_linear(int key, Tensor weight, Tensor? bias, Tensor? panels, int packed_key, int min_macs, "
      "int min_rows, int few_rows_max) -> ()",
      bind_linear);
  m.def("unbind_linear(int key) -> ()", unbind_linear);
  m.def("bound_linear(Tensor x, int key, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(wedlm_cpu, CPU, m) {
  m.impl("linear", linear);
  m.impl("bound_linear", bound_linear);
}
