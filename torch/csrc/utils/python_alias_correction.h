#pragma once

#include <torch/csrc/utils/pybind.h>

// Alias correction and audit of an op result given as Python objects (what a
// __torch_dispatch__ returns), on top of the C++ checks in alias_correction.h
// and alias_audit.h. What runs once per __torch_dispatch__ is plain CPython
// code: pybind11's argument handling alone would cost more than the whole
// correction of an op without alias annotations.

namespace aliasguard::utils {

// What a corrected __torch_dispatch__ returns in place of `out` (borrowed),
// the result of `func(*args, **kwargs)` from the __torch_dispatch__ of
// `owner` (a class or mode instance: the per-class opt-out is read on it).
// New reference; nullptr with an exception set.
PyObject* corrected_result(
    PyObject* owner,
    PyObject* func,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out);

// Registers _correct_aliasing and the correction/audit switches.
void init_alias_correction_bindings(pybind11::module& m);

} // namespace aliasguard::utils
