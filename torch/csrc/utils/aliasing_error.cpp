#include <torch/csrc/utils/aliasing_error.h>

#include <sstream>
#include <utility>

namespace aliasguard::utils {

AliasingError::AliasingError(
    std::string op,
    size_t return_index,
    std::string argument,
    AliasViolation kind,
    const std::string& message)
    : c10::Error(
          {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
          message),
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

std::string AliasSite::argument_name() const {
  return "argument '" + analysis.argument_name(*argument) + "'";
}

void throw_aliasing_error(
    const AliasSite& site,
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

void throw_aliasing_error(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    std::optional<size_t> argument,
    AliasViolation kind,
    std::string_view problem) {
  throw_aliasing_error(
      AliasSite{analysis, return_index, argument}, kind, problem);
}

} // namespace aliasguard::utils
