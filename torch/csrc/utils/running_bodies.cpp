#include <torch/csrc/utils/running_bodies.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

namespace aliasguard::utils {
namespace {

struct Bodies {
  // Threads inside an admitted body; see Note [Installing and uninstalling
  // while bodies run] for why both are sequentially consistent.
  std::atomic<size_t> threads{0};
  std::atomic<bool> closed{false};
  // Wakes uninstall() when the last body leaves, and explicit scopes when the
  // bodies open again.
  std::mutex mutex;
  std::condition_variable changed;
};

Bodies& bodies() {
  // Never destroyed: a thread may leave a body during interpreter shutdown.
  static Bodies* instance = new Bodies();
  return *instance;
}

// Admitted bodies this thread is inside, outermost included.
thread_local size_t depth = 0;

void wake_all(Bodies& b) {
  const std::lock_guard<std::mutex> lock(b.mutex);
  b.changed.notify_all();
}

} // namespace

// See Note [Installing and uninstalling while bodies run]
ALIASGUARD_HOT bool enter_body() {
  if (depth > 0) {
    ++depth;
    return true;
  }
  Bodies& b = bodies();
  b.threads.fetch_add(1);
  if (b.closed.load()) {
    if (b.threads.fetch_sub(1) == 1) {
      wake_all(b);
    }
    return false;
  }
  depth = 1;
  return true;
}

ALIASGUARD_HOT void exit_body() {
  if (--depth > 0) {
    return;
  }
  Bodies& b = bodies();
  if (b.threads.fetch_sub(1) == 1 && b.closed.load()) {
    wake_all(b);
  }
}

bool body_running_on_this_thread() {
  return depth > 0;
}

size_t threads_in_bodies() {
  return bodies().threads.load();
}

void close_bodies() {
  bodies().closed.store(true);
}

bool wait_for_no_running_bodies(std::chrono::milliseconds timeout) {
  Bodies& b = bodies();
  std::unique_lock<std::mutex> lock(b.mutex);
  return b.changed.wait_for(
      lock, timeout, [&b] { return b.threads.load() == 0; });
}

void open_bodies() {
  Bodies& b = bodies();
  b.closed.store(false);
  wake_all(b);
}

bool bodies_closed() {
  return bodies().closed.load();
}

bool wait_until_bodies_open(std::chrono::milliseconds timeout) {
  Bodies& b = bodies();
  std::unique_lock<std::mutex> lock(b.mutex);
  return b.changed.wait_for(lock, timeout, [&b] { return !b.closed.load(); });
}

} // namespace aliasguard::utils
