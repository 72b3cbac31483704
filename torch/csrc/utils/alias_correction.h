#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <torch/csrc/utils/schema_alias_analysis.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

// Alias correction: makes what an op returned agree with what its schema
// says about aliasing, after code below autograd (a __torch_dispatch__)
// produced it; and the alias audit, which only checks. See
// Note [Alias correction after __torch_dispatch__] and Note [Alias audit].

namespace torch::utils {

// Note [Kinds of aliasing violations]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every way a __torch_dispatch__ (or a kernel) can break its schema's alias
// promises, one value each, so that a report can group violations and say,
// once per kind, what the schema promises and what to change. The kind is
// decided where the violation is found, never recovered from the message.
enum class AliasViolation : uint8_t {
  kViewCopy, // a view return that owns memory of its own (answered by a copy)
  kViewStorage, // a view return whose storage is not its input's (a wrapper's
                // placeholder, or memory it cannot share)
  kViewVersionCounter, // a view return with a version counter of its own
  kViewInnerCopy, // a traceable wrapper view whose inner tensors do not alias
                  // the input's inner tensors
  kWriteNotArgument, // an in-place/out= return that is not the argument
  kWriteNewMemory, // an in-place/out= return with memory of its own
  kWriteMetadata, // an in-place/out= return shaped unlike its argument
  kFreshIsArgument, // an unannotated return that is an argument itself
  kFreshSharesMemory, // an unannotated return sharing memory with an argument
  kOtherArgument, // a return that is an argument the schema does not name
  kWrongType, // a return (or argument) of a type the schema does not declare
};

// "view_copy", "write_not_argument", ...: stable names for reports.
const char* alias_violation_name(AliasViolation kind);

// A return that cannot be made to alias what its schema says it aliases, or
// (audit) one that breaks the schema. Names the op, the return, the argument
// and the kind of violation; nothing was modified when correct_aliasing
// throws it.
class AliasingError : public c10::Error {
 public:
  AliasingError(
      std::string op,
      size_t return_index,
      std::string argument,
      AliasViolation kind,
      const std::string& message);
  ~AliasingError() override;

  AliasViolation kind() const {
    return kind_;
  }

  const std::string& op() const {
    return op_;
  }
  size_t return_index() const {
    return return_index_;
  }
  // The argument involved, or "" when the problem concerns the return alone.
  const std::string& argument() const {
    return argument_;
  }

 private:
  std::string op_;
  size_t return_index_;
  std::string argument_;
  AliasViolation kind_;
};

// Throws the AliasingError for `problem` with return `return_index` (and the
// argument it concerns, if any), in the format every check uses:
// "<op>: return <i> <problem>" followed by the schema.
[[noreturn]] void throw_aliasing_error(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    std::optional<size_t> argument,
    AliasViolation kind,
    std::string_view problem);

// One argument or return of an op as the checks see it: nothing, a tensor, a
// list of tensors, or some other value (named by its type, for errors).
// Borrowed, never copied: the checks run once per op, and copying a tensor
// that Python owns touches its PyObject's reference count.
class OpValueRef {
 public:
  OpValueRef() = default; // None
  // An undefined tensor (an absent optional) is None.
  /* implicit */ OpValueRef(const at::Tensor& tensor)
      : kind_(tensor.defined() ? Kind::kTensor : Kind::kNone),
        tensor_(&tensor) {}
  // Null elements are None (Tensor?[]); `elements` must outlive the ref.
  static OpValueRef list(c10::ArrayRef<const at::Tensor*> elements) {
    OpValueRef ref;
    ref.kind_ = Kind::kTensorList;
    ref.elements_ = elements;
    return ref;
  }
  // `type_name` must outlive the ref (a string literal, a tp_name).
  static OpValueRef other(const char* type_name) {
    OpValueRef ref;
    ref.kind_ = Kind::kOther;
    ref.type_name_ = type_name;
    return ref;
  }

  bool is_none() const {
    return kind_ == Kind::kNone;
  }
  bool is_tensor() const {
    return kind_ == Kind::kTensor;
  }
  bool is_list() const {
    return kind_ == Kind::kTensorList;
  }
  const at::Tensor& tensor() const {
    return *tensor_;
  }
  c10::ArrayRef<const at::Tensor*> elements() const {
    return elements_;
  }
  // "None", "a Tensor", "a list of 2 Tensors", "a float": for messages.
  std::string describe() const;

 private:
  enum class Kind : uint8_t { kNone, kTensor, kTensorList, kOther };
  Kind kind_ = Kind::kNone;
  const at::Tensor* tensor_ = nullptr;
  c10::ArrayRef<const at::Tensor*> elements_;
  const char* type_name_ = nullptr;
};

// Alias correction of one op's result, on borrowed values. `args` are the
// op's arguments in schema order (all of them), `rets` its returns. For every
// view return, a
// wrapper output with placeholder storage is given its input's storage
// (sizes, strides and offset kept) and every output shares its input's
// version counter; a real output that does not alias its input is an error.
// Every write return must be replaceable by its argument, which the caller
// then returns in its place (a wrapper argument takes the sizes and strides
// the returned tensor has, for in-place view ops such as t_). Returns without
// alias annotations are left alone. All checks run before the first change:
// on AliasingError nothing was modified.
void correct_aliasing_borrowed(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<OpValueRef> args,
    c10::ArrayRef<OpValueRef> rets);

// The same for one view return (`return_index`, not a list) of an op whose
// only tensor argument is `input` (analysis.sole_tensor_argument()): the
// common case, without building argument lists.
void correct_view_return(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    const at::Tensor& input,
    const at::Tensor& output);

// Boxed form, for C++ callers holding a stack: same, and write returns in
// `rets` are replaced by their arguments.
void correct_aliasing(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<c10::IValue> args,
    torch::jit::Stack& rets);
void correct_aliasing(
    const c10::OperatorHandle& op,
    c10::ArrayRef<c10::IValue> args,
    torch::jit::Stack& rets);
void correct_aliasing(
    const c10::FunctionSchema& schema,
    c10::ArrayRef<c10::IValue> args,
    torch::jit::Stack& rets);

// Checks, without changing anything, that an op's outputs keep its schema's
// aliasing promises: fresh outputs share memory with no input, view outputs
// share their input's storage (and version counter, when
// `views_share_version_counter`), write outputs are their argument. Throws
// AliasingError at the first violation.
void audit_aliasing_borrowed(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<OpValueRef> args,
    c10::ArrayRef<OpValueRef> rets,
    bool views_share_version_counter);
void audit_aliasing(
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
void audit_inner_view(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    size_t argument,
    const std::string& inner_name,
    const at::Tensor& inner_output,
    c10::ArrayRef<at::Tensor> inner_inputs);

// Whether the audit's fallback checks ops dispatched on this thread (and the
// autograd work it starts). See Note [Audit lifetime].
bool is_alias_audit_enabled();

// One audit scope on this thread: the first on any thread registers the
// audit fallback, the last to end removes it; the thread is audited while it
// has one open. Scopes may end in any order. Throws c10::Error naming the
// key if something else already registered a fallback on the key the audit
// borrows (nothing changed then).
void enter_alias_audit();
// Ends one scope of this thread; an error if it has none.
void exit_alias_audit();
// Keeps the fallback registered without auditing any thread (a scope of no
// thread): for callers that open and close many scopes in a row, since
// registering updates every operator's dispatch table. Same errors as
// enter_alias_audit / exit_alias_audit.
void retain_alias_audit_fallback();
void release_alias_audit_fallback();
// Scopes open on this thread / on all threads together.
size_t alias_audit_depth();
size_t alias_audit_scopes();

// Called with a violation the audit fallback found and the op's arguments,
// from inside the dispatcher. Returns true when it recorded the violation (report mode, or a
// violation its caller knows to be by design): the op's results then stand.
// Otherwise it returns false, or throws something of its own (the Python
// bindings throw their own exception type, which torch's bindings would
// otherwise turn into a plain RuntimeError), and the fallback rethrows.
// nullptr restores the default (always rethrow).
using AliasingErrorReporter =
    bool (*)(const AliasingError&, c10::ArrayRef<c10::IValue> args);
void set_alias_audit_error_reporter(AliasingErrorReporter reporter);

// Note [One report per op call]
// A violation in a __torch_dispatch__'s result is reported where that result
// is checked; the same result then reaches every enclosing check (an outer
// mode handing it back, the audit fallback) and would be blamed on each of
// them. Whoever reports a violation notes it; an enclosing check that finds
// one for the same op after a note was made during its call stays quiet.
struct ReportedViolationMark {
  uint64_t epoch = 0;
};
ReportedViolationMark reported_violation_mark();
void note_reported_violation(const SchemaAliasAnalysis& analysis);
bool reported_violation_since(
    const ReportedViolationMark& mark,
    const SchemaAliasAnalysis& analysis);

} // namespace torch::utils
