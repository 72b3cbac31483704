#include <torch/csrc/utils/alias_audit.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/utils/torch_internals.h>

#include <atomic>
#include <memory>

// The dispatcher fallback that runs the alias audit (alias_audit.cpp) on
// every op of a thread that enabled it. See Note [Alias audit].

namespace aliasguard::utils {
namespace {

std::atomic<AliasingErrorReporter> audit_error_reporter{nullptr};

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
      c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER,
                          internals::kAuditDispatchKey);
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
  op.redispatchBoxed(below, stack);
  const size_t num_rets = schema.returns().size();
  const c10::ArrayRef<c10::IValue> rets(
      stack->data() + stack->size() - num_rets, num_rets);
  try {
    audit_aliasing(
        *analysis, args, rets, below.has(c10::DispatchKey::ADInplaceOrView));
  } catch (const AliasingError& error) {
    if (AliasingErrorReporter reporter = audit_error_reporter.load()) {
      reporter(error);
    }
    throw;
  }
}

} // namespace

void set_alias_audit_error_reporter(AliasingErrorReporter reporter) {
  audit_error_reporter.store(reporter);
}

namespace {

// Registered when the library loads and never removed, like a
// TORCH_LIBRARY_IMPL fallback (registered directly: torch/library.h is heavy).
const bool audit_fallback_registered = [] {
  new c10::RegistrationHandleRAII(c10::Dispatcher::singleton().registerFallback(
      internals::kAuditDispatchKey,
      c10::KernelFunction::makeFromBoxedFunction<&audit_fallback>(),
      "aliasguard alias audit (torch/csrc/utils/alias_correction.cpp)"));
  return true;
}();

} // namespace

} // namespace aliasguard::utils
