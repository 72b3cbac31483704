#pragma once

#include <ATen/core/Tensor.h>

namespace at::native {

// aten::detach for dense backends, registered through the dispatcher when the
// library loads. See Note [Detach below autograd keeps the version counter].
at::Tensor detach_keep_version_counter(const at::Tensor& self);

} // namespace at::native
