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

// Corrects (and, when auditing, checks) `out`, the result of `func` called
// with `args`/`kwargs`. Returns the object to hand back (new reference):
// `out`, or, for write returns, the caller's argument objects in their place.
PyObject* correct_result(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    bool correct,
    bool audit,
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
    correct_aliasing_borrowed(analysis, arguments, results, options);
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
    PyObject* argument =
        returns[i].is_write() ? argument_objects[returns[i].argument] : nullptr;
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

} // namespace

bool correction_applies(PyObject* owner) {
  return correction_enabled.load(std::memory_order_relaxed) &&
      !opted_out(owner);
}

PyObject* corrected_result(
    PyObject* func,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    bool correct,
    bool audit,
    const CorrectionOptions& options) {
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
    if (correct && !audit && entry.sole_view_argument.has_value() &&
        correct_sole_view(entry, args, out, options)) {
      return Py_NewRef(out);
    }
    return correct_result(entry, args, kwargs, out, correct, audit, options);
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
    const CorrectionOptions options = explicit_correction_options(argv[0]);
    if (!entry.analysis->has_aliasing_returns() ||
        (entry.sole_view_argument.has_value() &&
         correct_sole_view(entry, argv[1], argv[3], options))) {
      return Py_NewRef(argv[3]);
    }
    return correct_result(
        entry,
        argv[1],
        argv[2],
        argv[3],
        /*correct=*/true,
        /*audit=*/false,
        options);
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
  m.def("_set_alias_audit", &set_alias_audit_enabled, py::arg("enabled"));
  m.def("_is_alias_audit_enabled", &is_alias_audit_enabled);
}

} // namespace aliasguard::utils
