#include <torch/csrc/autograd/selective_checkpoint.h>

#include <c10/core/VersionCounterUtils.h>
#include <torch/csrc/utils/schema_alias_analysis.h>
#include <torch/csrc/utils/torch_internals.h>

namespace aliasguard::autograd {

SacOpTraits sac_op_traits(
    const c10::OperatorName& op,
    const utils::SchemaAliasAnalysis& analysis) {
  // See Note [Which op calls SAC may cache].
  SacOpTraits traits;
  for (const utils::ReturnAlias& ret : analysis.returns()) {
    if (ret.annotated) {
      traits.has_annotated_returns = true;
      traits.may_return_view = traits.may_return_view || !ret.annotated_write;
    }
  }
  traits.is_unsafe_view = is_unsafe_view(op);
  traits.written_arguments = analysis.written_arguments();
  return traits;
}

bool is_unsafe_view(const c10::OperatorName& op) {
  return op.name == "aten::_unsafe_view" && op.overload_name.empty();
}

void SelectiveCheckpointCache::record_recompute(OpKey op) {
  slots_[op].push_back(kRecomputeSlot);
}

size_t SelectiveCheckpointCache::record_cached(
    OpKey op,
    const std::vector<const at::Tensor*>& outputs) {
  const size_t index = entries_.size();
  Entry entry;
  entry.op = op;
  entry.counters.reserve(outputs.size());
  entry.versions.reserve(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor* output = outputs[i];
    if (output == nullptr || !output->defined() ||
        !has_version_counter(*output->unsafeGetTensorImpl())) {
      // Nothing to watch: a non-tensor output, or an inference tensor.
      entry.counters.emplace_back();
      entry.versions.push_back(0);
      continue;
    }
    const c10::VariableVersion& counter =
        output->unsafeGetTensorImpl()->version_counter();
    entry.counters.push_back(counter);
    entry.versions.push_back(counter.current_version());
    // The first output keeps its place when two share a counter.
    by_counter_.try_emplace(
        internals::version_counter_identity(counter), CachedOutput{index, i});
  }
  entries_.push_back(std::move(entry));
  slots_[op].push_back(index);
  return index;
}

std::optional<SelectiveCheckpointCache::CachedOutput> SelectiveCheckpointCache::
    find_cached(const c10::TensorImpl& written) const {
  if (by_counter_.empty() || !has_version_counter(written)) {
    return std::nullopt;
  }
  auto it = by_counter_.find(
      internals::version_counter_identity(written.version_counter()));
  if (it == by_counter_.end()) {
    return std::nullopt;
  }
  return it->second;
}

void SelectiveCheckpointCache::share_counter_if_cached(
    const at::Tensor& input,
    const at::Tensor& output) const {
  // See Note [A batched matmul's result shares the cached counter].
  if (by_counter_.empty() || !input.defined() || !output.defined() ||
      !has_version_counter(*output.unsafeGetTensorImpl()) ||
      !output.is_alias_of(input) ||
      !find_cached(*input.unsafeGetTensorImpl()).has_value()) {
    return;
  }
  c10::TensorImpl* output_impl = output.unsafeGetTensorImpl();
  const c10::TensorImpl* input_impl = input.unsafeGetTensorImpl();
  if (!shares_version_counter(*output_impl, *input_impl)) {
    share_version_counter(*output_impl, *input_impl);
  }
}

void SelectiveCheckpointCache::end_forward() {
  by_counter_.clear();
}

void SelectiveCheckpointCache::begin_recompute() {
  recompute_calls_.clear();
}

SelectiveCheckpointCache::Slot SelectiveCheckpointCache::next_call(OpKey op) {
  Slot slot;
  slot.call_index = recompute_calls_[op]++;
  auto it = slots_.find(op);
  if (it == slots_.end()) {
    return slot; // kMissing, no forward calls
  }
  slot.forward_calls = it->second.size();
  if (slot.call_index >= slot.forward_calls) {
    return slot; // kMissing
  }
  const size_t entry = it->second[slot.call_index];
  if (entry == kRecomputeSlot) {
    slot.kind = SlotKind::kRecompute;
    return slot;
  }
  slot.entry = entry;
  slot.kind =
      entries_[entry].consumed ? SlotKind::kConsumed : SlotKind::kCached;
  return slot;
}

std::optional<SelectiveCheckpointCache::VersionChange> SelectiveCheckpointCache::
    changed_output(size_t entry) const {
  const Entry& cached = entries_.at(entry);
  for (size_t i = 0; i < cached.counters.size(); ++i) {
    if (!cached.counters[i].enabled()) {
      continue;
    }
    const uint32_t found = cached.counters[i].current_version();
    if (found != cached.versions[i]) {
      return VersionChange{i, cached.versions[i], found};
    }
  }
  return std::nullopt;
}

void SelectiveCheckpointCache::consume(size_t entry) {
  Entry& cached = entries_.at(entry);
  cached.consumed = true;
  cached.counters.clear();
  cached.counters.shrink_to_fit();
}

} // namespace aliasguard::autograd
