#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/AliasguardExport.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

// May this tensor alias (or become a view of) that storage? The one place
// that decides it: mark_as_view(alias_storage=True), alias correction and
// the audit all ask here. See Note [May a tensor alias a storage].

namespace aliasguard::autograd {

// The storage placeholder of a wrapper subclass (_make_wrapper_subclass):
// Python dispatch and no data. Such a tensor owns no memory, so it may be
// made to alias anything; its inner tensors carry the real aliasing.
inline bool has_placeholder_storage(const at::TensorBase& tensor) {
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  return impl->is_python_dispatch() &&
      (!impl->has_storage() || impl->unsafe_storage().data() == nullptr);
}

// unsafe_storage: a wrapper subclass's storage() throws by design.
inline const c10::Storage& storage_of(const at::TensorBase& tensor) {
  return tensor.unsafeGetTensorImpl()->unsafe_storage();
}

inline bool has_real_storage(const at::TensorBase& tensor) {
  return tensor.has_storage() && !has_placeholder_storage(tensor);
}

inline bool storages_alias(const at::TensorBase& a, const at::TensorBase& b) {
  return a.has_storage() && b.has_storage() &&
      storage_of(a).is_alias_of(storage_of(b));
}

// How the two tensors are named in messages: "tensor", "base" and "base's
// storage" for mark_as_view; "it", "argument 'self'" and "the storage of
// argument 'self'" for alias correction.
struct AliasNames {
  std::string_view tensor;
  std::string_view base;
  std::string_view base_storage;
};

// Why `tensor` may not be given `base`'s storage (keeping its own sizes,
// strides, storage offset and dtype, as set_storage_keep_dtype does), or
// nullopt when it may. Only what makes reading `tensor` afterwards safe and
// meaningful is checked, nothing about autograd.
ALIASGUARD_API std::optional<std::string> storage_alias_problem(
    const at::Tensor& tensor,
    const at::Tensor& base,
    const AliasNames& names);

// Why `tensor` may not be a differentiable view of `base` (gradients flow
// through as_strided replay, or `view_fn` when the caller has one), or
// nullopt when it may.
ALIASGUARD_API std::optional<std::string> differentiable_view_problem(
    const at::Tensor& tensor,
    const at::Tensor& base,
    bool has_view_fn,
    const AliasNames& names);

// The bytes of storage a strided tensor with these sizes, strides, storage
// offset and element size reaches (0 when it has no elements), computed with
// checked int64 arithmetic: nullopt when a value is negative or the result
// overflows.
ALIASGUARD_API std::optional<int64_t> checked_storage_nbytes(
    c10::IntArrayRef sizes,
    c10::IntArrayRef strides,
    int64_t storage_offset,
    size_t itemsize);

} // namespace aliasguard::autograd
