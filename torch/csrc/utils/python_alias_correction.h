#pragma once

#include <torch/csrc/utils/alias_correction.h>
#include <torch/csrc/utils/pybind.h>

// Alias correction and audit of an op result given as Python objects (what a
// __torch_dispatch__ returns), on top of the C++ checks in alias_correction.h
// and alias_audit.h. What runs once per __torch_dispatch__ is plain CPython
// code: pybind11's argument handling alone would cost more than the whole
// correction of an op without alias annotations.

namespace aliasguard::utils {

// Whether automatic correction applies to the __torch_dispatch__ of `owner`
// (a class or mode instance): on process-wide, not opted out by its class.
bool correction_applies(PyObject* owner);

// What a corrected __torch_dispatch__ returns in place of `out` (borrowed),
// the result of `func(*args, **kwargs)`: corrected when `correct`, as
// `options` say (see TrackedDispatchCall), and checked when `audit`. New
// reference; nullptr with an exception set.
PyObject* corrected_result(
    PyObject* func,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    bool correct,
    bool audit,
    const CorrectionOptions& options);

// Registers _correct_aliasing and the correction/audit switches.
void init_alias_correction_bindings(pybind11::module& m);

} // namespace aliasguard::utils
