#include <torch/csrc/utils/python_torch_internals.h>

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
