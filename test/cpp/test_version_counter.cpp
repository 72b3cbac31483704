#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/VersionCounterUtils.h>

namespace {

TEST(VersionCounterUtils, FreshTensorsDoNotShare) {
  at::Tensor a = at::ones({2});
  at::Tensor b = at::ones({2});
  EXPECT_FALSE(aliasguard::shares_version_counter(
      *a.unsafeGetTensorImpl(), *b.unsafeGetTensorImpl()));
  EXPECT_TRUE(aliasguard::shares_version_counter(
      *a.unsafeGetTensorImpl(), *a.unsafeGetTensorImpl()));
}

TEST(VersionCounterUtils, ShareThenBumpIsSeenByBoth) {
  at::Tensor a = at::ones({2});
  at::Tensor b = at::ones({2});
  aliasguard::share_version_counter(
      *b.unsafeGetTensorImpl(), *a.unsafeGetTensorImpl());
  EXPECT_TRUE(aliasguard::shares_version_counter(
      *a.unsafeGetTensorImpl(), *b.unsafeGetTensorImpl()));
  const auto v = a._version();
  b.add_(1);
  EXPECT_EQ(a._version(), v + 1);
}

TEST(VersionCounterUtils, InferenceTensorsShareNothing) {
  at::Tensor inference;
  {
    c10::InferenceMode guard;
    inference = at::ones({2});
  }
  at::Tensor normal = at::ones({2});
  EXPECT_FALSE(aliasguard::shares_version_counter(
      *inference.unsafeGetTensorImpl(), *inference.unsafeGetTensorImpl()));
  EXPECT_THROW(
      aliasguard::share_version_counter(
          *normal.unsafeGetTensorImpl(), *inference.unsafeGetTensorImpl()),
      c10::Error);
  EXPECT_THROW(
      aliasguard::share_version_counter(
          *inference.unsafeGetTensorImpl(), *normal.unsafeGetTensorImpl()),
      c10::Error);
  EXPECT_FALSE(aliasguard::shares_version_counter(
      *normal.unsafeGetTensorImpl(), *inference.unsafeGetTensorImpl()));
}

TEST(VersionCounterUtils, SharesNoVersionCounterOnlyWhenBothHaveOne) {
  at::Tensor a = at::ones({2});
  at::Tensor b = at::ones({2});
  EXPECT_TRUE(aliasguard::shares_no_version_counter(a, b));
  aliasguard::share_version_counter(
      *b.unsafeGetTensorImpl(), *a.unsafeGetTensorImpl());
  EXPECT_FALSE(aliasguard::shares_no_version_counter(a, b));
  at::Tensor inference;
  {
    c10::InferenceMode guard;
    inference = at::ones({2});
  }
  EXPECT_FALSE(aliasguard::shares_no_version_counter(a, inference));
}

} // namespace
