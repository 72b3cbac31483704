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
//
// A view made that way has view metadata but no grad_fn, because the autograd
// kernel that would have attached one is excluded. Its base may require grad
// (an argument) or come to require it once the autograd kernel above attaches
// history to the op's output; autograd rebuilds a view's grad_fn from its
// base only when the view's recorded version is stale, and for these views
// it is not. See Note [Views made below autograd build their grad_fn from
// their base].

// Note [Views made below autograd build their grad_fn from their base]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Left alone, a view made in a tracked scope reports requires_grad (its base
// requires grad) with grad_fn None: a leaf of the graph in all but name, so a
// backward through it fills nobody's .grad and no error says so. An in-tree
// ADInplaceOrView would let as_view record a stale attr_version when
// autograd is excluded; we do the same from outside: while a tracked scope is
// open, a kernel on a borrowed dispatch key just above ADInplaceOrView runs
// for every view op (those with an ADInplaceOrView kernel and a view return),
// redispatches, and marks each view return that has view metadata and no
// grad_fn as stale (internals::mark_view_grad_fn_stale). The first grad_fn()
// read after its base requires grad then builds the view's grad_fn from the
// base's history, as for any view whose base was written: the gradient
// reaches the base. Every other op falls through the key at no cost, and the
// key is in the thread's dispatch state only while a scope is open. See
// Note [The tracked views' dispatch key] for the key.

// Re-enables ADInplaceOrView for the calling thread and returns whether it was
// excluded before; hand that value to restore_view_tracking. Scopes nest and
// may be opened by several layers of __torch_dispatch__ at once.
ALIASGUARD_API bool enable_view_tracking();
ALIASGUARD_API void restore_view_tracking(bool was_excluded);
ALIASGUARD_API bool is_view_tracking_enabled();

// RAII form of the two functions above; does nothing when `active` is false.
class TrackViewsGuard {
 public:
  explicit TrackViewsGuard(bool active = true)
      : active_(active), was_excluded_(active && enable_view_tracking()) {}
  ~TrackViewsGuard() {
    if (active_) {
      restore_view_tracking(was_excluded_);
    }
  }
  TrackViewsGuard(const TrackViewsGuard&) = delete;
  TrackViewsGuard& operator=(const TrackViewsGuard&) = delete;

 private:
  bool active_;
  bool was_excluded_;
};

// The marking kernels of Note [Views made below autograd build their grad_fn
// from their base] are registered on the first tracked scope; these take
// them back and tell whether they are there (for uninstalling, and tests).
// Releasing while a tracked scope is open on any thread is the caller's bug.
ALIASGUARD_API void release_tracked_view_kernels();
ALIASGUARD_API bool has_tracked_view_kernels();

} // namespace aliasguard::autograd
