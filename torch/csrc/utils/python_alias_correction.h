#pragma once

#include <torch/csrc/utils/alias_audit.h>
#include <torch/csrc/utils/alias_correction.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/python_op_cache.h>

// Alias correction and audit of an op result given as Python objects (what a
// __torch_dispatch__ returns), on top of the C++ checks in alias_correction.h
// and alias_audit.h. What runs once per __torch_dispatch__ is plain CPython
// code: pybind11's argument handling alone would cost more than the whole
// correction of an op without alias annotations.

namespace aliasguard::utils {

// Whether the class of `owner` (a class or mode instance) sets `attribute`
// (an interned name: __aliasguard_fixup__, __aliasguard_track_views__) to a
// false value. The one reader of aliasguard's per-class opt-outs.
bool owner_opted_out(PyObject* owner, PyObject* attribute);

// Whether automatic correction applies to the __torch_dispatch__ of `owner`
// (a class or mode instance): on process-wide, not opted out by its class.
bool correction_applies(PyObject* owner);

// What a corrected __torch_dispatch__ returns in place of `out` (borrowed),
// the result of `func(*args, **kwargs)` from the __torch_dispatch__ of
// `owner` (a class or mode instance): corrected when `correct`, as `options`
// say (see TrackedDispatchCall), and checked when `audit`, violations blamed
// on `owner`; `mark` was taken before the handler ran (see Note [One report
// per op call]). `entry` is func's when the caller looked it up already
// (valid under a RunningCorrection), else nullptr. New reference; nullptr
// with an exception set.
PyObject* corrected_result(
    PyObject* owner,
    PyObject* func,
    const PyOpEntry* entry,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    bool correct,
    bool audit,
    const CorrectionOptions& options,
    const ReportedViolationMark& mark);

// Corrects `out`, the result of the op of `entry` called with `args` and
// `kwargs`, as `options` say. Returns the object to hand back (new
// reference): `out`, or, for write returns, the caller's argument objects in
// their place. Throws AliasingError where the correction refuses.
PyObject* correct_result(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    const CorrectionOptions& options);

// correct_result for an op with one view return of its only tensor argument
// (view, t, transpose, select, ...), when the values are the plain case;
// returns false, having done nothing, otherwise.
bool correct_sole_view(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* out,
    const CorrectionOptions& options);

// Registers the correction/audit switches.
void init_alias_correction_bindings(pybind11::module& m);

} // namespace aliasguard::utils
