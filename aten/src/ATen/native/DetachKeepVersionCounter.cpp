#include <aten/src/ATen/native/DetachKeepVersionCounter.h>

#include <torch/library.h>

#include <memory>
#include <mutex>

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

// Note [Reversible detach registration]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A TORCH_LIBRARY_IMPL block keeps its torch::Library in a static object that
// lives until the library is unloaded, so its registrations cannot be taken
// back. We own one torch::Library per key instead: destroying it releases its
// registration handles, and the dispatcher recomputes aten::detach's table
// for that key, which falls back to the CompositeExplicitAutograd kernel as
// in stock torch (the key had no kernel of its own to restore). That is what
// aliasguard.uninstall() relies on. Registering again creates new libraries.
// The libraries are kept in a function-local static made when the library
// loads, so they are destroyed before the dispatcher singleton, as a
// TORCH_LIBRARY_IMPL block's would be.
//
// Other threads may be running aten::detach meanwhile (any thread may, at
// any time), and unlike the kernels of Note [Installing and uninstalling
// while bodies run] this one cannot wait for them. Swapping it is safe in
// practice where removing a fast-path kernel is not (Note [Fast path
// registrations are kept]): both kernels here are real kernels, so the
// key's "not a fallthrough" bit never changes and every call still finds a
// kernel for the key; the dispatcher rewrites the table entry while a call
// may be reading it, the same unsynchronised write stock torch makes
// whenever a library registers or deregisters a kernel at run time
// (torch.library, a Library going away), and either kernel, or a mix of the
// two entries' fields, runs a detach: both are stateless wrappers of a
// plain function that never read their functor object.
namespace {

struct DetachRegistrations {
  std::mutex mutex;
  std::vector<std::unique_ptr<torch::Library>> libraries;
};

DetachRegistrations& detach_registrations() {
  static DetachRegistrations registrations;
  return registrations;
}

} // namespace

const std::vector<c10::DispatchKey>& detach_keep_version_counter_keys() {
  static const std::vector<c10::DispatchKey> keys = {
      c10::DispatchKey::CPU,
      c10::DispatchKey::CUDA,
      c10::DispatchKey::HIP,
      c10::DispatchKey::XPU,
      c10::DispatchKey::MPS,
  };
  return keys;
}

bool set_detach_keep_version_counter(bool registered) {
  DetachRegistrations& registrations = detach_registrations();
  const std::lock_guard<std::mutex> lock(registrations.mutex);
  const bool was_registered = !registrations.libraries.empty();
  if (registered == was_registered) {
    return was_registered;
  }
  if (!registered) {
    registrations.libraries.clear();
    return was_registered;
  }
  std::vector<std::unique_ptr<torch::Library>> libraries;
  for (c10::DispatchKey key : detach_keep_version_counter_keys()) {
    auto library = std::make_unique<torch::Library>(
        torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
    library->impl("detach", TORCH_FN(detach_keep_version_counter));
    libraries.push_back(std::move(library));
  }
  registrations.libraries = std::move(libraries);
  return was_registered;
}

bool is_detach_keep_version_counter_registered() {
  DetachRegistrations& registrations = detach_registrations();
  const std::lock_guard<std::mutex> lock(registrations.mutex);
  return !registrations.libraries.empty();
}

namespace {

// Registered when the library loads, like the TORCH_LIBRARY_IMPL blocks this
// replaces.
[[maybe_unused]] const bool registered_at_load =
    (set_detach_keep_version_counter(true), true);

} // namespace
} // namespace aliasguard::native
