#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/macros/AliasguardExport.h>

#include <cstddef>
#include <string>

// Refusing a write to a tensor selective checkpointing cached, before the
// write happens, without a dispatch mode. See Note [Refusing a write where it
// happens].

namespace aliasguard::autograd {

// Note [Refusing a write where it happens]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The fast path's kernels see only the ops it caches (Note [SAC below
// autograd]), not the in-place and out= ops that might write to what they
// cached. A dispatch mode sees those because it sees every op; the cost of
// seeing every op is what the fast path exists to avoid. What is needed is
// to see exactly the ops that write, and only while a region's forward phase
// is open:
//
//   * A borrowed dispatch key (Note [The checkpoint write guard's dispatch
//     key]) gets a fallthrough fallback and one boxed kernel per op whose
//     schema writes an argument (Tensor(a!)). Every other op has no kernel
//     there, so the dispatcher masks the key out of its key set: a
//     functional op costs nothing even while the key is on.
//   * The key is excluded by default and a thread turns it on only while a
//     forward region that refuses writes is open (one WriteChecker per
//     region, innermost last). Other threads, and this one outside regions,
//     never reach the kernels.
//   * The kernel runs above autograd, before the op's ADInplaceOrView kernel
//     bumps the version and before any backend kernel: it looks each written
//     tensor's version counter up in the open regions' caches (one hash
//     lookup each, Note [SAC cache keyed by version counter]) and the region
//     that cached it throws. Nothing is written and no version moves. A view
//     of a cached output and the result of a batched matmul over it share
//     its counter (Note [A batched matmul's result shares the cached
//     counter]), so writes through them are refused too.
//
// Kernels are registered for the ops that exist when the first such region
// opens, and kept (the reasons of Note [Fast path registrations are kept]
// apply); an op registered later gets its kernel when the next region opens,
// which finds the set of operators changed (utils::operator_registrations).
// CompositeImplicitAutograd ops get none: they decompose above the key into
// ops that have one.
//
// Not seen, so still found when the forward phase ends or at recompute by
// comparing versions: a write from another thread, by an op registered
// after the region opened, or by a kernel that bumps a version its schema
// does not declare. Tensor.data has a counter of its own and is neither
// refused nor found (the documented escape hatch).
class ALIASGUARD_API WriteChecker {
 public:
  virtual ~WriteChecker() = default;
  // Throws to refuse `op` writing to `written`; returns to let it.
  virtual void check_write(
      const c10::OperatorHandle& op,
      const at::Tensor& written) const = 0;
};

// Turns the guard on for this thread until the matching pop, registering the
// kernels first where operators were registered since the last time. False
// (and nothing changed) when the key is not free in this process: see
// write_guard_unavailable_reason().
ALIASGUARD_API bool push_write_checker(const WriteChecker* checker);
// Removes `checker` (wherever it is on this thread's stack; nothing if it is
// not there) and turns the guard off when it was the last.
ALIASGUARD_API void pop_write_checker(const WriteChecker* checker);

// Whether the guard is on for this thread (for tests).
ALIASGUARD_API bool is_write_guard_on();
// Test-only switch: with false, push_write_checker refuses (returns false)
// in every thread, so fast-path regions fall back to their version checks at
// the region's end. The differential harness's write-guard mutant uses it to
// show that its rules need the guard. Returns the previous setting.
ALIASGUARD_API bool set_write_guard_enabled_for_testing(bool enabled);
// Ops with a guard kernel (for tests).
ALIASGUARD_API size_t num_write_guard_kernels();
// Why the guard cannot be used here (empty when it can): another library
// registered a fallback on the borrowed key.
ALIASGUARD_API std::string write_guard_unavailable_reason();

} // namespace aliasguard::autograd
