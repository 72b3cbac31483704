#pragma once

#include <torch/csrc/utils/pybind.h>

namespace aliasguard {

// Adds the selective-checkpoint dispatch functions to aliasguard._C.
void init_selective_checkpoint_bindings(pybind11::module_& m);

}  // namespace aliasguard
