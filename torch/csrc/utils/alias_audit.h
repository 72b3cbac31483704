#pragma once

#include <ATen/core/ivalue.h>
#include <c10/macros/AliasguardExport.h>
#include <c10/util/ArrayRef.h>
#include <torch/csrc/utils/aliasing_error.h>
#include <torch/csrc/utils/op_values.h>
#include <torch/csrc/utils/schema_alias_analysis.h>

// The alias audit: checks, changing nothing, that an op's outputs keep its
// schema's aliasing promises. The checks are here; the dispatcher fallback
// that runs them on every op is alias_audit_fallback.cpp. See
// Note [Alias audit].

namespace aliasguard::utils {

// Fresh outputs share memory with no input, view outputs share their
// input's storage (and version counter, when `views_share_version_counter`),
// write outputs are their argument. Throws AliasingError at the first
// violation.
ALIASGUARD_API void audit_aliasing_borrowed(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<OpValueRef> args,
    c10::ArrayRef<OpValueRef> rets,
    bool views_share_version_counter);
ALIASGUARD_API void audit_aliasing(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<c10::IValue> args,
    c10::ArrayRef<c10::IValue> rets,
    bool views_share_version_counter);

// Turns the audit fallback on or off for ops dispatched on this thread (and
// the autograd work it starts). Returns the previous state.
ALIASGUARD_API bool set_alias_audit_enabled(bool enabled);
ALIASGUARD_API bool is_alias_audit_enabled();

// Called with the violation just before the audit fallback rethrows it from
// inside the dispatcher; it may throw something else instead (the Python
// bindings throw their own exception type, which torch's bindings would
// otherwise turn into a plain RuntimeError). nullptr restores the default.
using AliasingErrorReporter = void (*)(const AliasingError&);
ALIASGUARD_API void set_alias_audit_error_reporter(
    AliasingErrorReporter reporter);

} // namespace aliasguard::utils
