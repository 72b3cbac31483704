#include <torch/csrc/utils/python_alias_correction.h>

#include <c10/util/SmallVector.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/alias_audit.h>
#include <torch/csrc/utils/alias_correction.h>
#include <torch/csrc/utils/dispatch_state.h>
#include <torch/csrc/utils/python_aliasing_error.h>
#include <torch/csrc/utils/python_dispatch_audit.h>
#include <torch/csrc/utils/python_op_cache.h>
#include <torch/csrc/utils/python_op_values.h>
#include <torch/csrc/utils/python_torch_internals.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace aliasguard::utils {
namespace {

PyObject* opt_out_attribute = nullptr; // "__aliasguard_fixup__", interned
std::atomic<bool> correction_enabled{true};

// What owner_opted_out read from a class, valid while the class keeps
// `version` (see Note [Type version tags]). Only flags that are absent or a
// bool are remembered: the truth of any other object may change without the
// class changing.
struct RememberedOptOut {
  PyTypeObject* type = nullptr;
  PyObject* attribute = nullptr;
  unsigned int version = 0;
  bool opted_out = false;
};

// Direct-mapped by class and attribute. Python calls only, so the GIL
// guards it; a free-threaded interpreter gets one per thread.
#ifdef Py_GIL_DISABLED
thread_local
#endif
    std::array<RememberedOptOut, 32>
        remembered_opt_outs{};

RememberedOptOut& remembered_slot(PyTypeObject* type, PyObject* attribute) {
  const auto key = reinterpret_cast<uintptr_t>(type) ^
      (reinterpret_cast<uintptr_t>(attribute) >> 4);
  return remembered_opt_outs[(key >> 4) % remembered_opt_outs.size()];
}

} // namespace

// See Note [Class attribute lookup without descriptors]
ALIASGUARD_HOT bool owner_opted_out(PyObject* owner, PyObject* attribute) {
  PyTypeObject* type = PyType_Check(owner)
      ? reinterpret_cast<PyTypeObject*>(owner)
      : Py_TYPE(owner);
  RememberedOptOut& slot = remembered_slot(type, attribute);
  const unsigned int version = internals::type_version_tag(type);
  if (version != 0 && slot.version == version && slot.type == type &&
      slot.attribute == attribute) {
    return slot.opted_out;
  }
  PyObject* flag = internals::lookup_class_attribute(type, attribute);
  if (flag == nullptr || PyBool_Check(flag)) {
    // The lookup assigns the class a tag when it had none.
    slot = {
        type, attribute, internals::type_version_tag(type), flag == Py_False};
    return flag == Py_False;
  }
  const int is_false = PyObject_Not(flag);
  if (is_false < 0) {
    PyErr_Clear(); // an unusable flag: keep the default
    return false;
  }
  return is_false == 1;
}

ALIASGUARD_HOT PyObject* correct_result(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    const CorrectionOptions& options) {
  const SchemaAliasAnalysis& analysis = *entry.analysis;
  const auto& returns = analysis.returns();
  const size_t num_returns = returns.size();
  if (num_returns == 0) {
    return Py_NewRef(out);
  }
  // Borrowed: `out` keeps them alive.
  c10::SmallVector<PyObject*, 4> outputs;
  if (num_returns == 1) {
    outputs.push_back(out);
  } else {
    if (!has_one_value_per_return(out, num_returns)) {
      // See Note [Results of the wrong type are torch's to report]
      return Py_NewRef(out);
    }
    for (size_t i = 0; i < num_returns; ++i) {
      outputs.push_back(PySequence_Fast_GET_ITEM(out, i));
    }
  }

  BorrowedObjects borrowed;
  c10::SmallVector<PyObject*, 8> argument_objects;
  c10::SmallVector<OpValueRef, 8> arguments;
  for (size_t i = 0; i < analysis.num_arguments(); ++i) {
    argument_objects.push_back(argument_object(entry, args, kwargs, i));
    arguments.push_back(borrowed.borrow(argument_objects.back()));
  }
  c10::SmallVector<OpValueRef, 4> results;
  for (PyObject* output : outputs) {
    results.push_back(borrowed.borrow(output));
  }

  // See Note [What a write return may be]
  c10::SmallVector<bool, 4> hand_back;
  correct_aliasing_borrowed(analysis, arguments, results, options);
  for (size_t i = 0; i < num_returns; ++i) {
    hand_back.push_back(
        hands_back_argument(returns[i], results[i]) &&
        argument_objects[returns[i].argument] != nullptr);
  }
  if (!analysis.has_write_returns()) {
    return Py_NewRef(out);
  }
  // Write returns come back as the caller's own argument objects.
  const auto handed_back = [&](size_t i) -> PyObject* {
    return hand_back[i] ? argument_objects[returns[i].argument] : outputs[i];
  };
  if (num_returns == 1) {
    return Py_NewRef(handed_back(0));
  }
  const bool as_list = PyList_Check(out);
  PyObject* result =
      as_list ? PyList_New(num_returns) : PyTuple_New(num_returns);
  if (result == nullptr) {
    throw python_error();
  }
  for (size_t i = 0; i < num_returns; ++i) {
    PyObject* item = Py_NewRef(handed_back(i));
    if (as_list) {
      PyList_SET_ITEM(result, i, item);
    } else {
      PyTuple_SET_ITEM(result, i, item);
    }
  }
  if (!as_list && !PyTuple_CheckExact(out)) {
    // Keep a torch.return_types structseq what it was, when it can be
    // rebuilt from a sequence; a plain tuple serves the dispatcher as well.
    PyObject* typed =
        PyObject_CallOneArg(reinterpret_cast<PyObject*>(Py_TYPE(out)), result);
    if (typed != nullptr) {
      Py_DECREF(result);
      return typed;
    }
    PyErr_Clear();
  }
  return result;
}

ALIASGUARD_HOT bool correct_sole_view(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* out,
    const CorrectionOptions& options) {
  const size_t index = *entry.sole_view_argument;
  if (static_cast<Py_ssize_t>(index) >= PySequence_Fast_GET_SIZE(args)) {
    return false;
  }
  PyObject* input = PySequence_Fast_GET_ITEM(args, index);
  if (!internals::is_tensor_object(input) ||
      !internals::is_tensor_object(out)) {
    return false;
  }
  correct_view_return(
      *entry.analysis,
      0,
      THPVariable_Unpack(input),
      THPVariable_Unpack(out),
      options);
  return true;
}

ALIASGUARD_HOT bool correction_applies(PyObject* owner) {
  // See Note [Tracing infrastructure is left alone] and Note [make_fx
  // tracing is seen through fx's flag].
  return correction_enabled.load(std::memory_order_relaxed) &&
      !owner_opted_out(owner, opt_out_attribute) &&
      !tracing_infrastructure_active() && !internals::fx_tracing_active();
}

ALIASGUARD_HOT PyObject* corrected_result(
    PyObject* owner,
    PyObject* func,
    const PyOpEntry* known_entry,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    bool correct,
    bool audit,
    const CorrectionOptions& options,
    const ReportedViolationMark& mark) {
  if (out == Py_NotImplemented || (!correct && !audit)) {
    return Py_NewRef(out); // NotImplemented: the dispatcher asks someone else
  }
  return translate_errors([&]() -> PyObject* {
    const RunningCorrection running;
    const PyOpEntry& entry =
        known_entry != nullptr ? *known_entry : op_entry(func);
    if (!entry.analysis ||
        (!audit && !entry.analysis->has_aliasing_returns())) {
      return Py_NewRef(out);
    }
    check_args_kwargs(args, kwargs);
    if (audit) {
      return audited_result(
          owner, entry, args, kwargs, out, correct, options, mark);
    }
    if (entry.sole_view_argument.has_value() &&
        correct_sole_view(entry, args, out, options)) {
      return Py_NewRef(out);
    }
    return correct_result(entry, args, kwargs, out, options);
  });
}

void init_alias_correction_bindings(py::module& m) {
  opt_out_attribute = PyUnicode_InternFromString("__aliasguard_fixup__");
  if (opt_out_attribute == nullptr) {
    throw python_error();
  }
  m.def(
      "_set_alias_correction",
      [](bool enabled) { return correction_enabled.exchange(enabled); },
      py::arg("enabled"));
  m.def(
      "_is_alias_correction_enabled", [] { return correction_enabled.load(); });
  m.def(
      "_enter_alias_audit",
      &enter_alias_audit,
      py::arg("check_kernels") = false);
  m.def(
      "_exit_alias_audit", &exit_alias_audit, py::arg("check_kernels") = false);
  m.def("_retain_alias_audit_fallback", &retain_alias_audit_fallback);
  m.def("_release_alias_audit_fallback", &release_alias_audit_fallback);
  m.def("_alias_audit_depth", &alias_audit_depth);
  m.def("_alias_audit_scopes", &alias_audit_scopes);
  m.def("_is_alias_audit_enabled", &is_alias_audit_enabled);
}

} // namespace aliasguard::utils
