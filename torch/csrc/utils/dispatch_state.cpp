#include <torch/csrc/utils/dispatch_state.h>

#include <torch/csrc/utils/torch_internals.h>

namespace aliasguard::utils {
namespace {

thread_local DispatchBody current_body;

} // namespace

// See Note [Where a __torch_dispatch__ body runs]
ALIASGUARD_HOT const DispatchBody& current_dispatch_body() {
  return current_body;
}

ALIASGUARD_HOT DispatchBodyGuard::DispatchBodyGuard(const DispatchBody& body)
    : previous_(current_body) {
  current_body = body;
}

ALIASGUARD_HOT DispatchBodyGuard::~DispatchBodyGuard() {
  current_body = previous_;
}

// See Note [Tracing infrastructure is left alone]
ALIASGUARD_HOT bool tracing_infrastructure_active() {
  return internals::any_infrastructure_mode_set() ||
      functorch_transform_active();
}

ALIASGUARD_HOT bool functorch_transform_active() {
  // functorch includes its front key while any transform's layer is pushed.
  return internals::is_dispatch_key_included(
      c10::DispatchKey::FuncTorchDynamicLayerFrontMode);
}

} // namespace aliasguard::utils
