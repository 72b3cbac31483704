#pragma once

#include <ATen/core/TensorBase.h>

namespace torch::autograd {

// The storage placeholder of a wrapper subclass (_make_wrapper_subclass):
// Python dispatch and no data. Such a tensor owns no memory, so it may be
// made to alias anything; its inner tensors carry the real aliasing.
// Kept in its own light header: alias correction needs it without the rest of
// autograd's headers.
inline bool has_placeholder_storage(const at::TensorBase& tensor) {
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  return impl->is_python_dispatch() &&
      (!impl->has_storage() || impl->unsafe_storage().data() == nullptr);
}

} // namespace torch::autograd
