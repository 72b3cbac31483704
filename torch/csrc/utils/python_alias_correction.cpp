// Python face of alias correction and the alias audit. What runs once per
// __torch_dispatch__ (the _CorrectedDispatch wrapper, _correct_aliasing) is
// plain CPython vectorcall code: pybind11's argument handling alone would
// cost more than the whole correction of an op without alias annotations.

#include <torch/csrc/utils/python_alias_correction.h>
#include <torch/csrc/utils/python_c10_errors.h>

#include <ATen/core/operator_name.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/alias_correction.h>

#include <structmember.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace torch::utils {
namespace {

PyObject* aliasing_error_type = nullptr; // aliasguard.AliasingError
PyObject* opt_out_attribute = nullptr; // "__aliasguard_fixup__", interned
PyObject* empty_tuple = nullptr; // the default of a dispatch's `args`
std::atomic<bool> correction_enabled{true};
// aliasguard's violation hook (see set_alias_audit_reporter), or nullptr.
// Set and read with the GIL held; leaked like the other module globals.
PyObject* audit_reporter = nullptr;

// Raises aliasguard.AliasingError (a RuntimeError) carrying the op, the
// return index and the argument as attributes. Never throws: it runs in
// exception handlers.
bool set_aliasing_error_attributes(PyObject* instance, const AliasingError& error) {
  PyObject* op = PyUnicode_FromString(error.op().c_str());
  PyObject* return_index = PyLong_FromSize_t(error.return_index());
  PyObject* argument = error.argument().empty()
      ? Py_NewRef(Py_None)
      : PyUnicode_FromString(error.argument().c_str());
  PyObject* kind = PyUnicode_FromString(alias_violation_name(error.kind()));
  const bool ok = op != nullptr && return_index != nullptr &&
      argument != nullptr && kind != nullptr &&
      PyObject_SetAttrString(instance, "op", op) == 0 &&
      PyObject_SetAttrString(instance, "return_index", return_index) == 0 &&
      PyObject_SetAttrString(instance, "argument", argument) == 0 &&
      PyObject_SetAttrString(instance, "kind", kind) == 0;
  Py_XDECREF(op);
  Py_XDECREF(return_index);
  Py_XDECREF(argument);
  Py_XDECREF(kind);
  return ok;
}

void set_python_aliasing_error(const AliasingError& error) {
  PyObject* instance = PyObject_CallFunction(
      aliasing_error_type, "s", error.what_without_backtrace());
  if (instance == nullptr) {
    return; // the failed call set its own error
  }
  if (set_aliasing_error_attributes(instance, error)) {
    PyErr_SetObject(aliasing_error_type, instance);
  }
  Py_DECREF(instance);
}

// A new aliasguard.AliasingError for `error`, or nullptr with an exception
// set.
PyObject* new_python_aliasing_error(const AliasingError& error) {
  PyObject* instance = PyObject_CallFunction(
      aliasing_error_type, "s", error.what_without_backtrace());
  if (instance != nullptr && !set_aliasing_error_attributes(instance, error)) {
    Py_CLEAR(instance);
  }
  return instance;
}

// Note [The audit's Python reporter]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every violation the audit finds is offered to one Python callable,
// reporter(error, owner, repaired) -> bool, with the GIL held: `owner` is the
// class or mode whose __torch_dispatch__ returned the result (from the
// fallback: the first tensor subclass among the op's arguments, whose
// dispatch aliasguard does not wrap, or None: a kernel), `repaired`
// whether alias correction made the result keep the schema. True means it
// was handled (recorded in report mode, or by design: tracing
// infrastructure): the op's result stands. False means raise. Which
// violations to record where is aliasguard/_aliasing.py's business; what is
// a violation is decided here and in alias_correction.cpp.
// Returns the reporter's answer; throws python_error if it raised.
bool offer_violation(const AliasingError& error, PyObject* owner, bool repaired) {
  if (audit_reporter == nullptr) {
    return false;
  }
  PyObject* instance = new_python_aliasing_error(error);
  if (instance == nullptr) {
    throw python_error();
  }
  PyObject* answer = PyObject_CallFunction(
      audit_reporter, "OOO", instance, owner, repaired ? Py_True : Py_False);
  Py_DECREF(instance);
  if (answer == nullptr) {
    throw python_error();
  }
  const int handled = PyObject_IsTrue(answer);
  Py_DECREF(answer);
  if (handled < 0) {
    throw python_error();
  }
  return handled == 1;
}

// The audit fallback's reporter. It runs inside the dispatcher, usually under
// one of torch's own bindings, which would turn a c10::Error into a plain
// RuntimeError; a python_error carrying our exception is thrown instead.
bool report_fallback_violation(
    const AliasingError& error,
    c10::ArrayRef<c10::IValue> args) {
  py::gil_scoped_acquire gil;
  try {
    // Blame the first tensor subclass among the arguments (DTensor, say,
    // whose dispatch aliasguard does not wrap), or no one.
    py::object owner = py::none();
    for (const c10::IValue& arg : args) {
      if (!arg.isTensor() || !arg.toTensor().defined()) {
        continue;
      }
      py::object tensor = py::reinterpret_steal<py::object>(
          THPVariable_Wrap(arg.toTensor()));
      if (!tensor) {
        throw python_error();
      }
      if (!THPVariable_CheckExact(tensor.ptr())) {
        owner = py::reinterpret_borrow<py::object>(
            reinterpret_cast<PyObject*>(Py_TYPE(tensor.ptr())));
        break;
      }
    }
    if (offer_violation(error, owner.ptr(), /*repaired=*/false)) {
      return true;
    }
    set_python_aliasing_error(error);
    throw python_error();
  } catch (python_error& python_exception) {
    python_exception.persist(); // may cross to the thread that ran backward()
    throw;
  }
}

// Note [Per-OpOverload analysis cache]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Keyed by the OpOverload object itself: a pointer hash, no string work, on
// the path every op takes. Entries hold a strong reference to their key so
// the address cannot be reused by another object, and the analysis' argument
// names as interned Python strings for kwargs lookups. Only touched with the
// GIL held. When the C++ cache drops an operator (deregistration) its
// generation changes and we start over. Leaked, like the C++ cache, so that
// no Py_DECREF runs after interpreter shutdown.
struct PyOpEntry {
  py::object func; // keeps the key's address from being reused
  // nullptr: not a dispatcher operator (a higher-order op, say).
  std::shared_ptr<const SchemaAliasAnalysis> analysis;
  std::vector<py::object> argument_names;
  // Set for ops whose one return is a view of their only tensor argument,
  // passed positionally at this index: the fast path of correct_result.
  std::optional<size_t> sole_view_argument;
};

// A correction can run Python code (a wrapper's Python-customized sizes)
// that may flush the cache while an entry is in use; flushed entries are
// kept until no correction is running.
struct PyOpCache {
  std::unordered_map<PyObject*, std::unique_ptr<const PyOpEntry>> entries;
  std::vector<std::unique_ptr<const PyOpEntry>> retired;
  uint64_t generation = 0;
  int running = 0; // corrections in progress, re-entrant through Python
};

PyOpCache& py_op_cache() {
  static auto* cache = new PyOpCache();
  return *cache;
}

// Marks a correction in progress; see PyOpCache.
struct RunningCorrection {
  RunningCorrection() {
    ++py_op_cache().running;
  }
  ~RunningCorrection() {
    PyOpCache& cache = py_op_cache();
    if (--cache.running == 0 && !cache.retired.empty()) {
      cache.retired.clear();
    }
  }
  RunningCorrection(const RunningCorrection&) = delete;
  RunningCorrection& operator=(const RunningCorrection&) = delete;
};

std::shared_ptr<const SchemaAliasAnalysis> analysis_of_op_overload(
    PyObject* func) {
  py::object schema = py::reinterpret_steal<py::object>(
      PyObject_GetAttrString(func, "_schema"));
  if (!schema) {
    PyErr_Clear();
    return nullptr;
  }
  py::object name = py::reinterpret_steal<py::object>(
      PyObject_GetAttrString(schema.ptr(), "name"));
  py::object overload = py::reinterpret_steal<py::object>(
      PyObject_GetAttrString(schema.ptr(), "overload_name"));
  if (!name || !overload || !PyUnicode_Check(name.ptr()) ||
      !PyUnicode_Check(overload.ptr())) {
    PyErr_Clear();
    return nullptr;
  }
  return schema_alias_analysis(c10::OperatorName(
      name.cast<std::string>(), overload.cast<std::string>()));
}

// Valid until the end of the outermost RunningCorrection.
const PyOpEntry& op_entry(PyObject* func) {
  PyOpCache& cache = py_op_cache();
  const uint64_t generation = schema_alias_analysis_generation();
  if (cache.generation != generation) {
    for (auto& [key, entry] : cache.entries) {
      cache.retired.push_back(std::move(entry));
    }
    cache.entries.clear();
    cache.generation = generation;
    if (cache.running == 0) {
      cache.retired.clear();
    }
  }
  auto it = cache.entries.find(func);
  if (it != cache.entries.end()) {
    return *it->second;
  }
  auto entry = std::make_unique<PyOpEntry>();
  entry->func = py::reinterpret_borrow<py::object>(func);
  entry->analysis = analysis_of_op_overload(func);
  if (entry->analysis) {
    for (size_t i = 0; i < entry->analysis->num_arguments(); ++i) {
      PyObject* name =
          PyUnicode_FromString(entry->analysis->argument_name(i).c_str());
      if (name == nullptr) {
        throw python_error();
      }
      PyUnicode_InternInPlace(&name);
      entry->argument_names.push_back(py::reinterpret_steal<py::object>(name));
    }
    const auto& returns = entry->analysis->returns();
    const auto sole = entry->analysis->sole_tensor_argument();
    if (returns.size() == 1 && returns[0].kind == ReturnAliasKind::kView &&
        !returns[0].is_list && sole == returns[0].argument &&
        !entry->analysis->argument_is_kwarg_only(*sole)) {
      entry->sole_view_argument = sole;
    }
  }
  return *cache.entries.insert_or_assign(func, std::move(entry)).first->second;
}

bool opted_out(PyObject* owner) {
  PyTypeObject* type = PyType_Check(owner)
      ? reinterpret_cast<PyTypeObject*>(owner)
      : Py_TYPE(owner);
  PyObject* flag = _PyType_Lookup(type, opt_out_attribute); // borrowed
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

// The Python object passed for schema argument `index`, or nullptr.
PyObject* argument_object(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    size_t index) {
  const SchemaAliasAnalysis& analysis = *entry.analysis;
  if (!analysis.argument_is_kwarg_only(index) &&
      static_cast<Py_ssize_t>(index) < PySequence_Fast_GET_SIZE(args)) {
    return PySequence_Fast_GET_ITEM(args, index);
  }
  if (kwargs == nullptr || kwargs == Py_None) {
    return nullptr;
  }
  PyObject* value =
      PyDict_GetItemWithError(kwargs, entry.argument_names[index].ptr());
  if (value == nullptr && PyErr_Occurred()) {
    throw python_error();
  }
  return value;
}

// THPVariable_Check without PyObject_IsInstance, whose __instancecheck__
// lookup allocates a bound method per call: the same answer (TensorBase's
// metaclass does not customize instance checks) at a fraction of the cost.
bool is_tensor_object(PyObject* obj) {
  return PyObject_TypeCheck(
      obj, reinterpret_cast<PyTypeObject*>(THPVariableClass));
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
    if (!PyLong_Check(obj) && is_tensor_object(obj)) { // ints are common
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
      if (!is_none && (PyLong_Check(item) || !is_tensor_object(item))) {
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
    arguments.push_back(borrowed.borrow(argument_object(entry, args, kwargs, i)));
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
    PyObject* out) {
  const SchemaAliasAnalysis& analysis = *entry.analysis;
  const auto& returns = analysis.returns();
  const size_t num_returns = returns.size();
  if (num_returns == 0) {
    return Py_NewRef(out);
  }
  // Borrowed: `out` keeps them alive.
  const c10::SmallVector<PyObject*, 4> outputs = split_returns(analysis, out);

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

  correct_aliasing_borrowed(analysis, arguments, results);
  if (!analysis.has_write_returns()) {
    return Py_NewRef(out);
  }
  // Write returns come back as the caller's own argument objects.
  const auto handed_back = [&](size_t i) -> PyObject* {
    PyObject* argument = returns[i].is_write()
        ? argument_objects[returns[i].argument]
        : nullptr;
    return argument != nullptr ? argument : outputs[i];
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
bool correct_sole_view(const PyOpEntry& entry, PyObject* args, PyObject* out) {
  const size_t index = *entry.sole_view_argument;
  if (static_cast<Py_ssize_t>(index) >= PySequence_Fast_GET_SIZE(args)) {
    return false;
  }
  PyObject* input = PySequence_Fast_GET_ITEM(args, index);
  if (!is_tensor_object(input) || !is_tensor_object(out)) {
    return false;
  }
  correct_view_return(
      *entry.analysis, 0, THPVariable_Unpack(input), THPVariable_Unpack(out));
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

// Every exception leaves as a Python exception, AliasingError as ours.
// (torch's HANDLE_TH_ERRORS would also buffer warnings, which costs a few
// thread-local round trips per call on the hot path and is not needed here.)
template <typename Body>
PyObject* translate_errors(Body&& body) {
  try {
    return body();
  } catch (const AliasingError& error) {
    set_python_aliasing_error(error);
  } catch (python_error& error) {
    error.restore();
  } catch (py::error_already_set& error) {
    error.restore();
  } catch (const py::builtin_exception& error) {
    error.set_error();
  } catch (torch::PyTorchError& error) {
    PyErr_SetString(error.python_type(), error.what());
  } catch (const c10::Error& error) {
    set_python_error_from_c10(error);
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
  return nullptr;
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
// offered to the reporter once (see Note [The audit's Python reporter]): in
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
  if (depth > 8 || !is_tensor_object(obj) ||
      Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(THPVariableClass)) {
    return false;
  }
  static PyObject* flatten_name = PyUnicode_InternFromString("__tensor_flatten__");
  PyObject* flatten = _PyType_Lookup(Py_TYPE(obj), flatten_name); // borrowed
  if (flatten == nullptr) {
    return false;
  }
  py::object flattened = py::reinterpret_steal<py::object>(
      PyObject_CallMethodNoArgs(obj, flatten_name));
  if (!flattened) {
    throw python_error();
  }
  py::sequence parts = py::reinterpret_borrow<py::sequence>(flattened);
  for (py::handle name : py::reinterpret_borrow<py::sequence>(parts[0])) {
    py::object inner = py::reinterpret_steal<py::object>(
        PyObject_GetAttr(obj, name.ptr()));
    if (!inner) {
      throw python_error();
    }
    const std::string path = prefix + py::str(name).cast<std::string>();
    if (!flatten_traceable(inner.ptr(), path + ".", leaves, depth + 1) &&
        is_tensor_object(inner.ptr())) {
      leaves.emplace_back(path, THPVariable_Unpack(inner.ptr()));
    }
  }
  return true;
}

// The inner-tensor check of Note [Inner tensors of traceable wrappers] on
// the view returns of a handed-back result.
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
    PyObject* value = returns.size() == 1 ? result
        : (PyTuple_Check(result) || PyList_Check(result)) &&
            PySequence_Fast_GET_SIZE(result) > static_cast<Py_ssize_t>(i)
        ? PySequence_Fast_GET_ITEM(result, i)
        : nullptr;
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
      PyObject* output = is_sequence ? PySequence_Fast_GET_ITEM(value, k) : value;
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
    const ReportedViolationMark& mark) {
  const SchemaAliasAnalysis& analysis = *entry.analysis;
  std::optional<AliasingError> raw_error;
  std::optional<AliasingError> refusal;
  if (correct) {
    try {
      check_only(entry, args, kwargs, out, /*views_share_version_counter=*/false);
    } catch (const AliasingError& error) {
      raw_error = error;
    }
  }
  py::object result;
  if (correct) {
    try {
      result = py::reinterpret_steal<py::object>(correct_result(entry, args, kwargs, out));
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
      check_only(entry, args, kwargs, result.ptr(), /*views_share_version_counter=*/true);
      audit_inner_views(entry, args, kwargs, result.ptr());
    } catch (const AliasingError& error) {
      remaining = error;
    }
  }
  if (!raw_error && !refusal && !remaining) {
    return result.release().ptr();
  }
  if (reported_violation_since(mark, analysis)) {
    return result.release().ptr(); // See Note [One report per op call].
  }
  // What the handler got wrong and the correction fixed, then what is left.
  // Raise mode (a reporter answering false) raises only what is left.
  bool handled = true;
  if (refusal) {
    handled = offer_violation(raw_error ? *raw_error : *refusal, owner, false);
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

// What a corrected __torch_dispatch__ returns in place of `out` (borrowed),
// the result of `func(*args, **kwargs)` from the __torch_dispatch__ of
// `owner` (a class or mode instance: the per-class opt-out is read on it).
// New reference; nullptr with an exception set.
PyObject* corrected_result(
    PyObject* owner,
    PyObject* func,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    const ReportedViolationMark& mark) {
  if (out == Py_NotImplemented) {
    return Py_NewRef(out); // the dispatcher will ask someone else
  }
  const bool audit = is_alias_audit_enabled();
  const bool correct = correction_enabled.load(std::memory_order_relaxed) &&
      !opted_out(owner);
  if (!correct && !audit) {
    return Py_NewRef(out);
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
      return audited_result(owner, entry, args, kwargs, out, correct, mark);
    }
    if (entry.sole_view_argument.has_value() &&
        correct_sole_view(entry, args, out)) {
      return Py_NewRef(out);
    }
    return correct_result(entry, args, kwargs, out);
  });
}

// Note [The corrected __torch_dispatch__ wrapper]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What replaces a class's __torch_dispatch__: calls the original, then
// corrects its result. A C type rather than a Python closure, because a
// Python frame alone costs about as much as correcting a view. It binds like
// a function (so it works as a plain method of a mode, and inside
// classmethod), and has a __dict__ for __wrapped__, __name__ and friends. The
// original is called with exactly the arguments received; the owner, func,
// args and kwargs for the correction are read from them by position or by
// their conventional names. `owner` is set for the staticmethod form, which
// receives no class.
struct CorrectedDispatch {
  PyObject_HEAD
  PyObject* fn;
  PyObject* owner; // nullptr: the first argument is the owner
  PyObject* dict;
  vectorcallfunc vectorcall;
};

PyTypeObject CorrectedDispatchType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// Argument `position` (counting the owner when it is passed), or the keyword
// `name`, or nullptr.
PyObject* call_argument(
    PyObject* const* argv,
    Py_ssize_t nargs,
    PyObject* kwnames,
    Py_ssize_t position,
    const char* name) {
  if (position < nargs) {
    return argv[position];
  }
  if (kwnames != nullptr) {
    const Py_ssize_t count = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < count; ++i) {
      if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), name) == 0) {
        return argv[nargs + i];
      }
    }
  }
  return nullptr;
}

PyObject* corrected_dispatch_call(
    PyObject* callable,
    PyObject* const* argv,
    size_t nargsf,
    PyObject* kwnames) {
  auto* self = reinterpret_cast<CorrectedDispatch*>(callable);
  const ReportedViolationMark mark = reported_violation_mark();
  PyObject* out = PyObject_Vectorcall(self->fn, argv, nargsf, kwnames);
  if (out == nullptr) {
    return nullptr;
  }
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t shift = self->owner != nullptr ? 0 : 1;
  PyObject* owner = self->owner;
  if (owner == nullptr) {
    owner = nargs > 0 ? argv[0] : Py_None;
  }
  PyObject* func = call_argument(argv, nargs, kwnames, shift, "func");
  PyObject* args = call_argument(argv, nargs, kwnames, shift + 2, "args");
  PyObject* kwargs = call_argument(argv, nargs, kwnames, shift + 3, "kwargs");
  PyObject* result = func == nullptr
      ? Py_NewRef(out)
      : corrected_result(
            owner,
            func,
            args != nullptr ? args : empty_tuple,
            kwargs != nullptr ? kwargs : Py_None,
            out,
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
          args, kwargs, "O|O:_CorrectedDispatch", const_cast<char**>(keywords), &fn, &owner)) {
    return nullptr;
  }
  if (!PyCallable_Check(fn)) {
    PyErr_Format(PyExc_TypeError, "_CorrectedDispatch(): fn must be callable, got %s", Py_TYPE(fn)->tp_name);
    return nullptr;
  }
  auto* self = reinterpret_cast<CorrectedDispatch*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    return nullptr;
  }
  self->fn = Py_NewRef(fn);
  self->owner = owner == nullptr || owner == Py_None ? nullptr : Py_NewRef(owner);
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
PyObject* corrected_dispatch_get(PyObject* self, PyObject* obj, PyObject* /*type*/) {
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
    {"__aliasguard_wrapped__", T_OBJECT, offsetof(CorrectedDispatch, fn), READONLY,
     "the __torch_dispatch__ whose results are corrected"},
    {"__aliasguard_owner__", T_OBJECT, offsetof(CorrectedDispatch, owner), READONLY,
     "the class of a staticmethod __torch_dispatch__, else None"},
    {nullptr, 0, 0, 0, nullptr}};

PyGetSetDef corrected_dispatch_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

void init_corrected_dispatch_type() {
  PyTypeObject& type = CorrectedDispatchType;
  type.tp_name = "aliasguard._C._CorrectedDispatch";
  type.tp_basicsize = sizeof(CorrectedDispatch);
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
      Py_TPFLAGS_METHOD_DESCRIPTOR;
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

// _correct_aliasing(func, args, kwargs, out): the explicit call; corrects
// whatever the global switch says.
PyObject* explicit_correct_aliasing(
    PyObject* /*module*/,
    PyObject* const* argv,
    Py_ssize_t argc) {
  if (argc != 4) {
    PyErr_Format(
        PyExc_TypeError,
        "correct_aliasing() takes 4 arguments (func, args, kwargs, out), got %zd",
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
    if (!entry.analysis->has_aliasing_returns() ||
        (entry.sole_view_argument.has_value() &&
         correct_sole_view(entry, argv[1], argv[3]))) {
      return Py_NewRef(argv[3]);
    }
    return correct_result(entry, argv[1], argv[2], argv[3]);
  });
}

PyMethodDef hot_methods[] = {
    {"_correct_aliasing",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(explicit_correct_aliasing)),
     METH_FASTCALL,
     "_correct_aliasing(func, args, kwargs, out) -> out, corrected"},
    {nullptr, nullptr, 0, nullptr}};

// (kind, argument index or None, argument name or None, is_list) per return.
py::list schema_alias_info(const std::string& name, const std::string& overload) {
  const auto analysis =
      schema_alias_analysis(c10::OperatorName(name, overload));
  if (!analysis) {
    throw py::value_error(
        "_schema_alias_info(): no operator " + name +
        (overload.empty() ? std::string() : "." + overload) +
        " is registered");
  }
  py::list result;
  for (const ReturnAlias& alias : analysis->returns()) {
    py::object argument = py::none();
    py::object argument_name = py::none();
    if (alias.aliases_argument()) {
      argument = py::int_(alias.argument);
      argument_name = py::str(analysis->argument_name(alias.argument));
    }
    result.append(py::make_tuple(
        return_alias_kind_name(alias.kind), argument, argument_name, alias.is_list));
  }
  return result;
}

void translate_aliasing_error(std::exception_ptr error) {
  try {
    if (error) {
      std::rethrow_exception(error);
    }
  } catch (const AliasingError& e) {
    set_python_aliasing_error(e);
  }
}

} // namespace

void init_alias_correction_bindings(pybind11::module& m) {
  aliasing_error_type = PyErr_NewExceptionWithDoc(
      "aliasguard.AliasingError",
      "An op's outputs do not alias its inputs the way its schema says, and "
      "cannot be made to. Attributes: op, return_index, argument.",
      PyExc_RuntimeError,
      nullptr);
  if (aliasing_error_type == nullptr) {
    throw python_error();
  }
  m.add_object("AliasingError", py::handle(aliasing_error_type));
  opt_out_attribute = PyUnicode_InternFromString("__aliasguard_fixup__");
  empty_tuple = PyTuple_New(0);
  if (opt_out_attribute == nullptr || empty_tuple == nullptr ||
      PyModule_AddFunctions(m.ptr(), hot_methods) != 0) {
    throw python_error();
  }
  init_corrected_dispatch_type();
  m.add_object(
      "_CorrectedDispatch",
      py::handle(reinterpret_cast<PyObject*>(&CorrectedDispatchType)));
  // Registered after the module's own c10::Error translator, so tried first.
  py::register_local_exception_translator(&translate_aliasing_error);
  set_alias_audit_error_reporter(&report_fallback_violation);

  m.def(
      "_set_alias_correction",
      [](bool enabled) { return correction_enabled.exchange(enabled); },
      py::arg("enabled"));
  m.def("_is_alias_correction_enabled", [] {
    return correction_enabled.load();
  });
  m.def("_alias_violation_kinds", [] {
    std::vector<std::string> names;
    for (auto kind = static_cast<uint8_t>(AliasViolation::kViewCopy);
         kind <= static_cast<uint8_t>(AliasViolation::kWrongType);
         ++kind) {
      names.emplace_back(alias_violation_name(static_cast<AliasViolation>(kind)));
    }
    return names;
  });
  m.def("_enter_alias_audit", &enter_alias_audit);
  m.def("_exit_alias_audit", &exit_alias_audit);
  m.def("_retain_alias_audit_fallback", &retain_alias_audit_fallback);
  m.def("_release_alias_audit_fallback", &release_alias_audit_fallback);
  m.def("_alias_audit_depth", &alias_audit_depth);
  m.def("_alias_audit_scopes", &alias_audit_scopes);
  m.def("_is_alias_audit_enabled", &is_alias_audit_enabled);
  m.def(
      "_set_alias_audit_reporter",
      [](py::object reporter) {
        // See Note [The audit's Python reporter].
        if (!reporter.is_none() && !PyCallable_Check(reporter.ptr())) {
          throw py::type_error(
              "_set_alias_audit_reporter(): expected a callable or None, got " +
              std::string(Py_TYPE(reporter.ptr())->tp_name));
        }
        PyObject* previous = audit_reporter;
        audit_reporter = reporter.is_none() ? nullptr : reporter.inc_ref().ptr();
        Py_XDECREF(previous);
      },
      py::arg("reporter"));
  m.def(
      "_schema_alias_info",
      &schema_alias_info,
      py::arg("name"),
      py::arg("overload") = "");
}

} // namespace torch::utils
