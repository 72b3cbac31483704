#include <torch/csrc/utils/dispatch_state.h>

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

namespace aliasguard::utils {
namespace {

thread_local DispatchBody current_body;

} // namespace

// See Note [Where a __torch_dispatch__ body runs]
const DispatchBody& current_dispatch_body() {
  return current_body;
}

DispatchBodyGuard::DispatchBodyGuard(const DispatchBody& body)
    : previous_(current_body) {
  current_body = body;
}

DispatchBodyGuard::~DispatchBodyGuard() {
  current_body = previous_;
}

// See Note [Tracing infrastructure is left alone]
bool tracing_infrastructure_active() {
  using c10::impl::TorchDispatchModeKey;
  using c10::impl::TorchDispatchModeTLS;
  for (const auto key :
       {TorchDispatchModeKey::FAKE,
        TorchDispatchModeKey::PROXY,
        TorchDispatchModeKey::FUNCTIONAL}) {
    if (TorchDispatchModeTLS::get_mode(key).has_value()) {
      return true;
    }
  }
  // functorch includes its front key while any transform's layer is pushed.
  return c10::impl::tls_is_dispatch_key_included(
      c10::DispatchKey::FuncTorchDynamicLayerFrontMode);
}

} // namespace aliasguard::utils
