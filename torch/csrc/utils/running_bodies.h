#pragma once

#include <c10/macros/AliasguardExport.h>

#include <chrono>
#include <cstddef>

// Which threads are inside a body that depends on what install() set up, so
// that uninstall() takes nothing away from under one. No Python: the
// bindings (python_running_bodies.cpp) release the GIL around every wait.
// See Note [Installing and uninstalling while bodies run].

namespace aliasguard::utils {

// Note [Installing and uninstalling while bodies run]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A corrected __torch_dispatch__ body, and a track_views() or with_tracking()
// scope, runs with the tracked views' dispatch key included in its thread's
// local key set (Note [The tracked views' dispatch key]); every op it calls
// is dispatched through the kernels registered on that key. uninstall()
// deregisters them. A thread still in such a body then dispatches on a key
// with no kernel ("Could not run 'aten::view_as' with arguments from the
// 'AutocastIPU' backend"), on the uninstalling thread's next op as on any
// other's. So uninstall() must never run while a body runs anywhere:
//
//   * Each body enters here first (enter_body); a thread already inside one
//     just nests (a per-thread depth), so a count of threads inside a body
//     says whether any body runs.
//   * uninstall() refuses at once when its own thread is inside a body: it
//     would wait for itself.
//   * Otherwise it closes the bodies (close_bodies), waits until no thread is
//     inside one (wait_for_no_running_bodies, with the GIL released: the
//     bodies are Python code), changes everything, and opens them again.
//   * While closed, a body that is not nested in a running one is not
//     admitted: an automatic one (the corrected wrapper, the checkpoint
//     modes' per-op bodies) runs as stock, which is what it is about to
//     become; an explicit scope (track_views(), with_tracking()), which must
//     track as asked, waits until the bodies are open again
//     (wait_until_bodies_open) and then enters. A body nested in a running
//     one is always admitted: its thread is counted already, and waiting
//     there would wait for the uninstall that waits for it. An uninstall()
//     that refuses after all (an audit opened meanwhile on a path that does
//     not ask whether it runs, a KeyboardInterrupt while it waits) opens the
//     bodies again; the bodies that started meanwhile ran as stock.
//   * install() never waits: it takes nothing away, and what it registers is
//     safe to register while other threads dispatch (Note [Reversible detach
//     registration]; the tracked views' kernels are registered by the first
//     tracked body, before any thread includes their key). It refuses only
//     inside a body whose thread an uninstall() on another thread waits for.
//
// The count and the closed flag are sequentially consistent atomics: a body
// increments the count, then reads the flag; uninstall() sets the flag, then
// reads the count. Whatever the interleaving, either the body sees the flag
// (and leaves) or uninstall() sees the body (and waits for it). A body that
// leaves last while the bodies are closed wakes the waiter under its mutex, so
// no wake-up is lost.
//
// A thread that a running body waits for (autograd's worker thread, running a
// hook of the backward() a body called) must not call uninstall(): it would
// wait for that body, which waits for it. That is not detected.
//
// What the count does not cover: a C++ caller that opens a
// autograd::TrackViewsGuard of its own, outside these bodies, must not let
// uninstall() run meanwhile (release_tracked_view_kernels says so). The
// registrations uninstall() keeps for that reason, and the one it swaps while
// other threads may dispatch through it, are in Note [Fast path
// registrations are kept] and Note [Reversible detach registration].

// Enters a body on this thread. Returns whether it was admitted: always when
// nested in an admitted body of this thread, else unless the bodies are
// closed. Only an admitted body is left with exit_body.
ALIASGUARD_API bool enter_body();
ALIASGUARD_API void exit_body();
// Whether an admitted body runs on this thread.
ALIASGUARD_API bool body_running_on_this_thread();
// How many threads are inside an admitted body.
ALIASGUARD_API size_t threads_in_bodies();

// For uninstall(): no new body is admitted from now on (nested ones are)...
ALIASGUARD_API void close_bodies();
// ...waits at most `timeout` until no thread is inside a body; true when none
// is...
ALIASGUARD_API bool wait_for_no_running_bodies(
    std::chrono::milliseconds timeout);
// ...and admits bodies again. Idempotent.
ALIASGUARD_API void open_bodies();
ALIASGUARD_API bool bodies_closed();
// For explicit scopes: waits at most `timeout` until the bodies are open;
// true when they are.
ALIASGUARD_API bool wait_until_bodies_open(std::chrono::milliseconds timeout);

// RAII form of enter_body / exit_body, for an automatic body: when not
// admitted the caller runs the body as stock.
class RunningBody {
 public:
  RunningBody() : admitted_(enter_body()) {}
  ~RunningBody() {
    if (admitted_) {
      exit_body();
    }
  }
  RunningBody(const RunningBody&) = delete;
  RunningBody& operator=(const RunningBody&) = delete;

  bool admitted() const {
    return admitted_;
  }

 private:
  bool admitted_;
};

} // namespace aliasguard::utils
