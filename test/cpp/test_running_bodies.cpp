#include <gtest/gtest.h>

#include <torch/csrc/utils/running_bodies.h>

#include <atomic>
#include <chrono>
#include <thread>

// See Note [Installing and uninstalling while bodies run].

namespace {

using namespace std::chrono_literals;
using aliasguard::utils::RunningBody;

// Each test leaves the bodies open and none running.
class RunningBodies : public ::testing::Test {
 protected:
  void TearDown() override {
    aliasguard::utils::open_bodies();
    EXPECT_EQ(aliasguard::utils::threads_in_bodies(), 0u);
  }
};

TEST_F(RunningBodies, NestedBodiesCountTheirThreadOnce) {
  EXPECT_FALSE(aliasguard::utils::body_running_on_this_thread());
  {
    const RunningBody outer;
    ASSERT_TRUE(outer.admitted());
    const RunningBody inner;
    ASSERT_TRUE(inner.admitted());
    EXPECT_TRUE(aliasguard::utils::body_running_on_this_thread());
    EXPECT_EQ(aliasguard::utils::threads_in_bodies(), 1u);
  }
  EXPECT_FALSE(aliasguard::utils::body_running_on_this_thread());
  EXPECT_EQ(aliasguard::utils::threads_in_bodies(), 0u);
}

TEST_F(RunningBodies, ClosedAdmitsOnlyBodiesNestedInARunningOne) {
  const RunningBody outer;
  aliasguard::utils::close_bodies();
  {
    // Nested: its thread is counted already, so it must not wait.
    const RunningBody nested;
    EXPECT_TRUE(nested.admitted());
  }
  std::atomic<bool> admitted{true};
  std::thread other([&admitted] { admitted = RunningBody().admitted(); });
  other.join();
  EXPECT_FALSE(admitted.load()); // a new body runs as stock
  EXPECT_EQ(aliasguard::utils::threads_in_bodies(), 1u);
}

TEST_F(RunningBodies, UninstallWaitsForABodyOnAnotherThread) {
  std::atomic<bool> entered{false};
  std::atomic<bool> leave{false};
  std::thread body([&] {
    const RunningBody running;
    entered = true;
    while (!leave) {
      std::this_thread::sleep_for(1ms);
    }
  });
  while (!entered) {
    std::this_thread::sleep_for(1ms);
  }
  aliasguard::utils::close_bodies();
  EXPECT_FALSE(aliasguard::utils::wait_for_no_running_bodies(20ms));
  leave = true;
  EXPECT_TRUE(aliasguard::utils::wait_for_no_running_bodies(60s));
  body.join();
  EXPECT_TRUE(aliasguard::utils::bodies_closed());
}

TEST_F(RunningBodies, AnExplicitScopeWaitsUntilTheBodiesOpen) {
  aliasguard::utils::close_bodies();
  EXPECT_FALSE(aliasguard::utils::wait_until_bodies_open(10ms));
  std::thread opener([] {
    std::this_thread::sleep_for(20ms);
    aliasguard::utils::open_bodies();
  });
  EXPECT_TRUE(aliasguard::utils::wait_until_bodies_open(60s));
  opener.join();
  EXPECT_TRUE(RunningBody().admitted());
}

} // namespace
