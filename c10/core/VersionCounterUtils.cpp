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

void WrittenVersions::bump_unmoved() {
  for (auto& [counter, version] : entries_) {
    if (counter.current_version() == version) {
      counter.bump();
    }
  }
}

} // namespace aliasguard
