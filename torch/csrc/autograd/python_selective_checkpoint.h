#pragma once

#include <torch/csrc/utils/pybind.h>

namespace aliasguard::autograd {

// Adds the selective-checkpoint dispatch functions to aliasguard._C.
void init_selective_checkpoint_bindings(pybind11::module_& m);

} // namespace aliasguard::autograd
