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
};

// The entry of `func` (any object; an OpOverload has an analysis). GIL held.
// Valid until the end of the outermost RunningCorrection.
const PyOpEntry& op_entry(PyObject* func);

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
