#include <torch/csrc/utils/alias_audit.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/utils/torch_internals.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

// The dispatcher fallback that runs the alias audit (alias_audit.cpp) on
// every op of a thread that enabled it. See Note [Alias audit].

namespace aliasguard::utils {
namespace {

std::atomic<AliasingErrorReporter> audit_error_reporter{nullptr};

// Open scopes, on any thread, that asked for kernels to be checked too. A
// process-wide count rather than a thread's own: the backward ops an audited
// thread starts may run on autograd's worker threads.
std::atomic<size_t> kernel_audit_scopes{0};

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
  const bool reaches_torch_dispatch =
      dispatch_keys.has(c10::DispatchKey::Python);
  if ((!reaches_torch_dispatch && kernel_audit_scopes.load() == 0) ||
      !has_tensor_inputs(inputs) ||
      op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
    op.redispatchBoxed(below, stack);
    report_diverged_inner_copies();
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
        *analysis,
        args,
        rets,
        below.has(c10::DispatchKey::ADInplaceOrView),
        /*judge_wrapper_views=*/true);
  } catch (const AliasingError& error) {
    AliasingErrorReporter reporter = audit_error_reporter.load();
    // See Note [One report per op call].
    if (!reported_violation_since(mark, *analysis)) {
      if (reporter == nullptr || !reporter(error, args)) {
        throw;
      }
      note_reported_violation(*analysis);
    }
  }
  report_diverged_inner_copies();
}

} // namespace

void set_alias_audit_error_reporter(AliasingErrorReporter reporter) {
  audit_error_reporter.store(reporter);
}

// Note [Audit lifetime]
// ~~~~~~~~~~~~~~~~~~~~~
// The fallback is registered only while some thread has an audit scope open:
// the key is borrowed (Note [The audit's dispatch key]), and a fallback left
// registered would be in the way of anyone else who borrows it. A process-wide
// count of open scopes registers it on 0 -> 1 and removes it on 1 -> 0; a
// per-thread depth includes the key in the thread's TLS while the thread has a
// scope open. Registering updates every operator's dispatch table (~17 ms), so
// a test runner that audits test after test retains the registration for its
// whole session. Counting rather than saving and restoring the previous state
// makes scopes that end out of order (two context managers entered A, B and
// exited A, B) leave the thread as it was. The registration handle is leaked on
// purpose: the dispatcher may be gone by the time static destructors run.

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

// See Note [Inner tensors of traceable wrappers].
struct WatchedCopy {
  AliasingError error;
  // Weak: a watch must not keep a wrapper (and its inner data) alive.
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> input;
  // Held weakly, for identity only: a weak reference keeps the address from
  // being reused.
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> copy;
  std::vector<c10::VariableVersion> counters;
  std::vector<uint32_t> versions;

  bool diverged() const {
    for (size_t i = 0; i < counters.size(); ++i) {
      if (counters[i].current_version() != versions[i]) {
        return true;
      }
    }
    return false;
  }
  // Nothing but this watch holds the counters: the tensors are gone.
  bool orphaned() const {
    for (const c10::VariableVersion& counter : counters) {
      if (!counter.unique()) {
        return false;
      }
    }
    return true;
  }
};
thread_local std::vector<WatchedCopy> watched_copies;

thread_local uint64_t reported_epoch = 0;
thread_local const SchemaAliasAnalysis* reported_op = nullptr;

} // namespace

void retain_alias_audit_fallback() {
  AuditRegistration& registration = audit_registration();
  const std::lock_guard<std::mutex> lock(registration.mutex);
  if (registration.scopes == 0) {
    c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
    TORCH_CHECK(
        !dispatcher.hasBackendFallbackForDispatchKey(
            internals::kAuditDispatchKey),
        "aliasguard.audit(): the dispatch key ",
        internals::kAuditDispatchKey,
        ", which the audit borrows (stock PyTorch has no free key above "
        "autograd), already has a fallback registered by someone else; "
        "remove that registration before auditing");
    registration.handle.emplace(dispatcher.registerFallback(
        internals::kAuditDispatchKey,
        c10::KernelFunction::makeFromBoxedFunction<&audit_fallback>(),
        "aliasguard alias audit (torch/csrc/utils/alias_audit_fallback.cpp)"));
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

void enter_alias_audit(bool check_kernels) {
  retain_alias_audit_fallback();
  if (check_kernels) {
    ++kernel_audit_scopes;
  }
  if (audit_depth++ == 0) {
    internals::set_dispatch_key_included(internals::kAuditDispatchKey, true);
  }
}

void exit_alias_audit(bool check_kernels) {
  TORCH_CHECK(
      audit_depth > 0,
      "aliasguard.audit(): no audit scope is open on this thread");
  if (check_kernels) {
    // Checked and decremented in one step, so that two threads ending scopes
    // at once cannot take the count below zero.
    size_t open = kernel_audit_scopes.load();
    do {
      TORCH_CHECK(
          open > 0,
          "aliasguard.audit(): no audit scope that checks kernels is open");
    } while (!kernel_audit_scopes.compare_exchange_weak(open, open - 1));
  }
  if (--audit_depth == 0) {
    internals::set_dispatch_key_included(internals::kAuditDispatchKey, false);
    watched_copies.clear();
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

ALIASGUARD_HOT ReportedViolationMark reported_violation_mark() {
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

void watch_inner_copy(
    AliasingError error,
    const at::Tensor& input,
    const at::Tensor& copy,
    std::vector<c10::VariableVersion> counters) {
  if (audit_depth == 0) {
    // A thread auditing for another (autograd's workers) has no scope that
    // would end the watch: reported now, as a copy that is not watched.
    throw error;
  }
  if (watched_copies.size() >= 64) {
    watched_copies.erase(
        std::remove_if(
            watched_copies.begin(),
            watched_copies.end(),
            [](const WatchedCopy& copy) { return copy.orphaned(); }),
        watched_copies.end());
  }
  for (const WatchedCopy& watched : watched_copies) {
    if (watched.copy._unsafe_get_target() == copy.unsafeGetTensorImpl() &&
        watched.error.op() == error.op() &&
        watched.error.return_index() == error.return_index()) {
      return;
    }
  }
  std::vector<uint32_t> versions;
  versions.reserve(counters.size());
  for (const c10::VariableVersion& counter : counters) {
    versions.push_back(counter.current_version());
  }
  watched_copies.push_back(WatchedCopy{
      std::move(error),
      c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
          input.getIntrusivePtr()),
      c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
          copy.getIntrusivePtr()),
      std::move(counters),
      std::move(versions)});
}

size_t watched_inner_copies() {
  return watched_copies.size();
}

void report_diverged_inner_copies() {
  for (size_t i = 0; i < watched_copies.size();) {
    if (!watched_copies[i].diverged()) {
      ++i;
      continue;
    }
    const AliasingError error = std::move(watched_copies[i].error);
    // The wrapper, as an argument, tells the reporter whom to blame.
    c10::SmallVector<c10::IValue, 1> owner;
    if (auto input = watched_copies[i].input.lock()) {
      owner.emplace_back(at::Tensor(std::move(input)));
    }
    watched_copies.erase(watched_copies.begin() + static_cast<ptrdiff_t>(i));
    AliasingErrorReporter reporter = audit_error_reporter.load();
    if (reporter == nullptr || !reporter(error, owner)) {
      throw error;
    }
  }
}

} // namespace aliasguard::utils
