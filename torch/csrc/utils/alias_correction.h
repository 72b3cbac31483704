#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/macros/AliasguardExport.h>
#include <c10/util/ArrayRef.h>
#include <torch/csrc/utils/aliasing_error.h>
#include <torch/csrc/utils/op_values.h>
#include <torch/csrc/utils/schema_alias_analysis.h>

#include <cstddef>

// Alias correction: makes what an op returned agree with what its schema
// says about aliasing, after code below autograd (a __torch_dispatch__)
// produced it. See Note [Alias correction after __torch_dispatch__].

namespace aliasguard::utils {

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
  // The explicit correct_aliasing() call: a wrapper output with placeholder
  // storage that cannot take its input's storage is an error instead of
  // being left alone. See Note [What correction refuses].
  bool strict = false;
  // No kernel above will mark the view returns (the body runs nested in an
  // untracked body below autograd, or under inference mode), so a wrapper
  // output keeps its own placeholder storage. See Note [A wrapper view made
  // under an untracked body].
  bool no_kernel_above_marks_views = false;
};

// Alias correction of one op's result, on borrowed values. `args` are the
// op's arguments in schema order (all of them), `rets` its returns. For every
// view return, a wrapper output with placeholder storage is given its
// input's storage (sizes, strides and offset kept) and every output shares
// its input's version counter; a real output that does not alias its input
// is an error. For every write return the caller hands back its argument
// (hands_back_argument; a wrapper argument takes the sizes and strides the
// returned tensor has, for in-place view ops such as t_); a returned real
// tensor with memory of its own, or another argument, is an error.
// Returns without alias annotations, and values of a type the schema does
// not allow (torch reports those), are left alone. All checks run before the
// first change: on AliasingError nothing was modified.
// See Note [What a write return may be].
ALIASGUARD_API void correct_aliasing_borrowed(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<OpValueRef> args,
    c10::ArrayRef<OpValueRef> rets,
    const CorrectionOptions& options = {});

// Whether the caller hands back the argument in place of `value`, returned
// for `alias`: a write return holding a tensor or None (a list for a list
// return). A value of another type is torch's to report and stays as it is.
ALIASGUARD_API bool hands_back_argument(
    const ReturnAlias& alias,
    const OpValueRef& value);

// The same for one view return (`return_index`, not a list) of an op whose
// only tensor argument is `input` (analysis.sole_tensor_argument()): the
// common case, without building argument lists.
ALIASGUARD_API void correct_view_return(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    const at::Tensor& input,
    const at::Tensor& output,
    const CorrectionOptions& options = {});

// Boxed form, for C++ callers holding a stack: same, strict (an explicit
// call), and write returns in `rets` are replaced by their arguments.
ALIASGUARD_API void correct_aliasing(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<c10::IValue> args,
    torch::jit::Stack& rets);
ALIASGUARD_API void correct_aliasing(
    const c10::OperatorHandle& op,
    c10::ArrayRef<c10::IValue> args,
    torch::jit::Stack& rets);
ALIASGUARD_API void correct_aliasing(
    const c10::FunctionSchema& schema,
    c10::ArrayRef<c10::IValue> args,
    torch::jit::Stack& rets);

} // namespace aliasguard::utils
