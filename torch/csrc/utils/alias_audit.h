#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/TensorImpl.h>
#include <c10/macros/AliasguardExport.h>
#include <c10/util/ArrayRef.h>
#include <torch/csrc/utils/aliasing_error.h>
#include <torch/csrc/utils/op_values.h>
#include <torch/csrc/utils/schema_alias_analysis.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

// The alias audit: checks, changing nothing, that an op's outputs keep its
// schema's aliasing promises. The checks are here; the dispatcher fallback
// that runs them on every op is alias_audit_fallback.cpp. See
// Note [Alias audit].

namespace aliasguard::utils {

// Fresh outputs share memory with no input, view outputs share their
// input's storage (and version counter, when `views_share_version_counter`),
// write outputs are their argument. Throws AliasingError at the first
// violation.
//
// What an op's registrations allow beyond its schema (OpCorrectionInfo's
// fields of the same names; see Note [What the audit leaves alone]).
struct AuditAllowances {
  // Fresh returns are not checked.
  bool fresh_return_may_alias = false;
  // A view return that does not share its input's storage is a copy.
  bool view_may_be_a_copy = false;
};
// With `judge_wrapper_views`, see Note [Wrapper views judged by their inner
// tensors].
ALIASGUARD_API void audit_aliasing_borrowed(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<OpValueRef> args,
    c10::ArrayRef<OpValueRef> rets,
    bool views_share_version_counter,
    AuditAllowances allowances,
    bool judge_wrapper_views = false);
// The same on boxed values, as the audit fallback has them.
ALIASGUARD_API void audit_aliasing(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<c10::IValue> args,
    c10::ArrayRef<c10::IValue> rets,
    bool views_share_version_counter,
    bool judge_wrapper_views = false);

// Note [Inner tensors of traceable wrappers]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A wrapper subclass whose view handler copies its inner data passes every
// wrapper-level check once correction has given the wrapper its input's
// storage, yet writes through the view never reach the input's data. Where
// both sides are traceable (__tensor_flatten__), the audit also checks a view
// return's inner tensors (flattened down to plain tensors) against the
// input's. "Against some inner tensor of the input", not "the one of the
// same name": a view may legitimately rearrange which inner tensor holds what
// (a transposed packing); what matters is that the view's data is the
// input's data. Which copies are reported, and when:
//   * no inner tensor of the view that holds data shares memory with the
//     input's: the view is a copy, reported at once, as a plain tensor
//     answering a view op with a copy is;
//   * some do, some are copies (torchao's quantized optimizer states slice
//     their codes and scales but clone their constant lookup table): the view
//     shares the input's data and keeps private copies of the rest. A private
//     copy makes the view and the input disagree only once one side of it is
//     written, which a constant never is. So each copy is watched instead:
//     the version counters of the copy and of the input's inner tensor it
//     stands for (the one of the same name, or all of the input's when no
//     name matches) are recorded, and the copy is reported (as
//     view_inner_copy, naming the view op) after the first audited op during
//     which either counter moved. Watches belong to the thread, end with its
//     last audit scope, and are dropped once nothing else holds the counters
//     (the tensors are gone: nothing can write them any more). A write the
//     audit cannot see (after the scope, or through a data pointer) goes
//     unreported, as every write the audit does not see does.
// Ops whose view return may be a copy (reshape: CompositeImplicitAutograd,
// which a jagged tensor answers in inference mode by copying its values and
// sharing its offsets when the input is not contiguous) are not checked.
struct InnerTensorLeaf {
  std::string name; // the dotted attribute path from the wrapper
  at::Tensor tensor;
};

// Whether the inner tensors of an op's view returns are checked at all: not
// when `view_may_be_a_copy` (OpCorrectionInfo's: a CompositeImplicitAutograd
// op such as reshape, which copies when it must), since copies of any inner
// tensor are then legitimate. Callers ask before flattening any wrapper.
ALIASGUARD_API bool inner_views_are_audited(bool view_may_be_a_copy);

// Checks the inner tensors of the view `output_leaves` (at `site`) against
// `input_leaves`, those of the wrapper `input`, by the rules above: throws
// AliasingError (view_inner_copy) for a view that is a copy, watches partial
// copies on this thread. Checks nothing unless
// inner_views_are_audited(view_may_be_a_copy).
ALIASGUARD_API void audit_inner_view(
    const AliasSite& site,
    const at::Tensor& input,
    c10::ArrayRef<InnerTensorLeaf> output_leaves,
    c10::ArrayRef<InnerTensorLeaf> input_leaves,
    bool view_may_be_a_copy = false);

// Copies watched on this thread (see above).
ALIASGUARD_API size_t watched_inner_copies();
// Watches `copy`: `error` is reported once one of `counters` has moved from
// the version it has now, blamed on the class of the wrapper `input` if it
// still lives. A copy already watched for the same return is not watched
// twice. Called by audit_inner_view.
void watch_inner_copy(
    AliasingError error,
    const at::Tensor& input,
    const at::Tensor& copy,
    std::vector<c10::VariableVersion> counters);
// Reports, through the audit's reporter, each watched copy whose counters
// moved since it was watched, and forgets it; throws (AliasingError, or the
// reporter's own exception) when the reporter does not handle one. The audit
// fallback calls it after every op while copies are watched.
ALIASGUARD_API void report_diverged_inner_copies();

// Note [Wrapper views judged by their inner tensors]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The audit fallback sees results that no alias correction touched, when
// torch bypasses the __torch_dispatch__ that aliasguard wraps: DTensor is
// dispatched by torch's C++ fast path, which gives a single view return its
// input's storage but leaves each wrapper of a list return (split, chunk,
// unbind) a placeholder of its own. The fallback sits above autograd, so such
// a view already shares its input's version counter (the audit checks that);
// a placeholder storage holds no data, so whether a write through the view
// reaches the input is decided by the inner tensors. When a view return is a
// wrapper whose placeholder storage is not its wrapper input's, the fallback
// therefore asks the judge (set by the Python bindings, which can flatten
// traceable wrappers) to check the pair by their inner tensors (Note [Inner
// tensors of traceable wrappers]); only a pair the judge cannot see into (not
// traceable) is reported as view_storage. The check of a __torch_dispatch__
// result (below autograd) does not judge: there a wrapper view with a
// placeholder of its own also has a counter of its own, which correction
// repairs, and a class that opted out of correction is reported for it.
// Except where correction leaves a wrapper view its own placeholder on
// purpose, because no kernel above will mark it a view (inference mode, a
// body nested in an untracked one: Note [A wrapper view made under an
// untracked body]): the corrected result is judged as the fallback judges.
// The judge returns whether it judged the pair; it throws what
// audit_inner_view throws.
using WrapperViewJudge = bool (*)(
    const AliasSite& site,
    const at::Tensor& input,
    const at::Tensor& output);
ALIASGUARD_API void set_wrapper_view_judge(WrapperViewJudge judge);

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

// Note [Repaired or not]
// ~~~~~~~~~~~~~~~~~~~~~~
// Under audit a handler's result is checked around the correction: as the
// handler returned it (`before`), by the correction itself (`refusal`, when
// it refused), and as it is handed back (`after`, with the inner tensors of
// traceable wrappers). A violation found before and gone after was repaired
// by the correction: without aliasguard the user would hit it, with it they
// do not. A refusal, or what is still found after, was not repaired. When
// the correction refused, the handler's own violation (if the first check
// found one) is what is reported, since it says what the handler did; the
// refusal is what is raised. A repaired violation of the same kind as one
// still found after is reported once, as not repaired.
struct AuditJudgement {
  // Report as repaired (the run goes on either way).
  std::optional<AliasingError> repaired;
  // Report as not repaired; if the reporter does not take it, raise `raise`.
  std::optional<AliasingError> unrepaired;
  std::optional<AliasingError> raise;
};
ALIASGUARD_API AuditJudgement judge_audited_result(
    const std::optional<AliasingError>& before,
    const std::optional<AliasingError>& refusal,
    const std::optional<AliasingError>& after);

} // namespace aliasguard::utils
