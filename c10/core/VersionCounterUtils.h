#pragma once

#include <c10/core/TensorImpl.h>

#include <cstring>

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

} // namespace c10
