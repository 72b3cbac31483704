#include <torch/csrc/utils/python_tracked_dispatch.h>

#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/track_views.h>
#include <torch/csrc/utils/python_alias_correction.h>
#include <torch/csrc/utils/python_running_bodies.h>
#include <torch/csrc/utils/python_torch_internals.h>
#include <torch/csrc/utils/running_bodies.h>

#include <atomic>

namespace py = pybind11;

// The Python side of a tracked __torch_dispatch__ body: reads the owner's
// opt-out and the written arguments from the call, and hands them to the
// core's TrackedDispatchBody, which decides. See Note [Tracked
// __torch_dispatch__ bodies].

namespace aliasguard::utils {
namespace {

// "__aliasguard_track_views__", interned.
PyObject* tracking_opt_out_attribute = nullptr;
std::atomic<bool> automatic_tracking{true};
// Test-only (the differential harness's `version` mutant): false skips
// settle(), i.e. Note [One bump per write through __torch_dispatch__], so
// that the harness can show it notices the rule missing. Not public API.
std::atomic<bool> settle_written_versions{true};

void settle(TrackedDispatchBody& body) {
  if (settle_written_versions.load(std::memory_order_relaxed)) {
    body.settle();
  }
}

void remember(PyObject* value, TrackedDispatchBody& body) {
  if (internals::is_tensor_object(value)) {
    body.remember_written(*THPVariable_Unpack(value).unsafeGetTensorImpl());
  }
}

// Hands `body` the tensors `entry`'s op writes, as passed in `args`/`kwargs`;
// nothing for arguments it cannot read (the correction after the body
// reports malformed ones). Out of line: in-place ops only (Note [Hot path
// layout]).
[[gnu::noinline]] void remember_written_tensors(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    TrackedDispatchBody& body) {
  if ((!PyTuple_Check(args) && !PyList_Check(args)) ||
      (kwargs != Py_None && !PyDict_Check(kwargs))) {
    return;
  }
  for (const size_t index : entry.analysis->written_arguments()) {
    PyObject* value = argument_object(entry, args, kwargs, index);
    if (value == nullptr || value == Py_None) {
      continue;
    }
    if (PyList_Check(value) || PyTuple_Check(value)) {
      const Py_ssize_t size = PySequence_Fast_GET_SIZE(value);
      for (Py_ssize_t i = 0; i < size; ++i) {
        remember(PySequence_Fast_GET_ITEM(value, i), body);
      }
    } else {
      remember(value, body);
    }
  }
}

// _call_tracked(op, *args, **kwargs): op(*args, **kwargs) with
// ADInplaceOrView re-enabled for that one call (aliasguard.with_tracking).
PyObject* call_tracked(
    PyObject* /*module*/,
    PyObject* const* argv,
    Py_ssize_t nargs,
    PyObject* kwnames) {
  if (nargs < 1) {
    PyErr_SetString(
        PyExc_TypeError, "_call_tracked(op, *args, **kwargs): op is missing");
    return nullptr;
  }
  // An explicit scope: see Note [Installing and uninstalling while bodies
  // run].
  if (!enter_explicit_body()) {
    return nullptr;
  }
  PyObject* out = nullptr;
  {
    const autograd::TrackViewsGuard tracked;
    out = PyObject_Vectorcall(argv[0], argv + 1, nargs - 1, kwnames);
  }
  exit_body();
  return out;
}

PyMethodDef tracked_methods[] = {
    {"_call_tracked",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call_tracked)),
     METH_FASTCALL | METH_KEYWORDS,
     "_call_tracked(op, *args, **kwargs): op(*args, **kwargs) with "
     "ADInplaceOrView re-enabled"},
    {nullptr, nullptr, 0, nullptr}};

} // namespace

ALIASGUARD_HOT TrackedDispatchCall::TrackedDispatchCall(
    PyObject* owner,
    PyObject* func,
    PyObject* args,
    PyObject* kwargs,
    bool correct)
    : entry_(correct ? &op_entry(func) : nullptr),
      body_(
          func,
          entry_ != nullptr && entry_->analysis ? entry_ : nullptr,
          correct,
          correct && automatic_tracking.load(std::memory_order_relaxed) &&
              !owner_opted_out(owner, tracking_opt_out_attribute)) {
  if (body_.wants_written_tensors()) {
    remember_written_tensors(*entry_, args, kwargs, body_);
    if (settle_written_versions.load(std::memory_order_relaxed)) {
      body_.written_remembered();
    }
  }
}

ALIASGUARD_HOT PyObject* TrackedDispatchCall::call(
    PyObject* fn,
    PyObject* const* argv,
    size_t nargsf,
    PyObject* kwnames) {
  PyObject* out = nullptr;
  {
    const TrackedDispatchBody::Scope scope(body_);
    out = PyObject_Vectorcall(fn, argv, nargsf, kwnames);
  }
  if (out != nullptr) {
    settle(body_);
  }
  return out;
}

PyObject* TrackedDispatchCall::call_with(
    PyObject* fn,
    PyObject* args,
    PyObject* kwargs) {
  PyObject* out = nullptr;
  {
    const TrackedDispatchBody::Scope scope(body_);
    out = PyObject_Call(fn, args, kwargs == Py_None ? nullptr : kwargs);
  }
  if (out != nullptr) {
    settle(body_);
  }
  return out;
}

CorrectionOptions explicit_correction_options(PyObject* func) {
  const PyOpEntry& entry = op_entry(func);
  return utils::explicit_correction_options(func, entry);
}

void init_tracked_dispatch(py::module& m) {
  tracking_opt_out_attribute =
      PyUnicode_InternFromString("__aliasguard_track_views__");
  if (tracking_opt_out_attribute == nullptr ||
      PyModule_AddFunctions(m.ptr(), tracked_methods) != 0) {
    throw python_error();
  }
  m.def(
      "_set_automatic_view_tracking",
      [](bool enabled) { return automatic_tracking.exchange(enabled); },
      py::arg("enabled"));
  m.def("_is_automatic_view_tracking_enabled", [] {
    return automatic_tracking.load();
  });
  m.def(
      "_test_set_version_settling",
      [](bool enabled) { return settle_written_versions.exchange(enabled); },
      py::arg("enabled"));
}

} // namespace aliasguard::utils
