#include <torch/csrc/utils/python_torch_internals.h>

#include <frameobject.h>

#include <string_view>
#include <utility>

#include <aten/src/ATen/native/DetachKeepVersionCounter.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace aliasguard::internals {

namespace {

// An object without a usable schema is simply not an operator (an Exception
// while reading it); a KeyboardInterrupt or SystemExit is not an answer to
// that question and must reach the caller.
void clear_exception_or_rethrow() {
  if (PyErr_Occurred() != nullptr && !PyErr_ExceptionMatches(PyExc_Exception)) {
    throw python_error();
  }
  PyErr_Clear();
}

std::optional<std::string> utf8_of(PyObject* text) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(text, &size);
  if (data == nullptr) {
    clear_exception_or_rethrow();
    return std::nullopt;
  }
  return std::string(data, size);
}

} // namespace

std::optional<c10::OperatorName> operator_name_of(PyObject* func) {
  py::object schema = py::reinterpret_steal<py::object>(
      PyObject_GetAttrString(func, "_schema"));
  if (!schema) {
    clear_exception_or_rethrow();
    return std::nullopt;
  }
  py::object name = py::reinterpret_steal<py::object>(
      PyObject_GetAttrString(schema.ptr(), "name"));
  if (!name) {
    clear_exception_or_rethrow();
    return std::nullopt;
  }
  py::object overload = py::reinterpret_steal<py::object>(
      PyObject_GetAttrString(schema.ptr(), "overload_name"));
  if (!overload) {
    clear_exception_or_rethrow();
    return std::nullopt;
  }
  if (!PyUnicode_Check(name.ptr()) || !PyUnicode_Check(overload.ptr())) {
    return std::nullopt;
  }
  auto name_text = utf8_of(name.ptr());
  auto overload_text = utf8_of(overload.ptr());
  if (!name_text || !overload_text) {
    return std::nullopt;
  }
  return c10::OperatorName(std::move(*name_text), std::move(*overload_text));
}

// See Note [Calling an OpOverload's operator directly]
py::object operator_callable_of(PyObject* func) {
  py::object call =
      py::reinterpret_steal<py::object>(PyObject_GetAttrString(func, "_op"));
  if (!call) {
    throw python_error();
  }
  return call;
}

// See Note [Walking the Python stack for the user's line]
std::pair<py::object, int> innermost_user_frame(
    const std::vector<std::string>& library_prefixes) {
  PyFrameObject* frame = PyEval_GetFrame(); // borrowed
  Py_XINCREF(frame);
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame); // new reference
    Py_ssize_t size = 0;
    const char* filename = PyUnicode_AsUTF8AndSize(code->co_filename, &size);
    if (filename == nullptr) {
      PyErr_Clear();
      size = 0;
    }
    const std::string_view name(filename == nullptr ? "" : filename, size);
    bool library = false;
    for (const auto& prefix : library_prefixes) {
      library = library || name.substr(0, prefix.size()) == prefix;
    }
    if (!library) {
      const int line = PyFrame_GetLineNumber(frame);
      Py_DECREF(frame);
      return {
          py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(code)),
          line};
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame); // new reference
    Py_DECREF(frame);
    frame = back;
  }
  return {py::none(), 0};
}

std::string code_location(const py::object& code, int line) {
  if (code.is_none()) {
    return "<unknown>";
  }
  auto* object = reinterpret_cast<PyCodeObject*>(code.ptr());
  return py::reinterpret_borrow<py::object>(object->co_filename)
             .cast<std::string>() +
      ":" + std::to_string(line);
}

namespace {
// torch.fx._symbolic_trace's __dict__ (borrowed from the module, which
// sys.modules keeps alive), looked up once.
PyObject* fx_symbolic_trace_dict() {
  static PyObject* dict = []() -> PyObject* {
    PyObject* module = PyImport_ImportModule("torch.fx._symbolic_trace");
    if (module == nullptr) {
      PyErr_Clear();
      return nullptr;
    }
    PyObject* found = PyModule_GetDict(module); // borrowed
    Py_INCREF(found); // leaked on purpose: no decref after finalization
    Py_DECREF(module);
    return found;
  }();
  return dict;
}
} // namespace

namespace {
// Where fx keeps its tracing flag. See Note [make_fx tracing is seen through
// fx's flag].
struct FxTracingFlag {
  // Interned: read on every corrected __torch_dispatch__, so the lookups
  // allocate nothing and reuse the strings' cached hashes.
  PyObject* module_flag_name =
      PyUnicode_InternFromString("_is_fx_tracing_flag");
  PyObject* thread_flag_name = PyUnicode_InternFromString("flag");
  PyObject* dict_name = PyUnicode_InternFromString("__dict__");
  // torch 2.14's threading.local (a strong reference, leaked on purpose), or
  // nullptr for torch 2.13's module global.
  PyObject* thread_local_flags = nullptr;
  // fx_symbolic_trace_dict(), kept here so that the check on every corrected
  // op reads one function-local static, not two.
  PyObject* module_dict = nullptr;
};

ALIASGUARD_COLD const FxTracingFlag* find_fx_tracing_flag() {
  auto* found = new FxTracingFlag();
  PyObject* dict = fx_symbolic_trace_dict();
  found->module_dict = dict;
  PyObject* tls = dict == nullptr
      ? nullptr
      : PyDict_GetItemString(dict, "_is_fx_tracing_tls"); // borrowed
  if (tls != nullptr) {
    Py_INCREF(tls);
    found->thread_local_flags = tls;
  }
  return found;
}

inline const FxTracingFlag& fx_tracing_flag() {
  static const FxTracingFlag* flag = find_fx_tracing_flag();
  return *flag;
}

// The calling thread's attribute dict of torch 2.14's flag holder (a new
// reference), or nullptr with no error set.
PyObject* thread_flag_dict(const FxTracingFlag& flag) {
  PyObject* dict = PyObject_GetAttr(flag.thread_local_flags, flag.dict_name);
  if (dict == nullptr || !PyDict_Check(dict)) {
    PyErr_Clear();
    Py_XDECREF(dict);
    return nullptr;
  }
  return dict;
}
} // namespace

namespace {
// dict[name] is True, as PyDict_GetItem(dict, name) == Py_True answers it.
// PyDict_GetItem saves and restores the error indicator around every lookup
// (two calls into CPython per corrected op); a lookup that starts with no
// error pending needs neither: a failure of it is dropped, as PyDict_GetItem
// drops it, and reads as "not set".
inline bool flag_is_true(PyObject* dict, PyObject* name) {
  if (PyErr_Occurred() != nullptr) [[unlikely]] {
    return PyDict_GetItem(dict, name) == Py_True; // keeps the pending error
  }
  PyObject* value = PyDict_GetItemWithError(dict, name); // borrowed
  if (value == nullptr) {
    PyErr_Clear(); // nothing to clear unless the lookup raised
  }
  return value == Py_True;
}
} // namespace

// See Note [make_fx tracing is seen through fx's flag]
ALIASGUARD_HOT bool fx_tracing_active() {
  const FxTracingFlag& flag = fx_tracing_flag();
  if (flag.thread_local_flags != nullptr) {
    PyObject* dict = thread_flag_dict(flag);
    if (dict == nullptr) {
      return false;
    }
    const bool active = flag_is_true(dict, flag.thread_flag_name);
    Py_DECREF(dict);
    return active;
  }
  return flag.module_dict != nullptr && flag.module_flag_name != nullptr &&
      flag_is_true(flag.module_dict, flag.module_flag_name);
}

namespace {
// Sets fx's tracing flag to `value` (Py_True / Py_False, or nullptr to
// remove it) through the layout fx_tracing_active reads, and returns what it
// was (a new reference, or nullptr when unset). For the self-test only.
PyObject* swap_fx_tracing_flag(PyObject* value) {
  const FxTracingFlag& flag = fx_tracing_flag();
  const bool per_thread = flag.thread_local_flags != nullptr;
  PyObject* dict =
      per_thread ? thread_flag_dict(flag) : fx_symbolic_trace_dict();
  if (dict == nullptr) {
    return nullptr;
  }
  if (!per_thread) {
    Py_INCREF(dict); // the module's dict is borrowed
  }
  PyObject* name = per_thread ? flag.thread_flag_name : flag.module_flag_name;
  PyObject* previous = PyDict_GetItem(dict, name);
  Py_XINCREF(previous);
  if (value != nullptr) {
    PyDict_SetItem(dict, name, value);
  } else if (previous != nullptr) {
    PyDict_DelItem(dict, name);
  }
  PyErr_Clear();
  Py_DECREF(dict);
  return previous;
}

// Whether setting fx's flag is seen by fx_tracing_active, and clearing it.
bool fx_tracing_flag_is_read() {
  PyObject* previous = swap_fx_tracing_flag(Py_True);
  const bool seen_set = fx_tracing_active();
  Py_XDECREF(swap_fx_tracing_flag(Py_False));
  const bool seen_clear = !fx_tracing_active();
  Py_XDECREF(swap_fx_tracing_flag(previous));
  Py_XDECREF(previous);
  return seen_set && seen_clear;
}

// Whether a lookup gives a fresh class a nonzero tag, and setting an
// attribute on its base gives it another.
bool class_change_renews_version_tag() {
  const py::object make_class = py::module_::import("builtins").attr("type");
  py::object base =
      make_class("_AliasguardVersionTagProbe", py::make_tuple(), py::dict());
  py::object derived = make_class(
      "_AliasguardVersionTagProbeChild", py::make_tuple(base), py::dict());
  auto* type = reinterpret_cast<PyTypeObject*>(derived.ptr());
  py::str name("__aliasguard_self_test__");
  lookup_class_attribute(type, name.ptr());
  const unsigned int before = type_version_tag(type);
  base.attr("__aliasguard_self_test__") = py::bool_(false);
  lookup_class_attribute(type, name.ptr());
  const unsigned int after = type_version_tag(type);
  return before != 0 && after != 0 && before != after;
}
} // namespace

// See Note [A SelectiveCheckpointContext without its __init__]
py::object new_checkpoint_context(
    PyObject* context_type,
    PyObject* is_recompute_name,
    PyObject* op_output_name,
    PyObject* op_output) {
  py::object ctx = py::reinterpret_steal<py::object>(PyBaseObject_Type.tp_new(
      reinterpret_cast<PyTypeObject*>(context_type),
      py::tuple().ptr(),
      nullptr));
  if (!ctx || PyObject_SetAttr(ctx.ptr(), is_recompute_name, Py_False) < 0 ||
      (op_output != nullptr &&
       PyObject_SetAttr(ctx.ptr(), op_output_name, op_output) < 0)) {
    throw python_error();
  }
  return ctx;
}

std::vector<std::string> python_torch_internals_self_test() {
  std::vector<std::string> problems;
  py::module_ torch = py::module_::import("torch");
  py::object add = torch.attr("ops").attr("aten").attr("add_").attr("Tensor");
  const auto name = operator_name_of(add.ptr());
  if (!name.has_value() || name->name != "aten::add_" ||
      name->overload_name != "Tensor") {
    problems.emplace_back(
        "torch._ops.OpOverload._schema.name / .overload_name (Note [Operator "
        "of an OpOverload]): torch.ops.aten.add_.Tensor does not name "
        "aten::add_.Tensor");
  }
  py::object tensor = torch.attr("ones")(1);
  if (!is_tensor_object(tensor.ptr()) || is_tensor_object(Py_None)) {
    problems.emplace_back(
        "THPVariableClass (Note [Tensor instance check]): torch.ones(1) is "
        "not recognised as a tensor");
  }
  py::object flag = py::str("__aliasguard_self_test__");
  py::object type = py::reinterpret_borrow<py::object>(
      reinterpret_cast<PyObject*>(Py_TYPE(tensor.ptr())));
  if (lookup_class_attribute(
          reinterpret_cast<PyTypeObject*>(type.ptr()),
          py::str("__torch_dispatch__").ptr()) == nullptr ||
      lookup_class_attribute(
          reinterpret_cast<PyTypeObject*>(type.ptr()), flag.ptr()) != nullptr) {
    problems.emplace_back(
        "_PyType_Lookup (Note [Class attribute lookup without descriptors]): "
        "does not find torch.Tensor.__torch_dispatch__");
  }
  if (!class_change_renews_version_tag()) {
    problems.emplace_back(
        "PyTypeObject.tp_version_tag (Note [Type version tags]): setting a "
        "class attribute did not give the class a new version tag");
  }
  try {
    py::object call = operator_callable_of(add.ptr());
    if (!PyCallable_Check(call.ptr())) {
      throw std::runtime_error("not callable");
    }
  } catch (const std::exception&) {
    PyErr_Clear();
    problems.emplace_back(
        "torch._ops.OpOverload._op (Note [Calling an OpOverload's operator "
        "directly]): torch.ops.aten.add_.Tensor has no callable _op");
  }
  try {
    py::object context_type = py::module_::import("torch.utils.checkpoint")
                                  .attr("SelectiveCheckpointContext");
    py::object ctx = new_checkpoint_context(
        context_type.ptr(),
        py::str("is_recompute").ptr(),
        py::str("op_output").ptr(),
        nullptr);
    if (ctx.attr("is_recompute").ptr() != Py_False) {
      throw std::runtime_error("is_recompute not set");
    }
  } catch (const std::exception&) {
    PyErr_Clear();
    problems.emplace_back(
        "torch.utils.checkpoint.SelectiveCheckpointContext (Note [A "
        "SelectiveCheckpointContext without its __init__]): cannot be made "
        "with object.__new__ and is_recompute");
  }
  {
    PyObject* dict = fx_symbolic_trace_dict();
    PyObject* module_flag = dict == nullptr
        ? nullptr
        : PyDict_GetItemString(dict, "_is_fx_tracing_flag"); // borrowed
    const bool has_layout = fx_tracing_flag().thread_local_flags != nullptr ||
        (module_flag != nullptr && PyBool_Check(module_flag));
    if (!has_layout || !fx_tracing_flag_is_read()) {
      problems.emplace_back(
          "torch.fx._symbolic_trace's tracing flag (_is_fx_tracing_flag, or "
          "_is_fx_tracing_tls.flag) (Note [make_fx tracing is seen through "
          "fx's flag]): not found, or not read back; make_fx traces would be "
          "corrected");
    }
  }
  if (innermost_user_frame({}).first.is_none()) {
    problems.emplace_back(
        "PyEval_GetFrame / PyCodeObject::co_filename (Note [Walking the "
        "Python stack for the user's line]): no Python frame is seen");
  }
  return problems;
}

void init_install_bindings(py::module_& m) {
  m.def(
      "_set_detach_keep_version_counter",
      [](py::handle registered) {
        if (!PyBool_Check(registered.ptr())) {
          throw py::type_error(
              std::string("_set_detach_keep_version_counter(): registered "
                          "must be a bool, got ") +
              Py_TYPE(registered.ptr())->tp_name);
        }
        return native::set_detach_keep_version_counter(
            registered.ptr() == Py_True);
      },
      py::arg("registered"));
  m.def(
      "_is_detach_keep_version_counter_registered",
      &native::is_detach_keep_version_counter_registered);
  m.def("_detach_keep_version_counter_keys", [] {
    std::vector<std::string> names;
    for (c10::DispatchKey key : native::detach_keep_version_counter_keys()) {
      names.emplace_back(c10::toString(key));
    }
    return names;
  });
}

} // namespace aliasguard::internals
