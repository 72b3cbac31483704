#pragma once

#include <Python.h>

#include <array>
#include <string_view>

// The arguments of one __torch_dispatch__ call, read from a vectorcall.
// Shared by the corrected wrapper (python_corrected_dispatch.cpp) and the
// selective checkpoint modes (python_selective_checkpoint.cpp), which are
// both called by torch in place of a Python __torch_dispatch__.

namespace aliasguard::utils {

// torch calls `__torch_dispatch__(owner, func, types, args=(), kwargs=None)`
// positionally; Python code may pass any of them by keyword. Missing ones
// are nullptr (the caller applies the defaults it wants); a keyword that is
// none of these names is reported in `unknown_keyword` (borrowed) for the
// callers that refuse it.
struct TorchDispatchArguments {
  PyObject* owner = nullptr; // the class or mode instance
  PyObject* func = nullptr;
  PyObject* types = nullptr;
  PyObject* args = nullptr;
  PyObject* kwargs = nullptr;
  PyObject* unknown_keyword = nullptr;
  bool too_many_positional = false;
};

// The keywords of a call (torch passes every argument by position; Python
// code may not). Out of line, so that the positional case every dispatched
// op takes stays short (Note [Hot path layout]).
[[gnu::noinline]] inline void read_torch_dispatch_keywords(
    PyObject* const* argv,
    Py_ssize_t nargs,
    PyObject* kwnames,
    std::array<PyObject*, 5>& values,
    TorchDispatchArguments& read) {
  static constexpr std::array<std::string_view, 5> kNames = {
      "self", "func", "types", "args", "kwargs"};
  const Py_ssize_t num_keywords = PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < num_keywords; ++k) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, k);
    bool known = false;
    for (size_t i = 1; i < kNames.size() && !known; ++i) {
      if (PyUnicode_CompareWithASCIIString(name, kNames[i].data()) == 0) {
        values[i] = argv[nargs + k];
        known = true;
      }
    }
    if (!known && read.unknown_keyword == nullptr) {
      read.unknown_keyword = name;
    }
  }
}

// `bound_owner`: the owner when the callable carries it (the staticmethod
// form, which receives no class); else argv[0] is the owner.
inline TorchDispatchArguments read_torch_dispatch_arguments(
    PyObject* const* argv,
    Py_ssize_t nargs,
    PyObject* kwnames,
    PyObject* bound_owner) {
  std::array<PyObject*, 5> values{};
  const Py_ssize_t shift = bound_owner != nullptr ? 1 : 0;
  TorchDispatchArguments read;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    if (i + shift >= static_cast<Py_ssize_t>(values.size())) {
      read.too_many_positional = true;
      break;
    }
    values[i + shift] = argv[i];
  }
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) > 0) {
    read_torch_dispatch_keywords(argv, nargs, kwnames, values, read);
  }
  read.owner = bound_owner != nullptr ? bound_owner : values[0];
  read.func = values[1];
  read.types = values[2];
  read.args = values[3];
  read.kwargs = values[4];
  return read;
}

} // namespace aliasguard::utils
