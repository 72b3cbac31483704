#pragma once

#include <c10/macros/AliasguardExport.h>
#include <c10/util/Exception.h>
#include <torch/csrc/utils/schema_alias_analysis.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

// The one error type of alias correction and the audit, and the one format
// of its messages.

namespace aliasguard::utils {

// A return that cannot be made to alias what its schema says it aliases, or
// (audit) one that breaks the schema. Names the op, the return and the
// argument; nothing was modified when correct_aliasing throws it.
class ALIASGUARD_API AliasingError : public c10::Error {
 public:
  AliasingError(
      std::string op,
      size_t return_index,
      std::string argument,
      const std::string& message);
  ~AliasingError() override;

  const std::string& op() const {
    return op_;
  }
  size_t return_index() const {
    return return_index_;
  }
  // The argument involved, or "" when the problem concerns the return alone.
  const std::string& argument() const {
    return argument_;
  }

 private:
  std::string op_;
  size_t return_index_;
  std::string argument_;
};

// One return (or one element of a list return) of an op and the argument it
// concerns: where a check failed.
struct AliasSite {
  const SchemaAliasAnalysis& analysis;
  size_t return_index;
  std::optional<size_t> argument;
  std::optional<size_t> element = std::nullopt;

  AliasSite with_argument(size_t index) const {
    return AliasSite{analysis, return_index, index, element};
  }
  AliasSite with_element(size_t index) const {
    return AliasSite{analysis, return_index, argument, index};
  }
  // "argument 'self'", for the argument the site concerns.
  std::string argument_name() const;
};

// Throws the AliasingError for `problem` at `site`, in the format every
// check uses: "<op>: return <i> [(list element <k>)] <problem>" followed by
// the schema.
[[noreturn]] ALIASGUARD_API void throw_aliasing_error(
    const AliasSite& site,
    std::string_view problem);

// The same, for callers without a site.
[[noreturn]] ALIASGUARD_API void throw_aliasing_error(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    std::optional<size_t> argument,
    std::string_view problem);

} // namespace aliasguard::utils
