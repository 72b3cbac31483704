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

// Note [Kinds of aliasing violations]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every way a __torch_dispatch__ (or a kernel) can break its schema's alias
// promises, one value each, so that a report can group violations and say,
// once per kind, what the schema promises and what to change. The kind is
// decided where the violation is found, never recovered from the message.
enum class AliasViolation : uint8_t {
  kViewCopy, // a view return that owns memory of its own (answered by a copy)
  kViewStorage, // a view return whose storage is not its input's (a wrapper's
                // placeholder, or memory it cannot share)
  kViewVersionCounter, // a view return with a version counter of its own
  kViewInnerCopy, // a traceable wrapper view whose inner tensors do not alias
                  // the input's inner tensors
  kWriteNotArgument, // an in-place/out= return that is not the argument
  kWriteNewMemory, // an in-place/out= return with memory of its own
  kWriteMetadata, // an in-place/out= return shaped unlike its argument
  kFreshIsArgument, // an unannotated return that is an argument itself
  kFreshSharesMemory, // an unannotated return sharing memory with an argument
  kOtherArgument, // a return that is an argument the schema does not name
  kWrongType, // a return (or argument) of a type the schema does not declare
};
constexpr AliasViolation kLastAliasViolation = AliasViolation::kWrongType;

// "view_copy", "write_not_argument", ...: stable names for reports.
ALIASGUARD_API const char* alias_violation_name(AliasViolation kind);

// A return that cannot be made to alias what its schema says it aliases, or
// (audit) one that breaks the schema. Names the op, the return, the argument
// and the kind of violation; nothing was modified when correct_aliasing
// throws it.
class ALIASGUARD_API AliasingError : public c10::Error {
 public:
  AliasingError(
      std::string op,
      size_t return_index,
      std::string argument,
      AliasViolation kind,
      const std::string& message);
  ~AliasingError() override;

  AliasViolation kind() const {
    return kind_;
  }

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
  AliasViolation kind_;
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
    AliasViolation kind,
    std::string_view problem);

// The same, for callers without a site.
[[noreturn]] ALIASGUARD_API void throw_aliasing_error(
    const SchemaAliasAnalysis& analysis,
    size_t return_index,
    std::optional<size_t> argument,
    AliasViolation kind,
    std::string_view problem);

} // namespace aliasguard::utils
