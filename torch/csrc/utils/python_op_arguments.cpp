// See Note [Boxed arguments as a __torch_dispatch__ sees them].

#include <torch/csrc/utils/python_op_arguments.h>

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

namespace py = pybind11;

namespace aliasguard::utils {
namespace {

c10::TypeKind kind_of(const c10::Argument& argument) {
  const c10::TypePtr& type = argument.real_type();
  if (const auto optional = type->cast<c10::OptionalType>()) {
    return optional->getElementType()->kind();
  }
  return type->kind();
}

py::object python_value(
    const c10::Argument& argument,
    const c10::IValue& value) {
  if (value.isNone()) {
    return py::none();
  }
  switch (kind_of(argument)) {
    case c10::TypeKind::ScalarTypeType:
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(
          torch::getTHPDtype(static_cast<c10::ScalarType>(value.toInt()))));
    case c10::TypeKind::LayoutType:
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(
          torch::getTHPLayout(static_cast<c10::Layout>(value.toInt()))));
    case c10::TypeKind::MemoryFormatType:
      return py::reinterpret_borrow<py::object>(
          torch::utils::getTHPMemoryFormat(
              static_cast<c10::MemoryFormat>(value.toInt())));
    default:
      return torch::jit::toPyObject(value);
  }
}

bool is_default(const c10::Argument& argument, const c10::IValue& value) {
  const auto& default_value = argument.default_value();
  return default_value.has_value() && *default_value == value;
}

} // namespace

std::pair<py::tuple, py::dict> python_arguments(
    const c10::FunctionSchema& schema,
    c10::ArrayRef<c10::IValue> arguments) {
  const std::vector<c10::Argument>& declared = schema.arguments();
  TORCH_INTERNAL_ASSERT(arguments.size() == declared.size());
  size_t keyword_only_start = arguments.size();
  while (keyword_only_start > 0 &&
         declared[keyword_only_start - 1].kwarg_only()) {
    --keyword_only_start;
  }
  size_t num_positional = keyword_only_start;
  while (
      num_positional > 0 &&
      is_default(declared[num_positional - 1], arguments[num_positional - 1])) {
    --num_positional;
  }
  py::tuple args(num_positional);
  for (size_t i = 0; i < num_positional; ++i) {
    args[i] = python_value(declared[i], arguments[i]);
  }
  py::dict kwargs;
  for (size_t i = keyword_only_start; i < arguments.size(); ++i) {
    if (!is_default(declared[i], arguments[i])) {
      kwargs[py::str(declared[i].name())] =
          python_value(declared[i], arguments[i]);
    }
  }
  return {std::move(args), std::move(kwargs)};
}

py::object python_value(const c10::IValue& value) {
  return torch::jit::toPyObject(value);
}

py::object python_returns(c10::ArrayRef<c10::IValue> returns) {
  if (returns.size() == 1) {
    return python_value(returns[0]);
  }
  py::tuple values(returns.size());
  for (size_t i = 0; i < returns.size(); ++i) {
    values[i] = python_value(returns[i]);
  }
  return values;
}

} // namespace aliasguard::utils
