// The write guard of selective checkpointing's fast path.
// See Note [Refusing a write where it happens] in
// selective_checkpoint_write_guard.h.

#include <torch/csrc/autograd/selective_checkpoint_write_guard.h>

#include <torch/csrc/utils/schema_alias_analysis.h>
#include <torch/csrc/utils/torch_internals.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace aliasguard::autograd {
namespace {

constexpr c10::DispatchKey kGuardKey =
    internals::kCheckpointWriteGuardDispatchKey;

// This thread's open checkers, innermost last, and the key's state before the
// first of them turned it on.
struct ThreadGuard {
  std::vector<const WriteChecker*> checkers;
  bool key_was_included = false;
  bool key_was_excluded = false;
};
thread_local ThreadGuard thread_guard;

bool writes_an_argument(const c10::FunctionSchema& schema) {
  for (const c10::Argument& argument : schema.arguments()) {
    const c10::AliasInfo* alias = argument.alias_info();
    if (alias != nullptr && alias->isWrite()) {
      return true;
    }
  }
  return false;
}

void check_value(
    const c10::OperatorHandle& op,
    const c10::IValue& value,
    const std::vector<const WriteChecker*>& checkers) {
  auto check = [&](const at::Tensor& tensor) {
    if (!tensor.defined()) {
      return;
    }
    for (auto it = checkers.rbegin(); it != checkers.rend(); ++it) {
      (*it)->check_write(op, tensor);
    }
  };
  if (value.isTensor()) {
    check(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& tensor : value.toTensorList()) {
      check(tensor);
    }
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (element.isTensor()) {
        check(element.toTensor());
      }
    }
  }
}

ALIASGUARD_HOT void write_guard_kernel(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet keys,
    torch::jit::Stack* stack) {
  const std::vector<const WriteChecker*>& checkers = thread_guard.checkers;
  if (!checkers.empty()) {
    const std::vector<c10::Argument>& arguments = op.schema().arguments();
    const size_t first = stack->size() - arguments.size();
    for (size_t i = 0; i < arguments.size(); ++i) {
      const c10::AliasInfo* alias = arguments[i].alias_info();
      if (alias != nullptr && alias->isWrite()) {
        check_value(op, (*stack)[first + i], checkers);
      }
    }
  }
  op.redispatchBoxed(
      keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kGuardKey),
      stack);
}

constexpr uint64_t kNeverSwept = std::numeric_limits<uint64_t>::max();

// Kept for the life of the process: see Note [Refusing a write where it
// happens]. Made when the library loads, so destroyed before the dispatcher.
struct GuardKernels {
  std::mutex mutex;
  std::unique_ptr<torch::Library> fallback;
  std::map<std::string, std::unique_ptr<torch::Library>> by_namespace;
  std::unordered_set<std::string> ops;
  std::atomic<uint64_t> swept_at{kNeverSwept};
  std::string unavailable;
};

GuardKernels& guard_kernels() {
  static GuardKernels kernels;
  return kernels;
}
[[maybe_unused]] const GuardKernels& guard_kernels_at_load = guard_kernels();

std::string foreign_fallback_reason() {
  return "another library registered a fallback on the dispatch key "
         "aliasguard borrows for it (c10::DispatchKey::AutocastXLA, Note "
         "[The checkpoint write guard's dispatch key])";
}

ALIASGUARD_COLD void register_kernels_locked(GuardKernels& kernels) {
  auto& dispatcher = c10::Dispatcher::singleton();
  if (!kernels.fallback) {
    if (dispatcher.hasBackendFallbackForDispatchKey(kGuardKey)) {
      kernels.unavailable = foreign_fallback_reason();
      return;
    }
    kernels.fallback = std::make_unique<torch::Library>(
        torch::Library::IMPL, "_", kGuardKey, __FILE__, __LINE__);
    kernels.fallback->fallback(torch::CppFunction::makeFallthrough());
  }
  // Read before listing: an op registered meanwhile makes the next region
  // sweep again.
  const uint64_t registrations = utils::operator_registrations();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    std::string qualified = name.name;
    if (!name.overload_name.empty()) {
      qualified += "." + name.overload_name;
    }
    if (kernels.ops.count(qualified) != 0) {
      continue;
    }
    const auto op = dispatcher.findOp(name);
    const auto separator = name.name.find("::");
    if (!op.has_value() || !op->hasSchema() || separator == std::string::npos ||
        !writes_an_argument(op->schema()) ||
        op->hasKernelForDispatchKey(
            c10::DispatchKey::CompositeImplicitAutograd) ||
        op->hasKernelForDispatchKey(kGuardKey)) {
      continue;
    }
    const std::string ns = name.name.substr(0, separator);
    auto& library = kernels.by_namespace[ns];
    if (!library) {
      library = std::make_unique<torch::Library>(
          torch::Library::IMPL, ns, kGuardKey, __FILE__, __LINE__);
    }
    library->impl(
        qualified.c_str(),
        torch::CppFunction::makeFromBoxedFunction<&write_guard_kernel>());
    kernels.ops.insert(std::move(qualified));
  }
  kernels.swept_at.store(registrations, std::memory_order_release);
}

bool ensure_kernels() {
  GuardKernels& kernels = guard_kernels();
  if (kernels.swept_at.load(std::memory_order_acquire) ==
      utils::operator_registrations()) {
    return true;
  }
  const std::lock_guard<std::mutex> lock(kernels.mutex);
  if (kernels.unavailable.empty()) {
    register_kernels_locked(kernels);
  }
  return kernels.unavailable.empty();
}

void set_guard_key(bool on) {
  // See Note [Thread-local dispatch key state]
  internals::LocalDispatchKeys keys = internals::local_dispatch_keys();
  if (on) {
    thread_guard.key_was_included = keys.included.has(kGuardKey);
    thread_guard.key_was_excluded = keys.excluded.has(kGuardKey);
    keys.included = keys.included.add(kGuardKey);
    keys.excluded = keys.excluded.remove(kGuardKey);
  } else {
    keys.included = thread_guard.key_was_included
        ? keys.included.add(kGuardKey)
        : keys.included.remove(kGuardKey);
    keys.excluded = thread_guard.key_was_excluded
        ? keys.excluded.add(kGuardKey)
        : keys.excluded.remove(kGuardKey);
  }
  internals::set_local_dispatch_keys(keys);
}

std::atomic<bool> enabled_for_testing{true};

} // namespace

bool set_write_guard_enabled_for_testing(bool enabled) {
  return enabled_for_testing.exchange(enabled);
}

bool push_write_checker(const WriteChecker* checker) {
  if (!enabled_for_testing.load(std::memory_order_relaxed) ||
      !ensure_kernels()) {
    return false;
  }
  if (thread_guard.checkers.empty()) {
    set_guard_key(true);
  }
  thread_guard.checkers.push_back(checker);
  return true;
}

void pop_write_checker(const WriteChecker* checker) {
  std::vector<const WriteChecker*>& checkers = thread_guard.checkers;
  const auto found = std::find(checkers.rbegin(), checkers.rend(), checker);
  if (found == checkers.rend()) {
    return;
  }
  checkers.erase(std::next(found).base());
  if (checkers.empty()) {
    set_guard_key(false);
  }
}

bool is_write_guard_on() {
  return internals::is_dispatch_key_included(kGuardKey) &&
      !internals::is_dispatch_key_excluded(kGuardKey);
}

size_t num_write_guard_kernels() {
  GuardKernels& kernels = guard_kernels();
  const std::lock_guard<std::mutex> lock(kernels.mutex);
  return kernels.ops.size();
}

std::string write_guard_unavailable_reason() {
  GuardKernels& kernels = guard_kernels();
  const std::lock_guard<std::mutex> lock(kernels.mutex);
  if (!kernels.unavailable.empty()) {
    return kernels.unavailable;
  }
  if (!kernels.fallback &&
      c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(
          kGuardKey)) {
    return foreign_fallback_reason();
  }
  return "";
}

} // namespace aliasguard::autograd
