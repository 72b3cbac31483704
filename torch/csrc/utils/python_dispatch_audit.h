#pragma once

#include <torch/csrc/utils/alias_audit.h>
#include <torch/csrc/utils/alias_correction.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/python_op_cache.h>

// The audit of a __torch_dispatch__ result given as Python objects: checked as
// the handler returned it and as it is handed back, around the correction.

namespace aliasguard::utils {

// What corrected_result hands back when the thread audits: `out` corrected
// (when `correct`) as `options` say, each violation offered to the audit's
// reporter and blamed on `owner`. See Note [Auditing a __torch_dispatch__
// result]. New reference.
PyObject* audited_result(
    PyObject* owner,
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    bool correct,
    const CorrectionOptions& options,
    const ReportedViolationMark& mark);

} // namespace aliasguard::utils
