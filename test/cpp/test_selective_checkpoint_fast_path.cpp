// FastPathRegion: the state machine of the selective checkpoint fast path,
// driven through the dispatcher as autograd's engine and checkpoint would
// drive it. See Note [SAC below autograd] and Note [Function policies below
// autograd].

#include <torch/csrc/autograd/selective_checkpoint_fast_path.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using aliasguard::autograd::FastPathPolicy;
using aliasguard::autograd::FastPathRegion;
using aliasguard::autograd::is_write_guard_on;
using aliasguard::autograd::num_open_fast_path_regions;
using aliasguard::autograd::release_fast_path_kernels;

c10::OperatorHandle op(const char* name, const char* overload = "") {
  auto handle = c10::Dispatcher::singleton().findOp({name, overload});
  EXPECT_TRUE(handle.has_value()) << name;
  return *handle;
}

std::vector<c10::OperatorHandle> mm_only() {
  return {op("aten::mm")};
}

// The message of the c10::Error `fn` throws, or "" when it throws none.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const c10::Error& error) {
    return error.what_without_backtrace();
  }
  return "";
}

TEST(FastPathRegion, CachesInTheForwardAndHandsBackInTheRecompute) {
  FastPathRegion region(mm_only(), /*allow_mutation=*/false);
  at::Tensor a = at::randn({3, 3});
  at::Tensor b = at::randn({3, 3});
  region.enter_forward();
  at::Tensor forward = at::mm(a, b);
  at::Tensor not_listed = at::sin(forward);
  region.exit_forward(/*check=*/true);
  EXPECT_EQ(region.num_cached(), 1u);
  EXPECT_EQ(num_open_fast_path_regions(), 0u);

  const at::Tensor expected = forward.clone();
  a.add_(1); // an input may change: the recompute must not run mm again
  region.enter_recompute();
  at::Tensor recomputed = at::mm(a, b);
  region.exit_recompute();
  EXPECT_TRUE(recomputed.is_alias_of(forward));
  EXPECT_TRUE(at::equal(recomputed, expected));
  EXPECT_TRUE(region.entries()[0].outputs.empty()); // handed back, released
}

TEST(FastPathRegion, RecomputeHandsBackEachOpsCallsInForwardOrder) {
  FastPathRegion region(mm_only(), false);
  at::Tensor a = at::randn({2, 2});
  region.enter_forward();
  at::Tensor first = at::mm(a, a);
  at::Tensor second = at::mm(a, a.t());
  region.exit_forward(true);

  region.enter_recompute();
  at::Tensor again_first = at::mm(a, a);
  at::Tensor again_second = at::mm(a, a.t());
  region.exit_recompute();
  EXPECT_TRUE(again_first.is_alias_of(first));
  EXPECT_TRUE(again_second.is_alias_of(second));

  // A second backward finds the entries used.
  region.enter_recompute();
  const std::string message = error_of([&] { at::mm(a, a); });
  region.exit_recompute();
  EXPECT_NE(
      message.find("already used by an earlier backward"), std::string::npos)
      << message;
}

TEST(FastPathRegion, WriteAfterTheForwardIsRefusedAtRecompute) {
  FastPathRegion region(mm_only(), false);
  at::Tensor a = at::randn({2, 2});
  region.enter_forward();
  at::Tensor out = at::mm(a, a);
  region.exit_forward(true);
  out.view({4}).mul_(2); // through a view: the same counter

  region.enter_recompute();
  const std::string message = error_of([&] { at::mm(a, a); });
  region.exit_recompute();
  EXPECT_NE(message.find("aten::mm"), std::string::npos) << message;
  EXPECT_NE(message.find("after the forward pass"), std::string::npos)
      << message;
  EXPECT_NE(
      message.find("its version was 0 when cached and is 1"), std::string::npos)
      << message;
}

TEST(FastPathRegion, WriteInsideTheForwardIsRefusedBeforeItHappens) {
  at::Tensor a = at::randn({2, 2});
  {
    FastPathRegion region(mm_only(), false);
    region.enter_forward();
    EXPECT_TRUE(is_write_guard_on());
    at::Tensor out = at::mm(a, a);
    const at::Tensor before = out.clone();
    // Directly, through a view, and as an out= argument.
    for (const auto& write : std::vector<std::function<void()>>{
             [&] { out.add_(1); },
             [&] { out.view({4}).mul_(2); },
             [&] { at::mul_out(out, a, a); }}) {
      const std::string message = error_of(write);
      EXPECT_NE(
          message.find("would write to the memory of output 0 of aten::mm"),
          std::string::npos)
          << message;
      EXPECT_NE(message.find("Nothing was written"), std::string::npos)
          << message;
    }
    EXPECT_TRUE(at::equal(out, before));
    EXPECT_EQ(out._version(), 0);
    // Tensors it did not cache are written as usual.
    at::Tensor other = a.clone();
    other.add_(1);
    EXPECT_EQ(other._version(), 1);
    region.exit_forward(true);
    EXPECT_FALSE(is_write_guard_on());
  }
  {
    // The guard is this thread's: another thread's write is found by
    // version when the forward phase ends.
    FastPathRegion region(mm_only(), false);
    region.enter_forward();
    at::Tensor out = at::mm(a, a);
    std::thread([&] {
      EXPECT_FALSE(is_write_guard_on());
      out.add_(1);
    }).join();
    const std::string message = error_of([&] { region.exit_forward(true); });
    EXPECT_NE(
        message.find("later in the checkpointed region"), std::string::npos)
        << message;
    EXPECT_FALSE(is_write_guard_on());
  }
  {
    // Left by an exception: nothing is compared (the first error stands).
    FastPathRegion region(mm_only(), false);
    region.enter_forward();
    at::Tensor out = at::mm(a, a);
    std::thread([&] { out.add_(1); }).join();
    EXPECT_EQ(error_of([&] { region.exit_forward(false); }), "");
  }
  {
    FastPathRegion region(mm_only(), /*allow_mutation=*/true);
    region.enter_forward();
    EXPECT_FALSE(is_write_guard_on());
    at::mm(a, a).add_(1);
    EXPECT_EQ(error_of([&] { region.exit_forward(true); }), "");
  }
  {
    // A region dropped while open turns the guard off.
    auto region = std::make_unique<FastPathRegion>(mm_only(), false);
    region->enter_forward();
    EXPECT_TRUE(is_write_guard_on());
    region.reset();
    EXPECT_FALSE(is_write_guard_on());
  }
}

// Saves the calls whose 1-based index is odd; throws on call `throw_on`.
class EveryOtherCall final : public FastPathPolicy {
 public:
  explicit EveryOtherCall(int throw_on = 0) : throw_on_(throw_on) {}
  bool saves(
      const c10::OperatorHandle& op,
      c10::ArrayRef<c10::IValue> arguments,
      c10::ArrayRef<c10::IValue> outputs) override {
    ++calls;
    EXPECT_EQ(op.operator_name().name, "aten::mm");
    EXPECT_EQ(arguments.size(), 2u); // self, mat2
    EXPECT_EQ(outputs.size(), 1u);
    EXPECT_TRUE(outputs[0].isTensor());
    if (calls == throw_on_) {
      throw std::runtime_error("policy failed");
    }
    return calls % 2 == 1;
  }
  int calls = 0;

 private:
  int throw_on_;
};

TEST(FastPathRegion, PolicyDecidesPerCallAndTheRecomputeReplaysIt) {
  auto owned = std::make_unique<EveryOtherCall>();
  EveryOtherCall* policy = owned.get();
  FastPathRegion region(mm_only(), false, std::move(owned));
  EXPECT_TRUE(region.asks_policy());
  at::Tensor a = at::randn({2, 2});
  region.enter_forward();
  std::vector<at::Tensor> forward;
  for (int i = 0; i < 3; ++i) {
    forward.push_back(at::mm(a, a));
  }
  region.exit_forward(true);
  EXPECT_EQ(policy->calls, 3);
  EXPECT_EQ(region.num_cached(), 2u);

  forward[1].add_(1); // not cached: writing it is fine
  region.enter_recompute();
  std::vector<at::Tensor> recomputed;
  for (int i = 0; i < 3; ++i) {
    recomputed.push_back(at::mm(a, a));
  }
  region.exit_recompute();
  EXPECT_EQ(policy->calls, 3); // not asked again
  EXPECT_TRUE(recomputed[0].is_alias_of(forward[0]));
  EXPECT_FALSE(recomputed[1].is_alias_of(forward[1])); // run again
  EXPECT_TRUE(recomputed[2].is_alias_of(forward[2]));
}

TEST(FastPathRegion, PolicyThrowingPartWayLeavesNoMisalignedEntry) {
  FastPathRegion region(
      mm_only(), false, std::make_unique<EveryOtherCall>(/*throw_on=*/2));
  at::Tensor a = at::randn({2, 2});
  at::Tensor b = at::randn({2, 2});
  region.enter_forward();
  at::Tensor first = at::mm(a, b);
  EXPECT_THROW(at::mm(a, b), std::runtime_error); // caught; the region goes on
  at::Tensor third = at::mm(a, b); // call 3: odd, saved
  region.exit_forward(false);
  ASSERT_EQ(region.num_cached(), 2u);

  // The failed call is run again by the recompute; the calls around it get
  // their own outputs back.
  b.add_(1); // an input, not a cached output: a recomputed call sees it
  const at::Tensor expected_second = at::mm(a, b); // no region open
  region.enter_recompute();
  EXPECT_TRUE(at::mm(a, b).is_alias_of(first));
  at::Tensor second = at::mm(a, b);
  EXPECT_FALSE(second.is_alias_of(first) || second.is_alias_of(third));
  EXPECT_TRUE(at::equal(second, expected_second));
  EXPECT_TRUE(at::mm(a, b).is_alias_of(third));
  region.exit_recompute();
}

TEST(FastPathRegion, NestedRegionsActAsNestedModes) {
  FastPathRegion outer(mm_only(), false);
  FastPathRegion inner(mm_only(), false);
  at::Tensor a = at::randn({2, 2});
  outer.enter_forward();
  inner.enter_forward();
  at::Tensor out = at::mm(a, a);
  inner.exit_forward(true);
  outer.exit_forward(true);
  EXPECT_EQ(inner.num_cached(), 1u);
  EXPECT_EQ(outer.num_cached(), 1u);

  // The outer recompute hands back its own alias without reaching the inner
  // region, which is not open.
  outer.enter_recompute();
  EXPECT_TRUE(at::mm(a, a).is_alias_of(out));
  outer.exit_recompute();
  inner.enter_recompute();
  EXPECT_TRUE(at::mm(a, a).is_alias_of(out));
  EXPECT_FALSE(release_fast_path_kernels()); // refused while a region is open
  inner.exit_recompute();
}

TEST(FastPathRegion, EachThreadSeesOnlyItsOwnRegions) {
  FastPathRegion region(mm_only(), false);
  at::Tensor a = at::randn({2, 2});
  region.enter_forward();
  std::atomic<size_t> other_thread_open{99};
  std::thread other([&] {
    at::Tensor b = at::randn({2, 2});
    at::mm(b, b); // not this thread's region
    other_thread_open = num_open_fast_path_regions();
    FastPathRegion own(mm_only(), false);
    own.enter_forward();
    at::mm(b, b);
    own.exit_forward(true);
    EXPECT_EQ(own.num_cached(), 1u);
  });
  other.join();
  at::mm(a, a);
  region.exit_forward(true);
  EXPECT_EQ(other_thread_open.load(), 0u);
  EXPECT_EQ(region.num_cached(), 1u);
}

TEST(FastPathRegion, RegionDestroyedWhileOpenIsNotReachedAgain) {
  at::Tensor a = at::randn({2, 2});
  {
    FastPathRegion region(mm_only(), false);
    region.enter_forward();
    at::mm(a, a);
  }
  EXPECT_EQ(num_open_fast_path_regions(), 0u);
  EXPECT_TRUE(at::equal(at::mm(a, a), at::mm(a, a.clone())));
}

} // namespace
