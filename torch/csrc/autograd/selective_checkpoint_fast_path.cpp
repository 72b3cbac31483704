// Selective checkpointing for list policies below autograd, without Python.
// See Note [SAC below autograd] in selective_checkpoint_fast_path.h.

#include <torch/csrc/autograd/selective_checkpoint_fast_path.h>

#include <c10/core/VersionCounterUtils.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

namespace aliasguard::autograd {
namespace {

constexpr c10::DispatchKey kKey = c10::DispatchKey::ADInplaceOrView;

std::atomic<const FastPathHooks*> hooks_{nullptr};

const FastPathHooks* hooks() {
  return hooks_.load(std::memory_order_acquire);
}

enum class Phase : uint8_t { kForward, kRecompute };

struct OpenRegion {
  FastPathRegion* region;
  Phase phase;
};

thread_local std::vector<OpenRegion> open_regions;

std::string qualified_name(const c10::OperatorHandle& op) {
  const c10::OperatorName& name = op.operator_name();
  return name.overload_name.empty() ? name.name
                                    : name.name + "." + name.overload_name;
}

OpKey key_of(const c10::OperatorHandle& op) {
  // The OperatorEntry owns the name, so its address identifies the op.
  return &op.operator_name();
}

// An alias of `tensor` with its own TensorImpl and the same storage and
// version counter, made without dispatching (no autograd, no subclass).
at::Tensor counter_sharing_alias(const at::Tensor& tensor) {
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  return at::Tensor(impl->shallow_copy_and_detach(
      /*version_counter=*/impl->version_counter(),
      /*allow_tensor_metadata_change=*/false));
}

// Whether an output can be kept as a counter-sharing alias: a tensor whose
// implementation is not a Python subclass's.
bool cacheable(const at::Tensor& tensor) {
  return !tensor.defined() ||
      (!tensor.key_set().has(c10::DispatchKey::Python) &&
       has_version_counter(*tensor.unsafeGetTensorImpl()));
}

void redispatch_below(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  op.redispatchBoxed(
      keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey), stack);
}

// Regions [0, depth) of this thread's stack, innermost (depth - 1) first, as
// nested dispatch modes would see the op.
void run_in_regions(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack,
    size_t depth) {
  if (is_unsafe_view(op.operator_name())) {
    const at::Tensor input = (*stack)[stack->size() - 2].toTensor();
    redispatch_below(op, keys, stack);
    for (size_t i = depth; i-- > 0;) {
      if (open_regions[i].phase == Phase::kForward) {
        open_regions[i].region->share_unsafe_view_counter(
            input, stack->back().toTensor());
      }
    }
    return;
  }
  while (depth > 0 && !open_regions[depth - 1].region->saves(op)) {
    --depth;
  }
  if (depth == 0) {
    redispatch_below(op, keys, stack);
    return;
  }
  // Copied: running the op may open regions on this thread.
  const OpenRegion region = open_regions[depth - 1];
  if (region.phase == Phase::kRecompute) {
    if (!region.region->hand_back(op, stack)) {
      run_in_regions(op, keys, stack, depth - 1);
    }
    return;
  }
  // See Note [Function policies below autograd]: a policy sees the call's
  // arguments, which running the op takes off the stack.
  std::vector<c10::IValue> arguments;
  if (region.region->asks_policy()) {
    const size_t num_arguments = op.schema().arguments().size();
    arguments.assign(stack->end() - num_arguments, stack->end());
  }
  run_in_regions(op, keys, stack, depth - 1);
  region.region->record(op, *stack, arguments);
}

// Set while the kernel handles an op for the open regions. A dispatch mode
// or tensor subclass below the key may call the op again from its Python
// handler, and the dispatcher reaches this kernel again for that inner call;
// the regions must not count it: a mode above them (which is what they act
// as) would not see it either.
thread_local bool handling_op = false;

ALIASGUARD_HOT void fast_path_kernel(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  if (open_regions.empty() || handling_op) {
    redispatch_below(op, keys, stack);
    return;
  }
  handling_op = true;
  try {
    run_in_regions(op, keys, stack, open_regions.size());
  } catch (...) {
    handling_op = false;
    throw;
  }
  handling_op = false;
}

// Note [Fast path registrations are kept]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// One torch::Library per op, made on the first region that saves it and
// kept for the life of the process, aliasguard.uninstall() included:
//
//   * Cost: outside a region the kernel costs a thread-local read, while
//     registering per region would update the op's dispatch table twice per
//     checkpoint call, under the dispatcher's lock.
//   * Outside a region, on any thread, the kernel is an exact pass-through:
//     it redispatches with the same key set minus ADInplaceOrView and
//     everything above it, which is the kernel the fallthrough it replaces
//     would have reached (the dispatcher drops a fallthrough key from the set
//     before the lookup), with the same arguments; only the boxing differs.
//     So after uninstall() the op computes, aliases and counts as in stock.
//   * Taking it out is not safe while another thread may dispatch the op,
//     and for these ops that is any thread: the autograd kernel of mm
//     redispatches to ADInplaceOrView for every call. Deregistering writes
//     the op's table entry (now the fallthrough kernel) before it clears the
//     key's "not a fallthrough" bit (OperatorEntry::updateDispatchTableEntry_),
//     and a call whose key set was computed before the bit was cleared then
//     runs c10's fallthrough_kernel, which fails ("0 INTERNAL ASSERT FAILED
//     at KernelFunction.cpp:14") on an unrelated thread. No count of
//     aliasguard's own bodies can rule that out; keeping the kernel can.
//
// So release_fast_path_kernels() is for a process that knows no other
// thread dispatches (tests), and uninstall() does not call it. Registering
// is safe meanwhile: the entry is written before the bit is set, so a call
// either skips the key or finds the kernel. The owner is a function-local
// static made when the library loads, so it is destroyed before the
// dispatcher, like a TORCH_LIBRARY_IMPL block's library would be.
struct Registrations {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<torch::Library>> by_op;
};

Registrations& registrations() {
  static Registrations instance;
  return instance;
}
[[maybe_unused]] const Registrations& registrations_at_load = registrations();

void register_kernel_locked(
    Registrations& regs,
    const c10::OperatorHandle& op) {
  const std::string name = qualified_name(op);
  if (regs.by_op.count(name) != 0) {
    return;
  }
  const auto separator = name.find("::");
  TORCH_CHECK(
      separator != std::string::npos,
      "aliasguard selective checkpoint: op name '",
      name,
      "' has no namespace");
  auto library = std::make_unique<torch::Library>(
      torch::Library::IMPL,
      name.substr(0, separator),
      kKey,
      __FILE__,
      __LINE__);
  library->impl(
      name.substr(separator + 2).c_str(),
      torch::CppFunction::makeFromBoxedFunction<&fast_path_kernel>());
  regs.by_op.emplace(name, std::move(library));
}

std::optional<c10::OperatorHandle> unsafe_view_op() {
  return c10::Dispatcher::singleton().findOp({"aten::_unsafe_view", ""});
}

} // namespace

void set_fast_path_hooks(const FastPathHooks* new_hooks) {
  hooks_.store(new_hooks, std::memory_order_release);
}

std::string fast_path_skip_reason(const c10::OperatorHandle& op) {
  if (!op.hasSchema()) {
    return "it has no schema";
  }
  {
    Registrations& regs = registrations();
    const std::lock_guard<std::mutex> lock(regs.mutex);
    if (regs.by_op.count(qualified_name(op)) != 0) {
      return "";
    }
  }
  if (op.hasKernelForDispatchKey(kKey)) {
    return "it has an ADInplaceOrView kernel (a view or in-place op)";
  }
  if (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
    return "it is CompositeImplicitAutograd (it decomposes above autograd)";
  }
  return "";
}

void register_fast_path_kernel(const c10::OperatorHandle& op) {
  const std::string reason = fast_path_skip_reason(op);
  TORCH_CHECK(
      reason.empty(),
      "aliasguard selective checkpoint: cannot cache ",
      qualified_name(op),
      " below autograd: ",
      reason);
  Registrations& regs = registrations();
  const std::lock_guard<std::mutex> lock(regs.mutex);
  register_kernel_locked(regs, op);
}

bool release_fast_path_kernels() {
  if (!open_regions.empty()) {
    return false;
  }
  Registrations& regs = registrations();
  const std::lock_guard<std::mutex> lock(regs.mutex);
  regs.by_op.clear();
  return true;
}

size_t num_fast_path_kernels() {
  Registrations& regs = registrations();
  const std::lock_guard<std::mutex> lock(regs.mutex);
  return regs.by_op.size();
}

size_t num_open_fast_path_regions() {
  return open_regions.size();
}

FastPathRegion::FastPathRegion(
    const std::vector<c10::OperatorHandle>& ops,
    bool allow_mutation,
    std::unique_ptr<FastPathPolicy> policy)
    : allow_mutation_(allow_mutation), policy_(std::move(policy)) {
  for (const c10::OperatorHandle& op : ops) {
    if (fast_path_skip_reason(op).empty() &&
        std::find(ops_.begin(), ops_.end(), op) == ops_.end()) {
      ops_.push_back(op);
    }
  }
  Registrations& regs = registrations();
  const std::lock_guard<std::mutex> lock(regs.mutex);
  for (const c10::OperatorHandle& op : ops_) {
    register_kernel_locked(regs, op);
  }
  if (!ops_.empty()) {
    const auto unsafe_view = unsafe_view_op();
    if (unsafe_view.has_value() &&
        (regs.by_op.count("aten::_unsafe_view") != 0 ||
         !unsafe_view->hasKernelForDispatchKey(kKey))) {
      register_kernel_locked(regs, *unsafe_view);
    }
  }
}

FastPathRegion::~FastPathRegion() {
  if (guarding_writes_) {
    pop_write_checker(this);
  }
  for (Entry& entry : entries_) {
    forget_site(entry);
  }
  // A region destroyed while open (its owner dropped it mid-phase) must not
  // be reached by the kernel again.
  open_regions.erase(
      std::remove_if(
          open_regions.begin(),
          open_regions.end(),
          [this](const OpenRegion& open) { return open.region == this; }),
      open_regions.end());
}

void FastPathRegion::forget_site(Entry& entry) {
  if (entry.site != nullptr) {
    const FastPathHooks* h = hooks();
    if (h != nullptr && h->release_call_site != nullptr) {
      h->release_call_site(entry.site);
    }
    entry.site = nullptr;
  }
}

std::string FastPathRegion::site_of(const Entry& entry) const {
  const FastPathHooks* h = hooks();
  if (entry.site == nullptr || h == nullptr ||
      h->describe_call_site == nullptr) {
    return "<unknown>";
  }
  return h->describe_call_site(entry.site);
}

bool FastPathRegion::saves(const c10::OperatorHandle& op) const {
  // A policy list is short: a scan beats hashing.
  return std::find(ops_.begin(), ops_.end(), op) != ops_.end();
}

void FastPathRegion::enter_forward() {
  open_regions.push_back({this, Phase::kForward});
  if (!allow_mutation_ && !guarding_writes_) {
    // False only where the key is not free, which the import's self-test
    // already refuses, or the test-only switch is off; the version checks
    // then remain.
    guarding_writes_ = push_write_checker(this);
  }
}

namespace {
void close(FastPathRegion* region, Phase phase) {
  for (size_t i = open_regions.size(); i-- > 0;) {
    if (open_regions[i].region == region && open_regions[i].phase == phase) {
      open_regions.erase(open_regions.begin() + static_cast<ptrdiff_t>(i));
      return;
    }
  }
}
} // namespace

void FastPathRegion::exit_forward(bool check) {
  close(this, Phase::kForward);
  if (guarding_writes_) {
    pop_write_checker(this);
    guarding_writes_ = false;
  }
  cache_.end_forward();
  if (check && !allow_mutation_) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      check_versions(i, /*in_forward=*/true);
    }
  }
}

void FastPathRegion::enter_recompute() {
  cache_.begin_recompute();
  open_regions.push_back({this, Phase::kRecompute});
}

void FastPathRegion::exit_recompute() {
  close(this, Phase::kRecompute);
}

void FastPathRegion::record(
    const c10::OperatorHandle& op,
    const torch::jit::Stack& stack,
    c10::ArrayRef<c10::IValue> arguments) {
  const size_t num_returns = op.schema().returns().size();
  if (policy_ != nullptr) {
    bool saves = false;
    try {
      saves = policy_->saves(
          op,
          arguments,
          c10::ArrayRef<c10::IValue>(stack).slice(stack.size() - num_returns));
    } catch (...) {
      // The op ran; a caller that catches the error and goes on must still
      // find the recompute's calls matching the forward's: this one is run
      // again.
      cache_.record_recompute(key_of(op));
      throw;
    }
    if (!saves) {
      cache_.record_recompute(key_of(op));
      return;
    }
  }
  std::vector<c10::IValue> outputs;
  outputs.reserve(num_returns);
  std::vector<const at::Tensor*> tensors;
  bool ok = true;
  for (size_t i = stack.size() - num_returns; ok && i < stack.size(); ++i) {
    const c10::IValue& value = stack[i];
    if (value.isTensor()) {
      ok = cacheable(value.toTensor());
      if (ok) {
        outputs.emplace_back(
            value.toTensor().defined() ? counter_sharing_alias(value.toTensor())
                                       : at::Tensor());
      }
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> aliases;
      for (const at::Tensor& tensor : value.toTensorList()) {
        ok = ok && cacheable(tensor);
        aliases.push_back(
            tensor.defined() ? counter_sharing_alias(tensor) : at::Tensor());
      }
      outputs.emplace_back(std::move(aliases));
    } else if (value.isList() || value.isTuple()) {
      ok = false; // nested containers: recompute rather than guess
    } else {
      outputs.push_back(value);
    }
  }
  const OpKey key = key_of(op);
  if (!ok) {
    cache_.record_recompute(key);
    return;
  }
  // Counters from the aliases: they share the outputs'.
  for (const c10::IValue& value : outputs) {
    if (value.isTensor()) {
      tensors.push_back(&value.toTensor());
    } else if (value.isTensorList()) {
      // The list holds the tensors; take their addresses from a stable copy.
      for (const c10::IValue& element : value.toListRef()) {
        tensors.push_back(&element.toTensor());
      }
    } else {
      tensors.push_back(nullptr);
    }
  }
  cache_.record_cached(key, tensors);
  Entry entry;
  entry.op = nullptr;
  for (const c10::OperatorHandle& saved : ops_) {
    if (saved == op) {
      entry.op = &saved;
    }
  }
  entry.outputs = std::move(outputs);
  const FastPathHooks* h = hooks();
  if (h != nullptr && h->capture_call_site != nullptr) {
    entry.site = h->capture_call_site();
  }
  entries_.push_back(std::move(entry));
}

void FastPathRegion::check_versions(size_t entry, bool in_forward) const {
  const auto change = cache_.changed_output(entry);
  if (!change.has_value()) {
    return;
  }
  FastPathMutation mutation;
  mutation.cached_op = qualified_name(*entries_[entry].op);
  mutation.output_index = change->output_index;
  mutation.cached_at = site_of(entries_[entry]);
  mutation.expected_version = change->expected;
  mutation.found_version = change->found;
  mutation.in_forward = in_forward;
  const FastPathHooks* h = hooks();
  if (h != nullptr && h->raise_mutation != nullptr) {
    h->raise_mutation(mutation);
  }
  TORCH_CHECK(
      false,
      "aliasguard.checkpoint: output ",
      mutation.output_index,
      " of ",
      mutation.cached_op,
      " (run at ",
      mutation.cached_at,
      "), cached by selective checkpointing, was modified in place ",
      in_forward ? "later in the checkpointed region"
                 : "after the forward pass",
      ": its version was ",
      mutation.expected_version,
      " when cached and is ",
      mutation.found_version,
      " now. Using it would compute wrong gradients.");
}

void FastPathRegion::check_write(
    const c10::OperatorHandle& op,
    const at::Tensor& written) const {
  const auto found = cache_.find_cached(*written.unsafeGetTensorImpl());
  if (!found.has_value()) {
    return;
  }
  FastPathWrite write;
  write.writing_op = qualified_name(op);
  write.cached_op = qualified_name(*entries_[found->entry].op);
  write.output_index = found->output_index;
  write.cached_at = site_of(entries_[found->entry]);
  const FastPathHooks* h = hooks();
  if (h != nullptr && h->raise_write != nullptr) {
    h->raise_write(write);
  }
  TORCH_CHECK(
      false,
      "aliasguard.checkpoint: ",
      write.writing_op,
      " would write to the memory of output ",
      write.output_index,
      " of ",
      write.cached_op,
      " (run at ",
      write.cached_at,
      "), which selective checkpointing cached for the backward pass. The "
      "recompute would read the written values and compute wrong gradients. "
      "Nothing was written.");
}

bool FastPathRegion::hand_back(
    const c10::OperatorHandle& op,
    torch::jit::Stack* stack) {
  const OpKey key = key_of(op);
  const SelectiveCheckpointCache::Slot slot = cache_.next_call(key);
  const FastPathHooks* h = hooks();
  switch (slot.kind) {
    case SelectiveCheckpointCache::SlotKind::kRecompute:
      return false;
    case SelectiveCheckpointCache::SlotKind::kMissing:
      if (h != nullptr && h->raise_missing != nullptr) {
        h->raise_missing(
            qualified_name(op), slot.call_index + 1, slot.forward_calls);
      }
      TORCH_CHECK(
          false,
          "aliasguard.checkpoint: the recompute ran ",
          qualified_name(op),
          " ",
          slot.call_index + 1,
          " time(s), the forward pass ",
          slot.forward_calls,
          ". The checkpointed function must run the same ops in the "
          "recompute.");
    case SelectiveCheckpointCache::SlotKind::kConsumed:
      if (h != nullptr && h->raise_consumed != nullptr) {
        h->raise_consumed(qualified_name(op));
      }
      TORCH_CHECK(
          false,
          "aliasguard.checkpoint: the cached output of ",
          qualified_name(op),
          " was already used by an earlier backward.");
    case SelectiveCheckpointCache::SlotKind::kCached:
      break;
  }
  if (!allow_mutation_) {
    check_versions(slot.entry, /*in_forward=*/false);
  }
  Entry& entry = entries_[slot.entry];
  torch::jit::drop(*stack, op.schema().arguments().size());
  for (const c10::IValue& value : entry.outputs) {
    if (value.isTensor()) {
      const at::Tensor& tensor = value.toTensor();
      stack->emplace_back(
          tensor.defined() ? counter_sharing_alias(tensor) : at::Tensor());
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> aliases;
      for (const at::Tensor& tensor : value.toTensorList()) {
        aliases.push_back(
            tensor.defined() ? counter_sharing_alias(tensor) : at::Tensor());
      }
      stack->emplace_back(std::move(aliases));
    } else {
      stack->push_back(value);
    }
  }
  cache_.consume(slot.entry);
  entry.outputs.clear();
  return true;
}

void FastPathRegion::share_unsafe_view_counter(
    const at::Tensor& input,
    const at::Tensor& output) const {
  cache_.share_counter_if_cached(input, output);
}

std::vector<FastPathRegion::EntryView> FastPathRegion::entries() const {
  std::vector<EntryView> views;
  views.reserve(entries_.size());
  for (const Entry& entry : entries_) {
    views.push_back({qualified_name(*entry.op), entry.outputs, site_of(entry)});
  }
  return views;
}

size_t FastPathRegion::num_cached() const {
  return entries_.size();
}

} // namespace aliasguard::autograd
