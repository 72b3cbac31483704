#include <aten/src/ATen/native/DetachKeepVersionCounter.h>

#include <torch/library.h>

namespace aliasguard::native {

// Note [Detach below autograd keeps the version counter]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Stock aten::detach (CompositeExplicitAutograd) builds its result with a
// fresh counter and relies on the ADInplaceOrView kernel, which runs above it,
// to replace that counter with the input's. Code running below autograd
// (__torch_dispatch__, AutoDispatchBelowADInplaceOrView) never reaches that
// kernel, so the detached tensor silently escaped in-place tracking.
//
// We hand the input's counter to shallow_copy_and_detach directly. Above
// autograd nothing changes: ADInplaceOrView still installs the same counter.
// Sharing is also cheaper than the stock path, which allocates a counter.
// Inference tensors have no counter; copy_tensor_metadata leaves theirs
// disabled whatever we pass, exactly as stock.
//
// Registration: the kernel is registered for the dense backend keys, which
// have no detach kernel of their own, so it takes precedence over the
// CompositeExplicitAutograd one without overriding any registration (and
// without the dispatcher's override warning). Meta, sparse, quantized and
// nested tensors keep their stock kernels.
at::Tensor detach_keep_version_counter(const at::Tensor& self) {
  const c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  return at::Tensor(impl->shallow_copy_and_detach(
      /*version_counter=*/impl->version_counter(),
      /*allow_tensor_metadata_change=*/false));
}

namespace {

#define ALIASGUARD_REGISTER_DETACH(BACKEND)                  \
  TORCH_LIBRARY_IMPL(aten, BACKEND, m) {                     \
    m.impl("detach", TORCH_FN(detach_keep_version_counter)); \
  }

ALIASGUARD_REGISTER_DETACH(CPU)
ALIASGUARD_REGISTER_DETACH(CUDA)
ALIASGUARD_REGISTER_DETACH(HIP)
ALIASGUARD_REGISTER_DETACH(XPU)
ALIASGUARD_REGISTER_DETACH(MPS)

#undef ALIASGUARD_REGISTER_DETACH

} // namespace
} // namespace aliasguard::native
