#pragma once

#include <c10/macros/AliasguardExport.h>
#include <torch/csrc/utils/schema_alias_analysis.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

namespace c10 {
class OperatorHandle;
} // namespace c10

// What correcting an operator's results needs to know about it, decided once
// per operator from its schema and its registrations. The bindings cache it
// per OpOverload object; every rule that reads it lives in the core.

namespace aliasguard::utils {

// How the writes an op makes through a __torch_dispatch__ body are counted.
// See Note [One bump per write through __torch_dispatch__].
enum class WriteCounting : uint8_t {
  // The op has an ADInplaceOrView kernel, which bumps each written argument
  // after the body returns: the body's own bump is taken back.
  kOuterKernelBumps,
  // The op's ADInplaceOrView kernel bumped each written argument before the
  // body started (Note [ADInplaceOrView kernels that bump first]): that bump
  // is taken back as the body starts, and given back when it ends if nothing
  // moved the counter since.
  kOuterKernelBumpedFirst,
  // No such kernel and no returns (the _foreach_*_ family): each counter is
  // brought up to one bump per written argument that uses it.
  kOnePerWrite,
  // No such kernel, but returns (batch norm's running statistics): counted
  // as the body counted, as at top level.
  kAsCounted,
};

struct OpCorrectionInfo {
  std::shared_ptr<const SchemaAliasAnalysis> analysis; // never null
  // Above a __torch_dispatch__, this kernel marks view returns and bumps
  // written arguments. Read once: registering such a kernel for an op
  // already in use is not supported.
  bool has_inplace_or_view_kernel = false;
  // A Tensor(a) return may legitimately be a copy: the op is
  // CompositeImplicitAutograd with no ADInplaceOrView kernel (to,
  // contiguous, reshape alias when they can and copy when they must). Any
  // other op that promises an alias (lift_fresh, alias, view) must keep it.
  bool view_may_be_a_copy = false;
  // An unannotated return may be an argument or share its memory: the op is
  // CompositeImplicitAutograd, whose results may ignore the schema (dropout
  // in eval mode, NJT's broadcast_tensors of equal shapes return their
  // input). See Note [What the audit leaves alone].
  bool fresh_return_may_alias = false;
  // Set when the op's one return is a view of its only tensor argument and
  // that argument may be passed positionally: the fast path of correction.
  std::optional<size_t> sole_view_argument;
  WriteCounting write_counting = WriteCounting::kAsCounted;
};

ALIASGUARD_API OpCorrectionInfo
op_correction_info(const c10::OperatorHandle& op);

} // namespace aliasguard::utils
