#pragma once

#include <Python.h>
#include <c10/util/Exception.h>

namespace torch::utils {

// Sets the Python exception that matches a c10 error's class (c10::TypeError
// -> TypeError, ...), without the C++ backtrace. Shared by the pybind11
// translator and the raw C-API entry points of aliasguard._C.
inline void set_python_error_from_c10(const c10::Error& error) {
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

} // namespace torch::utils
