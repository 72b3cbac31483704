#include <torch/csrc/utils/python_torch_internals.h>

#include <torch/csrc/utils/pybind.h>

#include <vector>

namespace py = pybind11;

namespace aliasguard::internals {

std::optional<c10::OperatorName> operator_name_of(PyObject* func) {
  py::object schema = py::reinterpret_steal<py::object>(
      PyObject_GetAttrString(func, "_schema"));
  if (!schema) {
    PyErr_Clear();
    return std::nullopt;
  }
  py::object name = py::reinterpret_steal<py::object>(
      PyObject_GetAttrString(schema.ptr(), "name"));
  py::object overload = py::reinterpret_steal<py::object>(
      PyObject_GetAttrString(schema.ptr(), "overload_name"));
  if (!name || !overload || !PyUnicode_Check(name.ptr()) ||
      !PyUnicode_Check(overload.ptr())) {
    PyErr_Clear();
    return std::nullopt;
  }
  return c10::OperatorName(
      name.cast<std::string>(), overload.cast<std::string>());
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

} // namespace aliasguard::internals
