#include <c10/core/VersionCounterUtils.h>

#include <c10/util/Exception.h>
#include <torch/csrc/utils/torch_internals.h>

namespace aliasguard {

bool shares_version_counter(
    const c10::TensorImpl& a,
    const c10::TensorImpl& b) {
  // See Note [Version counter identity]
  const void* identity =
      internals::version_counter_identity(a.version_counter());
  return identity != nullptr &&
      identity == internals::version_counter_identity(b.version_counter());
}

void share_version_counter(c10::TensorImpl& dst, const c10::TensorImpl& src) {
  TORCH_CHECK(
      has_version_counter(src),
      "share_version_counter: the source is an inference tensor and has no "
      "version counter to share");
  TORCH_CHECK(
      !dst.is_inference(),
      "share_version_counter: cannot give an inference tensor a version "
      "counter");
  dst.set_version_counter(src.version_counter());
}

void WrittenVersions::undo_one_bump() {
  for (auto& [counter, version] : entries_) {
    const uint32_t current = counter.current_version();
    if (current > version) {
      counter.set_version(current - 1);
    }
  }
}

void WrittenVersions::take_back_bumps_made_above() {
  for (auto& [counter, version] : entries_) {
    const uint32_t current = counter.current_version();
    if (current > 0) {
      counter.set_version(current - 1);
    }
  }
  for (auto& [counter, version] : entries_) {
    version = counter.current_version();
  }
}

void WrittenVersions::give_back_unmoved() {
  // One bump was taken per entry; entries sharing a counter were remembered
  // at the same version, so whether it moved is read for all of them before
  // any is given back.
  c10::SmallVector<bool, 2> unmoved;
  for (const auto& [counter, version] : entries_) {
    unmoved.push_back(counter.current_version() == version);
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (unmoved[i]) {
      entries_[i].first.bump();
    }
  }
}

void WrittenVersions::bump_to_one_per_write() {
  // Entries that share a counter (a tensor listed twice, two views of one
  // base) were remembered at the same version; the first of them settles
  // the counter for all. Lists are short: a quadratic walk beats hashing.
  for (size_t i = 0; i < entries_.size(); ++i) {
    const void* identity =
        internals::version_counter_identity(entries_[i].first);
    bool settled = false;
    uint32_t writes = 0;
    for (size_t j = 0; j < entries_.size(); ++j) {
      if (internals::version_counter_identity(entries_[j].first) == identity) {
        settled = settled || j < i;
        ++writes;
      }
    }
    if (settled) {
      continue;
    }
    auto& [counter, version] = entries_[i];
    for (uint32_t current = counter.current_version();
         current < version + writes;
         ++current) {
      counter.bump();
    }
  }
}

} // namespace aliasguard
