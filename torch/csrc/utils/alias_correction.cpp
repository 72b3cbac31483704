#include <torch/csrc/utils/alias_correction.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/VersionCounterUtils.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/placeholder_storage.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

namespace torch::utils {

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
// another argument. A wrong answer is worse than an error, so every check of
// every return runs before the first change (plan, then apply): when
// AliasingError is thrown, nothing was modified.
//
// Storage cannot be checked when the input is a placeholder and the output
// real (a nested-tensor wrapper returning views of its values buffer), or
// when either side has no storage (sparse): those outputs only get the
// counter, as as_view would give them.

AliasingError::AliasingError(
    std::string op,
    size_t return_index,
    std::string argument,
    AliasViolation kind,
    const std::string& message)
    : c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message),
      op_(std::move(op)),
      return_index_(return_index),
      argument_(std::move(argument)),
      kind_(kind) {}

const char* alias_violation_name(AliasViolation kind) {
  switch (kind) {
    case AliasViolation::kViewCopy:
      return "view_copy";
    case AliasViolation::kViewStorage:
      return "view_storage";
    case AliasViolation::kViewVersionCounter:
      return "view_version_counter";
    case AliasViolation::kViewInnerCopy:
      return "view_inner_copy";
    case AliasViolation::kWriteNotArgument:
      return "write_not_argument";
    case AliasViolation::kWriteNewMemory:
      return "write_new_memory";
    case AliasViolation::kWriteMetadata:
      return "write_metadata";
    case AliasViolation::kFreshIsArgument:
      return "fresh_is_argument";
    case AliasViolation::kFreshSharesMemory:
      return "fresh_shares_memory";
    case AliasViolation::kOtherArgument:
      return "other_argument";
    case AliasViolation::kWrongType:
      return "wrong_type";
  }
  return "unknown";
}

AliasingError::~AliasingError() = default;

} // namespace torch::utils

namespace torch::utils {

std::string OpValueRef::describe() const {
  switch (kind_) {
    case Kind::kNone:
      return "None";
    case Kind::kTensor:
      return "a Tensor";
    case Kind::kTensorList:
      return "a list of " + std::to_string(elements_.size()) + " Tensors";
    case Kind::kOther:
      return std::string("a ") + type_name_;
  }
  return "an unknown value";
}

namespace {

using torch::autograd::has_placeholder_storage;

// One return (or one element of a list return) and the argument it concerns.
struct Site {
  const SchemaAliasAnalysis& analysis;
  size_t return_index;
  std::optional<size_t> argument;
  std::optional<size_t> element = std::nullopt;

  Site with_argument(size_t index) const {
    return Site{analysis, return_index, index, element};
  }
  Site with_element(size_t index) const {
    return Site{analysis, return_index, argument, index};
  }
};

[[noreturn]] void fail(
    const Site& site,
    AliasViolation kind,
    std::string_view problem) {
  std::ostringstream message;
  message << site.analysis.op_name() << ": return " << site.return_index;
  if (site.element.has_value()) {
    message << " (list element " << *site.element << ")";
  }
  message << ' ' << problem << "\n  schema: " << site.analysis.schema_string();
  throw AliasingError(
      site.analysis.op_name(),
      site.return_index,
      site.argument.has_value() ? site.analysis.argument_name(*site.argument)
                                : std::string(),
      kind,
      message.str());
}

// "argument 'self'", for the argument the site concerns.
std::string named(const Site& site) {
  return "argument '" + site.analysis.argument_name(*site.argument) + "'";
}

bool has_real_storage(const at::Tensor& tensor) {
  return tensor.has_storage() && !has_placeholder_storage(tensor);
}

const c10::Storage& storage_of(const at::Tensor& tensor) {
  // unsafe_storage: a wrapper subclass's storage() throws by design.
  return tensor.unsafeGetTensorImpl()->unsafe_storage();
}

bool storages_alias(const at::Tensor& a, const at::Tensor& b) {
  return a.has_storage() && b.has_storage() &&
      storage_of(a).is_alias_of(storage_of(b));
}

// Calls `visit(tensor)` for each defined tensor of a value.
template <typename Visit>
void for_each_tensor(const OpValueRef& value, Visit&& visit) {
  if (value.is_tensor()) {
    visit(value.tensor());
  } else if (value.is_list()) {
    for (const at::Tensor* element : value.elements()) {
      if (element != nullptr && element->defined()) {
        visit(*element);
      }
    }
  }
}

const at::Tensor& tensor_argument(
    const Site& site,
    c10::ArrayRef<OpValueRef> args) {
  const OpValueRef& value = args[*site.argument];
  if (!value.is_tensor()) {
    fail(
        site,
        AliasViolation::kWrongType,
        "is a tensor but " + named(site) + ", which it aliases, is " +
            value.describe());
  }
  return value.tensor();
}

// The return must not be some other argument: making it alias (or replacing
// it by) the argument the schema names would modify an input of the op.
void check_not_other_argument(
    const Site& site,
    const at::Tensor& output,
    c10::ArrayRef<OpValueRef> args) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (i == *site.argument) {
      continue;
    }
    for_each_tensor(args[i], [&](const at::Tensor& input) {
      if (output.is_same(input)) {
        fail(
            site,
            AliasViolation::kOtherArgument,
            "is " + named(site.with_argument(i)) +
                ", but the schema says it aliases " + named(site));
      }
    });
  }
}

bool needs_shared_version_counter(
    const at::Tensor& input,
    const at::Tensor& output) {
  const c10::TensorImpl& in = *input.unsafeGetTensorImpl();
  const c10::TensorImpl& out = *output.unsafeGetTensorImpl();
  // Inference tensors have no counter to share; as_view skips them too.
  return c10::has_version_counter(in) && c10::has_version_counter(out) &&
      !c10::shares_version_counter(in, out);
}

struct ViewFix {
  c10::TensorImpl* output;
  const c10::TensorImpl* input;
  bool alias_storage;
  bool share_version_counter;
};

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
    const Site& site,
    const at::Tensor& input,
    const at::Tensor& output,
    c10::ArrayRef<OpValueRef> args) {
  if (output.is_same(input)) {
    return std::nullopt;
  }
  check_not_other_argument(site, output, args);
  bool alias_storage = false;
  const bool input_has_storage = input.has_storage();
  const bool output_is_placeholder = has_placeholder_storage(output);
  const bool same_storage = input_has_storage && output.has_storage() &&
      storage_of(output).is_alias_of(storage_of(input));
  if (output_is_placeholder) {
    if (!input_has_storage) {
      fail(
          site,
          AliasViolation::kViewStorage,
          "is a wrapper tensor with placeholder storage, but " + named(site) +
              " (layout " + c10::str(input.layout()) +
              ") has no storage it could share");
    }
    if (!same_storage) {
      const c10::Device from = storage_of(output).device();
      const c10::Device to = storage_of(input).device();
      if (from != to) {
        fail(
            site,
            AliasViolation::kViewStorage,
            "is a wrapper tensor on " + from.str() + " but " + named(site) +
                " keeps its storage on " + to.str() +
                ", so it cannot share that storage");
      }
      alias_storage = true;
    }
  } else if (has_real_storage(output) && has_real_storage(input)) {
    if (!same_storage) {
      fail(
          site,
          AliasViolation::kViewCopy,
          "should be a view of " + named(site) +
              " but has storage of its own: it shares no memory with its "
              "input (was the view op answered with a copy?)");
    }
  }
  const bool share = needs_shared_version_counter(input, output);
  if (!alias_storage && !share) {
    return std::nullopt;
  }
  return ViewFix{
      output.unsafeGetTensorImpl(),
      input.unsafeGetTensorImpl(),
      alias_storage,
      share};
}

void apply(const ViewFix& fix) {
  if (fix.alias_storage) {
    fix.output->set_storage_keep_dtype(fix.input->unsafe_storage());
  }
  if (fix.share_version_counter) {
    c10::share_version_counter(*fix.output, *fix.input);
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
    const Site& site,
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
    fail(
        site,
        AliasViolation::kWriteNewMemory,
        "is a new tensor that shares no memory with " + named(site) +
            ": an in-place or out= op must write into that argument and "
            "return it");
  }
  if (same_strided_metadata(output, argument)) {
    return;
  }
  c10::TensorImpl* impl = argument.unsafeGetTensorImpl();
  if (!has_placeholder_storage(argument) ||
      argument.layout() != c10::kStrided || output.layout() != c10::kStrided) {
    fail(
        site,
        AliasViolation::kWriteMetadata,
        "has sizes " + c10::str(output.sym_sizes()) + " but " + named(site) +
            " has sizes " + c10::str(argument.sym_sizes()) +
            " (or their strides, offsets or layouts differ): the op did not "
            "update the argument it claims to have written");
  }
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
    const Site& site,
    c10::ArrayRef<OpValueRef> args,
    const OpValueRef& value,
    bool is_list,
    Plan& plan) {
  if (!is_list) {
    if (value.is_none()) {
      return; // an optional return
    }
    if (!value.is_tensor()) {
      fail(
          site,
          AliasViolation::kWrongType,
          "is " + value.describe() + ", but the schema returns a Tensor");
    }
    if (auto fix = plan_view_output(
            site, tensor_argument(site, args), value.tensor(), args)) {
      plan.view_fixes.push_back(*fix);
    }
    return;
  }
  if (!value.is_list()) {
    fail(
        site,
        AliasViolation::kWrongType,
        "is " + value.describe() + ", but the schema returns a list of Tensors");
  }
  const at::Tensor& input = tensor_argument(site, args);
  const auto elements = value.elements();
  for (size_t k = 0; k < elements.size(); ++k) {
    if (elements[k] != nullptr && elements[k]->defined()) {
      if (auto fix =
              plan_view_output(site.with_element(k), input, *elements[k], args)) {
        plan.view_fixes.push_back(*fix);
      }
    }
  }
}

void plan_write_return(
    const Site& site,
    c10::ArrayRef<OpValueRef> args,
    const OpValueRef& value,
    bool is_list,
    Plan& plan) {
  if (!is_list) {
    if (!value.is_tensor()) {
      fail(
          site,
          AliasViolation::kWriteNotArgument,
          "is " + value.describe() + ", but the op writes " + named(site) +
              " and must return it");
    }
    plan_write_output(site, tensor_argument(site, args), value.tensor(), args, plan);
    return;
  }
  const OpValueRef& argument = args[*site.argument];
  if (!value.is_list() || !argument.is_list()) {
    fail(
        site,
        AliasViolation::kWrongType,
        "is " + value.describe() + " and " + named(site) + " is " +
            argument.describe() + ", but the schema says both are lists of "
            "Tensors, the one returned as the other");
  }
  const auto outputs = value.elements();
  const auto inputs = argument.elements();
  if (outputs.size() != inputs.size()) {
    fail(
        site,
        AliasViolation::kWrongType,
        "is a list of " + std::to_string(outputs.size()) + " tensors but " +
            named(site) + " is a list of " + std::to_string(inputs.size()));
  }
  for (size_t k = 0; k < outputs.size(); ++k) {
    const Site element_site = site.with_element(k);
    if (outputs[k] == nullptr || inputs[k] == nullptr ||
        !outputs[k]->defined() || !inputs[k]->defined()) {
      fail(
          element_site,
          AliasViolation::kWrongType,
          "and the matching element of " + named(site) +
              " must both be tensors");
    }
    plan_write_output(element_site, *inputs[k], *outputs[k], args, plan);
  }
}

void check_arity(
    const SchemaAliasAnalysis& analysis,
    size_t num_args,
    size_t num_rets) {
  TORCH_CHECK(
      num_args == analysis.num_arguments(),
      analysis.op_name(),
      ": expected ",
      analysis.num_arguments(),
      " arguments (all of the schema's, in order), got ",
      num_args);
  TORCH_CHECK(
      num_rets == analysis.returns().size(),
      analysis.op_name(),
      ": expected ",
      analysis.returns().size(),
      " returns, got ",
      num_rets);
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

const char* ivalue_type_name(const c10::IValue& value) {
  if (value.isInt() || value.isSymInt()) {
    return "int";
  }
  if (value.isDouble() || value.isSymFloat()) {
    return "float";
  }
  if (value.isBool() || value.isSymBool()) {
    return "bool";
  }
  if (value.isString()) {
    return "str";
  }
  if (value.isList()) {
    return "list";
  }
  if (value.isTuple()) {
    return "tuple";
  }
  if (value.isGenerator()) {
    return "Generator";
  }
  return "non-tensor value";
}

// OpValueRefs over a stack's IValues; owns the element arrays of lists.
class BorrowedIValues {
 public:
  explicit BorrowedIValues(c10::ArrayRef<c10::IValue> values) {
    refs_.reserve(values.size());
    for (const c10::IValue& value : values) {
      refs_.push_back(borrow(value));
    }
  }
  c10::ArrayRef<OpValueRef> refs() const {
    return refs_;
  }

 private:
  OpValueRef borrow(const c10::IValue& value) {
    if (value.isTensor()) {
      return OpValueRef(value.toTensor());
    }
    if (value.isNone()) {
      return OpValueRef();
    }
    if (!value.isList()) {
      return OpValueRef::other(ivalue_type_name(value));
    }
    const auto elements = value.toListRef();
    std::vector<const at::Tensor*> tensors;
    tensors.reserve(elements.size());
    for (const c10::IValue& element : elements) {
      if (element.isTensor()) {
        tensors.push_back(&element.toTensor());
      } else if (element.isNone()) {
        tensors.push_back(nullptr);
      } else {
        return OpValueRef::other("list");
      }
    }
    // Moving the vector keeps its buffer, which the ref points into.
    lists_.push_back(std::move(tensors));
    return OpValueRef::list(lists_.back());
  }

  c10::SmallVector<OpValueRef, 8> refs_;
  std::vector<std::vector<const at::Tensor*>> lists_;
};

} // namespace

void throw_aliasing_error(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    std::optional<size_t> argument,
    AliasViolation kind,
    std::string_view problem) {
  fail(Site{analysis, return_index, argument}, kind, problem);
}

void correct_aliasing_borrowed(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<OpValueRef> args,
    c10::ArrayRef<OpValueRef> rets) {
  check_arity(analysis, args.size(), rets.size());
  if (!analysis.has_aliasing_returns()) {
    return;
  }
  Plan plan;
  const auto& returns = analysis.returns();
  for (size_t i = 0; i < returns.size(); ++i) {
    const ReturnAlias& alias = returns[i];
    const Site site{analysis, i, alias.argument};
    if (alias.kind == ReturnAliasKind::kView) {
      plan_view_return(site, args, rets[i], alias.is_list, plan);
    } else if (alias.kind == ReturnAliasKind::kWrite) {
      plan_write_return(site, args, rets[i], alias.is_list, plan);
    }
  }
  apply(plan);
}

void correct_view_return(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    const at::Tensor& input,
    const at::Tensor& output) {
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
          Site{analysis, return_index, alias.argument}, input, output, {})) {
    apply(*fix);
  }
}

void correct_aliasing(
    const SchemaAliasAnalysis& analysis,
    c10::ArrayRef<c10::IValue> args,
    torch::jit::Stack& rets) {
  {
    const BorrowedIValues arg_refs(args);
    const BorrowedIValues ret_refs(rets);
    correct_aliasing_borrowed(analysis, arg_refs.refs(), ret_refs.refs());
  }
  const auto& returns = analysis.returns();
  for (size_t i = 0; i < returns.size(); ++i) {
    if (returns[i].is_write()) {
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
// kernels return their empty input for fresh returns).
//
// Note [What the audit leaves alone]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Code that keeps its schema's promises on its own terms must not be
// reported:
//   * ops whose unannotated returns share memory by design:
//     aten::_unsafe_view and the unsafe_split family (views that autograd is
//     told not to track), and c10d's collectives, which return the tensors
//     they were given (the schemas carry no write annotation);
//   * functorch's and functionalization's wrappers (vmap's batched tensors,
//     grad's wrappers, functionalize's tensors): they have no storage of
//     their own and keep aliasing inside, one level down, where the audit
//     sees the ops again;
//   * pairs of tensors of which exactly one lives on meta: tracing
//     infrastructure (FakeTensorMode's lift_fresh of a real tensor) hands
//     back fake tensors, whose storage cannot be compared with real memory.
// Tracing infrastructure in Python (fake, proxy and functional modes and
// tensors) is recognised by the Python bindings' reporter, which knows which
// classes are infrastructure (see aliasguard/_aliasing.py).

namespace {

constexpr c10::DispatchKey kAuditKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

std::atomic<AliasingErrorReporter> audit_error_reporter{nullptr};

// See Note [What the audit leaves alone].
bool returns_alias_by_design(const SchemaAliasAnalysis& analysis) {
  std::string_view name = analysis.op_name();
  if (name.substr(0, 6) == "c10d::") {
    return true;
  }
  name = name.substr(0, name.find('.'));
  return name == "aten::_unsafe_view" || name == "aten::unsafe_split" ||
      name == "aten::unsafe_chunk" || name == "aten::unsafe_split_with_sizes";
}

bool is_functorch_wrapper(const at::Tensor& tensor) {
  static const c10::DispatchKeySet wrapper_keys({
      c10::DispatchKey::FuncTorchBatched,
      c10::DispatchKey::BatchedNestedTensor,
      c10::DispatchKey::FuncTorchGradWrapper,
      c10::DispatchKey::Functionalize,
  });
  return tensor.key_set().has_any(wrapper_keys);
}

bool has_meta_storage(const at::Tensor& tensor) {
  return tensor.has_storage() && storage_of(tensor).device().is_meta();
}

// Whether the aliasing of `output` to `input` can be judged at all.
bool comparable(const at::Tensor& input, const at::Tensor& output) {
  return !is_functorch_wrapper(input) && !is_functorch_wrapper(output) &&
      has_meta_storage(input) == has_meta_storage(output);
}

void audit_fresh_output(
    const Site& site,
    const at::Tensor& output,
    c10::ArrayRef<OpValueRef> args) {
  if (!output.has_storage() || storage_of(output).nbytes() == 0) {
    return;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    for_each_tensor(args[i], [&](const at::Tensor& input) {
      const Site argument_site = site.with_argument(i);
      if (!comparable(input, output)) {
        return;
      }
      if (output.is_same(input)) {
        fail(
            argument_site,
            AliasViolation::kFreshIsArgument,
            "is " + named(argument_site) +
                " itself, but the schema says it is a new tensor (no alias "
                "annotation)");
      }
      if (storages_alias(output, input)) {
        fail(
            argument_site,
            AliasViolation::kFreshSharesMemory,
            "shares memory with " + named(argument_site) +
                ", but the schema says it is a new tensor (no alias "
                "annotation)");
      }
    });
  }
}

void audit_view_output(
    const Site& site,
    const at::Tensor& input,
    const at::Tensor& output,
    bool views_share_version_counter) {
  if (output.is_same(input) || !comparable(input, output)) {
    return;
  }
  // A real output of a placeholder input (a wrapper returning views of its
  // inner tensors) cannot be checked; everything else with storage can.
  const bool checkable = output.has_storage() && input.has_storage() &&
      !(has_placeholder_storage(input) && has_real_storage(output));
  if (checkable && !storages_alias(output, input)) {
    fail(
        site,
        has_placeholder_storage(output) ? AliasViolation::kViewStorage
                                        : AliasViolation::kViewCopy,
        "does not share the storage of " + named(site) +
            ", of which the schema says it is a view");
  }
  if (views_share_version_counter &&
      needs_shared_version_counter(input, output)) {
    fail(
        site,
        AliasViolation::kViewVersionCounter,
        "is a view of " + named(site) +
            " with a version counter of its own: an in-place change through "
            "one is invisible to autograd and to caches through the other");
  }
}

void audit_write_output(
    const Site& site,
    const at::Tensor* argument,
    const at::Tensor& output) {
  if (argument != nullptr && !comparable(*argument, output)) {
    return;
  }
  if (argument == nullptr || !output.is_same(*argument)) {
    fail(
        site,
        argument != nullptr && has_real_storage(output) &&
                has_real_storage(*argument) && !storages_alias(output, *argument)
            ? AliasViolation::kWriteNewMemory
            : AliasViolation::kWriteNotArgument,
        "is not " + named(site) +
            " itself: an in-place or out= op must return the tensor it "
            "wrote");
  }
}

void audit_return(
    const Site& site,
    const ReturnAlias& alias,
    c10::ArrayRef<OpValueRef> args,
    const OpValueRef& value,
    bool views_share_version_counter) {
  const at::Tensor* single = value.is_tensor() ? &value.tensor() : nullptr;
  const auto outputs = value.is_list()
      ? value.elements()
      : c10::ArrayRef<const at::Tensor*>(single != nullptr ? &single : nullptr,
                                         single != nullptr ? 1 : 0);
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (outputs[k] == nullptr || !outputs[k]->defined()) {
      continue;
    }
    const at::Tensor& output = *outputs[k];
    const Site element_site = value.is_list() ? site.with_element(k) : site;
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
        } else if (alias.is_list && argument.is_list() &&
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

bool has_tensor_inputs(c10::ArrayRef<c10::IValue> args) {
  for (const c10::IValue& value : args) {
    if (value.isTensor()) {
      return true;
    }
    if (value.isList()) {
      for (const c10::IValue& element : value.toListRef()) {
        if (element.isTensor()) {
          return true;
        }
      }
    }
  }
  return false;
}

void audit_fallback(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet dispatch_keys,
    torch::jit::Stack* stack) {
  const c10::DispatchKeySet below = dispatch_keys &
      c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kAuditKey);
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const c10::ArrayRef<c10::IValue> inputs(
      stack->data() + stack->size() - num_args, num_args);
  // See Note [Alias audit] for the skipped ops.
  if (!has_tensor_inputs(inputs) ||
      op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
    op.redispatchBoxed(below, stack);
    return;
  }
  // The op pops its arguments; keep them to check the results against.
  const c10::SmallVector<c10::IValue, 8> args(inputs.begin(), inputs.end());
  const std::shared_ptr<const SchemaAliasAnalysis> analysis =
      schema_alias_analysis(op);
  const ReportedViolationMark mark = reported_violation_mark();
  op.redispatchBoxed(below, stack);
  const size_t num_rets = schema.returns().size();
  const c10::ArrayRef<c10::IValue> rets(
      stack->data() + stack->size() - num_rets, num_rets);
  try {
    audit_aliasing(
        *analysis, args, rets, below.has(c10::DispatchKey::ADInplaceOrView));
  } catch (const AliasingError& error) {
    // See Note [One report per op call].
    if (reported_violation_since(mark, *analysis)) {
      return;
    }
    AliasingErrorReporter reporter = audit_error_reporter.load();
    if (reporter != nullptr && reporter(error, args)) {
      note_reported_violation(*analysis);
      return;
    }
    throw;
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
        Site{analysis, i, alias.aliased_argument()},
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

void audit_inner_view(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    size_t argument,
    const std::string& inner_name,
    const at::Tensor& inner_output,
    c10::ArrayRef<at::Tensor> inner_inputs) {
  // See Note [Inner tensors of traceable wrappers].
  if (!inner_output.defined() || !inner_output.has_storage() ||
      storage_of(inner_output).nbytes() == 0) {
    return;
  }
  for (const at::Tensor& input : inner_inputs) {
    if (!input.defined()) {
      continue;
    }
    // Aliasing found, or a pair that cannot be judged: nothing to report.
    if (!comparable(input, inner_output) || inner_output.is_same(input) ||
        storages_alias(inner_output, input)) {
      return;
    }
  }
  const Site site{analysis, return_index, argument};
  fail(
      site,
      AliasViolation::kViewInnerCopy,
      "is a wrapper whose inner tensor '" + inner_name +
          "' shares no memory with the inner tensors of " + named(site) +
          ", of which the schema says it is a view: writes through the view "
          "never reach the input's data");
}

// Note [Audit lifetime]
// ~~~~~~~~~~~~~~~~~~~~~
// The fallback is registered only while some thread has an audit scope open:
// TESTING_ONLY_GenericMode is borrowed, and others (torch's own tests) use
// it too. A process-wide count of open scopes registers it on 0 -> 1 and
// removes it on 1 -> 0; a per-thread depth includes the key in the thread's
// TLS while the thread has a scope open. Registering updates every
// operator's dispatch table (~17 ms), so a test runner that audits test
// after test retains the registration for its whole session. Counting
// rather than saving and
// restoring the previous state makes scopes that end out of order (two
// context managers entered A, B and exited A, B) leave the thread as it was.
// The registration handle is leaked on purpose: the dispatcher may be gone
// by the time static destructors run.

namespace {

struct AuditRegistration {
  std::mutex mutex;
  size_t scopes = 0;
  std::optional<c10::RegistrationHandleRAII> handle;
};

AuditRegistration& audit_registration() {
  static auto* registration = new AuditRegistration();
  return *registration;
}

thread_local size_t audit_depth = 0;

thread_local uint64_t reported_epoch = 0;
thread_local const SchemaAliasAnalysis* reported_op = nullptr;

} // namespace

void retain_alias_audit_fallback() {
  AuditRegistration& registration = audit_registration();
  const std::lock_guard<std::mutex> lock(registration.mutex);
  if (registration.scopes == 0) {
    c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
    TORCH_CHECK(
        !dispatcher.hasBackendFallbackForDispatchKey(kAuditKey),
        "aliasguard.audit(): the dispatch key ",
        kAuditKey,
        ", which the audit borrows (stock PyTorch has no free key above "
        "autograd), already has a fallback registered by someone else; "
        "remove that registration before auditing");
    registration.handle.emplace(dispatcher.registerFallback(
        kAuditKey,
        c10::KernelFunction::makeFromBoxedFunction<&audit_fallback>(),
        "aliasguard alias audit (torch/csrc/utils/alias_correction.cpp)"));
  }
  ++registration.scopes;
}

void release_alias_audit_fallback() {
  AuditRegistration& registration = audit_registration();
  const std::lock_guard<std::mutex> lock(registration.mutex);
  TORCH_CHECK(
      registration.scopes > 0,
      "aliasguard.audit(): the audit fallback is not retained");
  if (--registration.scopes == 0) {
    registration.handle.reset();
  }
}

void enter_alias_audit() {
  retain_alias_audit_fallback();
  if (audit_depth++ == 0) {
    c10::impl::tls_set_dispatch_key_included(kAuditKey, true);
  }
}

void exit_alias_audit() {
  TORCH_CHECK(
      audit_depth > 0,
      "aliasguard.audit(): no audit scope is open on this thread");
  if (--audit_depth == 0) {
    c10::impl::tls_set_dispatch_key_included(kAuditKey, false);
  }
  release_alias_audit_fallback();
}

size_t alias_audit_depth() {
  return audit_depth;
}

size_t alias_audit_scopes() {
  AuditRegistration& registration = audit_registration();
  const std::lock_guard<std::mutex> lock(registration.mutex);
  return registration.scopes;
}

bool is_alias_audit_enabled() {
  return c10::impl::tls_is_dispatch_key_included(kAuditKey);
}

void set_alias_audit_error_reporter(AliasingErrorReporter reporter) {
  audit_error_reporter.store(reporter);
}

ReportedViolationMark reported_violation_mark() {
  return ReportedViolationMark{reported_epoch};
}

void note_reported_violation(const SchemaAliasAnalysis& analysis) {
  ++reported_epoch;
  reported_op = &analysis;
}

bool reported_violation_since(
    const ReportedViolationMark& mark,
    const SchemaAliasAnalysis& analysis) {
  return reported_epoch != mark.epoch && reported_op == &analysis;
}

} // namespace torch::utils
