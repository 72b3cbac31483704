#include <torch/csrc/autograd/track_views.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/utils/schema_alias_analysis.h>
#include <torch/csrc/utils/torch_internals.h>
#include <torch/library.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace aliasguard::autograd {
namespace {

constexpr c10::DispatchKey kMarkerKey = internals::kTrackedViewsDispatchKey;

// Tracked scopes open on this thread that turned the marker key on.
thread_local size_t marking_scopes = 0;

void mark_if_made_below_autograd(const at::Tensor& tensor) {
  if (tensor.defined() &&
      internals::autograd_meta_kind(tensor) ==
          internals::AutogradMetaKind::kView) {
    internals::mark_view_grad_fn_stale(tensor);
  }
}

// See Note [Views made below autograd build their grad_fn from their base]
void mark_view_returns(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet dispatch_keys,
    torch::jit::Stack* stack) {
  op.redispatchBoxed(
      dispatch_keys &
          c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kMarkerKey),
      stack);
  const size_t num_returns = op.schema().returns().size();
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    const c10::IValue& value = (*stack)[i];
    if (value.isTensor()) {
      mark_if_made_below_autograd(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& tensor : value.toTensorList()) {
        mark_if_made_below_autograd(tensor);
      }
    }
  }
}

struct MarkerKernels {
  std::mutex mutex;
  std::atomic<bool> registered{false};
  std::unique_ptr<torch::Library> fallthrough;
  std::map<std::string, std::unique_ptr<torch::Library>> by_namespace;
};

MarkerKernels& marker_kernels() {
  // Made when the library loads, so destroyed before the dispatcher.
  static MarkerKernels kernels;
  return kernels;
}
[[maybe_unused]] const MarkerKernels& kernels_at_load = marker_kernels();

bool is_view_op(const c10::OperatorHandle& op) {
  if (!op.hasSchema() ||
      !op.hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView)) {
    return false;
  }
  return utils::schema_alias_analysis(op)->has_view_returns();
}

void register_marker_kernels() {
  MarkerKernels& kernels = marker_kernels();
  if (kernels.registered.load(std::memory_order_acquire)) {
    return;
  }
  const std::lock_guard<std::mutex> lock(kernels.mutex);
  if (kernels.registered.load(std::memory_order_relaxed)) {
    return;
  }
  // Every op without a kernel of ours passes the key by, as if it were not
  // in the dispatch key set.
  kernels.fallthrough = std::make_unique<torch::Library>(
      torch::Library::IMPL, "_", kMarkerKey, __FILE__, __LINE__);
  kernels.fallthrough->fallback(torch::CppFunction::makeFallthrough());
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    const auto op = dispatcher.findOp(name);
    if (!op.has_value() || !is_view_op(*op)) {
      continue;
    }
    const auto separator = name.name.find("::");
    if (separator == std::string::npos) {
      continue;
    }
    const std::string ns = name.name.substr(0, separator);
    auto& library = kernels.by_namespace[ns];
    if (!library) {
      library = std::make_unique<torch::Library>(
          torch::Library::IMPL, ns, kMarkerKey, __FILE__, __LINE__);
    }
    std::string qualified = name.name;
    if (!name.overload_name.empty()) {
      qualified += "." + name.overload_name;
    }
    library->impl(
        qualified.c_str(),
        torch::CppFunction::makeFromBoxedFunction<&mark_view_returns>());
  }
  kernels.registered.store(true, std::memory_order_release);
}

void set_marker_key(bool on) {
  c10::impl::tls_set_dispatch_key_excluded(kMarkerKey, !on);
  c10::impl::tls_set_dispatch_key_included(kMarkerKey, on);
}

} // namespace

// See Note [Tracking views below autograd]
bool enable_view_tracking() {
  const bool was_excluded = c10::impl::tls_is_dispatch_key_excluded(
      c10::DispatchKey::ADInplaceOrView);
  if (was_excluded) {
    register_marker_kernels();
    c10::impl::tls_set_dispatch_key_excluded(
        c10::DispatchKey::ADInplaceOrView, false);
    if (marking_scopes++ == 0) {
      set_marker_key(true);
    }
  }
  return was_excluded;
}

void restore_view_tracking(bool was_excluded) {
  c10::impl::tls_set_dispatch_key_excluded(
      c10::DispatchKey::ADInplaceOrView, was_excluded);
  if (was_excluded && marking_scopes > 0 && --marking_scopes == 0) {
    set_marker_key(false);
  }
}

bool is_view_tracking_enabled() {
  return !c10::impl::tls_is_dispatch_key_excluded(
      c10::DispatchKey::ADInplaceOrView);
}

void release_tracked_view_kernels() {
  MarkerKernels& kernels = marker_kernels();
  const std::lock_guard<std::mutex> lock(kernels.mutex);
  kernels.by_namespace.clear();
  kernels.fallthrough.reset();
  kernels.registered.store(false, std::memory_order_release);
}

bool has_tracked_view_kernels() {
  return marker_kernels().registered.load(std::memory_order_acquire);
}

} // namespace aliasguard::autograd
