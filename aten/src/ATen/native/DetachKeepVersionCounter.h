#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKey.h>
#include <c10/macros/AliasguardExport.h>

#include <vector>

namespace aliasguard::native {

// aten::detach for dense backends, registered through the dispatcher when the
// library loads. See Note [Detach below autograd keeps the version counter].
ALIASGUARD_API at::Tensor detach_keep_version_counter(const at::Tensor& self);

// The backend keys the kernel above is registered for (CPU, CUDA, HIP, XPU,
// MPS): the dense keys that have no detach kernel of their own in stock torch.
ALIASGUARD_API const std::vector<c10::DispatchKey>&
detach_keep_version_counter_keys();

// Registers the kernel on every key above (true) or removes those
// registrations (false), leaving aten::detach's dispatch table as stock torch
// has it; returns whether it was registered before. Loading the library
// registers it. Thread-safe. See Note [Reversible detach registration].
ALIASGUARD_API bool set_detach_keep_version_counter(bool registered);
ALIASGUARD_API bool is_detach_keep_version_counter_registered();

} // namespace aliasguard::native
