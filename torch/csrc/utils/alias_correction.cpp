#include <torch/csrc/utils/alias_correction.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/VersionCounterUtils.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/storage_alias.h>
#include <torch/csrc/utils/torch_internals.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace aliasguard::utils {

// Note [Alias correction after __torch_dispatch__]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Above the Python key, autograd trusts an op's schema: ADInplaceOrView makes
// a view return share its base's version counter and returns the argument of
// an in-place op. Below it, what comes back is whatever __torch_dispatch__
// built, and three things go wrong silently:
//   * a wrapper subclass (_make_wrapper_subclass) answers a view op with a
//     new wrapper whose storage is a placeholder of its own, so storage-based
//     alias analysis (untyped_storage(), AOTAutograd, functionalization)
//     concludes it aliases nothing;
//   * any view made below autograd gets a fresh version counter, so an
//     in-place op through the input is invisible through the output (and to
//     a mode that cached the output: selective checkpointing);
//   * an in-place or out= op is answered with a new tensor, so the caller's
//     argument object is not what comes back.
// correct_aliasing repairs what can be repaired without guessing: a
// placeholder output takes its input's storage (set_storage_keep_dtype, which
// keeps its sizes, strides and offset, as upstream's
// return_and_correct_aliasing does), every view output shares its input's
// counter (the below-autograd counterpart of as_view), a write return is
// replaced by its argument (updating a wrapper argument's sizes and strides
// when an in-place view op such as t_ changed them). What cannot be repaired
// without inventing an answer is an error: a view answered with a tensor that
// owns different memory, a write answered with new memory, a return that is
// another argument. See Note [What a write return may be] and
// Note [Results of the wrong type are torch's to report]. A wrong answer is
// worse than an error, so every check of every return runs before the first
// change (plan, then apply): when AliasingError is thrown, nothing was
// modified.
//
// Note [What correction refuses]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Automatic correction runs after every __torch_dispatch__ in the process, so
// it must never turn a result that stock torch handles into an error: it
// repairs what it can, leaves alone what it cannot repair, and refuses only a
// result that would otherwise give a wrong answer. A wrapper output whose
// placeholder storage cannot become its input's (another device: a fake
// tensor's storage is on meta while the wrapper says cpu; out of bounds; a
// layout without strides) keeps its placeholder, as in stock, and still gets
// the counter: nothing is lost that stock had, and audit() reports it. A
// returned view that carries another tensor's view metadata but lives in the
// input's memory (a body that answers a view op on `.data`, or on any other
// alias of the input) is repaired: its metadata is dropped and it takes the
// input's counter. What stays an error is memory that is not the input's:
// a view answered with a copy, a view of an unrelated tensor, a write
// answered with new memory, a return that is another argument. The explicit
// correct_aliasing() (CorrectionOptions::strict) also refuses the wrapper
// that cannot take its input's storage: its caller asked for exactly that.
//
// Storage cannot be checked when the input is a placeholder and the output
// real (a nested-tensor wrapper returning views of its values buffer), or
// when either side has no storage (sparse): those outputs only get the
// counter, as as_view would give them.

// Note [Views returned from below autograd]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The question left open upstream: what should the ADInplaceOrView kernel of
// a view op do when the code below it (a __torch_dispatch__ that tracks views,
// see Note [Tracked __torch_dispatch__ bodies]) already returns a view, with
// autograd view metadata? Stock's as_view refuses it ("Attempted to make a
// tensor into a differentiable view, but the tensor already had autograd
// metadata"). Our answer: the kernel above has the final word, because it
// alone sees the op as autograd does (grad mode, creation meta, forward AD,
// the op's own view_fn). So the metadata made below is checked, then dropped,
// and the kernel marks the tensor afresh (CorrectionOptions::
// outer_kernel_marks_views says it will):
//   * a view made below autograd (no grad_fn: one made above belongs to a
//     graph and keeps its metadata, so stock's error stays) whose version
//     counter is its input's is a view of the input's
//     alias group: dropping its metadata keeps storage, geometry and counter,
//     and the kernel makes it a view of the input again, with the same _base.
//     It stays the same tensor object, so a body that kept the view it
//     returned (a cache) holds the marked view, not a stale twin; a fresh
//     alias would have left the cache holding a view the kernel never saw;
//   * a view whose counter is another tensor's is a view of something other
//     than the op's input: no marking can make it both, so it is an
//     AliasingError, raised before anything changed (plan, then apply);
//   * a wrapper output (placeholder storage) built in a tracked body may
//     require grad only because its inner tensors are now real views of inner
//     tensors that require grad (TwoTensor copies requires_grad from them).
//     A leaf flag and nothing else (no grad, grad_fn or hook) is dropped: the
//     kernel derives requires_grad from the input, as stock does where the
//     inner views were plain aliases.
// An input with placeholder storage carries its aliasing in its inner
// tensors, so a real view of some inner buffer (a nested tensor's unbind)
// cannot be checked against it and is only re-marked. Ops without an
// ADInplaceOrView kernel are no view ops for autograd: nothing marks their
// returns, so their metadata stays, and a Tensor(a) return that is a copy
// (to, contiguous, reshape: CompositeImplicitAutograd ops that copy when they
// must, reached only from below autograd) is left alone
// (CorrectionOptions::view_may_be_a_copy). So is every wrapper (placeholder)
// return of such an op that does not already share its input's storage:
// whether the wrapper copied cannot be told from outside (a jagged tensor's
// reshape in inference mode clones a non-contiguous input), and giving a copy
// its input's storage (and counter) would make a later view of its inner
// data look like a copy of it.

// Note [A wrapper view made under an untracked body]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A body that runs untracked below autograd (view tracking off, for the
// process or its class) calls its ops with ADInplaceOrView excluded, so a
// wrapper's __torch_dispatch__ reached from there (a wrapper of wrappers; a
// mode over a wrapper) has no kernel above it to mark its view returns.
// Given its input's storage, such an output would be a wrapper that shares a
// storage without being a view, which stock never builds and torch's
// fakeification cannot rebuild: meta_utils set_()s the real wrapper class
// onto the meta storage it made for the other tensor, and dynamo fails
// ("Attempted to set the storage of a tensor on device cpu to a storage on
// different device meta") after a graph break in such a body (the
// differential harness's wrapper under torch.compile, tracking off). So it
// keeps its own placeholder, as in stock, and gets the counter; when the
// enclosing body returns it as its own view return, the enclosing
// correction, which a kernel does follow, gives it the storage. With
// tracking on the enclosing body re-enables the key, the kernel runs and
// marks the nested output, and this does not arise. Under inference mode no
// kernel above marks any view either (InferenceMode excludes ADInplaceOrView
// for the whole thread), so a wrapper output keeps its placeholder there too:
// a nested jagged tensor made in inference mode and compiled later would
// otherwise fail the same way (NestedTensorMeta has no set_).

// Note [What a write return may be]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Stock PyTorch ignores what an in-place handler returns: the autograd kernel
// of an in-place op returns `self`, whatever its redispatch produced, and
// upstream's return_and_correct_aliasing returns the argument too. Real
// handlers rely on it: torchao's copy_ ends in a bare `return` (None), and a
// handler may answer index_put_ on a real tensor with a wrapper of any shape.
// Refusing those would make aliasguard worse than stock (load_state_dict on
// every torchao-quantized model), so for a write return the argument is
// handed back whenever the returned value tells nothing that contradicts it:
// None, or a tensor whose sizes differ from an argument whose metadata cannot
// be updated (a real tensor). Only a wrapper argument takes the returned
// metadata (in-place view ops on wrappers: t_, squeeze_, as_strided_). What
// is still refused is what would be wrong to hand back: a real tensor with
// memory of its own (the argument was not written) or another argument.
// Spotting sloppy handlers is audit()'s job, not correction's.
//
// Note [Results of the wrong type are torch's to report]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A value that is not what the schema's return type allows (a str, an int,
// a tensor where a list belongs) is passed through untouched: torch converts
// every result to the schema's types right after __torch_dispatch__ and
// reports such values itself ("Unable to cast ..."), and its tests expect its
// message. None is what torch turns into an undefined tensor, so it passes
// too. The explicit correct_aliasing() is stricter: it checks types before
// correcting (python_alias_correction.cpp).

bool hands_back_argument(const ReturnAlias& alias, const OpValueRef& value) {
  if (!alias.is_write()) {
    return false;
  }
  return alias.is_list ? value.is_list() : value.is_none() || value.is_tensor();
}

namespace {

using autograd::has_placeholder_storage;
using autograd::has_real_storage;
using autograd::storage_of;
using autograd::storages_alias;

// The return must not be some other argument: making it alias (or replacing
// it by) the argument the schema names would modify an input of the op.
void check_not_other_argument(
    const AliasSite& site,
    const at::Tensor& output,
    c10::ArrayRef<OpValueRef> args) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (i == *site.argument) {
      continue;
    }
    for_each_tensor(args[i], [&](const at::Tensor& input) {
      if (output.is_same(input)) {
        throw_aliasing_error(
            site,
            AliasViolation::kOtherArgument,
            "is " + site.with_argument(i).argument_name() +
                ", but the schema says it aliases " + site.argument_name());
      }
    });
  }
}

struct ViewFix {
  c10::TensorImpl* output;
  const c10::TensorImpl* input;
  bool alias_storage;
  bool share_version_counter;
  bool drop_autograd_meta;
};

// Whether `output`'s autograd metadata must go before the outer
// ADInplaceOrView kernel marks it; throws when it is a view of some other
// tensor. See Note [Views returned from below autograd].
bool plan_drop_autograd_meta(
    const AliasSite& site,
    const at::Tensor& input,
    const at::Tensor& output,
    const CorrectionOptions& options) {
  if (!options.outer_kernel_marks_views) {
    return false;
  }
  switch (internals::autograd_meta_kind(output)) {
    case internals::AutogradMetaKind::kNone:
    case internals::AutogradMetaKind::kOther:
      return false;
    case internals::AutogradMetaKind::kBareRequiresGradLeaf:
      return options.tracked && has_placeholder_storage(output);
    case internals::AutogradMetaKind::kView:
      break;
  }
  // See Note [What correction refuses]
  if (!has_placeholder_storage(input) &&
      shares_no_version_counter(input, output) &&
      !storages_alias(output, input)) {
    throw_aliasing_error(
        site,
        AliasViolation::kViewVersionCounter,
        "is a view of another tensor, not of " + site.argument_name() +
            ": it carries autograd view metadata and that tensor's version "
            "counter (did __torch_dispatch__ return a view of something other "
            "than the op's input?)");
  }
  return true;
}

struct Restride {
  c10::TensorImpl* argument;
  std::vector<c10::SymInt> sizes;
  std::vector<c10::SymInt> strides;
  c10::SymInt storage_offset;
};

struct Plan {
  c10::SmallVector<ViewFix, 4> view_fixes;
  c10::SmallVector<Restride, 1> restrides;
};

// What making `output` a proper view of `input` takes, if anything.
std::optional<ViewFix> plan_view_output(
    const AliasSite& site,
    const at::Tensor& input,
    const at::Tensor& output,
    c10::ArrayRef<OpValueRef> args,
    const CorrectionOptions& options) {
  if (output.is_same(input)) {
    return std::nullopt;
  }
  check_not_other_argument(site, output, args);
  const bool drop_autograd_meta =
      plan_drop_autograd_meta(site, input, output, options);
  bool alias_storage = false;
  const bool input_has_storage = input.has_storage();
  const bool output_is_placeholder = has_placeholder_storage(output);
  const bool same_storage = input_has_storage && output.has_storage() &&
      storage_of(output).is_alias_of(storage_of(input));
  if (output_is_placeholder && !same_storage) {
    if (options.view_may_be_a_copy && !drop_autograd_meta) {
      return std::nullopt; // See Note [Views returned from below autograd]
    }
    if (options.strict) {
      check_storage_alias(
          site,
          AliasViolation::kViewStorage,
          output,
          input,
          "the returned wrapper",
          "is a wrapper tensor with placeholder storage that cannot share the "
          "storage of " +
              site.argument_name());
      alias_storage = true;
    } else if (!options.no_kernel_above_marks_views) {
      // See Note [What correction refuses]
      alias_storage = !autograd::storage_alias_problem(
                           output, input, {"output", "input", "storage"})
                           .has_value();
    }
  } else if (has_real_storage(output) && has_real_storage(input)) {
    if (!same_storage && options.view_may_be_a_copy) {
      return std::nullopt; // a copy, legitimately
    }
    if (!same_storage) {
      throw_aliasing_error(
          site,
          AliasViolation::kViewCopy,
          "should be a view of " + site.argument_name() +
              " but has storage of its own: it shares no memory with its "
              "input (was the view op answered with a copy?)");
    }
  }
  const bool share = shares_no_version_counter(input, output);
  if (!alias_storage && !share && !drop_autograd_meta) {
    return std::nullopt;
  }
  return ViewFix{
      output.unsafeGetTensorImpl(),
      input.unsafeGetTensorImpl(),
      alias_storage,
      share,
      drop_autograd_meta};
}

void apply(const ViewFix& fix) {
  if (fix.alias_storage) {
    fix.output->set_storage_keep_dtype(fix.input->unsafe_storage());
  }
  if (fix.share_version_counter) {
    share_version_counter(*fix.output, *fix.input);
  }
  if (fix.drop_autograd_meta) {
    fix.output->set_autograd_meta(nullptr);
  }
}

bool same_strided_metadata(const at::Tensor& a, const at::Tensor& b) {
  if (a.layout() != b.layout() || !a.sym_sizes().equals(b.sym_sizes())) {
    return false;
  }
  if (a.layout() != c10::kStrided) {
    return true;
  }
  return a.sym_strides().equals(b.sym_strides()) &&
      a.sym_storage_offset() == b.sym_storage_offset();
}

void plan_write_output(
    const AliasSite& site,
    const at::Tensor& argument,
    const at::Tensor& output,
    c10::ArrayRef<OpValueRef> args,
    Plan& plan) {
  if (output.is_same(argument)) {
    return;
  }
  check_not_other_argument(site, output, args);
  if (has_real_storage(output) && has_real_storage(argument) &&
      !storages_alias(output, argument)) {
    throw_aliasing_error(
        site,
        AliasViolation::kWriteNewMemory,
        "is a new tensor that shares no memory with " + site.argument_name() +
            ": an in-place or out= op must write into that argument and "
            "return it");
  }
  if (same_strided_metadata(output, argument)) {
    return;
  }
  if (!has_placeholder_storage(argument) ||
      argument.layout() != c10::kStrided || output.layout() != c10::kStrided) {
    // The argument's metadata is its own (a real tensor) or cannot be set
    // from the output's: it is handed back as it is, as stock does.
    // See Note [What a write return may be]
    return;
  }
  c10::TensorImpl* impl = argument.unsafeGetTensorImpl();
  // An in-place view op (t_, squeeze_, as_strided_, ...) on a wrapper: the
  // dispatch computed the new metadata on the wrapper it returned; the
  // argument, which is what the caller gets back, must carry it.
  plan.restrides.push_back(
      {impl,
       output.sym_sizes().vec(),
       output.sym_strides().vec(),
       output.sym_storage_offset()});
}

void plan_view_return(
    const AliasSite& site,
    c10::ArrayRef<OpValueRef> args,
    const OpValueRef& value,
    bool is_list,
    const CorrectionOptions& options,
    Plan& plan) {
  if (!is_list) {
    if (!value.is_tensor()) {
      // None (an optional return, or torch's undefined tensor) or a value of
      // the wrong type. See Note [Results of the wrong type are torch's to
      // report]
      return;
    }
    if (auto fix = plan_view_output(
            site, tensor_argument(site, args), value.tensor(), args, options)) {
      plan.view_fixes.push_back(*fix);
    }
    return;
  }
  if (!value.is_list()) {
    return; // See Note [Results of the wrong type are torch's to report]
  }
  const at::Tensor& input = tensor_argument(site, args);
  const auto elements = value.elements();
  for (size_t k = 0; k < elements.size(); ++k) {
    if (elements[k] != nullptr && elements[k]->defined()) {
      if (auto fix = plan_view_output(
              site.with_element(k), input, *elements[k], args, options)) {
        plan.view_fixes.push_back(*fix);
      }
    }
  }
}

void plan_write_return(
    const AliasSite& site,
    c10::ArrayRef<OpValueRef> args,
    const OpValueRef& value,
    bool is_list,
    Plan& plan) {
  if (!is_list) {
    if (!value.is_tensor()) {
      // None: the argument is handed back (See Note [What a write return may
      // be]); anything else is left to torch (See Note [Results of the wrong
      // type are torch's to report]).
      return;
    }
    plan_write_output(
        site, tensor_argument(site, args), value.tensor(), args, plan);
    return;
  }
  const OpValueRef& argument = args[*site.argument];
  if (!value.is_list()) {
    return; // See Note [Results of the wrong type are torch's to report]
  }
  if (!argument.is_list()) {
    throw_aliasing_error(
        site,
        AliasViolation::kWrongType,
        "is " + value.describe() + " and " + site.argument_name() + " is " +
            argument.describe() +
            ", but the schema says both are lists of "
            "Tensors, the one returned as the other");
  }
  const auto outputs = value.elements();
  const auto inputs = argument.elements();
  for (size_t k = 0; k < outputs.size(); ++k) {
    const at::Tensor* output = outputs[k];
    if (output == nullptr || !output->defined()) {
      continue; // the argument list is handed back whole
    }
    const AliasSite element_site = site.with_element(k);
    if (outputs.size() == inputs.size() && inputs[k] != nullptr &&
        inputs[k]->defined()) {
      plan_write_output(element_site, *inputs[k], *output, args, plan);
    } else {
      check_not_other_argument(element_site, *output, args);
    }
  }
}

void apply(const Plan& plan) {
  // Restrides first: set_sizes_and_strides is the one step that can still
  // refuse (a wrapper whose sizes Python customizes); nothing else has
  // changed by then.
  for (const Restride& restride : plan.restrides) {
    restride.argument->set_sizes_and_strides(
        restride.sizes, restride.strides, restride.storage_offset);
  }
  for (const ViewFix& fix : plan.view_fixes) {
    apply(fix);
  }
}

} // namespace

ALIASGUARD_HOT void correct_aliasing_borrowed(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<OpValueRef> args,
    c10::ArrayRef<OpValueRef> rets,
    const CorrectionOptions& options) {
  check_arity(analysis, args.size(), rets.size());
  if (!analysis.has_aliasing_returns()) {
    return;
  }
  Plan plan;
  const auto& returns = analysis.returns();
  for (size_t i = 0; i < returns.size(); ++i) {
    const ReturnAlias& alias = returns[i];
    const AliasSite site{analysis, i, alias.argument};
    if (alias.kind == ReturnAliasKind::kView) {
      plan_view_return(site, args, rets[i], alias.is_list, options, plan);
    } else if (alias.kind == ReturnAliasKind::kWrite) {
      plan_write_return(site, args, rets[i], alias.is_list, plan);
    }
  }
  apply(plan);
}

ALIASGUARD_HOT void correct_view_return(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    const at::Tensor& input,
    const at::Tensor& output,
    const CorrectionOptions& options) {
  const ReturnAlias& alias = analysis.returns().at(return_index);
  TORCH_CHECK(
      alias.kind == ReturnAliasKind::kView && !alias.is_list &&
          analysis.sole_tensor_argument() == alias.argument,
      analysis.op_name(),
      ": correct_view_return() needs a tensor view return of the op's only "
      "tensor argument");
  if (!output.defined()) {
    return;
  }
  // No other tensor argument exists, so none can be the output.
  if (auto fix = plan_view_output(
          AliasSite{analysis, return_index, alias.argument},
          input,
          output,
          {},
          options)) {
    apply(*fix);
  }
}

void correct_aliasing(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<c10::IValue> args,
    torch::jit::Stack& rets) {
  const auto& returns = analysis.returns();
  c10::SmallVector<bool, 4> hand_back;
  {
    const BorrowedIValues arg_refs(args);
    const BorrowedIValues ret_refs(rets);
    // An explicit call from C++: see Note [What correction refuses].
    CorrectionOptions options;
    options.strict = true;
    correct_aliasing_borrowed(
        analysis, arg_refs.refs(), ret_refs.refs(), options);
    for (size_t i = 0; i < returns.size(); ++i) {
      hand_back.push_back(hands_back_argument(returns[i], ret_refs.refs()[i]));
    }
  }
  for (size_t i = 0; i < returns.size(); ++i) {
    if (hand_back[i]) {
      rets[i] = args[returns[i].argument];
    }
  }
}

void correct_aliasing(
    const c10::OperatorHandle& op,
    c10::ArrayRef<c10::IValue> args,
    torch::jit::Stack& rets) {
  correct_aliasing(*schema_alias_analysis(op), args, rets);
}

void correct_aliasing(
    const c10::FunctionSchema& schema,
    c10::ArrayRef<c10::IValue> args,
    torch::jit::Stack& rets) {
  correct_aliasing(SchemaAliasAnalysis(schema), args, rets);
}

} // namespace aliasguard::utils
