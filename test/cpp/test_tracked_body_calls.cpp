#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/track_views.h>
#include <torch/csrc/autograd/tracked_body_calls.h>
#include <torch/library.h>

#include <optional>
#include <string>

// Note [Ops registered after the tracked views' kernels]: a C++ op defined
// the way TORCH_LIBRARY defines one at load, but after the first tracked
// scope, is tracked in a scope as one defined before.

namespace {

using aliasguard::autograd::BodyCall;
using aliasguard::autograd::LateOps;
using aliasguard::autograd::TrackViewsGuard;

at::Tensor late_view(const at::Tensor& x) {
  return x.view(x.sizes());
}

at::Tensor& late_write(at::Tensor& x) {
  return x.add_(1);
}

void open_a_tracked_scope() {
  const at::AutoDispatchBelowADInplaceOrView below;
  const TrackViewsGuard guard;
}

c10::OperatorHandle op_named(
    const std::string& ns,
    const char* name,
    const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(
      (ns + "::" + name).c_str(), overload);
}

// TORCH_LIBRARY(ns, m) { m.def(...); } and TORCH_LIBRARY_IMPL(ns, CPU, m),
// at run time.
struct CustomLibrary {
  explicit CustomLibrary(const char* ns)
      : def(torch::Library::DEF, ns, std::nullopt, __FILE__, __LINE__),
        impl(
            torch::Library::IMPL,
            ns,
            c10::DispatchKey::CPU,
            __FILE__,
            __LINE__) {
    def.def("view_op(Tensor(a) x) -> Tensor(a)");
    def.def("write_op(Tensor(a!) x) -> Tensor(a!)");
    impl.impl("view_op", &late_view);
    impl.impl("write_op", &late_write);
  }
  torch::Library def;
  torch::Library impl;
};

struct Observed {
  bool untracked_view_is_view;
  bool tracked_view_is_view;
  bool tracked_view_shares_counter;
  int64_t writes_counted;
};

Observed observe(const std::string& ns) {
  const auto view_op =
      op_named(ns, "view_op").typed<at::Tensor(const at::Tensor&)>();
  const auto write_op =
      op_named(ns, "write_op").typed<at::Tensor&(at::Tensor&)>();
  at::Tensor base = at::zeros({4});
  Observed seen{};
  const at::AutoDispatchBelowADInplaceOrView below;
  seen.untracked_view_is_view = view_op.call(base).is_view();
  const TrackViewsGuard guard;
  const at::Tensor view = view_op.call(base);
  seen.tracked_view_is_view = view.is_view();
  const auto before = base._version();
  write_op.call(base);
  seen.writes_counted = static_cast<int64_t>(base._version() - before);
  seen.tracked_view_shares_counter = view._version() == base._version();
  return seen;
}

TEST(TrackedBodyCalls, AnOpWithoutAnAutogradKernelRunsAsAtTopLevel) {
  const CustomLibrary library("aliasguard_calls_test");
  EXPECT_EQ(
      aliasguard::autograd::body_call_of(
          op_named("aliasguard_calls_test", "write_op")),
      BodyCall::kThrough);
  // Generated aten kernels exclude ADInplaceOrView below themselves.
  EXPECT_EQ(
      aliasguard::autograd::body_call_of(op_named("aten", "mul", "Tensor")),
      BodyCall::kKernel);
}

TEST(TrackedBodyCalls, AnOpDefinedBeforeOrAfterTheKernelsIsTrackedAlike) {
  aliasguard::autograd::release_tracked_view_kernels();
  const CustomLibrary before("aliasguard_before_test");
  open_a_tracked_scope();
  ASSERT_TRUE(aliasguard::autograd::has_tracked_view_kernels());
  const CustomLibrary after("aliasguard_after_test");
  EXPECT_EQ(
      LateOps::body_call(op_named("aliasguard_after_test", "view_op")),
      std::optional<BodyCall>(BodyCall::kThrough));
  EXPECT_EQ(
      LateOps::body_call(op_named("aliasguard_before_test", "view_op")),
      std::nullopt); // its own kernel at the key
  for (const char* ns : {"aliasguard_before_test", "aliasguard_after_test"}) {
    const Observed seen = observe(ns);
    EXPECT_FALSE(seen.untracked_view_is_view) << ns << ": stock below autograd";
    EXPECT_TRUE(seen.tracked_view_is_view) << ns;
    EXPECT_TRUE(seen.tracked_view_shares_counter) << ns;
    EXPECT_EQ(seen.writes_counted, 1) << ns << ": top level counts one";
  }
}

TEST(TrackedBodyCalls, ReleasingTheKernelsStopsListening) {
  open_a_tracked_scope();
  const CustomLibrary recorded("aliasguard_recorded_test");
  ASSERT_TRUE(
      LateOps::body_call(op_named("aliasguard_recorded_test", "write_op"))
          .has_value());
  aliasguard::autograd::release_tracked_view_kernels();
  EXPECT_FALSE(
      LateOps::body_call(op_named("aliasguard_recorded_test", "write_op"))
          .has_value());
  const CustomLibrary unrecorded("aliasguard_unrecorded_test");
  EXPECT_FALSE(
      LateOps::body_call(op_named("aliasguard_unrecorded_test", "write_op"))
          .has_value());
  // The next scope registers the kernels again, for both.
  for (const char* ns :
       {"aliasguard_recorded_test", "aliasguard_unrecorded_test"}) {
    const Observed seen = observe(ns);
    EXPECT_TRUE(seen.tracked_view_is_view) << ns;
    EXPECT_EQ(seen.writes_counted, 1) << ns;
  }
}

} // namespace
