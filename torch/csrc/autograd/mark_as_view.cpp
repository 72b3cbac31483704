#include <torch/csrc/autograd/mark_as_view.h>

#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/VersionCounterUtils.h>
#include <torch/csrc/autograd/storage_alias.h>
#include <torch/csrc/utils/torch_internals.h>

#include <array>
#include <utility>

namespace aliasguard::autograd {

// Note [Marking a tensor as a view]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// mark_as_view is as_view applied to an existing tensor: for differentiable
// views, make_variable_differentiable_view installs a DifferentiableViewMeta
// on the tensor's own TensorImpl, which shares the base's version counter and
// records `_base` (the root base when `base` is itself a view). For
// non-differentiable views as_view would allocate a new TensorImpl, so we only
// share the counter, in place, as such views do.
//
// as_view attaches no grad_fn; the autograd kernel of a view op does that
// above it. A tensor marked at top level has no such kernel, and with a null
// grad_fn it would behave as a leaf and swallow the gradient meant for the
// base. Autograd already knows how to build the grad_fn of a view from its
// base: VariableHooks::grad_fn rebuilds it (view_fn replay, else
// as_strided) whenever the view's recorded attr_version differs from the
// counter's current version, which is how views are fixed after an in-place
// op on their base. We record a version one behind the current one, so the
// first grad_fn access builds the right node; 2^32 - 1 bumps would be needed
// for the two to meet again by accident. Only DEFAULT views take this path:
// for the other creation metas, rebuilding the grad_fn is exactly what
// autograd forbids (handle_view_on_rebase raises), as it does for real views
// made under no_grad or in a custom Function.

namespace {

// Holds a user callable so that autograd can replay the view.
struct CallableViewFunc final : public torch::autograd::ViewFunc {
  explicit CallableViewFunc(ViewReplayFn fn) : fn_(std::move(fn)) {}
  at::Tensor operator()(const at::Tensor& base) const override {
    return fn_(base);
  }
  std::unique_ptr<torch::autograd::ViewFunc> clone_and_set(
      std::optional<std::vector<c10::SymInt>> /*symints*/,
      std::optional<std::vector<at::Tensor>> /*tensors*/) const override {
    return std::make_unique<CallableViewFunc>(fn_);
  }

 private:
  ViewReplayFn fn_;
};

constexpr std::array<std::pair<std::string_view, CreationMeta>, 5>
    kCreationMetaNames{{
        {"DEFAULT", CreationMeta::DEFAULT},
        {"IN_CUSTOM_FUNCTION", CreationMeta::IN_CUSTOM_FUNCTION},
        {"MULTI_OUTPUT_NODE", CreationMeta::MULTI_OUTPUT_NODE},
        {"NO_GRAD_MODE", CreationMeta::NO_GRAD_MODE},
        {"INFERENCE_MODE", CreationMeta::INFERENCE_MODE},
    }};

CreationMeta creation_meta_for_current_mode() {
  if (c10::InferenceMode::is_enabled()) {
    return CreationMeta::INFERENCE_MODE;
  }
  return c10::GradMode::is_enabled() ? CreationMeta::DEFAULT
                                     : CreationMeta::NO_GRAD_MODE;
}

// Raises, naming the cause, when `tensor` already carries autograd metadata
// that a view meta would have to replace.
void check_has_no_autograd_meta(const at::Tensor& tensor) {
  if (tensor.unsafeGetTensorImpl()->autograd_meta() == nullptr) {
    return;
  }
  TORCH_CHECK(
      !tensor.is_view(),
      "mark_as_view(): tensor is already a view of another tensor; a tensor "
      "can be marked as a view only once");
  TORCH_CHECK(
      !tensor.grad_fn(),
      "mark_as_view(): tensor has a grad_fn (",
      tensor.grad_fn()->name(),
      "), so it is the output of a differentiable op; mark a fresh alias of "
      "it instead (e.g. one made below autograd)");
  TORCH_CHECK(
      !tensor.requires_grad(),
      "mark_as_view(): tensor is a leaf that requires grad; a view cannot be "
      "a leaf of the autograd graph, mark the tensor before setting "
      "requires_grad");
  TORCH_CHECK(
      false,
      "mark_as_view(): tensor already has autograd metadata (e.g. it once "
      "required grad, holds a .grad or has hooks); mark a fresh alias of it "
      "instead");
}

constexpr AliasNames kNames{"tensor", "base", "base's storage"};

const at::TensorBase& root_of(const at::Tensor& tensor) {
  return tensor.is_view() ? tensor._base() : tensor;
}

// Already what mark_as_view would make it: a view of base's root (views of
// views point at the root, as as_view makes them) that counts with base.
// Code written to the upstream proposal calls mark_as_view on views made in
// a tracked __torch_dispatch__ body, which are that already.
bool is_view_of(const at::Tensor& tensor, const at::Tensor& base) {
  return tensor.is_view() && root_of(tensor).is_same(root_of(base)) &&
      shares_version_counter(
             *tensor.unsafeGetTensorImpl(), *base.unsafeGetTensorImpl());
}

void check_storage(
    const at::Tensor& tensor,
    const at::Tensor& base,
    bool alias_storage) {
  // See Note [May a tensor alias a storage]
  if (alias_storage) {
    const auto problem = storage_alias_problem(tensor, base, kNames);
    TORCH_CHECK(
        !problem.has_value(),
        "mark_as_view(alias_storage=True): ",
        problem.value_or(""));
    return;
  }
  if (has_placeholder_storage(tensor)) {
    return; // a wrapper subclass aliases whatever its inner tensors alias
  }
  TORCH_CHECK(
      storages_alias(tensor, base),
      "mark_as_view(): tensor does not share base's storage, so it cannot be "
      "a view of it; pass alias_storage=True to make tensor use base's "
      "storage first");
}

} // namespace

CreationMeta creation_meta_from_name(std::string_view name) {
  for (const auto& [known, meta] : kCreationMetaNames) {
    if (known == name) {
      return meta;
    }
  }
  TORCH_CHECK_VALUE(
      false,
      "mark_as_view(): unknown creation_meta '",
      name,
      "'; expected one of DEFAULT, IN_CUSTOM_FUNCTION, MULTI_OUTPUT_NODE, "
      "NO_GRAD_MODE, INFERENCE_MODE");
}

const char* creation_meta_name(CreationMeta meta) {
  for (const auto& [name, known] : kCreationMetaNames) {
    if (known == meta) {
      return name.data();
    }
  }
  return "UNKNOWN";
}

// See Note [Marking a tensor as a view]
const at::Tensor& mark_as_view(
    const at::Tensor& tensor,
    const at::Tensor& base,
    MarkAsViewOptions options) {
  TORCH_CHECK(tensor.defined(), "mark_as_view(): tensor is undefined");
  TORCH_CHECK(base.defined(), "mark_as_view(): base is undefined");
  TORCH_CHECK(
      !tensor.is_same(base),
      "mark_as_view(): tensor and base are the same tensor");
  TORCH_CHECK(
      !base.is_inference(),
      "mark_as_view(): base is an inference tensor; inference tensors have "
      "no version counter and cannot have tracked views");
  TORCH_CHECK(
      !tensor.is_inference(),
      "mark_as_view(): tensor is an inference tensor; inference tensors have "
      "no version counter and cannot be views");
  if (is_view_of(tensor, base) && !options.alias_storage) {
    return tensor;
  }
  check_has_no_autograd_meta(tensor);
  const CreationMeta creation_meta =
      options.creation_meta.value_or(creation_meta_for_current_mode());
  const bool differentiable =
      options.is_bw_differentiable || options.is_fw_differentiable;
  TORCH_CHECK(
      options.is_bw_differentiable || creation_meta == CreationMeta::DEFAULT,
      "mark_as_view(): a view that is not backward differentiable must have "
      "creation_meta DEFAULT, got ",
      creation_meta_name(creation_meta));
  TORCH_CHECK(
      differentiable || !options.view_fn,
      "mark_as_view(): view_fn is only used by differentiable views");
  if (differentiable) {
    const auto problem = differentiable_view_problem(
        tensor, base, static_cast<bool>(options.view_fn), kNames);
    TORCH_CHECK(!problem.has_value(), "mark_as_view(): ", problem.value_or(""));
  }
  check_storage(tensor, base, options.alias_storage);

  // Every check passed: from here on, nothing throws for a reason the caller
  // could have avoided.
  c10::TensorImpl* tensor_impl = tensor.unsafeGetTensorImpl();
  if (options.alias_storage) {
    tensor_impl->set_storage_keep_dtype(
        base.unsafeGetTensorImpl()->unsafe_storage());
  }
  if (!differentiable) {
    share_version_counter(*tensor_impl, *base.unsafeGetTensorImpl());
    return tensor;
  }
  std::unique_ptr<torch::autograd::ViewFunc> view_func = options.view_fn
      ? std::make_unique<CallableViewFunc>(std::move(options.view_fn))
      : nullptr;
  internals::make_differentiable_view_in_place(
      base,
      tensor,
      options.is_bw_differentiable,
      options.is_fw_differentiable,
      std::move(view_func),
      creation_meta);
  if (options.is_bw_differentiable && creation_meta == CreationMeta::DEFAULT) {
    internals::mark_view_grad_fn_stale(tensor);
  }
  return tensor;
}

} // namespace aliasguard::autograd
