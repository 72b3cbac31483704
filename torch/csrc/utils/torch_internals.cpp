#include <torch/csrc/utils/torch_internals.h>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/selective_checkpoint_write_guard.h>
#include <torch/csrc/autograd/track_views.h>

#include <string_view>

namespace aliasguard::internals {

// See Note [Torch's infrastructure modes]
ALIASGUARD_HOT bool any_infrastructure_mode_set() {
  using c10::impl::TorchDispatchModeKey;
  using c10::impl::TorchDispatchModeTLS;
  if (!TorchDispatchModeTLS::any_modes_set()) {
    return false; // one thread-local read for the common case: no mode
  }
  for (const auto key :
       {TorchDispatchModeKey::FAKE,
        TorchDispatchModeKey::PROXY,
        TorchDispatchModeKey::FUNCTIONAL}) {
    if (TorchDispatchModeTLS::get_mode(key).has_value()) {
      return true;
    }
  }
  return false;
}

// See Note [Storage bytes of symbolic sizes]
c10::SymInt symbolic_storage_nbytes(
    c10::SymIntArrayRef sizes,
    c10::SymIntArrayRef strides,
    size_t itemsize,
    const c10::SymInt& storage_offset) {
  return at::detail::computeStorageNbytes(
      sizes, strides, itemsize, storage_offset);
}

// See Note [Autograd view internals]
void make_differentiable_view_in_place(
    const at::Tensor& base,
    const at::Tensor& tensor,
    bool is_bw_differentiable,
    bool is_fw_differentiable,
    std::unique_ptr<torch::autograd::ViewFunc> view_func,
    torch::autograd::CreationMeta creation_meta) {
  const at::Tensor marked = torch::autograd::as_view(
      base,
      tensor,
      is_bw_differentiable,
      is_fw_differentiable,
      std::move(view_func),
      /*rev_view_func=*/nullptr,
      creation_meta);
  TORCH_INTERNAL_ASSERT(marked.is_same(tensor));
}

bool let_view_grad_fn_be_rebuilt(const at::Tensor& tensor) {
  using torch::autograd::CreationMeta;
  auto* view_meta = torch::autograd::impl::get_view_autograd_meta(tensor);
  if (view_meta == nullptr || !view_meta->has_bw_view()) {
    return false;
  }
  // One of several views of one op: autograd forbids rebuilding its grad_fn
  // because that grad_fn would be the op's shared node. A view made below
  // autograd has no grad_fn at all, so the rebuilt one is its own.
  if (view_meta->get_creation_meta() == CreationMeta::MULTI_OUTPUT_NODE) {
    view_meta->set_creation_meta(CreationMeta::DEFAULT);
  }
  return view_meta->get_creation_meta() == CreationMeta::DEFAULT;
}

void mark_view_grad_fn_stale(const at::Tensor& tensor) {
  auto* view_meta = torch::autograd::impl::get_view_autograd_meta(tensor);
  // Autograd refuses to rebuild the grad_fn of a view made in another mode
  // (several views of one op, no-grad mode, a custom Function): it would
  // raise on the first read.
  if (view_meta != nullptr && view_meta->has_bw_view() &&
      view_meta->get_creation_meta() ==
          torch::autograd::CreationMeta::DEFAULT) {
    view_meta->set_attr_version(static_cast<uint32_t>(tensor._version()) - 1u);
  }
}

// See Note [Autograd metadata of a tensor made below autograd]
AutogradMetaKind autograd_meta_kind(const at::TensorBase& tensor) {
  c10::AutogradMetaInterface* interface =
      tensor.unsafeGetTensorImpl()->autograd_meta();
  if (interface == nullptr) {
    return AutogradMetaKind::kNone;
  }
  // Every AutogradMetaInterface libtorch creates is an AutogradMeta.
  const auto& meta =
      static_cast<const torch::autograd::AutogradMeta&>(*interface);
  if (meta.is_view_) {
    // A view with a grad_fn was made (or used) above autograd: it belongs to
    // a graph, and its metadata is not ours to drop.
    return meta.grad_fn_ ? AutogradMetaKind::kOther : AutogradMetaKind::kView;
  }
  const bool bare_leaf = meta.requires_grad_ && !meta.grad_fn_ &&
      !meta.grad_.defined() && meta.hooks_.empty() &&
      meta.cpp_hooks_list_ == nullptr && meta.post_acc_grad_hooks_ == nullptr &&
      !meta.retains_grad_;
  return bare_leaf ? AutogradMetaKind::kBareRequiresGradLeaf
                   : AutogradMetaKind::kOther;
}

namespace {

void check_autograd_meta_kind(std::vector<std::string>& problems) {
  const char* name =
      "torch::autograd::AutogradMeta fields (Note [Autograd metadata of a "
      "tensor made below autograd])";
  const c10::AutoGradMode grad_mode(true);
  const at::Tensor plain = at::zeros({2});
  const at::Tensor leaf = at::zeros({2}).set_requires_grad(true);
  const at::Tensor view = plain.view({2});
  const at::Tensor with_grad_fn = leaf * 2;
  const at::Tensor view_with_grad_fn = leaf.view({2});
  if (autograd_meta_kind(plain) != AutogradMetaKind::kNone ||
      autograd_meta_kind(leaf) != AutogradMetaKind::kBareRequiresGradLeaf ||
      autograd_meta_kind(view) != AutogradMetaKind::kView ||
      autograd_meta_kind(with_grad_fn) != AutogradMetaKind::kOther ||
      autograd_meta_kind(view_with_grad_fn) != AutogradMetaKind::kOther) {
    problems.push_back(
        std::string(name) +
        ": a plain tensor, a leaf, views with and without a grad_fn and a "
        "result with a grad_fn are not told apart");
  }
}

void check_version_counter_identity(std::vector<std::string>& problems) {
  const char* name =
      "c10::VariableVersion layout (Note [Version counter identity])";
  const at::Tensor a = at::zeros({1});
  const at::Tensor b = at::zeros({1});
  const auto& va = a.unsafeGetTensorImpl()->version_counter();
  const auto& vb = b.unsafeGetTensorImpl()->version_counter();
  if (version_counter_identity(va) == nullptr ||
      version_counter_identity(va) == version_counter_identity(vb)) {
    problems.push_back(
        std::string(name) + ": two fresh counters are not told apart");
    return;
  }
  // A copy of a VariableVersion shares its counter: same identity.
  const c10::VariableVersion copy =
      va; // NOLINT(performance-unnecessary-copy-initialization)
  if (version_counter_identity(copy) != version_counter_identity(va)) {
    problems.push_back(
        std::string(name) + ": a copied counter has another identity");
  }
}

void check_audit_key(std::vector<std::string>& problems) {
  // It must be a functionality key above autograd, so that the audit sees
  // what ADInplaceOrView made of an op's result.
  if (!(kAuditDispatchKey > c10::DispatchKey::AutogradFunctionality &&
        kAuditDispatchKey < c10::DispatchKey::EndOfFunctionalityKeys)) {
    problems.push_back(
        "c10::DispatchKey::DeferredInit (Note [The audit's "
        "dispatch key]): is no longer a functionality key above autograd");
  }
}

void check_tracked_views_key(std::vector<std::string>& problems) {
  const char* name =
      "c10::DispatchKey::AutocastIPU (Note [The tracked views' dispatch key])";
  if (!(kTrackedViewsDispatchKey > c10::DispatchKey::ADInplaceOrView &&
        kTrackedViewsDispatchKey < c10::DispatchKey::EndOfFunctionalityKeys)) {
    problems.push_back(
        std::string(name) +
        ": is no longer a functionality key above ADInplaceOrView");
  }
  if (!is_dispatch_key_excluded(kTrackedViewsDispatchKey) &&
      !is_dispatch_key_included(kTrackedViewsDispatchKey)) {
    problems.push_back(
        std::string(name) + ": is no longer excluded by default");
  }
  if (!autograd::has_tracked_view_kernels() &&
      c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(
          kTrackedViewsDispatchKey)) {
    problems.push_back(
        std::string(name) +
        ": some library registered a fallback for it; it is not free");
  }
}

void check_write_guard_key(std::vector<std::string>& problems) {
  // Whether another library holds it is not a problem here: checkpointing
  // then keeps its modes (Note [The checkpoint write guard's dispatch key]).
  const std::string name =
      "c10::DispatchKey::AutocastXLA (Note [The checkpoint write guard's "
      "dispatch key])";
  if (!(kCheckpointWriteGuardDispatchKey >
            c10::DispatchKey::AutogradFunctionality &&
        kCheckpointWriteGuardDispatchKey <
            c10::DispatchKey::EndOfFunctionalityKeys)) {
    problems.push_back(
        name + ": is no longer a functionality key above autograd");
  }
  if (kCheckpointWriteGuardDispatchKey == kTrackedViewsDispatchKey ||
      kCheckpointWriteGuardDispatchKey == kAuditDispatchKey) {
    problems.push_back(name + ": is another feature's key");
  }
  if (!is_dispatch_key_excluded(kCheckpointWriteGuardDispatchKey) &&
      !autograd::is_write_guard_on()) {
    problems.push_back(name + ": is no longer excluded by default");
  }
}

// The attr_version trick must make autograd build an as_strided grad_fn.
void check_view_grad_fn_rebuild(std::vector<std::string>& problems) {
  const c10::AutoGradMode grad_mode(true);
  try {
    const at::Tensor base = at::ones({4}).set_requires_grad(true);
    at::Tensor alias;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      alias = base.view({2, 2});
    }
    make_differentiable_view_in_place(
        base,
        alias,
        /*is_bw_differentiable=*/true,
        /*is_fw_differentiable=*/true,
        nullptr,
        torch::autograd::CreationMeta::DEFAULT);
    mark_view_grad_fn_stale(alias);
    const auto grad_fn = alias.grad_fn();
    if (grad_fn == nullptr ||
        grad_fn->name().find("AsStrided") == std::string::npos) {
      problems.push_back(
          "torch::autograd::as_view / ViewInfo attr_version (Note [Autograd "
          "view internals]): a marked view's grad_fn is not rebuilt from its "
          "base");
    }
  } catch (const std::exception& error) {
    problems.push_back(
        std::string(
            "torch::autograd::as_view (Note [Autograd view internals]): ") +
        error.what());
  }
}

} // namespace

bool inplace_or_view_kernel_bumps_first(const c10::OperatorHandle& op) {
  // See Note [ADInplaceOrView kernels that bump first]: the line of the
  // key's own registration in the op's state, e.g. "ADInplaceOrView:
  // registered at .../torch/_library/custom_ops.py:1104 :: ...".
  const std::string state = op.dumpState();
  const std::string_view line_start = "\nADInplaceOrView: registered at ";
  const size_t start = state.find(line_start);
  if (start == std::string::npos) {
    return false;
  }
  const size_t end = state.find('\n', start + 1);
  const std::string_view line = std::string_view(state).substr(
      start, end == std::string::npos ? std::string::npos : end - start);
  return line.find("torch/_library/custom_ops.py") != std::string_view::npos;
}

std::vector<std::string> torch_internals_self_test() {
  // The checks need tensors with version counters and autograd metadata;
  // `import aliasguard` may run under torch.inference_mode(), where fresh
  // tensors have neither. Leaving inference mode for this scope is allowed
  // there and changes nothing outside it.
  const c10::InferenceMode normal_tensors(/*enabled=*/false);
  std::vector<std::string> problems;
  check_version_counter_identity(problems);
  check_audit_key(problems);
  check_tracked_views_key(problems);
  check_write_guard_key(problems);
  check_view_grad_fn_rebuild(problems);
  check_autograd_meta_kind(problems);
  return problems;
}

} // namespace aliasguard::internals
