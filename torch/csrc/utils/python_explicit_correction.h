#pragma once

#include <torch/csrc/utils/pybind.h>

// aliasguard.correct_aliasing(func, args, kwargs, out): the explicit call a
// __torch_dispatch__ makes in place of upstream's return_and_correct_aliasing.
// See Note [The explicit call checks its arguments].

namespace aliasguard::utils {

// Registers _correct_aliasing (a METH_FASTCALL function: it runs once per op).
void init_explicit_correction_bindings(pybind11::module& m);

} // namespace aliasguard::utils
