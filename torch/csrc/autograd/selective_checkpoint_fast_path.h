#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/macros/AliasguardExport.h>
#include <torch/csrc/autograd/selective_checkpoint.h>
#include <torch/csrc/autograd/selective_checkpoint_write_guard.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

// Selective activation checkpointing (SAC) for a policy whose ops are known
// in advance (a list of ops to save), with no Python on the per-op path.
// See Note [SAC below autograd].

namespace aliasguard::autograd {

// Note [SAC below autograd]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A dispatch mode sees every op of the region through the Python dispatch
// key, which costs more than the ops of a small model. For a list policy only
// the listed ops matter, and a stock build has an interception point for one
// op that needs no Python: ADInplaceOrView. Functional ops have no kernel
// there (the key's fallback is a fallthrough), so a boxed kernel registered
// for exactly the listed ops runs below autograd on every call of those ops
// (forward, recompute and the backward's own calls alike), and autograd's
// graph above it is the one it would build anyway.
//
// The kernel reads a thread-local stack of open regions. With none open it
// redispatches at once, so the registrations are made once per op and kept
// (registering costs a dispatch table update per op; a region costs nothing
// extra when its ops are registered already). A region in its forward phase
// runs the op and keeps an alias of each output that shares its version
// counter (a shallow copy made here, below autograd); in its recompute phase
// it hands those aliases back in call order instead of running the op, after
// checking the versions did not move. Nested regions act as nested dispatch
// modes would: the innermost region sees the op first and the outer ones see
// what it returns.
//
// Writes. The kernels see only the listed ops, not the in-place ops that
// might write to a cached output; while the forward phase runs, the write
// guard sees those (Note [Refusing a write where it happens]) and the region
// refuses a write to what it cached before it happens, naming the writing op
// and the cached one, as the mode does. A write the guard cannot see still
// moves the version counter the cached alias shares, and the versions are
// compared twice: when the forward phase ends and when the recompute hands
// the output back (a write between forward and backward, which the mode
// path finds the same way). Either raises before the cached value is used,
// so no gradient is computed from written memory.
//
// What is not cached (the op is run again at recompute, as with a policy
// that recomputes it): ops that already have an ADInplaceOrView kernel
// (views and in-place ops, which the mode path never caches either),
// CompositeImplicitAutograd ops (they decompose above autograd and never
// reach the key), and calls whose outputs are tensor subclasses (their
// aliases would be made by the subclass, which may not share the counter).
//
// aten::_unsafe_view shares its input's memory but not its counter: see
// Note [A batched matmul's result shares the cached counter] in
// selective_checkpoint.h, which the kernel applies while a region's forward
// phase runs.

// Note [Function policies below autograd]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A policy function decides per call, so it can use the fast path only when
// its owner names the ops it may save: the kernels are registered for those
// ops and nothing else, and every other op is recomputed without the policy
// being asked (as if it had answered "recompute"). The region asks its
// FastPathPolicy once per call of a named op in the forward phase, after the
// op ran, with the arguments it was called with and its outputs (what a
// dispatch mode's policy sees). The answer is recorded per call, so the
// recompute replays the forward's decisions in call order without asking
// again; a policy that would answer differently at recompute cannot make the
// two passes disagree. The policy runs while the kernel handles the op, so
// ops it runs itself are not seen by the regions (see `handling_op`).

// Hooks a language binding installs: where user code ran an op, and the
// errors it raises in its own types. Without them, call sites are
// "<unknown>" and errors are c10::Error.
struct FastPathMutation {
  std::string cached_op; // "aten::mm"
  size_t output_index = 0;
  std::string cached_at; // "file:line" of the user code that ran it
  uint32_t expected_version = 0;
  uint32_t found_version = 0;
  bool in_forward = false; // found when the forward phase ended
};

// A write the guard refused before it happened.
struct FastPathWrite {
  std::string writing_op; // "aten::mul_.Tensor"
  std::string cached_op;
  size_t output_index = 0;
  std::string cached_at;
};

struct FastPathHooks {
  // Returns an opaque handle for the current call site (or null).
  void* (*capture_call_site)() = nullptr;
  void (*release_call_site)(void* site) = nullptr;
  std::string (*describe_call_site)(void* site) = nullptr;
  // Each throws the binding's error; if it returns, a c10::Error follows.
  void (*raise_mutation)(const FastPathMutation& mutation) = nullptr;
  void (*raise_write)(const FastPathWrite& write) = nullptr;
  void (*raise_missing)(
      const std::string& op,
      size_t calls,
      size_t forward_calls) = nullptr;
  void (*raise_consumed)(const std::string& op) = nullptr;
};

ALIASGUARD_API void set_fast_path_hooks(const FastPathHooks* hooks);

// Why `op` cannot be cached by the fast path (empty: it can), e.g. it is a
// view or in-place op, or CompositeImplicitAutograd. Those ops are recomputed
// by the mode path too, so a list holding them still qualifies.
ALIASGUARD_API std::string fast_path_skip_reason(const c10::OperatorHandle& op);

// Registers the kernel for `op` if it is not registered yet (idempotent,
// thread-safe). Requires fast_path_skip_reason(op) to be empty.
ALIASGUARD_API void register_fast_path_kernel(const c10::OperatorHandle& op);
// Releases every registration; ops dispatch as in stock torch again.
// Refused (returns false) while a region is open on this thread. Only safe
// while no other thread dispatches those ops: see Note [Fast path
// registrations are kept] (aliasguard.uninstall() keeps them).
ALIASGUARD_API bool release_fast_path_kernels();
ALIASGUARD_API size_t num_fast_path_kernels();

// Decides whether one call of a region's op is cached.
// See Note [Function policies below autograd].
class ALIASGUARD_API FastPathPolicy {
 public:
  virtual ~FastPathPolicy() = default;
  // `arguments`: the call's arguments as passed; `outputs`: what it returned.
  // May throw; the call then fails as if the op had.
  virtual bool saves(
      const c10::OperatorHandle& op,
      c10::ArrayRef<c10::IValue> arguments,
      c10::ArrayRef<c10::IValue> outputs) = 0;
};

class ALIASGUARD_API FastPathRegion final : public WriteChecker {
 public:
  // `ops`: the ops whose outputs may be cached; registers their kernels (and
  // aten::_unsafe_view's). Ops with a skip reason are ignored. Without a
  // `policy` every call of those ops is cached (a list policy); with one,
  // the calls it answers true for.
  FastPathRegion(
      const std::vector<c10::OperatorHandle>& ops,
      bool allow_mutation,
      std::unique_ptr<FastPathPolicy> policy = nullptr);
  ~FastPathRegion() override;
  FastPathRegion(const FastPathRegion&) = delete;
  FastPathRegion& operator=(const FastPathRegion&) = delete;

  // The forward phase, on the calling thread; unless mutation is allowed,
  // writes to what it caches are refused meanwhile (Note [Refusing a write
  // where it happens]). `check` on exit compares the cached versions (false
  // when the region is left by an exception).
  void enter_forward();
  void exit_forward(bool check);
  // The recompute phase; each recompute starts from the first call again.
  void enter_recompute();
  void exit_recompute();

  struct EntryView {
    std::string op;
    std::vector<c10::IValue> outputs; // empty once handed back
    std::string cached_at;
  };
  std::vector<EntryView> entries() const;
  size_t num_cached() const;

  // Used by the kernel.
  bool saves(const c10::OperatorHandle& op) const;
  bool asks_policy() const {
    return policy_ != nullptr;
  }
  // `stack` holds the outputs; `arguments` the call's arguments when
  // asks_policy() (else empty).
  void record(
      const c10::OperatorHandle& op,
      const torch::jit::Stack& stack,
      c10::ArrayRef<c10::IValue> arguments);
  bool hand_back(const c10::OperatorHandle& op, torch::jit::Stack* stack);
  void share_unsafe_view_counter(
      const at::Tensor& input,
      const at::Tensor& output) const;
  // Used by the write guard: throws when `written` shares a cached output's
  // counter.
  void check_write(const c10::OperatorHandle& op, const at::Tensor& written)
      const override;

 private:
  struct Entry {
    const c10::OperatorHandle* op = nullptr;
    std::vector<c10::IValue> outputs;
    void* site = nullptr;
  };
  std::string site_of(const Entry& entry) const;
  void check_versions(size_t entry, bool in_forward) const;
  void forget_site(Entry& entry);

  std::vector<c10::OperatorHandle> ops_;
  SelectiveCheckpointCache cache_;
  std::vector<Entry> entries_;
  bool allow_mutation_ = false;
  bool guarding_writes_ = false;
  std::unique_ptr<FastPathPolicy> policy_;
};

// Open regions on this thread (innermost last); for tests.
ALIASGUARD_API size_t num_open_fast_path_regions();

} // namespace aliasguard::autograd
