#pragma once

#include <c10/core/TensorImpl.h>
#include <c10/core/VersionCounterUtils.h>
#include <c10/macros/AliasguardExport.h>
#include <torch/csrc/autograd/track_views.h>
#include <torch/csrc/utils/alias_correction.h>
#include <torch/csrc/utils/dispatch_state.h>
#include <torch/csrc/utils/op_correction_info.h>

// One call of a __torch_dispatch__ body as the corrected wrapper runs it:
// whether it runs tracked, how the correction after it must treat its
// result, and the versions of the arguments it writes. No Python: the
// bindings hand in what they read from the call (python_tracked_dispatch.cpp).
// See Note [Tracked __torch_dispatch__ bodies].

namespace aliasguard::utils {

class ALIASGUARD_API TrackedDispatchBody {
 public:
  // `op`: identity of the op answered (compared only; see Note [Where a
  // __torch_dispatch__ body runs]). `info`: the op's, or nullptr for
  // something that is not a dispatcher operator. `correct`: correction
  // applies to the body's owner. `tracking_allowed`: automatic tracking is on
  // and the owner did not opt out of it.
  TrackedDispatchBody(
      const void* op,
      const OpCorrectionInfo* info,
      bool correct,
      bool tracking_allowed);

  // Whether the caller must hand in, through remember_written, every tensor
  // the op's schema marks written (info->analysis->written_arguments()).
  bool wants_written_tensors() const {
    return wants_written_;
  }
  void remember_written(const c10::TensorImpl& impl) {
    written_.remember(impl);
  }
  // After the written tensors were handed in, before the body runs. See Note
  // [One bump per write through __torch_dispatch__].
  void written_remembered();

  // The body runs while a Scope is alive: its op and entry state recorded,
  // ADInplaceOrView re-enabled when tracked.
  class Scope {
   public:
    explicit Scope(const TrackedDispatchBody& body)
        : where_(body.body_), tracked_(body.body_.tracked) {}

   private:
    DispatchBodyGuard where_;
    autograd::TrackViewsGuard tracked_;
  };

  // After the body returned normally: the counts of Note [One bump per write
  // through __torch_dispatch__]. Not called when it raised.
  void settle();

  const CorrectionOptions& options() const {
    return options_;
  }

 private:
  DispatchBody body_;
  CorrectionOptions options_;
  WriteCounting write_counting_ = WriteCounting::kAsCounted;
  bool wants_written_ = false;
  WrittenVersions written_;
};

// The options of an explicit correct_aliasing() call for op `op` (identity as
// in DispatchBody) described by `info`, from the thread's dispatch state:
// inside the wrapped body of that same op, exactly the wrapper's; anywhere
// else nothing above marks views. Strict: see Note [What correction refuses].
ALIASGUARD_API CorrectionOptions
explicit_correction_options(const void* op, const OpCorrectionInfo& info);

} // namespace aliasguard::utils
