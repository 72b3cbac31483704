#include <torch/csrc/utils/python_tracked_dispatch.h>

#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/track_views.h>
#include <torch/csrc/utils/dispatch_state.h>
#include <torch/csrc/utils/python_op_cache.h>
#include <torch/csrc/utils/python_torch_internals.h>

#include <atomic>

namespace py = pybind11;

namespace aliasguard::utils {

// Note [Tracked __torch_dispatch__ bodies]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The ADInplaceOrView kernel above the Python key runs its op under
// AutoDispatchBelowADInplaceOrView, so a __torch_dispatch__ body runs with
// ADInplaceOrView excluded: views made there are plain aliases with fresh
// counters, in-place ops there bump nothing, and a tensor cached there (the
// upstream report, selective checkpointing) misses every later mutation. The
// corrected wrapper re-enables the key for the body, as track_views() does,
// so those ops run their ADInplaceOrView kernels again (as_view,
// increment_version); autograd stays excluded. Only when the key was
// excluded on entry: otherwise the body already runs as stock.
//
// Two consequences need handling, both decided here because only the
// wrapper sees the body from the outside:
//   * views the body returns now carry view metadata, which the outer
//     kernel's as_view refuses: see Note [Views returned from below
//     autograd];
//   * an in-place op through a mode or subclass would be counted twice: once
//     by the body (the op's own ADInplaceOrView kernel, reached again when
//     the body calls func, or any write the body makes to the same memory)
//     and once by the outer kernel. See
//     Note [One bump per write through __torch_dispatch__].
// Automatic tracking depends on the correction to hand views back to the
// outer kernel, so a class or process without correction has no automatic
// tracking either.

// Note [One bump per write through __torch_dispatch__]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// At top level an in-place op bumps each argument it writes once. For ops
// with an ADInplaceOrView kernel that bump is made by the kernel, after the
// op returned, above the Python key; the kernel keeps that role: before the
// body runs we remember the version of every argument the schema marks
// written (Tensor(a!), returned or not), and when the body returns normally
// we take one bump back from each counter that moved, the one the body's own
// call of the op made, so the outer kernel's bump counts the op once and
// counts equal stock's. A body that writes an argument more than once keeps
// the other bumps: setting the counter all the way back would let a version
// recorded between two writes (a cache made in the body, a view's
// attr_version) match again after the outer bump, hiding a real write. Stock
// counts such a body's writes not at all (they run below ADInplaceOrView);
// that difference is listed in docs/design.md. Avoiding the inner bump
// instead would mean excluding ADInplaceOrView for exactly the body's call of
// the same op on the same arguments, which the wrapper cannot single out (the
// body may unwrap, redispatch or write through a view).
// Ops without such a kernel that return nothing but write arguments (the
// _foreach_*_ family) are counted at top level by the in-place ops their
// backend kernel runs, which a body below ADInplaceOrView never reaches for a
// wrapper argument (its inner tensors are written instead) and stock never
// counts there at all: for those, a written argument whose counter did not
// move is bumped once, so a mode and a wrapper count what top level counts.
// An op without such a kernel that writes an argument beside its returns
// (batch norm's running statistics) is left as the body counted it: top level
// counts nothing for it either. Only the counters of written arguments are
// touched: a write the body made to anything else is real and stays counted.
// When the body raises nothing is settled: no outer bump follows, and a
// write made before the exception must stay visible. Counters move only
// through VariableVersion's public bump and set_version (the setter behind
// torch's _unsafe_set_version_counter), in aliasguard::WrittenVersions.

namespace {

// "__aliasguard_track_views__", interned.
PyObject* tracking_opt_out_attribute = nullptr;
std::atomic<bool> automatic_tracking{true};

bool tracking_opted_out(PyObject* owner) {
  PyTypeObject* type = PyType_Check(owner)
      ? reinterpret_cast<PyTypeObject*>(owner)
      : Py_TYPE(owner);
  // See Note [Class attribute lookup without descriptors]
  PyObject* flag =
      internals::lookup_class_attribute(type, tracking_opt_out_attribute);
  if (flag == nullptr || flag == Py_True) {
    return false;
  }
  const int is_false = PyObject_Not(flag);
  if (is_false < 0) {
    PyErr_Clear(); // an unusable flag: keep tracking
    return false;
  }
  return is_false == 1;
}

bool inplace_or_view_excluded() {
  return c10::impl::tls_is_dispatch_key_excluded(
      c10::DispatchKey::ADInplaceOrView);
}

void remember(PyObject* value, WrittenVersions& written) {
  if (internals::is_tensor_object(value)) {
    written.remember(*THPVariable_Unpack(value).unsafeGetTensorImpl());
  }
}

// The versions of the tensors `entry`'s op writes, as passed in
// `args`/`kwargs`; nothing for arguments it cannot read (the correction after
// the body reports malformed ones).
void remember_written_versions(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    WrittenVersions& written) {
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
        remember(PySequence_Fast_GET_ITEM(value, i), written);
      }
    } else {
      remember(value, written);
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
  const autograd::TrackViewsGuard tracked(inplace_or_view_excluded());
  return PyObject_Vectorcall(argv[0], argv + 1, nargs - 1, kwnames);
}

PyMethodDef tracked_methods[] = {
    {"_call_tracked",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call_tracked)),
     METH_FASTCALL | METH_KEYWORDS,
     "_call_tracked(op, *args, **kwargs): op(*args, **kwargs) with "
     "ADInplaceOrView re-enabled"},
    {nullptr, nullptr, 0, nullptr}};

} // namespace

TrackedDispatchCall::TrackedDispatchCall(
    PyObject* owner,
    PyObject* func,
    PyObject* args,
    PyObject* kwargs,
    bool correct) {
  body_.op = func;
  if (!correct) {
    return; // untracked, uncorrected: stock
  }
  // Inference mode excludes ADInplaceOrView too, but then no kernel above
  // runs, and stock makes plain aliases: the body runs as stock.
  const bool below =
      inplace_or_view_excluded() && !c10::InferenceMode::is_enabled();
  track_ = below && automatic_tracking.load(std::memory_order_relaxed) &&
      !tracking_opted_out(owner);
  const RunningCorrection running;
  const PyOpEntry& entry = op_entry(func);
  outer_bump_follows_ = entry.has_inplace_or_view_kernel;
  bump_unmoved_writes_ = !outer_bump_follows_ && entry.analysis &&
      entry.analysis->returns().empty();
  options_.outer_kernel_marks_views = below && entry.has_inplace_or_view_kernel;
  options_.tracked = track_;
  options_.view_may_be_a_copy = entry.view_may_be_a_copy;
  body_.outer_kernel_marks_views = options_.outer_kernel_marks_views;
  body_.tracked = track_;
  if (below && entry.analysis) {
    remember_written_versions(entry, args, kwargs, written_);
  }
}

PyObject* TrackedDispatchCall::call(
    PyObject* fn,
    PyObject* const* argv,
    size_t nargsf,
    PyObject* kwnames) {
  PyObject* out = nullptr;
  {
    // See Note [Where a __torch_dispatch__ body runs]
    const DispatchBodyGuard where(body_);
    const autograd::TrackViewsGuard tracked(track_);
    out = PyObject_Vectorcall(fn, argv, nargsf, kwnames);
  }
  // See Note [One bump per write through __torch_dispatch__]
  if (out != nullptr && !written_.empty()) {
    if (outer_bump_follows_) {
      written_.undo_one_bump();
    } else if (bump_unmoved_writes_) {
      written_.bump_unmoved();
    }
  }
  return out;
}

CorrectionOptions explicit_correction_options(PyObject* func) {
  const PyOpEntry& entry = op_entry(func);
  // See Note [Where a __torch_dispatch__ body runs]
  const DispatchBody& body = current_dispatch_body();
  CorrectionOptions options;
  if (body.op == func) {
    options.outer_kernel_marks_views = body.outer_kernel_marks_views;
    options.tracked =
        body.outer_kernel_marks_views && autograd::is_view_tracking_enabled();
  }
  options.view_may_be_a_copy = entry.view_may_be_a_copy;
  options.strict = true;
  return options;
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
}

} // namespace aliasguard::utils
