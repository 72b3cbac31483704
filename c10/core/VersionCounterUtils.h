#pragma once

#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <cstring>
#include <utility>

// Version-counter helpers that an in-tree patch would add to
// c10/core/TensorImpl.h. See Note [Version counter identity].

namespace c10 {

// Note [Version counter identity]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Two tensors are in the same alias group for autograd when their
// VariableVersion objects point at the same VersionCounter. c10 exposes no
// accessor for that pointer (upstream would add one to VariableVersion), so we
// read the object's representation: VariableVersion is exactly one
// intrusive_ptr, which is exactly one raw pointer. The static_asserts below
// turn any future layout change into a compile error instead of a wrong
// answer. A disabled counter (inference tensors) shares with nothing.
inline const void* version_counter_identity(const VariableVersion& version) {
  static_assert(sizeof(VariableVersion) == sizeof(void*));
  static_assert(alignof(VariableVersion) == alignof(void*));
  const void* identity = nullptr;
  std::memcpy(&identity, &version, sizeof(identity));
  return identity;
}

// True when both tensors bump and observe one and the same counter.
bool shares_version_counter(const TensorImpl& a, const TensorImpl& b);

// Makes `dst` use `src`'s counter, the way a view shares its base's counter.
// Refuses inference tensors (they have no counter to share) and leaves `dst`
// untouched in that case.
void share_version_counter(TensorImpl& dst, const TensorImpl& src);

// True when both tensors have an enabled counter, i.e. sharing is meaningful.
inline bool has_version_counter(const TensorImpl& impl) {
  return impl.version_counter().enabled();
}

// Remembers the versions of the counters of some tensors an op writes, then
// settles them once the code below autograd that ran the op returned. See
// Note [One bump per write through __torch_dispatch__] for the one user.
class WrittenVersions {
 public:
  // Tensors without a counter (inference tensors) are skipped.
  void remember(const TensorImpl& impl) {
    const VariableVersion& counter = impl.version_counter();
    if (counter.enabled()) {
      entries_.emplace_back(counter, counter.current_version());
    }
  }
  bool empty() const {
    return entries_.empty();
  }
  // Sets each counter back to its remembered version if it moved forward:
  // a bump that is coming from above will count the write.
  void rewind();
  // Bumps each counter that did not move: no bump is coming from above, and
  // the write must be counted.
  void bump_unmoved();

 private:
  c10::SmallVector<std::pair<VariableVersion, uint32_t>, 2> entries_;
};

} // namespace c10
