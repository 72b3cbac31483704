// Python face of alias correction and the alias audit. The functions called
// once per __torch_dispatch__ (_fixup, _correct_aliasing) are plain CPython
// FASTCALL functions: pybind11's argument handling alone would cost more than
// the whole correction of an op without alias annotations.

#include <torch/csrc/utils/python_alias_correction.h>

#include <ATen/core/operator_name.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/alias_correction.h>

#include <atomic>
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
std::atomic<bool> correction_enabled{true};

// Raises aliasguard.AliasingError (a RuntimeError) carrying the op, the
// return index and the argument as attributes.
void set_python_aliasing_error(const AliasingError& error) {
  py::object instance = py::reinterpret_steal<py::object>(PyObject_CallFunction(
      aliasing_error_type, "s", error.what_without_backtrace()));
  if (!instance) {
    return; // the failed call set its own error
  }
  instance.attr("op") = error.op();
  instance.attr("return_index") = error.return_index();
  instance.attr("argument") =
      error.argument().empty() ? py::object(py::none())
                               : py::object(py::str(error.argument()));
  PyErr_SetObject(aliasing_error_type, instance.ptr());
}

// The audit throws from inside the dispatcher, usually under one of torch's
// own bindings, which would turn a c10::Error into a plain RuntimeError; a
// python_error carrying our exception is restored as is instead.
[[noreturn]] void throw_python_aliasing_error(const AliasingError& error) {
  {
    py::gil_scoped_acquire gil;
    set_python_aliasing_error(error);
  }
  python_error python_exception;
  python_exception.persist(); // may cross to the thread that ran backward()
  throw python_exception;
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
};

// Handed out by value: a correction can run Python code (a wrapper's custom
// sizes) that could flush the cache under our feet.
using PyOpEntryPtr = std::shared_ptr<const PyOpEntry>;

struct PyOpCache {
  std::unordered_map<PyObject*, PyOpEntryPtr> entries;
  uint64_t generation = 0;
};

PyOpCache& py_op_cache() {
  static auto* cache = new PyOpCache();
  return *cache;
}

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

PyOpEntryPtr op_entry(PyObject* func) {
  PyOpCache& cache = py_op_cache();
  const uint64_t generation = schema_alias_analysis_generation();
  if (cache.generation != generation) {
    cache.entries.clear();
    cache.generation = generation;
  }
  auto it = cache.entries.find(func);
  if (it != cache.entries.end()) {
    return it->second;
  }
  auto entry = std::make_shared<PyOpEntry>();
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
  }
  return cache.entries.insert_or_assign(func, std::move(entry)).first->second;
}

bool opted_out(PyObject* owner) {
  PyTypeObject* type = PyType_Check(owner)
      ? reinterpret_cast<PyTypeObject*>(owner)
      : Py_TYPE(owner);
  PyObject* flag = _PyType_Lookup(type, opt_out_attribute); // borrowed
  return flag != nullptr && PyObject_Not(flag) == 1;
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
    if (is_tensor_object(obj)) {
      return OpValueRef(THPVariable_Unpack(obj));
    }
    if (!PyList_Check(obj) && !PyTuple_Check(obj)) {
      return OpValueRef::other(Py_TYPE(obj)->tp_name);
    }
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(obj);
    std::vector<const at::Tensor*> tensors;
    for (Py_ssize_t i = 0; i < size; ++i) {
      PyObject* item = PySequence_Fast_GET_ITEM(obj, i);
      if (is_tensor_object(item)) {
        tensors.reserve(size);
        tensors.push_back(&THPVariable_Unpack(item));
      } else if (item == Py_None) {
        tensors.push_back(nullptr);
      } else {
        return OpValueRef::other(Py_TYPE(obj)->tp_name); // e.g. a size list
      }
    }
    // Moving the vector keeps its buffer, which the ref points into.
    lists_.push_back(std::move(tensors));
    return OpValueRef::list(lists_.back());
  }

 private:
  std::vector<std::vector<const at::Tensor*>> lists_;
};

// Corrects (and, when auditing, checks) `out`, the result of `func` called
// with `args`/`kwargs`. Returns the object to hand back (new reference):
// `out`, or, for write returns, the caller's argument objects in their place.
PyObject* correct_result(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    bool correct,
    bool audit) {
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
    if ((!PyTuple_Check(out) && !PyList_Check(out)) ||
        PySequence_Fast_GET_SIZE(out) != static_cast<Py_ssize_t>(num_returns)) {
      throw_aliasing_error(
          analysis,
          0,
          std::nullopt,
          std::string("cannot be found: the op returned a ") +
              Py_TYPE(out)->tp_name + ", but its schema has " +
              std::to_string(num_returns) + " returns");
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

  if (correct) {
    correct_aliasing_borrowed(analysis, arguments, results);
    for (size_t i = 0; i < num_returns; ++i) {
      if (returns[i].is_write()) {
        results[i] = arguments[returns[i].argument]; // what we hand back
      }
    }
  }
  if (audit) {
    audit_aliasing_borrowed(
        analysis, arguments, results, /*views_share_version_counter=*/true);
  }
  if (!correct || !analysis.has_write_returns()) {
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
  return result;
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

// Every exception leaves as a Python exception; AliasingError as ours.
template <typename Body>
PyObject* translate_errors(Body&& body) {
  HANDLE_TH_ERRORS
  try {
    return body();
  } catch (const AliasingError& error) {
    set_python_aliasing_error(error);
    return nullptr;
  } catch (py::error_already_set& error) {
    error.restore();
    return nullptr;
  } catch (const py::builtin_exception& error) {
    error.set_error();
    return nullptr;
  }
  END_HANDLE_TH_ERRORS
}

// _fixup(owner, func, args, kwargs, out): what every wrapped
// __torch_dispatch__ returns. `owner` is the class or mode instance whose
// __torch_dispatch__ ran (for the per-class opt-out).
PyObject* fixup(PyObject* /*module*/, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 5) {
    PyErr_Format(
        PyExc_TypeError,
        "_fixup() takes 5 arguments (owner, func, args, kwargs, out), got %zd",
        argc);
    return nullptr;
  }
  PyObject* out = argv[4];
  if (out == Py_NotImplemented) {
    return Py_NewRef(out); // the dispatcher will ask someone else
  }
  const bool audit = is_alias_audit_enabled();
  const bool correct = correction_enabled.load(std::memory_order_relaxed) &&
      !opted_out(argv[0]);
  if (!correct && !audit) {
    return Py_NewRef(out);
  }
  return translate_errors([&]() -> PyObject* {
    const PyOpEntryPtr entry = op_entry(argv[1]);
    if (!entry->analysis ||
        (!audit && !entry->analysis->has_aliasing_returns())) {
      return Py_NewRef(out);
    }
    check_args_kwargs(argv[2], argv[3]);
    return correct_result(*entry, argv[2], argv[3], out, correct, audit);
  });
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
    const PyOpEntryPtr entry = op_entry(argv[0]);
    if (!entry->analysis) {
      throw py::type_error(
          std::string("correct_aliasing(): func must be an OpOverload of a "
                      "registered operator (e.g. torch.ops.aten.view.default), "
                      "got ") +
          Py_TYPE(argv[0])->tp_name);
    }
    check_args_kwargs(argv[1], argv[2]);
    if (!entry->analysis->has_aliasing_returns()) {
      return Py_NewRef(argv[3]);
    }
    return correct_result(
        *entry, argv[1], argv[2], argv[3], /*correct=*/true, /*audit=*/false);
  });
}

PyMethodDef hot_methods[] = {
    {"_fixup",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fixup)),
     METH_FASTCALL,
     "_fixup(owner, func, args, kwargs, out) -> out, corrected"},
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
  if (opt_out_attribute == nullptr ||
      PyModule_AddFunctions(m.ptr(), hot_methods) != 0) {
    throw python_error();
  }
  // Registered after the module's own c10::Error translator, so tried first.
  py::register_local_exception_translator(&translate_aliasing_error);
  set_alias_audit_error_reporter(&throw_python_aliasing_error);

  m.def(
      "_set_alias_correction",
      [](bool enabled) { return correction_enabled.exchange(enabled); },
      py::arg("enabled"));
  m.def("_is_alias_correction_enabled", [] {
    return correction_enabled.load();
  });
  m.def(
      "_set_alias_audit", &set_alias_audit_enabled, py::arg("enabled"));
  m.def("_is_alias_audit_enabled", &is_alias_audit_enabled);
  m.def(
      "_schema_alias_info",
      &schema_alias_info,
      py::arg("name"),
      py::arg("overload") = "");
}

} // namespace torch::utils
