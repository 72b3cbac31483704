#include <torch/csrc/utils/aliasing_error.h>

#include <sstream>
#include <utility>

namespace aliasguard::utils {

AliasingError::AliasingError(
    std::string op,
    size_t return_index,
    std::string argument,
    const std::string& message)
    : c10::Error(
          {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
          message),
      op_(std::move(op)),
      return_index_(return_index),
      argument_(std::move(argument)) {}

AliasingError::~AliasingError() = default;

std::string AliasSite::argument_name() const {
  return "argument '" + analysis.argument_name(*argument) + "'";
}

void throw_aliasing_error(const AliasSite& site, std::string_view problem) {
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
      message.str());
}

void throw_aliasing_error(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    std::optional<size_t> argument,
    std::string_view problem) {
  throw_aliasing_error(AliasSite{analysis, return_index, argument}, problem);
}

} // namespace aliasguard::utils
