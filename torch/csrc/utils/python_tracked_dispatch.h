#pragma once

#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/python_op_cache.h>
#include <torch/csrc/utils/tracked_dispatch_body.h>

// Automatic view tracking in __torch_dispatch__ bodies: what the
// corrected __torch_dispatch__ wrapper does around the body it calls. See
// Note [Tracked __torch_dispatch__ bodies].

namespace aliasguard::utils {

// One call of a wrapped __torch_dispatch__, adapted to the core's
// TrackedDispatchBody, which decides: the op's entry, the owner's opt-out
// and the written arguments read from the Python call. GIL held throughout.
class TrackedDispatchCall {
 public:
  // `owner`: the class or mode instance (the tracking opt-out is read on
  // it); `func`, `args`, `kwargs`: as the body receives them (borrowed).
  // May throw (a Python error while reading the arguments).
  TrackedDispatchCall(
      PyObject* owner,
      PyObject* func,
      PyObject* args,
      PyObject* kwargs,
      bool correct);

  // Calls the body inside the core's scope (tracked or not), then settles
  // the written versions when it returns normally. New reference, or
  // nullptr with the exception set.
  PyObject* call(
      PyObject* fn,
      PyObject* const* argv,
      size_t nargsf,
      PyObject* kwnames);

  // The same for a body given as `fn(*args, **kwargs)` (kwargs: a dict or
  // None).
  PyObject* call_with(PyObject* fn, PyObject* args, PyObject* kwargs);

  // How the correction after the body must treat its result.
  const CorrectionOptions& options() const {
    return body_.options();
  }
  // The op's entry, looked up once for the body and the correction after
  // it; nullptr when the call is not corrected.
  const PyOpEntry* entry() const {
    return entry_;
  }

 private:
  // Keeps `entry_` valid until the correction after the body is done.
  RunningCorrection running_;
  const PyOpEntry* entry_;
  TrackedDispatchBody body_;
};

// The correction options for an explicit correct_aliasing() call made from
// the current dispatch state (inside a __torch_dispatch__ or not).
CorrectionOptions explicit_correction_options(PyObject* func);

// Registers _call_tracked and the automatic-tracking switch.
void init_tracked_dispatch(pybind11::module& m);

} // namespace aliasguard::utils
