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

// A return that cannot be made to alias what its schema says it aliases, or
// (audit) one that breaks the schema. Names the op, the return and the
// argument; nothing was modified when correct_aliasing throws it.
class AliasingError : public c10::Error {
 public:
  AliasingError(
      std::string op,
      size_t return_index,
      std::string argument,
      const std::string& message);
  ~AliasingError() override;

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
};

// Throws the AliasingError for `problem` with return `return_index` (and the
// argument it concerns, if any), in the format every check uses:
// "<op>: return <i> <problem>" followed by the schema.
[[noreturn]] void throw_aliasing_error(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    std::optional<size_t> argument,
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

// What the caller knows about where the result goes. See
// Note [Views returned from below autograd].
struct CorrectionOptions {
  // An ADInplaceOrView kernel above the caller will mark each view return as
  // a view of its input (as_view), which refuses a tensor that already has
  // autograd metadata: such metadata is checked, then dropped.
  bool outer_kernel_marks_views = false;
  // The code that produced the result ran with ADInplaceOrView re-enabled
  // (Note [Tracked __torch_dispatch__ bodies]): a wrapper output may then
  // require grad only because it was built from a real view of an inner
  // tensor that requires grad; that flag is dropped too.
  bool tracked = false;
  // The op is no view op for autograd (no ADInplaceOrView kernel): a
  // CompositeImplicitAutograd op whose schema says Tensor(a) but which
  // returns a copy when it must (to, contiguous, reshape). Such ops reach a
  // __torch_dispatch__ only from below autograd (a forward-AD formula, a
  // tracked body); a real output with memory of its own is then left alone
  // instead of being an error.
  bool view_may_be_a_copy = false;
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
    c10::ArrayRef<OpValueRef> rets,
    const CorrectionOptions& options = {});

// The same for one view return (`return_index`, not a list) of an op whose
// only tensor argument is `input` (analysis.sole_tensor_argument()): the
// common case, without building argument lists.
void correct_view_return(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    const at::Tensor& input,
    const at::Tensor& output,
    const CorrectionOptions& options = {});

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

// Turns the audit fallback on or off for ops dispatched on this thread (and
// the autograd work it starts). Returns the previous state.
bool set_alias_audit_enabled(bool enabled);
bool is_alias_audit_enabled();

// Called with the violation just before the audit fallback rethrows it from
// inside the dispatcher; it may throw something else instead (the Python
// bindings throw their own exception type, which torch's bindings would
// otherwise turn into a plain RuntimeError). nullptr restores the default.
using AliasingErrorReporter = void (*)(const AliasingError&);
void set_alias_audit_error_reporter(AliasingErrorReporter reporter);

} // namespace torch::utils
