#include <torch/csrc/utils/op_values.h>

#include <torch/csrc/autograd/storage_alias.h>

#include <utility>

namespace aliasguard::utils {

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

const at::Tensor& tensor_argument(
    const AliasSite& site,
    c10::ArrayRef<OpValueRef> args) {
  const OpValueRef& value = args[*site.argument];
  if (!value.is_tensor()) {
    throw_aliasing_error(
        site,
        "is a tensor but " + site.argument_name() + ", which it aliases, is " +
            value.describe());
  }
  return value.tensor();
}

void check_storage_alias(
    const AliasSite& site,
    const at::Tensor& output,
    const at::Tensor& input,
    std::string_view output_name,
    std::string_view what) {
  const std::string argument = site.argument_name();
  const std::string argument_storage = "the storage of " + argument;
  if (const auto problem = autograd::storage_alias_problem(
          output,
          input,
          autograd::AliasNames{output_name, argument, argument_storage})) {
    throw_aliasing_error(site, std::string(what) + ": " + *problem);
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

namespace {

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

} // namespace

BorrowedIValues::BorrowedIValues(c10::ArrayRef<c10::IValue> values) {
  refs_.reserve(values.size());
  for (const c10::IValue& value : values) {
    refs_.push_back(borrow(value));
  }
}

OpValueRef BorrowedIValues::borrow(const c10::IValue& value) {
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

} // namespace aliasguard::utils
