#include <torch/csrc/utils/alias_audit.h>

#include <c10/core/VersionCounterUtils.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/storage_alias.h>
#include <torch/csrc/utils/torch_internals.h>

#include <atomic>
#include <optional>
#include <string>
#include <string_view>

namespace aliasguard::utils {

// Note [Alias audit]
// ~~~~~~~~~~~~~~~~~~
// The audit checks each op against its schema after it ran, changing
// nothing: fresh outputs share memory with no input, view outputs share their
// input's storage and (where autograd's view tracking ran, or alias correction
// promises it) its version counter, write outputs are their argument.
//
// It is a boxed fallback on a dispatch key enabled through the thread-local
// include set, so it sees every op of the thread (and of the autograd work the
// thread starts, which inherits the TLS). It checks the ops whose dispatch
// reaches the Python key, a tensor subclass's or a mode's __torch_dispatch__:
// that is the code autograd cannot see into and alias correction repairs.
// Kernels (C++, or Python registered with torch.library on a backend or
// autograd key) are trusted by autograd the way torch's own are, and
// PyTorch's tests register kernels that break their schema on purpose, so
// they are checked only when the scope asks for it (audit(kernels=True));
// torch.library.opcheck is the tool made for them. The key must sit above
// autograd, so that it sees the ADInplaceOrView result; see Note [The
// audit's dispatch key] for which one. Two consequences of sitting above
// autograd:
//   * CompositeImplicitAutograd ops are skipped: they decompose at the
//     autograd key into ops the audit sees one by one, and their own results
//     may legitimately ignore the schema (dropout in eval mode returns its
//     input for a fresh return);
//   * keys above the Python key are excluded inside __torch_dispatch__, so
//     ops called from there are not seen by the fallback. The Python bindings
//     audit each __torch_dispatch__ result instead, right after correcting
//     it, which covers nested modes and subclasses layer by layer.
// Empty outputs are exempt (sharing zero bytes is harmless, and native
// kernels return their empty input for fresh returns).
//
// Note [What the audit leaves alone]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Code that keeps its schema's promises on its own terms must not be
// reported:
//   * CompositeImplicitAutograd ops that a __torch_dispatch__ answers (below
//     autograd or in inference mode, where they reach the Python key before
//     decomposing): their results may ignore the schema, as the fallback's
//     note above says. A fresh return may alias (NJT answers
//     broadcast_tensors of equal shapes with its arguments), and a view
//     return that does not share its input's storage is a copy (reshape of a
//     non-contiguous input), as correction treats it (AuditAllowances);
//   * ops whose unannotated returns share memory by design:
//     aten::_unsafe_view and the unsafe_split family (views that autograd is
//     told not to track), c10d's collectives, which return the tensors
//     they were given (the schemas carry no write annotation), and the
//     functional collectives' wait_tensor, which hands back the tensor it
//     waited for;
//   * functorch's and functionalization's wrappers (vmap's batched tensors,
//     the legacy batched tensors of autograd.grad(is_grads_batched=True),
//     grad's wrappers, functionalize's tensors): they have no storage of
//     their own and keep aliasing inside, one level down, where the audit
//     sees the ops again;
//   * pairs of tensors of which exactly one lives on meta: tracing
//     infrastructure (FakeTensorMode's lift_fresh of a real tensor) hands
//     back fake tensors, whose storage cannot be compared with real memory.
// Tracing infrastructure in Python (fake, proxy and functional modes and
// tensors) is recognised by the Python reporter, which knows which classes
// are infrastructure (aliasguard/_torch_internals.py).

namespace {

// See Note [What the audit leaves alone].
bool returns_alias_by_design(const SchemaAliasAnalysis& analysis) {
  std::string_view name = analysis.op_name();
  if (name.substr(0, 6) == "c10d::") {
    return true;
  }
  name = name.substr(0, name.find('.'));
  return name == "aten::_unsafe_view" || name == "aten::unsafe_split" ||
      name == "aten::unsafe_chunk" || name == "aten::unsafe_split_with_sizes" ||
      name == "_c10d_functional::wait_tensor" ||
      name == "c10d_functional::wait_tensor";
}

bool is_functorch_wrapper(const at::Tensor& tensor) {
  static const c10::DispatchKeySet wrapper_keys({
      c10::DispatchKey::Batched, // the legacy vmap of is_grads_batched
      c10::DispatchKey::FuncTorchBatched,
      c10::DispatchKey::BatchedNestedTensor,
      c10::DispatchKey::FuncTorchGradWrapper,
      c10::DispatchKey::Functionalize,
  });
  return tensor.key_set().has_any(wrapper_keys);
}

bool has_meta_storage(const at::Tensor& tensor) {
  return tensor.has_storage() &&
      autograd::storage_of(tensor).device().is_meta();
}

// Whether the aliasing of `output` to `input` can be judged at all.
bool comparable(const at::Tensor& input, const at::Tensor& output) {
  return !is_functorch_wrapper(input) && !is_functorch_wrapper(output) &&
      has_meta_storage(input) == has_meta_storage(output);
}

// Tensors of traced code (fake tensors under dynamic shapes) have a storage
// size that is a symbol: not known to be empty, and not to be asked for as an
// integer (that raises), nor compared (that would add a guard to the trace).
bool holds_no_bytes(const at::Tensor& tensor) {
  const std::optional<int64_t> nbytes =
      autograd::storage_of(tensor).sym_nbytes().maybe_as_int();
  return nbytes.has_value() && *nbytes == 0;
}

void audit_fresh_output(
    const AliasSite& site,
    const at::Tensor& output,
    c10::ArrayRef<OpValueRef> args) {
  if (!output.has_storage() || holds_no_bytes(output)) {
    return;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    for_each_tensor(args[i], [&](const at::Tensor& input) {
      const AliasSite argument_site = site.with_argument(i);
      if (!comparable(input, output)) {
        return;
      }
      if (output.is_same(input)) {
        throw_aliasing_error(
            argument_site,
            AliasViolation::kFreshIsArgument,
            "is " + argument_site.argument_name() +
                " itself, but the schema says it is a new tensor (no alias "
                "annotation)");
      }
      if (autograd::storages_alias(output, input)) {
        throw_aliasing_error(
            argument_site,
            AliasViolation::kFreshSharesMemory,
            "shares memory with " + argument_site.argument_name() +
                ", but the schema says it is a new tensor (no alias "
                "annotation)");
      }
    });
  }
}

std::atomic<WrapperViewJudge> wrapper_view_judge{nullptr};

// See Note [Wrapper views judged by their inner tensors].
bool judged_by_inner_tensors(
    const AliasSite& site,
    const at::Tensor& input,
    const at::Tensor& output) {
  if (!autograd::has_placeholder_storage(output) ||
      !autograd::has_placeholder_storage(input)) {
    return false;
  }
  const WrapperViewJudge judge = wrapper_view_judge.load();
  return judge != nullptr && judge(site, input, output);
}

void audit_view_output(
    const AliasSite& site,
    const at::Tensor& input,
    const at::Tensor& output,
    bool views_share_version_counter,
    bool judge_wrapper_views) {
  if (output.is_same(input) || !comparable(input, output)) {
    return;
  }
  // A real output of a placeholder input (a wrapper returning views of its
  // inner tensors) cannot be checked; everything else with storage can.
  const bool checkable = output.has_storage() && input.has_storage() &&
      !(autograd::has_placeholder_storage(input) &&
        autograd::has_real_storage(output));
  if (checkable && !autograd::storages_alias(output, input) &&
      !(judge_wrapper_views && judged_by_inner_tensors(site, input, output))) {
    throw_aliasing_error(
        site,
        autograd::has_placeholder_storage(output) ? AliasViolation::kViewStorage
                                                  : AliasViolation::kViewCopy,
        "does not share the storage of " + site.argument_name() +
            ", of which the schema says it is a view");
  }
  if (checkable && autograd::has_real_storage(output) &&
      output.layout() == c10::kStrided && input.layout() == c10::kStrided) {
    // See Note [May a tensor alias a storage]: a strided view must stay
    // inside the memory it shares (a __torch_dispatch__ can build one that
    // does not). Other layouts (a jagged nested tensor over its values, on
    // either side: nt.values() is a strided view of a jagged input) do not
    // address it through sizes and strides.
    check_storage_alias(
        site,
        AliasViolation::kViewStorage,
        output,
        input,
        "the returned view",
        "is not a valid view");
  }
  if (views_share_version_counter && shares_no_version_counter(input, output)) {
    throw_aliasing_error(
        site,
        AliasViolation::kViewVersionCounter,
        "is a view of " + site.argument_name() +
            " with a version counter of its own: an in-place change through "
            "one is invisible to autograd and to caches through the other");
  }
}

void audit_write_output(
    const AliasSite& site,
    const at::Tensor* argument,
    const at::Tensor& output) {
  if (argument != nullptr && !comparable(*argument, output)) {
    return;
  }
  if (argument == nullptr || !output.is_same(*argument)) {
    throw_aliasing_error(
        site,
        argument != nullptr && autograd::has_real_storage(output) &&
                autograd::has_real_storage(*argument) &&
                !autograd::storages_alias(output, *argument)
            ? AliasViolation::kWriteNewMemory
            : AliasViolation::kWriteNotArgument,
        "is not " + site.argument_name() +
            " itself: an in-place or out= op must return the tensor it "
            "wrote");
  }
}

void audit_return(
    const AliasSite& site,
    const ReturnAlias& alias,
    c10::ArrayRef<OpValueRef> args,
    const OpValueRef& value,
    bool views_share_version_counter,
    bool judge_wrapper_views,
    AuditAllowances allowances) {
  if (alias.kind == ReturnAliasKind::kWrite && !alias.is_list &&
      !value.is_tensor()) {
    // An in-place handler ending in a bare `return`: whatever the caller
    // gets back, the handler broke the schema.
    throw_aliasing_error(
        site,
        AliasViolation::kWriteNotArgument,
        "is " + value.describe() + ", but the op writes " +
            site.argument_name() + " and must return it");
  }
  const at::Tensor* single = value.is_tensor() ? &value.tensor() : nullptr;
  const auto outputs = value.is_list()
      ? value.elements()
      : c10::ArrayRef<const at::Tensor*>(
            single != nullptr ? &single : nullptr, single != nullptr ? 1 : 0);
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (outputs[k] == nullptr || !outputs[k]->defined()) {
      continue;
    }
    const at::Tensor& output = *outputs[k];
    const AliasSite element_site =
        value.is_list() ? site.with_element(k) : site;
    switch (alias.kind) {
      case ReturnAliasKind::kFresh:
        audit_fresh_output(element_site, output, args);
        break;
      case ReturnAliasKind::kView: {
        const at::Tensor& input = tensor_argument(element_site, args);
        if (allowances.view_may_be_a_copy &&
            !autograd::storages_alias(output, input)) {
          break; // a copy, legitimately (reshape of a non-contiguous input)
        }
        audit_view_output(
            element_site,
            input,
            output,
            views_share_version_counter,
            judge_wrapper_views);
        break;
      }
      case ReturnAliasKind::kWrite: {
        const OpValueRef& argument = args[alias.argument];
        const at::Tensor* expected = nullptr;
        if (!alias.is_list && argument.is_tensor()) {
          expected = &argument.tensor();
        } else if (
            alias.is_list && argument.is_list() &&
            k < argument.elements().size()) {
          expected = argument.elements()[k];
        }
        audit_write_output(element_site, expected, output);
        break;
      }
      case ReturnAliasKind::kUnknown:
        return;
    }
  }
}

void audit_returns(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<OpValueRef> args,
    c10::ArrayRef<OpValueRef> rets,
    bool views_share_version_counter,
    bool judge_wrapper_views,
    AuditAllowances allowances) {
  check_arity(analysis, args.size(), rets.size());
  const auto& returns = analysis.returns();
  for (size_t i = 0; i < returns.size(); ++i) {
    const ReturnAlias& alias = returns[i];
    if (alias.kind == ReturnAliasKind::kUnknown ||
        (alias.kind == ReturnAliasKind::kFresh &&
         (allowances.fresh_return_may_alias ||
          returns_alias_by_design(analysis)))) {
      continue;
    }
    audit_return(
        AliasSite{analysis, i, alias.aliased_argument()},
        alias,
        args,
        rets[i],
        views_share_version_counter,
        judge_wrapper_views,
        allowances);
  }
}

bool holds_data(const InnerTensorLeaf& leaf) {
  return leaf.tensor.defined() && leaf.tensor.has_storage() &&
      !holds_no_bytes(leaf.tensor);
}

} // namespace

void audit_aliasing_borrowed(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<OpValueRef> args,
    c10::ArrayRef<OpValueRef> rets,
    bool views_share_version_counter,
    AuditAllowances allowances,
    bool judge_wrapper_views) {
  audit_returns(
      analysis,
      args,
      rets,
      views_share_version_counter,
      judge_wrapper_views,
      allowances);
}

void audit_aliasing(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<c10::IValue> args,
    c10::ArrayRef<c10::IValue> rets,
    bool views_share_version_counter,
    bool judge_wrapper_views) {
  const BorrowedIValues arg_refs(args);
  const BorrowedIValues ret_refs(rets);
  audit_returns(
      analysis,
      arg_refs.refs(),
      ret_refs.refs(),
      views_share_version_counter,
      judge_wrapper_views,
      // The fallback skips CompositeImplicitAutograd ops altogether.
      AuditAllowances{});
}

void set_wrapper_view_judge(WrapperViewJudge judge) {
  wrapper_view_judge.store(judge);
}

bool inner_views_are_audited(bool view_may_be_a_copy) {
  // Its result may copy any part of the input: no promise to check.
  return !view_may_be_a_copy;
}

void audit_inner_view(
    const AliasSite& site,
    const at::Tensor& input,
    c10::ArrayRef<InnerTensorLeaf> output_leaves,
    c10::ArrayRef<InnerTensorLeaf> input_leaves,
    bool view_may_be_a_copy) {
  // See Note [Inner tensors of traceable wrappers].
  if (!inner_views_are_audited(view_may_be_a_copy)) {
    return;
  }
  c10::SmallVector<const InnerTensorLeaf*, 4> copies;
  bool shares_data = false;
  for (const InnerTensorLeaf& leaf : output_leaves) {
    if (!holds_data(leaf)) {
      continue;
    }
    bool judged = false; // aliasing found, or a pair that cannot be judged
    for (const InnerTensorLeaf& input : input_leaves) {
      if (!input.tensor.defined()) {
        continue;
      }
      if (!comparable(input.tensor, leaf.tensor)) {
        judged = true;
      } else if (
          leaf.tensor.is_same(input.tensor) ||
          autograd::storages_alias(leaf.tensor, input.tensor)) {
        judged = true;
        shares_data = true;
      }
      if (judged) {
        break;
      }
    }
    if (!judged) {
      copies.push_back(&leaf);
    }
  }
  for (const InnerTensorLeaf* copy : copies) {
    // The copy's counter, and those of the input's inner tensors it may
    // stand for.
    std::vector<c10::VariableVersion> counters{
        copy->tensor.unsafeGetTensorImpl()->version_counter()};
    bool matched = false;
    for (const InnerTensorLeaf& input : input_leaves) {
      if (input.tensor.defined() && input.name == copy->name) {
        counters.push_back(
            input.tensor.unsafeGetTensorImpl()->version_counter());
        matched = true;
      }
    }
    for (const InnerTensorLeaf& input : input_leaves) {
      if (!matched && input.tensor.defined()) {
        counters.push_back(
            input.tensor.unsafeGetTensorImpl()->version_counter());
      }
    }
    // Inference tensors are written without counting: a divergence could
    // not be seen, so such a copy is reported now.
    bool watchable = shares_data;
    for (const c10::VariableVersion& counter : counters) {
      watchable = watchable && counter.enabled();
    }
    const std::string problem = "is a wrapper whose inner tensor '" +
        copy->name + "' shares no memory with the inner tensors of " +
        site.argument_name() + ", of which the schema says it is a view: " +
        (watchable
             ? "that copy, or the input's '" + copy->name +
                 "', was written after the view was made, and the write "
                 "does not reach the other"
             : std::string("writes through the view never reach the input's "
                           "data"));
    try {
      throw_aliasing_error(site, AliasViolation::kViewInnerCopy, problem);
    } catch (const AliasingError& error) {
      if (!watchable) {
        throw;
      }
      watch_inner_copy(error, input, copy->tensor, std::move(counters));
    }
  }
}

ALIASGUARD_HOT bool is_alias_audit_enabled() {
  return internals::is_dispatch_key_included(internals::kAuditDispatchKey);
}

AuditJudgement judge_audited_result(
    const std::optional<AliasingError>& before,
    const std::optional<AliasingError>& refusal,
    const std::optional<AliasingError>& after) {
  // See Note [Repaired or not].
  AuditJudgement judgement;
  if (refusal) {
    judgement.unrepaired = before ? before : refusal;
    judgement.raise = refusal;
    return judgement;
  }
  if (before && (!after || after->kind() != before->kind())) {
    judgement.repaired = before;
  }
  if (after) {
    judgement.unrepaired = after;
    judgement.raise = after;
  }
  return judgement;
}

} // namespace aliasguard::utils
