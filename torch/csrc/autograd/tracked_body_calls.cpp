#include <torch/csrc/autograd/tracked_body_calls.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/utils/schema_alias_analysis.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace aliasguard::autograd {
namespace {

// An autograd kernel registered for the op itself, at the alias key or at any
// runtime autograd key; torch's autograd fallback is no kernel of the op's.
bool has_autograd_kernel(const c10::OperatorHandle& op) {
  for (const c10::DispatchKey key :
       {c10::DispatchKey::Autograd,
        c10::DispatchKey::AutogradOther,
        c10::DispatchKey::AutogradNestedTensor}) {
    if (op.hasKernelForDispatchKey(key)) {
      return true;
    }
  }
  for (uint8_t bit = 1;
       bit <= static_cast<uint8_t>(c10::BackendComponent::EndOfBackendKeys);
       ++bit) {
    if (op.hasKernelForDispatchKey(c10::getAutogradKeyFromBackend(
            static_cast<c10::BackendComponent>(bit)))) {
      return true;
    }
  }
  return false;
}

// See Note [Ops registered after the tracked views' kernels]
struct LateOpState {
  // Serialises start() and stop(); held while calling into the dispatcher.
  std::mutex control;
  std::optional<c10::RegistrationHandleRAII> listener;
  // False while the dispatcher replays the ops that exist to a new listener.
  std::atomic<bool> accepting{false};
  // Whether any op was ever recorded: the fallback's one load when none was.
  std::atomic<bool> any{false};
  // Taken by the listener under the dispatcher's lock: never held while
  // calling into the dispatcher. Shared for the fallback's lookups, which
  // run on every opaque call of a tracked body once an op was recorded.
  std::shared_mutex mutex;
  std::unordered_map<c10::OperatorHandle, std::optional<BodyCall>> ops;
};

LateOpState& late_op_state() {
  // Made when the library loads, so destroyed before the dispatcher.
  static LateOpState state;
  return state;
}
[[maybe_unused]] const LateOpState& late_op_state_at_load = late_op_state();

class LateOpListener final : public c10::OpRegistrationListener {
 public:
  void onOperatorRegistered(const c10::OperatorHandle& op) override {
    LateOpState& state = late_op_state();
    if (!state.accepting.load(std::memory_order_acquire)) {
      return;
    }
    const std::unique_lock<std::shared_mutex> lock(state.mutex);
    state.ops.emplace(op, std::nullopt);
    state.any.store(true, std::memory_order_release);
  }
  void onOperatorDeregistered(const c10::OperatorHandle& op) override {
    LateOpState& state = late_op_state();
    const std::unique_lock<std::shared_mutex> lock(state.mutex);
    state.ops.erase(op);
  }
};

} // namespace

// See Note [What a tracked body's call runs as]
BodyCall body_call_of(const c10::OperatorHandle& op) {
  if (op.hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView)) {
    return utils::schema_alias_analysis(op)->has_view_returns()
        ? BodyCall::kView
        : BodyCall::kThrough;
  }
  if (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
      !has_autograd_kernel(op)) {
    return BodyCall::kThrough;
  }
  return BodyCall::kKernel;
}

void LateOps::start() {
  LateOpState& state = late_op_state();
  const std::lock_guard<std::mutex> control(state.control);
  if (state.listener.has_value()) {
    return;
  }
  state.accepting.store(false, std::memory_order_release);
  state.listener.emplace(c10::Dispatcher::singleton().addRegistrationListener(
      std::make_unique<LateOpListener>()));
  state.accepting.store(true, std::memory_order_release);
}

void LateOps::stop() {
  LateOpState& state = late_op_state();
  const std::lock_guard<std::mutex> control(state.control);
  state.accepting.store(false, std::memory_order_release);
  state.listener.reset(); // takes the dispatcher's lock: not under `mutex`
  const std::unique_lock<std::shared_mutex> lock(state.mutex);
  state.ops.clear();
  state.any.store(false, std::memory_order_release);
}

std::optional<BodyCall> LateOps::body_call(const c10::OperatorHandle& op) {
  LateOpState& state = late_op_state();
  if (!state.any.load(std::memory_order_acquire)) {
    return std::nullopt;
  }
  {
    const std::shared_lock<std::shared_mutex> lock(state.mutex);
    const auto found = state.ops.find(op);
    if (found == state.ops.end()) {
      return std::nullopt;
    }
    if (found->second.has_value()) {
      return found->second;
    }
  }
  // Read on the first call, when the op's kernels are registered; outside
  // the lock, as the analysis has a lock of its own.
  const BodyCall call = body_call_of(op);
  const std::unique_lock<std::shared_mutex> lock(state.mutex);
  const auto found = state.ops.find(op);
  if (found != state.ops.end()) {
    found->second = call;
  }
  return call;
}

} // namespace aliasguard::autograd
