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

// See Note [make_fx tracing is seen through fx's flag]
bool fx_tracing_active() {
  PyObject* dict = fx_symbolic_trace_dict();
  if (dict == nullptr) {
    return false;
  }
  // Read on every corrected __torch_dispatch__: an interned key, so the
  // lookup allocates nothing and reuses the string's cached hash.
  static PyObject* key = PyUnicode_InternFromString("_is_fx_tracing_flag");
  return key != nullptr && PyDict_GetItem(dict, key) == Py_True;
}

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
    PyObject* flag = dict == nullptr
        ? nullptr
        : PyDict_GetItemString(dict, "_is_fx_tracing_flag");
    if (flag == nullptr || !PyBool_Check(flag)) {
      problems.emplace_back(
          "torch.fx._symbolic_trace._is_fx_tracing_flag (Note [make_fx "
          "tracing is seen through fx's flag]): not a bool any more; make_fx "
          "traces would be corrected");
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
