#include <torch/csrc/autograd/track_views.h>

#include <c10/core/impl/LocalDispatchKeySet.h>

namespace aliasguard::autograd {

// See Note [Tracking views below autograd]
bool enable_view_tracking() {
  const bool was_excluded = c10::impl::tls_is_dispatch_key_excluded(
      c10::DispatchKey::ADInplaceOrView);
  if (was_excluded) {
    c10::impl::tls_set_dispatch_key_excluded(
        c10::DispatchKey::ADInplaceOrView, false);
  }
  return was_excluded;
}

void restore_view_tracking(bool was_excluded) {
  c10::impl::tls_set_dispatch_key_excluded(
      c10::DispatchKey::ADInplaceOrView, was_excluded);
}

bool is_view_tracking_enabled() {
  return !c10::impl::tls_is_dispatch_key_excluded(
      c10::DispatchKey::ADInplaceOrView);
}

} // namespace aliasguard::autograd
