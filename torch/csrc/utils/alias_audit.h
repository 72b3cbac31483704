#pragma once

#include <ATen/core/ivalue.h>
#include <c10/macros/AliasguardExport.h>
#include <c10/util/ArrayRef.h>
#include <torch/csrc/utils/aliasing_error.h>
#include <torch/csrc/utils/op_values.h>
#include <torch/csrc/utils/schema_alias_analysis.h>

#include <cstddef>
#include <cstdint>
#include <string>

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

// Note [Inner tensors of traceable wrappers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A wrapper subclass whose view handler copies its inner data passes every
// wrapper-level check once correction has given the wrapper its input's
// storage, yet writes through the view never reach the input's data. Where
// both sides are traceable (__tensor_flatten__), the audit also checks a view
// return's inner tensors (flattened down to plain tensors): each one holding
// data must share memory with some inner tensor of the input. "Some", not
// "the one of the same name": a view may legitimately rearrange which inner
// tensor holds what (a transposed packing), and the property that matters is
// that the view's data is the input's data.
ALIASGUARD_API void audit_inner_view(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    size_t argument,
    const std::string& inner_name,
    const at::Tensor& inner_output,
    c10::ArrayRef<at::Tensor> inner_inputs);

// Whether the audit's fallback checks ops dispatched on this thread (and the
// autograd work it starts). See Note [Audit lifetime].
ALIASGUARD_API bool is_alias_audit_enabled();

// One audit scope on this thread: the first on any thread registers the
// audit fallback, the last to end removes it; the thread is audited while it
// has one open. Scopes may end in any order. With check_kernels, ops that
// reach no __torch_dispatch__ are checked too, on every audited thread, while
// the scope is open (see Note [Alias audit]). Throws c10::Error naming the
// key if something else already registered a fallback on the key the audit
// borrows (nothing changed then).
ALIASGUARD_API void enter_alias_audit(bool check_kernels = false);
// Ends one scope of this thread, opened with the same check_kernels; an
// error (nothing changed) if there is no such scope.
ALIASGUARD_API void exit_alias_audit(bool check_kernels = false);
// Keeps the fallback registered without auditing any thread (a scope of no
// thread): for callers that open and close many scopes in a row, since
// registering updates every operator's dispatch table. Same errors as
// enter_alias_audit / exit_alias_audit.
ALIASGUARD_API void retain_alias_audit_fallback();
ALIASGUARD_API void release_alias_audit_fallback();
// Scopes open on this thread / on all threads together.
ALIASGUARD_API size_t alias_audit_depth();
ALIASGUARD_API size_t alias_audit_scopes();

// Called with a violation the audit fallback found and the op's arguments,
// from inside the dispatcher. Returns true when it recorded the violation
// (report mode, or a violation its caller knows to be by design): the op's
// results then stand. Otherwise it returns false, or throws something of its
// own (the Python bindings throw their own exception type, which torch's
// bindings would otherwise turn into a plain RuntimeError), and the fallback
// rethrows. nullptr restores the default (always rethrow).
using AliasingErrorReporter =
    bool (*)(const AliasingError&, c10::ArrayRef<c10::IValue> args);
ALIASGUARD_API void set_alias_audit_error_reporter(
    AliasingErrorReporter reporter);

// Note [One report per op call]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A violation in a __torch_dispatch__'s result is reported where that result
// is checked; the same result then reaches every enclosing check (an outer
// mode handing it back, the audit fallback) and would be blamed on each of
// them. Whoever reports a violation notes it; an enclosing check that finds
// one for the same op after a note was made during its call stays quiet.
struct ReportedViolationMark {
  uint64_t epoch = 0;
};
ALIASGUARD_API ReportedViolationMark reported_violation_mark();
ALIASGUARD_API void note_reported_violation(
    const SchemaAliasAnalysis& analysis);
ALIASGUARD_API bool reported_violation_since(
    const ReportedViolationMark& mark,
    const SchemaAliasAnalysis& analysis);

} // namespace aliasguard::utils
