#include <torch/csrc/utils/python_aliasing_error.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/alias_audit.h>
#include <torch/csrc/utils/aliasing_error.h>

namespace py = pybind11;

namespace aliasguard::utils {

// Note [One error translation]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every C++ exception leaving aliasguard._C goes through
// set_python_error_from_current_exception: the pybind11 functions through the
// one translator registered here (so no two translators depend on the order
// in which they were registered), the raw CPython entry points through
// translate_errors. The audit is the one exception to "leaves through a
// binding of ours": it throws from inside the dispatcher, usually under one
// of torch's own bindings, which would turn a c10::Error into a plain
// RuntimeError; its reporter sets our Python exception and throws
// python_error, which torch restores as is.

namespace {

PyObject* aliasing_error_type = nullptr; // aliasguard.AliasingError

// Raises aliasguard.AliasingError (a RuntimeError) carrying the op, the
// return index and the argument as attributes. Never throws.
void set_python_aliasing_error(const AliasingError& error) {
  PyObject* instance = PyObject_CallFunction(
      aliasing_error_type, "s", error.what_without_backtrace());
  if (instance == nullptr) {
    return; // the failed call set its own error
  }
  PyObject* op = PyUnicode_FromString(error.op().c_str());
  PyObject* return_index = PyLong_FromSize_t(error.return_index());
  PyObject* argument = error.argument().empty()
      ? Py_NewRef(Py_None)
      : PyUnicode_FromString(error.argument().c_str());
  const bool ok = op != nullptr && return_index != nullptr &&
      argument != nullptr && PyObject_SetAttrString(instance, "op", op) == 0 &&
      PyObject_SetAttrString(instance, "return_index", return_index) == 0 &&
      PyObject_SetAttrString(instance, "argument", argument) == 0;
  Py_XDECREF(op);
  Py_XDECREF(return_index);
  Py_XDECREF(argument);
  if (ok) {
    PyErr_SetObject(aliasing_error_type, instance);
  }
  Py_DECREF(instance);
}

// c10::TypeError -> TypeError, ..., without the C++ backtrace.
void set_python_error_from_c10(const c10::Error& error) {
  PyObject* type = PyExc_RuntimeError;
  if (dynamic_cast<const c10::TypeError*>(&error) != nullptr) {
    type = PyExc_TypeError;
  } else if (dynamic_cast<const c10::ValueError*>(&error) != nullptr) {
    type = PyExc_ValueError;
  } else if (dynamic_cast<const c10::IndexError*>(&error) != nullptr) {
    type = PyExc_IndexError;
  } else if (dynamic_cast<const c10::NotImplementedError*>(&error) != nullptr) {
    type = PyExc_NotImplementedError;
  }
  PyErr_SetString(type, error.what_without_backtrace());
}

// The audit fallback's reporter: see the Note.
[[noreturn]] void throw_python_aliasing_error(const AliasingError& error) {
  {
    py::gil_scoped_acquire gil;
    set_python_aliasing_error(error);
  }
  python_error python_exception;
  python_exception.persist(); // may cross to the thread that ran backward()
  throw python_exception;
}

void translate_for_pybind11(std::exception_ptr error) {
  if (!error) {
    return;
  }
  try {
    std::rethrow_exception(error);
  } catch (...) {
    set_python_error_from_current_exception();
  }
}

} // namespace

void set_python_error_from_current_exception() {
  try {
    throw;
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
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "aliasguard: unknown C++ exception");
  }
}

void init_aliasing_error(py::module& m) {
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
  py::register_local_exception_translator(&translate_for_pybind11);
  set_alias_audit_error_reporter(&throw_python_aliasing_error);
}

} // namespace aliasguard::utils
