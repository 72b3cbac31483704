#pragma once

#include <torch/csrc/utils/pybind.h>

// Python access to the C++ schema alias analysis (schema_alias_analysis.h):
// what aliasguard.checkpoint and the tests read about an op.

namespace aliasguard::utils {

void init_schema_alias_analysis_bindings(pybind11::module& m);

} // namespace aliasguard::utils
