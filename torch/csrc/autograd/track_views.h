#pragma once

#include <c10/macros/AliasguardExport.h>

namespace aliasguard::autograd {

// Note [Tracking views below autograd]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Autograd kernels redispatch under AutoDispatchBelowADInplaceOrView, which
// puts ADInplaceOrView in the thread-local exclude set for everything they
// call, __torch_dispatch__ included. There, view ops return plain aliases with
// fresh counters and in-place ops bump nothing. Removing ADInplaceOrView from
// the exclude set for a scope makes those ops go through their
// ADInplaceOrView kernels again (as_view, increment_version) while autograd
// itself stays excluded. At top level the key is not excluded, so the scope
// changes nothing.

// Re-enables ADInplaceOrView for the calling thread and returns whether it was
// excluded before; hand that value to restore_view_tracking.
ALIASGUARD_API bool enable_view_tracking();
ALIASGUARD_API void restore_view_tracking(bool was_excluded);
ALIASGUARD_API bool is_view_tracking_enabled();

// RAII form of the two functions above.
class TrackViewsGuard {
 public:
  TrackViewsGuard() : was_excluded_(enable_view_tracking()) {}
  ~TrackViewsGuard() {
    restore_view_tracking(was_excluded_);
  }
  TrackViewsGuard(const TrackViewsGuard&) = delete;
  TrackViewsGuard& operator=(const TrackViewsGuard&) = delete;

 private:
  bool was_excluded_;
};

} // namespace aliasguard::autograd
