#include <torch/csrc/utils/python_alias_correction.h>

namespace torch::utils {

void init_alias_correction_bindings(pybind11::module& m) {}

} // namespace torch::utils
