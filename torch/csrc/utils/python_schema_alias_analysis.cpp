#include <torch/csrc/utils/python_schema_alias_analysis.h>

#include <ATen/core/operator_name.h>

#include <torch/csrc/utils/python_op_cache.h>
#include <torch/csrc/utils/schema_alias_analysis.h>

#include <memory>
#include <string>
#include <utility>

namespace py = pybind11;

namespace aliasguard::utils {
namespace {

// One return: (kind, argument index or None, argument name or None, is_list).
py::tuple return_tuple(
    const SchemaAliasAnalysis& analysis,
    const ReturnAlias& alias) {
  py::object argument = py::none();
  py::object argument_name = py::none();
  if (alias.aliases_argument()) {
    argument = py::int_(alias.argument);
    argument_name = py::str(analysis.argument_name(alias.argument));
  }
  return py::make_tuple(
      return_alias_kind_name(alias.kind),
      argument,
      argument_name,
      alias.is_list);
}

py::list schema_alias_info(
    const std::string& name,
    const std::string& overload) {
  const auto analysis =
      schema_alias_analysis(c10::OperatorName(name, overload));
  if (!analysis) {
    throw py::value_error(
        "_schema_alias_info(): no operator " + name +
        (overload.empty() ? std::string() : "." + overload) + " is registered");
  }
  py::list result;
  for (const ReturnAlias& alias : analysis->returns()) {
    result.append(return_tuple(*analysis, alias));
  }
  return result;
}

// What _op_alias_info returns; immutable, computed once per call.
struct OpAliasInfo {
  std::string name;
  py::tuple returns;
  py::tuple written_arguments;
  bool has_view_returns = false;
  bool has_write_returns = false;
  bool may_return_views = false;
};

py::object op_alias_info(py::handle op) {
  const RunningCorrection running; // keeps `entry` valid
  const PyOpEntry& entry = op_entry(op.ptr());
  if (!entry.analysis) {
    return py::none();
  }
  const SchemaAliasAnalysis& analysis = *entry.analysis;
  OpAliasInfo info;
  info.name = analysis.op_name();
  py::list returns;
  for (const ReturnAlias& alias : analysis.returns()) {
    returns.append(return_tuple(analysis, alias));
    info.may_return_views |= alias.annotated && !alias.annotated_write;
  }
  py::list written;
  for (size_t i = 0; i < analysis.num_arguments(); ++i) {
    if (analysis.argument_is_written(i)) {
      written.append(py::make_tuple(i, analysis.argument_name(i)));
    }
  }
  info.returns = py::tuple(returns);
  info.written_arguments = py::tuple(written);
  info.has_view_returns = analysis.has_view_returns();
  info.has_write_returns = analysis.has_write_returns();
  return py::cast(std::move(info));
}

} // namespace

void init_schema_alias_analysis_bindings(py::module& m) {
  py::class_<OpAliasInfo>(
      m,
      "OpAliasInfo",
      "What an operator's schema says about aliasing, from the C++ analysis "
      "(see _op_alias_info).")
      .def_readonly("name", &OpAliasInfo::name)
      .def_readonly("returns", &OpAliasInfo::returns)
      .def_readonly("written_arguments", &OpAliasInfo::written_arguments)
      .def_readonly("has_view_returns", &OpAliasInfo::has_view_returns)
      .def_readonly("has_write_returns", &OpAliasInfo::has_write_returns)
      .def_readonly("may_return_views", &OpAliasInfo::may_return_views)
      .def("__repr__", [](const OpAliasInfo& info) {
        return "<OpAliasInfo " + info.name + ">";
      });
  m.def(
      "_schema_alias_info",
      &schema_alias_info,
      py::arg("name"),
      py::arg("overload") = "");
  m.def("_op_alias_info", &op_alias_info, py::arg("op"));
  m.def("_operator_registrations", &operator_registrations);
}

} // namespace aliasguard::utils
