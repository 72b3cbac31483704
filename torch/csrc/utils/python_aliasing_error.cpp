#include <torch/csrc/utils/python_aliasing_error.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
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
// aliasguard's violation hook (see Note [The audit's Python reporter]), or
// nullptr. Set and read with the GIL held; leaked like the type above.
PyObject* audit_reporter = nullptr;

// Sets op, return_index, argument and kind on an AliasingError instance.
bool set_aliasing_error_attributes(
    PyObject* instance,
    const AliasingError& error) {
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

// Raises aliasguard.AliasingError (a RuntimeError) carrying the op, the
// return index, the argument and the kind as attributes. Never throws.
void set_python_aliasing_error(const AliasingError& error) {
  PyObject* instance = new_python_aliasing_error(error);
  if (instance == nullptr) {
    return; // the failed call set its own error
  }
  PyErr_SetObject(aliasing_error_type, instance);
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

// The audit fallback's reporter (see the Note, and Note [The audit's Python
// reporter]): blames the first tensor subclass among the arguments (DTensor,
// say, whose dispatch aliasguard does not wrap), or no one.
bool report_fallback_violation(
    const AliasingError& error,
    c10::ArrayRef<c10::IValue> args) {
  py::gil_scoped_acquire gil;
  try {
    py::object owner = py::none();
    for (const c10::IValue& arg : args) {
      if (!arg.isTensor() || !arg.toTensor().defined()) {
        continue;
      }
      py::object tensor =
          py::reinterpret_steal<py::object>(THPVariable_Wrap(arg.toTensor()));
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

// Note [The audit's Python reporter]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every violation the audit finds is offered to one Python callable,
// reporter(error, owner, repaired) -> bool, with the GIL held: `owner` is the
// class or mode whose __torch_dispatch__ returned the result (from the
// fallback: the first tensor subclass among the op's arguments, whose
// dispatch aliasguard does not wrap, or None: a kernel), `repaired` whether
// alias correction made the result keep the schema. True means it was
// handled (recorded in report mode, or by design: tracing infrastructure):
// the op's result stands. False means raise. Which violations to record
// where is aliasguard/_aliasing.py's business; what is a violation is decided
// in alias_correction.cpp and alias_audit.cpp.
bool offer_violation(
    const AliasingError& error,
    PyObject* owner,
    bool repaired) {
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
      "cannot be made to. Attributes: op, return_index, argument, kind.",
      PyExc_RuntimeError,
      nullptr);
  if (aliasing_error_type == nullptr) {
    throw python_error();
  }
  m.add_object("AliasingError", py::handle(aliasing_error_type));
  py::register_local_exception_translator(&translate_for_pybind11);
  set_alias_audit_error_reporter(&report_fallback_violation);
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
        audit_reporter =
            reporter.is_none() ? nullptr : reporter.inc_ref().ptr();
        Py_XDECREF(previous);
      },
      py::arg("reporter"));
  m.def("_alias_violation_kinds", [] {
    std::vector<std::string> names;
    for (auto kind = static_cast<uint8_t>(AliasViolation::kViewCopy);
         kind <= static_cast<uint8_t>(kLastAliasViolation);
         ++kind) {
      names.emplace_back(
          alias_violation_name(static_cast<AliasViolation>(kind)));
    }
    return names;
  });
}

} // namespace aliasguard::utils
