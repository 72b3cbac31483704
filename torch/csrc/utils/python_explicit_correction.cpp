#include <torch/csrc/utils/python_explicit_correction.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/python_alias_correction.h>
#include <torch/csrc/utils/python_aliasing_error.h>
#include <torch/csrc/utils/python_op_cache.h>
#include <torch/csrc/utils/python_op_values.h>
#include <torch/csrc/utils/python_tracked_dispatch.h>

#include <string>

namespace py = pybind11;

namespace aliasguard::utils {
namespace {

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

void init_explicit_correction_bindings(pybind11::module& m) {
  if (PyModule_AddFunctions(m.ptr(), hot_methods) != 0) {
    throw python_error();
  }
}

} // namespace aliasguard::utils
