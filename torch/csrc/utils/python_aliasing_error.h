#pragma once

#include <torch/csrc/utils/pybind.h>

#include <exception>

// The one path from C++ exceptions to Python ones in aliasguard._C, and the
// Python type of AliasingError. See Note [One error translation].

namespace aliasguard::utils {

// Sets the Python exception for the exception being handled (call it from a
// catch block): aliasguard.AliasingError with its attributes for an
// AliasingError, the matching builtin for other c10 errors (TypeError for
// c10::TypeError, ...) without the C++ backtrace, what pybind11 and torch's
// bindings would set for theirs. Never throws.
void set_python_error_from_current_exception();

// Runs `body` (returning a new reference) for a raw CPython entry point:
// nullptr with the Python exception set when it throws.
template <typename Body>
PyObject* translate_errors(Body&& body) {
  try {
    return body();
  } catch (...) {
    set_python_error_from_current_exception();
  }
  return nullptr;
}

// Creates aliasguard._C.AliasingError, registers the translator for pybind11
// functions (the same path as translate_errors) and the audit's reporter.
void init_aliasing_error(pybind11::module& m);

} // namespace aliasguard::utils
