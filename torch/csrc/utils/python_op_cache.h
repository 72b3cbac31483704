#pragma once

#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/schema_alias_analysis.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

// What the Python bindings know about an op, cached per OpOverload object.
// See Note [Per-OpOverload analysis cache].

namespace aliasguard::utils {

struct PyOpEntry {
  pybind11::object func; // keeps the key's address from being reused
  // nullptr: not a dispatcher operator (a higher-order op, say).
  std::shared_ptr<const SchemaAliasAnalysis> analysis;
  // The schema's argument names, interned, for kwargs lookups.
  std::vector<pybind11::object> argument_names;
  // Set for ops whose one return is a view of their only tensor argument,
  // passed positionally at this index: the fast path of the correction.
  std::optional<size_t> sole_view_argument;
  // The op has an ADInplaceOrView kernel: above a __torch_dispatch__ it marks
  // view returns and bumps written arguments. Read once per OpOverload:
  // registering such a kernel for an op already in use is not supported.
  bool has_inplace_or_view_kernel = false;
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
