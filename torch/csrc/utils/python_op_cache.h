#pragma once

#include <torch/csrc/utils/op_correction_info.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/schema_alias_analysis.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

// What the Python bindings know about an op, cached per OpOverload object.
// See Note [Per-OpOverload analysis cache].

namespace aliasguard::utils {

// The core's facts about the op (OpCorrectionInfo; `analysis` is nullptr
// when `func` is no dispatcher operator, a higher-order op say), plus what
// reading its Python arguments takes.
struct PyOpEntry : OpCorrectionInfo {
  pybind11::object func; // keeps the key's address from being reused
  // The schema's argument names, interned, for kwargs lookups.
  std::vector<pybind11::object> argument_names;
};

// The entry of `func` (any object; an OpOverload has an analysis). GIL held.
// Valid until the end of the outermost RunningCorrection.
const PyOpEntry& op_entry(PyObject* func);

// The Python object passed for schema argument `index` of `entry`'s op (which
// has an analysis) in `args` (a tuple or list) / `kwargs` (a dict or None),
// or nullptr. Throws python_error when a kwargs lookup fails.
PyObject* argument_object(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    size_t index);

// Marks a correction in progress: a correction can run Python code (a
// wrapper's Python-customized sizes) that may flush the cache while an entry
// is in use; flushed entries are kept until no correction is running.
class RunningCorrection {
 public:
  RunningCorrection();
  ~RunningCorrection();
  RunningCorrection(const RunningCorrection&) = delete;
  RunningCorrection& operator=(const RunningCorrection&) = delete;
};

} // namespace aliasguard::utils
