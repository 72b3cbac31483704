#include <torch/csrc/utils/python_dispatch_audit.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/python_alias_correction.h>
#include <torch/csrc/utils/python_aliasing_error.h>
#include <torch/csrc/utils/python_op_values.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace aliasguard::utils {
namespace {

// Audits `out` as the result of `func(*args, **kwargs)`, changing nothing.
void check_only(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    bool views_share_version_counter,
    bool judge_wrapper_views = false) {
  const SchemaAliasAnalysis& analysis = *entry.analysis;
  if (analysis.returns().empty()) {
    return;
  }
  const c10::SmallVector<PyObject*, 4> outputs = split_returns(analysis, out);
  BorrowedObjects borrowed;
  c10::SmallVector<OpValueRef, 8> arguments;
  for (size_t i = 0; i < analysis.num_arguments(); ++i) {
    arguments.push_back(
        borrowed.borrow(argument_object(entry, args, kwargs, i)));
  }
  c10::SmallVector<OpValueRef, 4> results;
  for (PyObject* output : outputs) {
    results.push_back(borrowed.borrow(output));
  }
  audit_aliasing_borrowed(
      analysis,
      arguments,
      results,
      views_share_version_counter,
      AuditAllowances{entry.fresh_return_may_alias, entry.view_may_be_a_copy},
      judge_wrapper_views);
}

// Note [Auditing a __torch_dispatch__ result]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under audit, a handler's result is checked twice around the correction: as
// the handler returned it (views may have counters of their own there: below
// autograd that is stock PyTorch's doing, not the handler's), then as it is
// handed back, with the inner tensors of traceable wrappers too. Which of
// what they find was repaired is the core's decision (see Note [Repaired or
// not] in alias_audit.h). Each violation is offered to the reporter (see
// Note [The audit's Python reporter]): in report mode the run goes on with
// the corrected result, or, when the correction refused, with what the
// handler returned (stock behaviour).

// Flattens a traceable wrapper (one with __tensor_flatten__) down to plain
// tensors: appends each with its dotted attribute path to `leaves`. Returns
// false when `obj` is not traceable.
bool flatten_traceable(
    PyObject* obj,
    const std::string& prefix,
    std::vector<InnerTensorLeaf>& leaves,
    int depth = 0) {
  if (depth > 8 || !internals::is_tensor_object(obj) ||
      THPVariable_CheckExact(obj)) {
    return false;
  }
  static PyObject* flatten_name =
      PyUnicode_InternFromString("__tensor_flatten__");
  if (internals::lookup_class_attribute(Py_TYPE(obj), flatten_name) ==
      nullptr) {
    return false;
  }
  py::object flattened = py::reinterpret_steal<py::object>(
      PyObject_CallMethodNoArgs(obj, flatten_name));
  if (!flattened) {
    throw python_error();
  }
  py::sequence parts = py::reinterpret_borrow<py::sequence>(flattened);
  for (py::handle name : py::reinterpret_borrow<py::sequence>(parts[0])) {
    py::object inner =
        py::reinterpret_steal<py::object>(PyObject_GetAttr(obj, name.ptr()));
    if (!inner) {
      throw python_error();
    }
    const std::string path = prefix + py::str(name).cast<std::string>();
    if (!flatten_traceable(inner.ptr(), path + ".", leaves, depth + 1) &&
        internals::is_tensor_object(inner.ptr())) {
      leaves.push_back(InnerTensorLeaf{path, THPVariable_Unpack(inner.ptr())});
    }
  }
  return true;
}

// The check of Note [Inner tensors of traceable wrappers] on the view
// returns of a handed-back result.
void audit_inner_views(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    PyObject* result) {
  if (!inner_views_are_audited(entry.view_may_be_a_copy)) {
    return;
  }
  const SchemaAliasAnalysis& analysis = *entry.analysis;
  const auto& returns = analysis.returns();
  for (size_t i = 0; i < returns.size(); ++i) {
    if (returns[i].kind != ReturnAliasKind::kView) {
      continue;
    }
    PyObject* input = argument_object(entry, args, kwargs, returns[i].argument);
    PyObject* value = nullptr;
    if (returns.size() == 1) {
      value = result;
    } else if (
        (PyTuple_Check(result) || PyList_Check(result)) &&
        PySequence_Fast_GET_SIZE(result) > static_cast<Py_ssize_t>(i)) {
      value = PySequence_Fast_GET_ITEM(result, i);
    }
    if (input == nullptr || value == nullptr) {
      continue;
    }
    std::vector<InnerTensorLeaf> input_leaves;
    if (!flatten_traceable(input, "", input_leaves)) {
      continue;
    }
    const AliasSite site{analysis, i, returns[i].argument};
    const bool is_sequence = PyTuple_Check(value) || PyList_Check(value);
    const Py_ssize_t count = is_sequence ? PySequence_Fast_GET_SIZE(value) : 1;
    for (Py_ssize_t k = 0; k < count; ++k) {
      PyObject* output =
          is_sequence ? PySequence_Fast_GET_ITEM(value, k) : value;
      std::vector<InnerTensorLeaf> output_leaves;
      if (flatten_traceable(output, "", output_leaves)) {
        audit_inner_view(
            is_sequence ? site.with_element(static_cast<size_t>(k)) : site,
            THPVariable_Unpack(input),
            output_leaves,
            input_leaves,
            entry.view_may_be_a_copy);
      }
    }
  }
}

// The judge of Note [Wrapper views judged by their inner tensors], called by
// the audit fallback (with or without the GIL).
bool judge_wrapper_view(
    const AliasSite& site,
    const at::Tensor& input,
    const at::Tensor& output) {
  py::gil_scoped_acquire gil;
  std::vector<InnerTensorLeaf> input_leaves;
  std::vector<InnerTensorLeaf> output_leaves;
  try {
    const py::object input_object =
        py::reinterpret_steal<py::object>(THPVariable_Wrap(input));
    const py::object output_object =
        py::reinterpret_steal<py::object>(THPVariable_Wrap(output));
    if (!input_object || !output_object ||
        !flatten_traceable(input_object.ptr(), "", input_leaves) ||
        !flatten_traceable(output_object.ptr(), "", output_leaves)) {
      PyErr_Clear();
      return false;
    }
  } catch (const python_error&) {
    // A __tensor_flatten__ that fails: the pair cannot be seen into, and
    // the storage check reports it.
    PyErr_Clear();
    return false;
  }
  audit_inner_view(site, input, output_leaves, input_leaves);
  return true;
}

const bool wrapper_view_judge_set =
    (set_wrapper_view_judge(&judge_wrapper_view), true);

} // namespace

PyObject* audited_result(
    PyObject* owner,
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    bool correct,
    const CorrectionOptions& options,
    const ReportedViolationMark& mark) {
  const SchemaAliasAnalysis& analysis = *entry.analysis;
  std::optional<AliasingError> raw_error;
  std::optional<AliasingError> refusal;
  py::object result;
  if (correct) {
    try {
      check_only(
          entry, args, kwargs, out, /*views_share_version_counter=*/false);
    } catch (const AliasingError& error) {
      raw_error = error;
    }
    try {
      result = py::reinterpret_steal<py::object>(
          correct_result(entry, args, kwargs, out, options));
    } catch (const AliasingError& error) {
      refusal = error;
    }
  }
  if (!result) {
    result = py::reinterpret_borrow<py::object>(out);
  }
  std::optional<AliasingError> remaining;
  if (!refusal) {
    try {
      check_only(
          entry,
          args,
          kwargs,
          result.ptr(),
          /*views_share_version_counter=*/true,
          // See Note [Wrapper views judged by their inner tensors].
          /*judge_wrapper_views=*/options.no_kernel_above_marks_views);
      audit_inner_views(entry, args, kwargs, result.ptr());
    } catch (const AliasingError& error) {
      remaining = error;
    }
  }
  if ((!raw_error && !refusal && !remaining) ||
      reported_violation_since(mark, analysis)) {
    // Clean, or blamed already: see Note [One report per op call].
    return result.release().ptr();
  }
  // See Note [Repaired or not]. Raise mode (a reporter answering false)
  // raises only what was not repaired.
  const AuditJudgement judgement =
      judge_audited_result(raw_error, refusal, remaining);
  if (judgement.repaired) {
    offer_violation(*judgement.repaired, owner, /*repaired=*/true);
  }
  if (judgement.unrepaired &&
      !offer_violation(*judgement.unrepaired, owner, /*repaired=*/false)) {
    throw *judgement.raise;
  }
  note_reported_violation(analysis);
  return result.release().ptr();
}

} // namespace aliasguard::utils
