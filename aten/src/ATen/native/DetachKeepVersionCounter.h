#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/AliasguardExport.h>

namespace aliasguard::native {

// aten::detach for dense backends, registered through the dispatcher when the
// library loads. See Note [Detach below autograd keeps the version counter].
ALIASGUARD_API at::Tensor detach_keep_version_counter(const at::Tensor& self);

} // namespace aliasguard::native
