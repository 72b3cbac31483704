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
// ADInplaceOrView would let such a view know its grad_fn is yet to be built;
// we do it from outside: while a tracked scope is open, a kernel on a
// borrowed dispatch key just above ADInplaceOrView runs for every view op
// (those with an ADInplaceOrView kernel and a view return), redispatches, and
// remembers (weakly) each view return that has view metadata and no grad_fn.
// When the scope ends, those still alive are marked stale
// (internals::mark_view_grad_fn_stale): the first grad_fn() read once their
// base requires grad builds their grad_fn from the base's history, as for
// any view whose base was written, and the gradient reaches the base.
// Marking at the end rather than at once keeps the body's own reads as
// stock: a view the body reads and returns has no grad_fn yet, so the
// correction can hand it back to the kernel above (Note [Views returned from
// below autograd]). One of several views of one op (chunk, split) is made a
// DEFAULT view first: autograd refuses to rebuild the grad_fn of such views
// because theirs is the op's shared node, but one made below autograd has
// none, and its rebuilt grad_fn is its own. A view made in no-grad or
// inference mode cannot be rebuilt at all; it loses its view metadata and
// stays what stock makes it, a plain alias that does not require grad,
// except that it keeps the shared counter. See Note [The
// tracked views' dispatch key] for the key.

// Note [A kernel's own calls are not the body's]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Above a __torch_dispatch__, the autograd kernel runs the op's kernel with
// ADInplaceOrView excluded, so whatever the kernel calls (abs writing its
// result through abs.out, unsafe_split slicing with split) is never tracked.
// A tracked scope re-enables the key for the ops the body calls, and must not
// for the ops their kernels call: the same borrowed key's fallback runs every
// op whose kernel is opaque (no ADInplaceOrView kernel of its own, no
// CompositeImplicitAutograd decomposition, an autograd kernel of its own)
// with ADInplaceOrView and the key excluded, as the autograd kernel would.
// View and in-place ops exclude it below themselves in their own
// ADInplaceOrView kernels; composites pass the key by (their decomposition is
// the body's code), and so do ops under torch's autograd fallback, which
// leaves the key on at top level too. A fresh output thus ends with the
// version top level gives it. The rule per op, and ops defined after the
// kernels were registered: Note [What a tracked body's call runs as] and
// Note [Ops registered after the tracked views' kernels] in
// tracked_body_calls.h.

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
// from their base] are registered on the first tracked scope, with the
// listener that records the ops defined later; these take them back (the
// listener too) and tell whether they are there (for uninstalling, and
// tests).
// Releasing while a tracked scope is open on any thread is the caller's bug.
ALIASGUARD_API void release_tracked_view_kernels();
ALIASGUARD_API bool has_tracked_view_kernels();

} // namespace aliasguard::autograd
