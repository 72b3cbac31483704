#pragma once

#include <c10/core/VersionCounterUtils.h>
#include <torch/csrc/utils/alias_correction.h>
#include <torch/csrc/utils/dispatch_state.h>
#include <torch/csrc/utils/pybind.h>

// Automatic view tracking in __torch_dispatch__ bodies: what the
// corrected __torch_dispatch__ wrapper does around the body it calls. See
// Note [Tracked __torch_dispatch__ bodies].

namespace aliasguard::utils {

// One call of a wrapped __torch_dispatch__: decides, before the body runs,
// whether it runs tracked, remembers the versions of the arguments the op
// writes, and settles them after a normal return. GIL held throughout.
class TrackedDispatchCall {
 public:
  // `owner`: the class or mode instance (the opt-outs are read on it);
  // `func`, `args`, `kwargs`: as the body receives them (borrowed). May throw
  // (a Python error while reading the arguments).
  TrackedDispatchCall(
      PyObject* owner,
      PyObject* func,
      PyObject* args,
      PyObject* kwargs,
      bool correct);

  // Calls the body with ADInplaceOrView re-enabled when tracked, restoring
  // the exclusion however it ends; settles the written versions when it
  // returns normally. New reference, or nullptr with the exception set.
  PyObject* call(
      PyObject* fn,
      PyObject* const* argv,
      size_t nargsf,
      PyObject* kwnames);

  // How the correction after the body must treat its result.
  const CorrectionOptions& options() const {
    return options_;
  }

 private:
  bool track_ = false;
  bool outer_bump_follows_ = false;
  // See Note [One bump per write through __torch_dispatch__]
  bool bump_unmoved_writes_ = false;
  CorrectionOptions options_;
  DispatchBody body_;
  WrittenVersions written_;
};

// The correction options for an explicit correct_aliasing() call made from
// the current dispatch state (inside a __torch_dispatch__ or not).
CorrectionOptions explicit_correction_options(PyObject* func);

// Registers _call_tracked and the automatic-tracking switch.
void init_tracked_dispatch(pybind11::module& m);

} // namespace aliasguard::utils
