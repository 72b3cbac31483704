#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/macros/AliasguardExport.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/utils/aliasing_error.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

// An op's arguments and returns as the alias checks see them, whatever holds
// them: a boxed stack (BorrowedIValues, here) or Python objects
// (python_op_values.h). The checks are written once, against OpValueRef.

namespace aliasguard::utils {

// One argument or return of an op: nothing, a tensor, a list of tensors, or
// some other value (named by its type, for errors). Borrowed, never copied:
// the checks run once per op, and copying a tensor that Python owns touches
// its PyObject's reference count.
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
  ALIASGUARD_API std::string describe() const;

 private:
  enum class Kind : uint8_t { kNone, kTensor, kTensorList, kOther };
  Kind kind_ = Kind::kNone;
  const at::Tensor* tensor_ = nullptr;
  c10::ArrayRef<const at::Tensor*> elements_;
  const char* type_name_ = nullptr;
};

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

// The tensor passed for the argument `site` concerns; AliasingError when it
// is not a tensor.
const at::Tensor& tensor_argument(
    const AliasSite& site,
    c10::ArrayRef<OpValueRef> args);

// Throws the AliasingError "<op>: return <i> <what>: <why>" unless
// `output` (called `output_name` in <why>) may use the storage of the tensor
// argument `input` that `site` concerns. See Note [May a tensor alias a
// storage].
void check_storage_alias(
    const AliasSite& site,
    const at::Tensor& output,
    const at::Tensor& input,
    std::string_view output_name,
    std::string_view what);

// c10::Error unless there are as many arguments and returns as the schema has.
void check_arity(
    const SchemaAliasAnalysis& analysis,
    size_t num_args,
    size_t num_rets);

// OpValueRefs over a stack's IValues; owns the element arrays of lists.
class BorrowedIValues {
 public:
  explicit BorrowedIValues(c10::ArrayRef<c10::IValue> values);
  c10::ArrayRef<OpValueRef> refs() const {
    return refs_;
  }

 private:
  OpValueRef borrow(const c10::IValue& value);

  c10::SmallVector<OpValueRef, 8> refs_;
  std::vector<std::vector<const at::Tensor*>> lists_;
};

} // namespace aliasguard::utils
