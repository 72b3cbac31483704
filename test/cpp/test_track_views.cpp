#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/VersionCounterUtils.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/track_views.h>

namespace {

using aliasguard::autograd::is_view_tracking_enabled;
using aliasguard::autograd::TrackViewsGuard;

TEST(TrackViews, BelowAutogradViewsBecomeRealViews) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  at::Tensor base = at::ones({4});
  at::Tensor untracked = base.view({2, 2});
  EXPECT_FALSE(untracked.is_view());
  EXPECT_FALSE(aliasguard::shares_version_counter(
      *untracked.unsafeGetTensorImpl(), *base.unsafeGetTensorImpl()));
  {
    TrackViewsGuard track;
    EXPECT_TRUE(is_view_tracking_enabled());
    at::Tensor tracked = base.view({2, 2});
    EXPECT_TRUE(tracked.is_view());
    EXPECT_TRUE(tracked._base().is_same(base));
    const auto before = tracked._version();
    base.add_(1);
    EXPECT_EQ(tracked._version(), before + 1);
  }
  EXPECT_FALSE(is_view_tracking_enabled());
}

TEST(TrackViews, NestingRestoresEachLevel) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  ASSERT_FALSE(is_view_tracking_enabled());
  {
    TrackViewsGuard outer;
    {
      TrackViewsGuard inner;
      EXPECT_TRUE(is_view_tracking_enabled());
    }
    EXPECT_TRUE(is_view_tracking_enabled());
  }
  EXPECT_FALSE(is_view_tracking_enabled());
}

TEST(TrackViews, TopLevelIsUnchanged) {
  const auto before = c10::impl::tls_local_dispatch_key_set();
  {
    TrackViewsGuard track;
    EXPECT_TRUE(is_view_tracking_enabled());
  }
  const auto after = c10::impl::tls_local_dispatch_key_set();
  EXPECT_EQ(before.included_, after.included_);
  EXPECT_EQ(before.excluded_, after.excluded_);
}

TEST(TrackViews, ExceptionRestoresState) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  try {
    TrackViewsGuard track;
    throw std::runtime_error("boom");
  } catch (const std::runtime_error&) {
  }
  EXPECT_FALSE(is_view_tracking_enabled());
}

} // namespace
