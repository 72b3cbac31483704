#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/AliasguardExport.h>
#include <torch/csrc/autograd/variable.h>

#include <functional>
#include <optional>
#include <string_view>

namespace aliasguard::autograd {

using torch::autograd::CreationMeta;

// A callable `base -> view` used to replay a view, e.g. when the view's
// grad_fn must be rebuilt after an in-place op on its base.
using ViewReplayFn = std::function<at::Tensor(const at::Tensor&)>;

struct MarkAsViewOptions {
  bool is_bw_differentiable = true;
  bool is_fw_differentiable = true;
  ViewReplayFn view_fn = nullptr;
  // Defaults to what a view op would record in the current grad mode:
  // INFERENCE_MODE, NO_GRAD_MODE or DEFAULT.
  std::optional<CreationMeta> creation_meta = std::nullopt;
  // First make `tensor` use `base`'s storage, keeping its own sizes, strides
  // and storage offset (set_ semantics). Meant for wrapper subclasses, whose
  // storage is a placeholder. See Note [May a tensor alias a storage].
  bool alias_storage = false;
};

// Turns `tensor`, in place, into a view of `base`, as the ADInplaceOrView
// kernel of a view op would (see Note [Marking a tensor as a view]).
// Every precondition is checked before anything is modified: on error,
// `tensor` is left exactly as it was. Returns `tensor`.
ALIASGUARD_API const at::Tensor& mark_as_view(
    const at::Tensor& tensor,
    const at::Tensor& base,
    MarkAsViewOptions options = {});

// "DEFAULT", "NO_GRAD_MODE", ... -> CreationMeta; ValueError for other names.
ALIASGUARD_API CreationMeta creation_meta_from_name(std::string_view name);
ALIASGUARD_API const char* creation_meta_name(CreationMeta meta);

} // namespace aliasguard::autograd
