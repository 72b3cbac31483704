#pragma once

#include <ATen/core/TensorBase.h>
#include <c10/core/TensorImpl.h>
#include <c10/macros/AliasguardExport.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <utility>

// Version-counter helpers that an in-tree patch would add to
// c10/core/TensorImpl.h. See Note [Version counter identity] in
// torch/csrc/utils/torch_internals.h for how identity is read.

namespace aliasguard {

// True when both tensors bump and observe one and the same counter.
ALIASGUARD_API bool shares_version_counter(
    const c10::TensorImpl& a,
    const c10::TensorImpl& b);

// Makes `dst` use `src`'s counter, the way a view shares its base's counter.
// Refuses inference tensors (they have no counter to share) and leaves `dst`
// untouched in that case.
ALIASGUARD_API void share_version_counter(
    c10::TensorImpl& dst,
    const c10::TensorImpl& src);

// True when the tensor has an enabled counter, i.e. sharing is meaningful.
inline bool has_version_counter(const c10::TensorImpl& impl) {
  return impl.version_counter().enabled();
}

// True when both tensors have a counter but not the same one: what a view
// made below autograd has, and alias correction gives the view its input's.
// (Inference tensors have no counter to share; as_view skips them too.)
inline bool shares_no_version_counter(
    const at::TensorBase& input,
    const at::TensorBase& output) {
  const c10::TensorImpl& in = *input.unsafeGetTensorImpl();
  const c10::TensorImpl& out = *output.unsafeGetTensorImpl();
  return has_version_counter(in) && has_version_counter(out) &&
      !shares_version_counter(in, out);
}

// Remembers the versions of the counters of some tensors an op writes, then
// settles them once the code below autograd that ran the op returned. See
// Note [One bump per write through __torch_dispatch__] for the one user.
class WrittenVersions {
 public:
  // Tensors without a counter (inference tensors) are skipped.
  void remember(const c10::TensorImpl& impl) {
    const c10::VariableVersion& counter = impl.version_counter();
    if (counter.enabled()) {
      entries_.emplace_back(counter, counter.current_version());
    }
  }
  bool empty() const {
    return entries_.empty();
  }
  // Takes one bump back from each counter that moved forward: a bump coming
  // from above counts the op's own write, the body's call of the op counted
  // it too. Further writes stay counted, so no version seen between them
  // can be current again.
  ALIASGUARD_API void undo_one_bump();
  // Brings each counter up to one bump per remembered tensor that uses it,
  // when it moved less: no bump is coming from above, and each write must be
  // counted as top level counts it (once per list element, so a tensor
  // listed twice, or two views of one base, count twice).
  ALIASGUARD_API void bump_to_one_per_write();
  // Takes back, from each counter, one bump per remembered tensor that uses
  // it, and remembers the versions after: a kernel above bumped them before
  // the body started, and the body's own call of the op bumps them again.
  ALIASGUARD_API void take_back_bumps_made_above();
  // Gives back what take_back_bumps_made_above took from each counter that
  // has not moved since: the body did not call the op, nor write the tensor.
  ALIASGUARD_API void give_back_unmoved();

 private:
  c10::SmallVector<std::pair<c10::VariableVersion, uint32_t>, 2> entries_;
};

} // namespace aliasguard
