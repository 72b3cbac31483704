#include <torch/csrc/autograd/track_views.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/tracked_body_calls.h>
#include <torch/csrc/utils/torch_internals.h>
#include <torch/library.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace aliasguard::autograd {
namespace {

constexpr c10::DispatchKey kMarkerKey = internals::kTrackedViewsDispatchKey;
constexpr c10::DispatchKeySet kInplaceOrView(c10::DispatchKey::ADInplaceOrView);

using WeakTensorImpl =
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

// One open tracked scope of this thread: where its views start in
// `views_made`, and the marker key's state to restore at its end.
struct OpenScope {
  size_t first_view;
  bool marker_was_included;
  bool marker_was_excluded;
};

// Views made in this thread's open tracked scopes, innermost last, and the
// scopes themselves. Weak: a view the body dropped needs nothing.
thread_local std::vector<WeakTensorImpl> views_made;
thread_local std::vector<OpenScope> open_scopes;

// See Note [Views made below autograd build their grad_fn from their base]
ALIASGUARD_HOT void remember_if_made_below_autograd(const at::Tensor& tensor) {
  if (tensor.defined() &&
      internals::autograd_meta_kind(tensor) ==
          internals::AutogradMetaKind::kView) {
    views_made.emplace_back(tensor.getIntrusivePtr());
  }
}

ALIASGUARD_HOT void remember_view_returns(
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
      remember_if_made_below_autograd(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& tensor : value.toTensorList()) {
        remember_if_made_below_autograd(tensor);
      }
    }
  }
}

// See Note [A kernel's own calls are not the body's]
void run_kernel_untracked(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet dispatch_keys,
    torch::jit::Stack* stack) {
  const c10::impl::ExcludeDispatchKeyGuard untracked(
      kInplaceOrView | c10::DispatchKeySet(kMarkerKey));
  op.redispatchBoxed(
      (dispatch_keys &
       c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kMarkerKey)) -
          kInplaceOrView,
      stack);
}

// The key's fallback: the ops without a kernel of their own at the key, the
// opaque ones the kernels were registered for and any op defined after that
// (Note [Ops registered after the tracked views' kernels]).
ALIASGUARD_HOT void run_body_call(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet dispatch_keys,
    torch::jit::Stack* stack) {
  switch (LateOps::body_call(op).value_or(BodyCall::kKernel)) {
    case BodyCall::kView:
      remember_view_returns(op, dispatch_keys, stack);
      return;
    case BodyCall::kThrough:
      op.redispatchBoxed(
          dispatch_keys &
              c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kMarkerKey),
          stack);
      return;
    case BodyCall::kKernel:
      run_kernel_untracked(op, dispatch_keys, stack);
      return;
  }
}

struct MarkerKernels {
  std::mutex mutex;
  std::atomic<bool> registered{false};
  std::unique_ptr<torch::Library> fallback;
  std::map<std::string, std::unique_ptr<torch::Library>> by_namespace;
};

MarkerKernels& marker_kernels() {
  // Made when the library loads, so destroyed before the dispatcher.
  static MarkerKernels kernels;
  return kernels;
}
[[maybe_unused]] const MarkerKernels& kernels_at_load = marker_kernels();

// Once per process (and after each release): see enable_view_tracking.
ALIASGUARD_COLD void register_marker_kernels() {
  MarkerKernels& kernels = marker_kernels();
  const std::lock_guard<std::mutex> lock(kernels.mutex);
  if (kernels.registered.load(std::memory_order_relaxed)) {
    return;
  }
  // Before listing the ops: an op defined in between is then recorded too.
  LateOps::start();
  kernels.fallback = std::make_unique<torch::Library>(
      torch::Library::IMPL, "_", kMarkerKey, __FILE__, __LINE__);
  kernels.fallback->fallback(
      torch::CppFunction::makeFromBoxedFunction<&run_body_call>());
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    const auto op = dispatcher.findOp(name);
    if (!op.has_value() || !op->hasSchema()) {
      continue;
    }
    const BodyCall call = body_call_of(*op);
    const auto separator = name.name.find("::");
    if (call == BodyCall::kKernel || separator == std::string::npos) {
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
        call == BodyCall::kView ? torch::CppFunction::makeFromBoxedFunction<
                                      &remember_view_returns>()
                                : torch::CppFunction::makeFallthrough());
  }
  kernels.registered.store(true, std::memory_order_release);
}

// The views this scope made that are still alive: their grad_fn is built from
// their base from now on.
void mark_views_made_since(size_t first) {
  for (size_t i = first; i < views_made.size(); ++i) {
    const c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> impl =
        views_made[i].lock();
    if (impl) {
      const at::Tensor view(impl);
      if (internals::autograd_meta_kind(view) !=
          internals::AutogradMetaKind::kView) {
        continue; // dropped by a correction, or given a graph meanwhile
      }
      if (internals::let_view_grad_fn_be_rebuilt(view)) {
        internals::mark_view_grad_fn_stale(view);
      } else {
        // Autograd would refuse to rebuild it: a plain alias that shares
        // the counter, as stock makes it, plus the counter.
        impl->set_autograd_meta(nullptr);
      }
    }
  }
  views_made.erase(
      views_made.begin() + static_cast<std::ptrdiff_t>(first),
      views_made.end());
}

} // namespace

// See Note [Tracking views below autograd]
ALIASGUARD_HOT bool enable_view_tracking() {
  // See Note [Thread-local dispatch key state]
  internals::LocalDispatchKeys keys = internals::local_dispatch_keys();
  const bool was_excluded =
      keys.excluded.has(c10::DispatchKey::ADInplaceOrView);
  if (was_excluded) {
    if (!marker_kernels().registered.load(std::memory_order_acquire)) {
      register_marker_kernels();
    }
    open_scopes.push_back(
        {views_made.size(),
         keys.included.has(kMarkerKey),
         keys.excluded.has(kMarkerKey)});
    keys.excluded = keys.excluded.remove(c10::DispatchKey::ADInplaceOrView)
                        .remove(kMarkerKey);
    keys.included = keys.included.add(kMarkerKey);
    internals::set_local_dispatch_keys(keys);
  }
  return was_excluded;
}

ALIASGUARD_HOT void restore_view_tracking(bool was_excluded) {
  internals::LocalDispatchKeys keys = internals::local_dispatch_keys();
  keys.excluded = was_excluded
      ? keys.excluded.add(c10::DispatchKey::ADInplaceOrView)
      : keys.excluded.remove(c10::DispatchKey::ADInplaceOrView);
  if (!was_excluded || open_scopes.empty()) {
    internals::set_local_dispatch_keys(keys);
    return;
  }
  const OpenScope scope = open_scopes.back();
  open_scopes.pop_back();
  keys.included = scope.marker_was_included ? keys.included.add(kMarkerKey)
                                            : keys.included.remove(kMarkerKey);
  keys.excluded = scope.marker_was_excluded ? keys.excluded.add(kMarkerKey)
                                            : keys.excluded.remove(kMarkerKey);
  internals::set_local_dispatch_keys(keys);
  mark_views_made_since(scope.first_view);
}

bool is_view_tracking_enabled() {
  return !internals::is_dispatch_key_excluded(
      c10::DispatchKey::ADInplaceOrView);
}

void release_tracked_view_kernels() {
  MarkerKernels& kernels = marker_kernels();
  const std::lock_guard<std::mutex> lock(kernels.mutex);
  kernels.by_namespace.clear();
  kernels.fallback.reset();
  LateOps::stop();
  kernels.registered.store(false, std::memory_order_release);
}

bool has_tracked_view_kernels() {
  return marker_kernels().registered.load(std::memory_order_acquire);
}

} // namespace aliasguard::autograd
