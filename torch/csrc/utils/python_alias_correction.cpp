#include <torch/csrc/utils/python_alias_correction.h>

#include <c10/util/SmallVector.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/alias_audit.h>
#include <torch/csrc/utils/alias_correction.h>
#include <torch/csrc/utils/python_aliasing_error.h>
#include <torch/csrc/utils/python_op_cache.h>
#include <torch/csrc/utils/python_torch_internals.h>
#include <torch/csrc/utils/python_tracked_dispatch.h>

#include <atomic>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace aliasguard::utils {
namespace {

PyObject* opt_out_attribute = nullptr; // "__aliasguard_fixup__", interned
std::atomic<bool> correction_enabled{true};

bool opted_out(PyObject* owner) {
  PyTypeObject* type = PyType_Check(owner)
      ? reinterpret_cast<PyTypeObject*>(owner)
      : Py_TYPE(owner);
  // See Note [Class attribute lookup without descriptors]
  PyObject* flag = internals::lookup_class_attribute(type, opt_out_attribute);
  if (flag == nullptr || flag == Py_True) {
    return false;
  }
  const int is_false = PyObject_Not(flag);
  if (is_false < 0) {
    PyErr_Clear(); // an unusable flag: keep correcting
    return false;
  }
  return is_false == 1;
}

// OpValueRefs over Python objects, without touching any reference count;
// owns the element arrays of lists. Only tensors matter to aliasing.
class BorrowedObjects {
 public:
  OpValueRef borrow(PyObject* obj) {
    if (obj == nullptr || obj == Py_None) {
      return OpValueRef();
    }
    if (PyList_Check(obj) || PyTuple_Check(obj)) {
      return borrow_sequence(obj);
    }
    if (!PyLong_Check(obj) &&
        internals::is_tensor_object(obj)) { // ints are common
      return OpValueRef(THPVariable_Unpack(obj));
    }
    return OpValueRef::other(Py_TYPE(obj)->tp_name);
  }

 private:
  OpValueRef borrow_sequence(PyObject* obj) {
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(obj);
    std::vector<const at::Tensor*> tensors;
    for (Py_ssize_t i = 0; i < size; ++i) {
      PyObject* item = PySequence_Fast_GET_ITEM(obj, i);
      const bool is_none = item == Py_None;
      if (!is_none &&
          (PyLong_Check(item) || !internals::is_tensor_object(item))) {
        return OpValueRef::other(Py_TYPE(obj)->tp_name); // e.g. a size list
      }
      if (tensors.empty()) {
        tensors.reserve(size); // only now: most lists are sizes
      }
      tensors.push_back(is_none ? nullptr : &THPVariable_Unpack(item));
    }
    // Moving the vector keeps its buffer, which the ref points into.
    lists_.push_back(std::move(tensors));
    return OpValueRef::list(lists_.back());
  }

  std::vector<std::vector<const at::Tensor*>> lists_;
};

// Whether `out` holds one value per return of a multi-return op.
bool has_one_value_per_return(PyObject* out, size_t num_returns) {
  return (PyTuple_Check(out) || PyList_Check(out)) &&
      PySequence_Fast_GET_SIZE(out) == static_cast<Py_ssize_t>(num_returns);
}

// The returns of `out` (borrowed from it), one per schema return.
c10::SmallVector<PyObject*, 4> split_returns(
    const SchemaAliasAnalysis& analysis,
    PyObject* out) {
  const size_t num_returns = analysis.returns().size();
  c10::SmallVector<PyObject*, 4> outputs;
  if (num_returns == 1) {
    outputs.push_back(out);
    return outputs;
  }
  if ((!PyTuple_Check(out) && !PyList_Check(out)) ||
      PySequence_Fast_GET_SIZE(out) != static_cast<Py_ssize_t>(num_returns)) {
    throw_aliasing_error(
        analysis,
        0,
        std::nullopt,
        AliasViolation::kWrongType,
        std::string("cannot be found: the op returned a ") +
            Py_TYPE(out)->tp_name + ", but its schema has " +
            std::to_string(num_returns) + " returns");
  }
  for (size_t i = 0; i < num_returns; ++i) {
    outputs.push_back(PySequence_Fast_GET_ITEM(out, i));
  }
  return outputs;
}

// Audits `out` as the result of `func(*args, **kwargs)`, changing nothing.
void check_only(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    bool views_share_version_counter) {
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
      analysis, arguments, results, views_share_version_counter);
}

// Corrects `out`, the result of `func` called with `args`/`kwargs`. Returns
// the object to hand back (new reference): `out`, or, for write returns, the
// caller's argument objects in their place.
PyObject* correct_result(
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

// The fast path for the most common aliasing op: one view return of the only
// tensor argument (view, t, transpose, select, slice, expand, ...). Returns
// false, having done nothing, when the values are not the plain case (the
// general path then handles them, errors included).
bool correct_sole_view(
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

void check_args_kwargs(PyObject* args, PyObject* kwargs) {
  if (!PyTuple_Check(args) && !PyList_Check(args)) {
    throw py::type_error(
        std::string("args must be a tuple, got ") + Py_TYPE(args)->tp_name);
  }
  if (kwargs != Py_None && !PyDict_Check(kwargs)) {
    throw py::type_error(
        std::string("kwargs must be a dict or None, got ") +
        Py_TYPE(kwargs)->tp_name);
  }
}

// Note [The explicit call checks its arguments]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// correct_aliasing() is called by hand at the end of a __torch_dispatch__,
// with the op's args and kwargs and what the handler computed. A mismatch
// there (more positional arguments than the schema has, a keyword it does
// not know, None or a str where the schema returns a Tensor) is a bug in the
// caller: it is a TypeError before anything is changed, where the automatic
// correction would pass it on for torch to report. See Note [Results of the
// wrong type are torch's to report].
[[noreturn]] void throw_call_error(
    const SchemaAliasAnalysis& analysis,
    const std::string& what) {
  throw py::type_error(
      "correct_aliasing(): " + analysis.op_name() + ": " + what +
      " (schema: " + analysis.schema_string() + ")");
}

bool is_tensor_or_none(PyObject* obj) {
  return obj == Py_None ||
      (!PyLong_Check(obj) && internals::is_tensor_object(obj));
}

void check_explicit_return(
    const SchemaAliasAnalysis& analysis,
    size_t index,
    PyObject* value) {
  const ReturnAlias& alias = analysis.returns()[index];
  const std::string which = "return " + std::to_string(index);
  if (alias.is_list) {
    if (!PyList_Check(value) && !PyTuple_Check(value)) {
      throw_call_error(
          analysis,
          which + " must be a list of Tensors, got " + Py_TYPE(value)->tp_name);
    }
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(value); ++k) {
      PyObject* item = PySequence_Fast_GET_ITEM(value, k);
      if (!is_tensor_or_none(item)) {
        throw_call_error(
            analysis,
            which + " must be a list of Tensors, but element " +
                std::to_string(k) + " is a " + Py_TYPE(item)->tp_name);
      }
    }
    return;
  }
  // A write return may be None: the argument is handed back.
  // See Note [What a write return may be]
  const bool none_allowed = alias.is_write() || alias.optional;
  if (value == Py_None ? !none_allowed : !is_tensor_or_none(value)) {
    throw_call_error(
        analysis,
        which + " must be a Tensor (it is a " +
            std::string(alias.is_write() ? "write" : "view") +
            " of argument '" + analysis.argument_name(alias.argument) +
            "'), got " + Py_TYPE(value)->tp_name);
  }
}

void check_explicit_call(
    const SchemaAliasAnalysis& analysis,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out) {
  size_t positional = 0;
  while (positional < analysis.num_arguments() &&
         !analysis.argument_is_kwarg_only(positional)) {
    ++positional;
  }
  const auto given = static_cast<size_t>(PySequence_Fast_GET_SIZE(args));
  if (given > positional) {
    throw_call_error(
        analysis,
        "args has " + std::to_string(given) +
            " positional arguments, but the op takes at most " +
            std::to_string(positional));
  }
  if (kwargs != Py_None) {
    PyObject* key = nullptr;
    PyObject* value = nullptr;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kwargs, &pos, &key, &value)) {
      size_t index = analysis.num_arguments();
      if (PyUnicode_Check(key)) {
        for (size_t i = 0; i < analysis.num_arguments(); ++i) {
          if (PyUnicode_CompareWithASCIIString(
                  key, analysis.argument_name(i).c_str()) == 0) {
            index = i;
            break;
          }
        }
      }
      if (index == analysis.num_arguments()) {
        PyObject* text = PyObject_Repr(key);
        const char* repr = text != nullptr ? PyUnicode_AsUTF8(text) : nullptr;
        const std::string name = repr != nullptr ? repr : "?";
        Py_XDECREF(text);
        PyErr_Clear();
        throw_call_error(analysis, "kwargs has an unknown argument " + name);
      }
      if (index < given) {
        throw_call_error(
            analysis,
            "argument '" + analysis.argument_name(index) +
                "' is given both in args and in kwargs");
      }
    }
  }
  const size_t num_returns = analysis.returns().size();
  if (num_returns == 0) {
    return;
  }
  if (num_returns > 1 && !has_one_value_per_return(out, num_returns)) {
    throw_call_error(
        analysis,
        std::string("out must be a tuple of ") + std::to_string(num_returns) +
            " values, one per return, got " + Py_TYPE(out)->tp_name);
  }
  for (size_t i = 0; i < num_returns; ++i) {
    if (analysis.returns()[i].aliases_argument()) {
      check_explicit_return(
          analysis,
          i,
          num_returns == 1 ? out : PySequence_Fast_GET_ITEM(out, i));
    }
  }
}

// Note [Auditing a __torch_dispatch__ result]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Under audit, a handler's result is checked twice around the correction: as
// the handler returned it (views may have counters of their own there: below
// autograd that is stock PyTorch's doing, not the handler's), then as it is
// handed back, with the inner tensors of traceable wrappers too. A violation
// in the first check that the second no longer finds was repaired by the
// correction (without aliasguard, the user would hit it); one the correction
// refused, or the second check still finds, was not. Each violation is
// offered to the reporter (see Note [The audit's Python reporter]): in
// report mode the run goes on with the corrected result, or, when the
// correction refused, with what the handler returned (stock behaviour).

// Flattens a traceable wrapper (one with __tensor_flatten__) down to plain
// tensors: appends (dotted attribute path, tensor) to `leaves`. Returns false
// when `obj` is not traceable.
bool flatten_traceable(
    PyObject* obj,
    const std::string& prefix,
    std::vector<std::pair<std::string, at::Tensor>>& leaves,
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
      leaves.emplace_back(path, THPVariable_Unpack(inner.ptr()));
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
    std::vector<std::pair<std::string, at::Tensor>> input_leaves;
    if (!flatten_traceable(input, "", input_leaves)) {
      continue;
    }
    std::vector<at::Tensor> inputs;
    inputs.reserve(input_leaves.size());
    for (auto& leaf : input_leaves) {
      inputs.push_back(leaf.second);
    }
    const bool is_sequence = PyTuple_Check(value) || PyList_Check(value);
    const Py_ssize_t count = is_sequence ? PySequence_Fast_GET_SIZE(value) : 1;
    for (Py_ssize_t k = 0; k < count; ++k) {
      PyObject* output =
          is_sequence ? PySequence_Fast_GET_ITEM(value, k) : value;
      std::vector<std::pair<std::string, at::Tensor>> output_leaves;
      if (!flatten_traceable(output, "", output_leaves)) {
        continue;
      }
      for (const auto& [name, leaf] : output_leaves) {
        audit_inner_view(analysis, i, returns[i].argument, name, leaf, inputs);
      }
    }
  }
}

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
          /*views_share_version_counter=*/true);
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
  // What the handler got wrong and the correction fixed, then what is left.
  // Raise mode (a reporter answering false) raises only what is left.
  bool handled = true;
  if (refusal) {
    handled = offer_violation(
        raw_error ? *raw_error : *refusal, owner, /*repaired=*/false);
  } else {
    if (raw_error && (!remaining || remaining->kind() != raw_error->kind())) {
      offer_violation(*raw_error, owner, /*repaired=*/true);
    }
    if (remaining) {
      handled = offer_violation(*remaining, owner, /*repaired=*/false);
    }
  }
  if (!handled) {
    throw refusal ? *refusal : *remaining;
  }
  note_reported_violation(analysis);
  return result.release().ptr();
}

} // namespace

bool correction_applies(PyObject* owner) {
  return correction_enabled.load(std::memory_order_relaxed) &&
      !opted_out(owner);
}

PyObject* corrected_result(
    PyObject* owner,
    PyObject* func,
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
    const PyOpEntry& entry = op_entry(func);
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

namespace {

// _correct_aliasing(func, args, kwargs, out): the explicit call; corrects
// whatever the global switch says.
PyObject* explicit_correct_aliasing(
    PyObject* /*module*/,
    PyObject* const* argv,
    Py_ssize_t argc) {
  if (argc != 4) {
    PyErr_Format(
        PyExc_TypeError,
        "correct_aliasing() takes 4 arguments (func, args, kwargs, out), got "
        "%zd",
        argc);
    return nullptr;
  }
  return translate_errors([&]() -> PyObject* {
    const RunningCorrection running;
    const PyOpEntry& entry = op_entry(argv[0]);
    if (!entry.analysis) {
      throw py::type_error(
          std::string("correct_aliasing(): func must be an OpOverload of a "
                      "registered operator (e.g. torch.ops.aten.view.default), "
                      "got ") +
          Py_TYPE(argv[0])->tp_name);
    }
    check_args_kwargs(argv[1], argv[2]);
    check_explicit_call(*entry.analysis, argv[1], argv[2], argv[3]);
    const CorrectionOptions options = explicit_correction_options(argv[0]);
    if (!entry.analysis->has_aliasing_returns() ||
        (entry.sole_view_argument.has_value() &&
         correct_sole_view(entry, argv[1], argv[3], options))) {
      return Py_NewRef(argv[3]);
    }
    return correct_result(entry, argv[1], argv[2], argv[3], options);
  });
}

PyMethodDef hot_methods[] = {
    {"_correct_aliasing",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(explicit_correct_aliasing)),
     METH_FASTCALL,
     "_correct_aliasing(func, args, kwargs, out) -> out, corrected"},
    {nullptr, nullptr, 0, nullptr}};

} // namespace

void init_alias_correction_bindings(py::module& m) {
  opt_out_attribute = PyUnicode_InternFromString("__aliasguard_fixup__");
  if (opt_out_attribute == nullptr ||
      PyModule_AddFunctions(m.ptr(), hot_methods) != 0) {
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
