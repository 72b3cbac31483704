#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/macros/AliasguardExport.h>

namespace c10 {
struct FunctionSchema;
struct OperatorName;
class OperatorHandle;
} // namespace c10

// What an operator's schema promises about the aliasing of its returns, read
// once per operator from the alias annotations. See
// Note [Return alias kinds].

namespace aliasguard::utils {

// Note [Return alias kinds]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// An alias annotation names an alias set: `Tensor(a) self -> Tensor(a)` says
// the return lives in the same memory as `self` (a view), `Tensor(a!)` adds
// that the op writes it (in-place and out= ops return the very argument they
// wrote). A list return `Tensor(a)[]` (split, unbind, chunk) annotates its
// elements, each a view of the argument; `Tensor[](a!)` annotates the list
// itself, returned element for element.
//
// Only annotations that name exactly one argument are actionable. A wildcard
// (`Tensor(*)`), a union (`Tensor(a|b)`: TorchScript's "may alias", e.g.
// `aten::to.prim_dtype`) or a set no single argument owns say "may alias",
// which can be neither corrected nor checked: those returns are kUnknown.
enum class ReturnAliasKind : uint8_t {
  kFresh, // `Tensor`: memory of its own
  kView, // `Tensor(a)`: aliases one argument, read-only
  kWrite, // `Tensor(a!)`: is one argument, which the op wrote
  kUnknown, // may alias something the schema does not pin down
};

ALIASGUARD_API const char* return_alias_kind_name(ReturnAliasKind kind);

struct ReturnAlias {
  ReturnAliasKind kind = ReturnAliasKind::kFresh;
  // Index in schema.arguments() of the aliased argument; kView/kWrite only.
  size_t argument = 0;
  // The return is a list of tensors (each element aliases the argument for
  // a view, or is the matching element of the argument list for a write).
  bool is_list = false;
  // The schema annotates the return at all (it may alias an argument), and
  // the annotation marks a write; kept for every kind, kUnknown included.
  bool annotated = false;
  bool annotated_write = false;
  // The return's type is optional (`Tensor(a)?`): None is a valid value.
  bool optional = false;

  bool aliases_argument() const {
    return kind == ReturnAliasKind::kView || kind == ReturnAliasKind::kWrite;
  }
  bool is_write() const {
    return kind == ReturnAliasKind::kWrite;
  }
  std::optional<size_t> aliased_argument() const {
    return aliases_argument() ? std::optional<size_t>(argument) : std::nullopt;
  }
};

class ALIASGUARD_API SchemaAliasAnalysis {
 public:
  explicit SchemaAliasAnalysis(const c10::FunctionSchema& schema);

  // "aten::add.out", or "aten::view" for the default overload.
  const std::string& op_name() const {
    return op_name_;
  }
  // The schema as written, for error messages.
  const std::string& schema_string() const {
    return schema_string_;
  }
  const std::vector<ReturnAlias>& returns() const {
    return returns_;
  }
  size_t num_arguments() const {
    return arguments_.size();
  }
  const std::string& argument_name(size_t index) const {
    return arguments_.at(index).name;
  }
  bool argument_is_kwarg_only(size_t index) const {
    return arguments_.at(index).kwarg_only;
  }
  // The op writes the argument (`Tensor(a!)`, `Tensor(a!)[]`).
  bool argument_is_written(size_t index) const {
    return arguments_.at(index).written;
  }
  // True when some return is a view of, or is, an argument: the only ops
  // alias correction has anything to do for.
  bool has_aliasing_returns() const {
    return has_view_returns_ || has_write_returns_;
  }
  bool has_view_returns() const {
    return has_view_returns_;
  }
  bool has_write_returns() const {
    return has_write_returns_;
  }
  // The indices i with argument_is_written(i), returned or not
  // (_foreach_add_, batch norm's running stats): the tensors autograd's
  // ADInplaceOrView kernel bumps. For the per-op path, which would otherwise
  // scan every argument.
  const std::vector<size_t>& written_arguments() const {
    return written_arguments_;
  }
  // The index of the op's only tensor argument, when it has exactly one and
  // no tensor lists (view, t, select, expand, ...): no return can then be
  // another argument, and callers can skip looking at the rest.
  std::optional<size_t> sole_tensor_argument() const {
    return sole_tensor_argument_;
  }

 private:
  struct ArgumentInfo {
    std::string name;
    bool kwarg_only = false;
    bool written = false;
  };

  std::string op_name_;
  std::string schema_string_;
  std::vector<ArgumentInfo> arguments_;
  std::vector<ReturnAlias> returns_;
  std::vector<size_t> written_arguments_;
  bool has_view_returns_ = false;
  bool has_write_returns_ = false;
  std::optional<size_t> sole_tensor_argument_;
};

// The analysis of a registered operator, computed on first use and cached
// (thread-safe) until the operator's schema is deregistered.
ALIASGUARD_API std::shared_ptr<const SchemaAliasAnalysis> schema_alias_analysis(
    const c10::OperatorHandle& op);

// Same, looked up by name; nullptr when no such operator has a schema.
ALIASGUARD_API std::shared_ptr<const SchemaAliasAnalysis> schema_alias_analysis(
    const c10::OperatorName& name);

// Bumped whenever a cached analysis is dropped because its operator was
// deregistered. Caches keyed by something other than the operator name (the
// Python bindings key by OpOverload object) flush when it changes.
ALIASGUARD_API uint64_t schema_alias_analysis_generation();

// Changes whenever an operator schema is registered or deregistered: what a
// cache of a question about every registered operator (which ops have an
// effect SAC keeps, say) is keyed by.
ALIASGUARD_API uint64_t operator_registrations();

} // namespace aliasguard::utils
