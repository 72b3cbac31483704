#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/operator_name.h>
#include <c10/core/TensorImpl.h>
#include <c10/macros/AliasguardExport.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace aliasguard::utils {
class SchemaAliasAnalysis;
} // namespace aliasguard::utils

// The bookkeeping of selective activation checkpointing (SAC) that needs no
// Python: which op calls were cached, under which version counters, and what
// the recompute finds. The Python adapter
// (torch/csrc/autograd/python_selective_checkpoint.cpp) keeps the cached
// values themselves and runs the ops.

namespace aliasguard::autograd {

// Note [Which op calls SAC may cache]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Only an op whose outputs are memory of its own is cached: handing back a
// view at recompute would detach it from the base the recompute made, and
// an op that writes its arguments must write them again. So every op whose
// schema says a return may alias an argument (Tensor(a), a wildcard) or that
// writes an argument (Tensor(a!)) runs again, whatever the policy says; both
// engines read it from the one schema analysis. (The list-policy fast path
// reaches the same ops by registration: views and in-place ops have an
// ADInplaceOrView kernel, and it refuses those.)
struct SacOpTraits {
  // Some return carries an alias annotation (a view, a write, a wildcard):
  // the mode's result goes through alias correction. Wider than
  // SchemaAliasAnalysis::has_aliasing_returns, which counts only the
  // returns correction can pin to one argument.
  bool has_annotated_returns = false;
  // Some annotated return is not a write: the op may return a view.
  bool may_return_view = false;
  // The op is aten::_unsafe_view. See Note [A batched matmul's result
  // shares the cached counter].
  bool is_unsafe_view = false;
  // Schema indices of the arguments the op writes. Each is checked against
  // the cache before the op runs in the forward pass.
  std::vector<size_t> written_arguments;

  bool may_cache() const {
    return !may_return_view && written_arguments.empty();
  }
};

ALIASGUARD_API SacOpTraits sac_op_traits(
    const c10::OperatorName& op,
    const utils::SchemaAliasAnalysis& analysis);

// Whether `op` is aten::_unsafe_view's default overload, the one op whose
// fresh result both engines may give a cached counter. See Note [A batched
// matmul's result shares the cached counter].
ALIASGUARD_API bool is_unsafe_view(const c10::OperatorName& op);

// Identifies an op for the per-op call counts; the adapter passes the
// address of the op's Python object (an OpOverload is a singleton per
// overload, and the adapter keeps it alive while the cache lives).
using OpKey = const void*;

// Note [SAC cache keyed by version counter]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A cached output is stale once anything writes to its memory. Every write
// that autograd can see goes through a tensor sharing the output's version
// counter (the output itself, a view, the detached alias the cache holds:
// below autograd, detach keeps the counter, see DetachKeepVersionCounter.h).
// So the forward pass indexes the cached outputs by counter identity (see
// Note [Version counter identity]): checking an in-place op's written
// arguments is one hash lookup each, however many outputs are cached. After
// the forward pass the index is dropped; each entry keeps its counters (not
// the tensors: with saved-tensors hooks the memory may be elsewhere) and the
// versions at caching time, and the recompute compares them.
class ALIASGUARD_API SelectiveCheckpointCache {
 public:
  // Where the recompute stands for one call of an op.
  enum class SlotKind : uint8_t {
    kRecompute, // the forward pass did not cache it: run the op
    kCached, // hand back entry `entry`
    kConsumed, // already handed back to an earlier recompute
    kMissing, // the forward pass made fewer calls of this op
  };
  struct Slot {
    SlotKind kind = SlotKind::kMissing;
    size_t entry = 0; // kCached, kConsumed
    size_t forward_calls = 0; // calls of the op in the forward pass
    size_t call_index = 0; // this call's index among the recompute's calls
  };
  // A cached output found by its counter.
  struct CachedOutput {
    size_t entry;
    size_t output_index;
  };
  // A cached output whose version moved after the forward pass.
  struct VersionChange {
    size_t output_index;
    uint32_t expected;
    uint32_t found;
  };

  // --- forward pass ---
  // The op's call is recomputed.
  void record_recompute(OpKey op);
  // The op's call is cached; `outputs` are its outputs in order, undefined
  // for non-tensor outputs. Returns the entry's index.
  size_t record_cached(OpKey op, const std::vector<const at::Tensor*>& outputs);
  // The cached output sharing `written`'s version counter, if any.
  std::optional<CachedOutput> find_cached(const c10::TensorImpl& written) const;
  bool has_cached_outputs() const {
    return !by_counter_.empty();
  }
  // Note [A batched matmul's result shares the cached counter]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // aten::_unsafe_view (the end of every batched `x @ w`) returns its
  // input's memory under a counter of its own: its schema claims a fresh
  // tensor. Once that input is a cached output, the memory is no longer
  // private, so in the forward pass the output is given the input's counter
  // and a write through the result of `x @ w` is seen. Anywhere else the
  // output keeps its own counter, as in stock. Both engines call this for
  // every _unsafe_view of the forward pass.
  void share_counter_if_cached(
      const at::Tensor& input,
      const at::Tensor& output) const;
  // Forgets the counter index (the forward pass is over).
  void end_forward();

  // --- recompute ---
  // Restarts the per-op call counts (each backward recomputes from the start).
  void begin_recompute();
  // The slot of the next call of `op`.
  Slot next_call(OpKey op);
  // The first cached output of `entry` modified since it was cached.
  std::optional<VersionChange> changed_output(size_t entry) const;
  // Marks `entry` handed back; its counters are released.
  void consume(size_t entry);

  size_t num_entries() const {
    return entries_.size();
  }
  OpKey entry_op(size_t entry) const {
    return entries_.at(entry).op;
  }

 private:
  static constexpr size_t kRecomputeSlot = static_cast<size_t>(-1);

  struct Entry {
    OpKey op = nullptr;
    // Per output; a default (disabled) counter for non-tensor outputs.
    std::vector<c10::VariableVersion> counters;
    std::vector<uint32_t> versions;
    bool consumed = false;
  };

  std::vector<Entry> entries_;
  // Per op, one slot per forward call: an entry index or kRecomputeSlot.
  std::unordered_map<OpKey, std::vector<size_t>> slots_;
  // See Note [SAC cache keyed by version counter].
  std::unordered_map<const void*, CachedOutput> by_counter_;
  std::unordered_map<OpKey, size_t> recompute_calls_;
};

} // namespace aliasguard::autograd
