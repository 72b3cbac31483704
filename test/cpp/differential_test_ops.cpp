// Custom ops registered from C++ with TORCH_LIBRARY, for the differential
// harness (test/differential/dispatcher_scenarios.py, `custom_cpp_*`) and
// test/python/test_registration_order.py. Built twice, once per namespace
// (AGDIFF_NAMESPACE: agdiff_cpp_before, agdiff_cpp_after), so that each
// registration time is one torch.ops.load_library: the ops exist only once
// their library is loaded, before or after the first tracked body. The same
// ops as the harness's Python-registered ones (Library.define): a mutating
// op, a list-mutating op, a view op and a view-list op. Never installed.

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <vector>

#ifndef AGDIFF_NAMESPACE
#error "AGDIFF_NAMESPACE names the ops' namespace (CMakeLists.txt)"
#endif

namespace aliasguard {
namespace {

at::Tensor& mutate(at::Tensor& x) {
  return x.add_(1);
}

void mutate_list(at::TensorList xs) {
  for (const at::Tensor& x : xs) {
    x.mul_(2);
  }
}

at::Tensor view(const at::Tensor& x) {
  return x.view(x.sizes());
}

std::vector<at::Tensor> view_list(const at::Tensor& x) {
  return x.unbind(0);
}

} // namespace
} // namespace aliasguard

// TORCH_LIBRARY pastes its namespace argument into names, which would keep
// the macro's own name: one more level expands AGDIFF_NAMESPACE first.
#define AGDIFF_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define AGDIFF_LIBRARY_IMPL(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)

AGDIFF_LIBRARY(AGDIFF_NAMESPACE, m) {
  m.def("mutate(Tensor(a!) x) -> Tensor(a!)");
  m.def("mutate_list(Tensor(a!)[] xs) -> ()");
  m.def("view(Tensor(a) x) -> Tensor(a)");
  m.def("view_list(Tensor(a) x) -> Tensor(a)[]");
}

AGDIFF_LIBRARY_IMPL(AGDIFF_NAMESPACE, CPU, m) {
  m.impl("mutate", TORCH_FN(aliasguard::mutate));
  m.impl("mutate_list", TORCH_FN(aliasguard::mutate_list));
  m.impl("view_list", TORCH_FN(aliasguard::view_list));
}

AGDIFF_LIBRARY_IMPL(AGDIFF_NAMESPACE, CompositeExplicitAutograd, m) {
  m.impl("view", TORCH_FN(aliasguard::view));
}
