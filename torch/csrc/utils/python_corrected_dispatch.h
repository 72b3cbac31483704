#pragma once

#include <torch/csrc/utils/pybind.h>

// aliasguard._C._CorrectedDispatch. See Note [The corrected
// __torch_dispatch__ wrapper].

namespace aliasguard::utils {

void init_corrected_dispatch(pybind11::module& m);

} // namespace aliasguard::utils
