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

// See Note [One bump per write through __torch_dispatch__]: a kernel above
// bumped first; the body's own call of the op bumps again.
TEST(WrittenVersions, BumpsMadeAboveAreTakenBackAndGivenBackIfUnmoved) {
  at::Tensor a = at::ones({2});
  at::Tensor view = a.view({2}); // shares a's counter
  const auto start = a._version();
  a.unsafeGetTensorImpl()->bump_version(); // the kernel above, for a
  a.unsafeGetTensorImpl()->bump_version(); // and for the view
  ASSERT_EQ(view._version(), start + 2);

  aliasguard::WrittenVersions untouched;
  untouched.remember(*a.unsafeGetTensorImpl());
  untouched.remember(*view.unsafeGetTensorImpl());
  untouched.take_back_bumps_made_above();
  EXPECT_EQ(a._version(), start);
  untouched.give_back_unmoved(); // the body neither called the op nor wrote
  EXPECT_EQ(a._version(), start + 2);

  aliasguard::WrittenVersions written;
  written.remember(*a.unsafeGetTensorImpl());
  written.take_back_bumps_made_above();
  EXPECT_EQ(a._version(), start + 1);
  a.unsafeGetTensorImpl()->bump_version(); // the body's call of the op
  const auto seen = a._version(); // recorded by the body
  a.unsafeGetTensorImpl()->bump_version(); // a second write in the body
  written.give_back_unmoved();
  EXPECT_EQ(a._version(), seen + 1); // moved: nothing given back, not stale
}

} // namespace
