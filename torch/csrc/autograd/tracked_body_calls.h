#pragma once

#include <c10/macros/AliasguardExport.h>

#include <cstdint>
#include <optional>

namespace c10 {
class OperatorHandle;
} // namespace c10

// What an op called from a tracked body runs as (Note [What a tracked body's
// call runs as]), decided from the op's registrations, for the ops of every
// library whenever it was loaded (Note [Ops registered after the tracked
// views' kernels]).

namespace aliasguard::autograd {

// Note [What a tracked body's call runs as]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A tracked body must run each op it calls the way the op runs at top level,
// with autograd excluded: the op's ADInplaceOrView kernel runs (views are
// marked, writes bumped), and whatever the op's kernel calls runs with
// ADInplaceOrView excluded or not exactly as the autograd kernel above it
// would leave it. Read from the dispatcher, not from a list:
//   * an ADInplaceOrView kernel of its own: the kernel runs; its view returns
//     are remembered (kView) or it passes by (kThrough);
//   * CompositeImplicitAutograd: the decomposition is the body's code and
//     passes by (kThrough);
//   * no autograd kernel of its own (a custom op defined with Library.define
//     or TORCH_LIBRARY and a backend kernel only): at top level torch's
//     autograd fallback runs it with ADInplaceOrView left on, so the views
//     and writes its kernel makes through other ops are views and bumps
//     there; it passes by (kThrough), and so do they in the body;
//   * otherwise an autograd kernel of its own (every generated aten kernel)
//     runs the kernel with ADInplaceOrView excluded (Note [A kernel's own
//     calls are not the body's]): kKernel, run untracked.
// An autograd kernel written in Python (torch.library.register_autograd
// without an ADInplaceOrView kernel) leaves the key on at top level; it is
// read as the generated ones are, so its kernel's own writes are not counted
// in a body, as in stock.
enum class BodyCall : uint8_t {
  kView, // an ADInplaceOrView kernel makes views: remember them
  kThrough, // as called: its own ADInplaceOrView kernel, a composite, or
            // torch's autograd fallback above it
  kKernel, // an opaque kernel under an autograd kernel: run it untracked
};

ALIASGUARD_API BodyCall body_call_of(const c10::OperatorHandle& op);

// Note [Ops registered after the tracked views' kernels]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The tracked views' kernels are registered per op for the ops that exist
// when the first tracked scope opens; an op defined later (a custom op
// registered after that, from Python or C++) has none, and the key's
// fallback would run it untracked whatever it is: a custom view op's output
// would not be a view, a custom op's ADInplaceOrView kernel would not bump.
// So while the kernels are registered, a dispatcher registration listener
// records every op defined afterwards, and the fallback asks LateOps how to
// run one it meets: body_call_of, read on its first call (its kernels are
// registered by then; a def alone has none). Registering the per-op kernel
// from there instead would write the dispatcher's tables from inside a call
// (and under concurrent calls on other threads); the fallback's boxed call
// costs only the ops defined late. Ops defined before the listener starts
// are the registering code's (getAllOpNames after start()); one defined
// in between is both, and its per-op kernel wins. Undefining an op forgets
// it. stop() removes the listener and forgets every op, with the kernels;
// the next tracked scope starts again. The listener is called with the
// dispatcher's lock held: it only records, under a lock of its own that is
// never held while calling into the dispatcher.
class ALIASGUARD_API LateOps {
 public:
  // Starts recording the ops defined from now on (ignoring the ones the
  // dispatcher replays to a new listener).
  static void start();
  // Stops recording and forgets every recorded op.
  static void stop();
  // How a body runs `op` if it was defined after start(); nullopt for any
  // other op (whose per-op kernel, or the fallback's default, applies).
  static std::optional<BodyCall> body_call(const c10::OperatorHandle& op);
};

} // namespace aliasguard::autograd
