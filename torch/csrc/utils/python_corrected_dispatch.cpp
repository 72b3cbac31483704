#include <torch/csrc/utils/python_corrected_dispatch.h>

#include <torch/csrc/utils/python_dispatch_call.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/alias_audit.h>
#include <torch/csrc/utils/python_alias_correction.h>
#include <torch/csrc/utils/python_aliasing_error.h>
#include <torch/csrc/utils/python_tracked_dispatch.h>
#include <torch/csrc/utils/running_bodies.h>

#include <structmember.h>

#include <optional>

namespace py = pybind11;

namespace aliasguard::utils {
namespace {

PyObject* empty_tuple = nullptr; // the default of a dispatch's `args`

// Note [The corrected __torch_dispatch__ wrapper]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What replaces a class's __torch_dispatch__: calls the original, tracked
// (see Note [Tracked __torch_dispatch__ bodies]), then corrects its result. A C
// type rather than a Python closure, because a Python frame alone costs about
// as much as correcting a view. It binds like a function (so it works as a
// plain method of a mode, and inside classmethod), and has a __dict__ for
// __wrapped__, __name__ and friends. The original is called with exactly the
// arguments received; the owner, func, args and kwargs for the correction are
// read from them by position or by their conventional names. `owner` is set for
// the staticmethod form, which receives no class.
struct CorrectedDispatch {
  PyObject_HEAD PyObject* fn;
  PyObject* owner; // nullptr: the first argument is the owner
  PyObject* dict;
  vectorcallfunc vectorcall;
};

PyTypeObject CorrectedDispatchType = {PyVarObject_HEAD_INIT(nullptr, 0)};

ALIASGUARD_HOT PyObject* corrected_dispatch_call(
    PyObject* callable,
    PyObject* const* argv,
    size_t nargsf,
    PyObject* kwnames) {
  auto* self = reinterpret_cast<CorrectedDispatch*>(callable);
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  const TorchDispatchArguments read =
      read_torch_dispatch_arguments(argv, nargs, kwnames, self->owner);
  PyObject* owner = read.owner != nullptr ? read.owner : Py_None;
  PyObject* func = read.func;
  const bool audit = is_alias_audit_enabled();
  const bool correct = func != nullptr && correction_applies(owner);
  if (func == nullptr || (!correct && !audit)) {
    return PyObject_Vectorcall(self->fn, argv, nargsf, kwnames); // stock
  }
  // See Note [Installing and uninstalling while bodies run]: not admitted
  // while uninstall() runs, after which the body runs as stock anyway.
  const RunningBody running;
  if (!running.admitted()) {
    return PyObject_Vectorcall(self->fn, argv, nargsf, kwnames);
  }
  PyObject* args = read.args != nullptr ? read.args : empty_tuple;
  PyObject* kwargs = read.kwargs != nullptr ? read.kwargs : Py_None;
  // See Note [Tracked __torch_dispatch__ bodies]
  std::optional<TrackedDispatchCall> call;
  if (translate_errors([&]() -> PyObject* {
        call.emplace(owner, func, args, kwargs, correct);
        return Py_None; // borrowed: a success marker
      }) == nullptr) {
    return nullptr;
  }
  // See Note [One report per op call].
  const ReportedViolationMark mark = reported_violation_mark();
  PyObject* out = call->call(self->fn, argv, nargsf, kwnames);
  if (out == nullptr) {
    return nullptr;
  }
  PyObject* result = corrected_result(
      owner,
      func,
      call->entry(),
      args,
      kwargs,
      out,
      correct,
      audit,
      call->options(),
      mark);
  Py_DECREF(out);
  return result;
}

PyObject* corrected_dispatch_new(
    PyTypeObject* type,
    PyObject* args,
    PyObject* kwargs) {
  static const char* keywords[] = {"fn", "owner", nullptr};
  PyObject* fn = nullptr;
  PyObject* owner = nullptr;
  if (!PyArg_ParseTupleAndKeywords(
          args,
          kwargs,
          "O|O:_CorrectedDispatch",
          const_cast<char**>(keywords),
          &fn,
          &owner)) {
    return nullptr;
  }
  if (!PyCallable_Check(fn)) {
    PyErr_Format(
        PyExc_TypeError,
        "_CorrectedDispatch(): fn must be callable, got %s",
        Py_TYPE(fn)->tp_name);
    return nullptr;
  }
  auto* self = reinterpret_cast<CorrectedDispatch*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    return nullptr;
  }
  self->fn = Py_NewRef(fn);
  self->owner =
      owner == nullptr || owner == Py_None ? nullptr : Py_NewRef(owner);
  self->dict = nullptr;
  self->vectorcall = corrected_dispatch_call;
  return reinterpret_cast<PyObject*>(self);
}

int corrected_dispatch_traverse(PyObject* obj, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<CorrectedDispatch*>(obj);
  Py_VISIT(self->fn);
  Py_VISIT(self->owner);
  Py_VISIT(self->dict);
  return 0;
}

int corrected_dispatch_clear(PyObject* obj) {
  auto* self = reinterpret_cast<CorrectedDispatch*>(obj);
  Py_CLEAR(self->fn);
  Py_CLEAR(self->owner);
  Py_CLEAR(self->dict);
  return 0;
}

void corrected_dispatch_dealloc(PyObject* obj) {
  PyObject_GC_UnTrack(obj);
  corrected_dispatch_clear(obj);
  Py_TYPE(obj)->tp_free(obj);
}

// Binds like a function: a method of its instance, itself on the class.
ALIASGUARD_HOT PyObject* corrected_dispatch_get(
    PyObject* self,
    PyObject* obj,
    PyObject* /*type*/) {
  if (obj == nullptr || obj == Py_None) {
    return Py_NewRef(self);
  }
  return PyMethod_New(self, obj);
}

PyObject* corrected_dispatch_repr(PyObject* obj) {
  auto* self = reinterpret_cast<CorrectedDispatch*>(obj);
  return PyUnicode_FromFormat("<alias-corrected %R>", self->fn);
}

PyMemberDef corrected_dispatch_members[] = {
    {"__aliasguard_wrapped__",
     T_OBJECT,
     offsetof(CorrectedDispatch, fn),
     READONLY,
     "the __torch_dispatch__ whose results are corrected"},
    {"__aliasguard_owner__",
     T_OBJECT,
     offsetof(CorrectedDispatch, owner),
     READONLY,
     "the class of a staticmethod __torch_dispatch__, else None"},
    {nullptr, 0, 0, 0, nullptr}};

PyGetSetDef corrected_dispatch_getset[] = {
    {"__dict__",
     PyObject_GenericGetDict,
     PyObject_GenericSetDict,
     nullptr,
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

void init_corrected_dispatch_type() {
  PyTypeObject& type = CorrectedDispatchType;
  type.tp_name = "aliasguard._C._CorrectedDispatch";
  type.tp_basicsize = sizeof(CorrectedDispatch);
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
      Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR;
  type.tp_doc =
      "_CorrectedDispatch(fn, owner=None): calls fn, then corrects the "
      "aliasing of its result (see aliasguard.correct_aliasing).";
  type.tp_new = corrected_dispatch_new;
  type.tp_dealloc = corrected_dispatch_dealloc;
  type.tp_traverse = corrected_dispatch_traverse;
  type.tp_clear = corrected_dispatch_clear;
  type.tp_call = PyVectorcall_Call;
  type.tp_vectorcall_offset = offsetof(CorrectedDispatch, vectorcall);
  type.tp_descr_get = corrected_dispatch_get;
  type.tp_repr = corrected_dispatch_repr;
  type.tp_dictoffset = offsetof(CorrectedDispatch, dict);
  type.tp_members = corrected_dispatch_members;
  type.tp_getset = corrected_dispatch_getset;
  if (PyType_Ready(&type) < 0) {
    throw python_error();
  }
}

} // namespace

void init_corrected_dispatch(py::module& m) {
  empty_tuple = PyTuple_New(0);
  if (empty_tuple == nullptr) {
    throw python_error();
  }
  init_corrected_dispatch_type();
  m.add_object(
      "_CorrectedDispatch",
      py::handle(reinterpret_cast<PyObject*>(&CorrectedDispatchType)));
}

} // namespace aliasguard::utils
