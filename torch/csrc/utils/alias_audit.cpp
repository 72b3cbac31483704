#include <torch/csrc/utils/alias_audit.h>

#include <c10/core/VersionCounterUtils.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/storage_alias.h>
#include <torch/csrc/utils/torch_internals.h>

#include <string>

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
// thread starts, which inherits the TLS), whatever the tensors: plain ones,
// subclasses, and the final result of every mode. The key must sit above
// autograd, so that it sees the ADInplaceOrView result; no key is free there
// in a stock build, so we borrow TESTING_ONLY_GenericMode, which stock PyTorch
// registers nothing for (an in-tree patch would add a dedicated key). Two
// consequences of sitting above autograd:
//   * CompositeImplicitAutograd ops are skipped: they decompose at the
//     autograd key into ops the audit sees one by one, and their own results
//     may legitimately ignore the schema (dropout in eval mode returns its
//     input for a fresh return);
//   * keys above the Python key are excluded inside __torch_dispatch__, so
//     ops called from there are not seen by the fallback. The Python bindings
//     audit each __torch_dispatch__ result instead, right after correcting
//     it, which covers nested modes and subclasses layer by layer.
// Empty outputs are exempt (sharing zero bytes is harmless, and native
// kernels return their empty input for fresh returns), as is
// aten::_unsafe_view, whose unannotated return aliases by design.

namespace {

bool returns_alias_by_design(const SchemaAliasAnalysis& analysis) {
  return analysis.op_name() == "aten::_unsafe_view";
}

void audit_fresh_output(
    const AliasSite& site,
    const at::Tensor& output,
    c10::ArrayRef<OpValueRef> args) {
  if (!output.has_storage() || autograd::storage_of(output).nbytes() == 0) {
    return;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    for_each_tensor(args[i], [&](const at::Tensor& input) {
      const AliasSite argument_site = site.with_argument(i);
      if (output.is_same(input)) {
        throw_aliasing_error(
            argument_site,
            "is " + argument_site.argument_name() +
                " itself, but the schema says it is a new tensor (no alias "
                "annotation)");
      }
      if (autograd::storages_alias(output, input)) {
        throw_aliasing_error(
            argument_site,
            "shares memory with " + argument_site.argument_name() +
                ", but the schema says it is a new tensor (no alias "
                "annotation)");
      }
    });
  }
}

void audit_view_output(
    const AliasSite& site,
    const at::Tensor& input,
    const at::Tensor& output,
    bool views_share_version_counter) {
  if (output.is_same(input)) {
    return;
  }
  // A real output of a placeholder input (a wrapper returning views of its
  // inner tensors) cannot be checked; everything else with storage can.
  const bool checkable = output.has_storage() && input.has_storage() &&
      !(autograd::has_placeholder_storage(input) &&
        autograd::has_real_storage(output));
  if (checkable && !autograd::storages_alias(output, input)) {
    throw_aliasing_error(
        site,
        "does not share the storage of " + site.argument_name() +
            ", of which the schema says it is a view");
  }
  if (checkable && autograd::has_real_storage(output) &&
      output.layout() == c10::kStrided) {
    // See Note [May a tensor alias a storage]: a strided view must stay
    // inside the memory it shares (a __torch_dispatch__ can build one that
    // does not). Other layouts (a jagged nested tensor over its values) do
    // not address it through sizes and strides.
    check_storage_alias(
        site, output, input, "the returned view", "is not a valid view");
  }
  if (views_share_version_counter && shares_no_version_counter(input, output)) {
    throw_aliasing_error(
        site,
        "is a view of " + site.argument_name() +
            " with a version counter of its own: an in-place change through "
            "one is invisible to autograd and to caches through the other");
  }
}

void audit_write_output(
    const AliasSite& site,
    const at::Tensor* argument,
    const at::Tensor& output) {
  if (argument == nullptr || !output.is_same(*argument)) {
    throw_aliasing_error(
        site,
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
    bool views_share_version_counter) {
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
      case ReturnAliasKind::kView:
        audit_view_output(
            element_site,
            tensor_argument(element_site, args),
            output,
            views_share_version_counter);
        break;
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

} // namespace

void audit_aliasing_borrowed(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<OpValueRef> args,
    c10::ArrayRef<OpValueRef> rets,
    bool views_share_version_counter) {
  check_arity(analysis, args.size(), rets.size());
  const auto& returns = analysis.returns();
  for (size_t i = 0; i < returns.size(); ++i) {
    const ReturnAlias& alias = returns[i];
    if (alias.kind == ReturnAliasKind::kUnknown ||
        (alias.kind == ReturnAliasKind::kFresh &&
         returns_alias_by_design(analysis))) {
      continue;
    }
    audit_return(
        AliasSite{analysis, i, alias.aliased_argument()},
        alias,
        args,
        rets[i],
        views_share_version_counter);
  }
}

void audit_aliasing(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<c10::IValue> args,
    c10::ArrayRef<c10::IValue> rets,
    bool views_share_version_counter) {
  const BorrowedIValues arg_refs(args);
  const BorrowedIValues ret_refs(rets);
  audit_aliasing_borrowed(
      analysis, arg_refs.refs(), ret_refs.refs(), views_share_version_counter);
}

bool set_alias_audit_enabled(bool enabled) {
  const bool previous =
      c10::impl::tls_is_dispatch_key_included(internals::kAuditDispatchKey);
  c10::impl::tls_set_dispatch_key_included(
      internals::kAuditDispatchKey, enabled);
  return previous;
}

bool is_alias_audit_enabled() {
  return c10::impl::tls_is_dispatch_key_included(internals::kAuditDispatchKey);
}

} // namespace aliasguard::utils
