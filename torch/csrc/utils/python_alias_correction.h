#pragma once

#include <torch/csrc/utils/pybind.h>

namespace torch::utils {

// Registers the alias-correction and audit bindings on aliasguard._C.
void init_alias_correction_bindings(pybind11::module& m);

} // namespace torch::utils
