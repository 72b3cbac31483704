#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/storage_alias.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "wrapper_tensor.h"

namespace {

using aliasguard::autograd::AliasNames;
using aliasguard::autograd::checked_storage_nbytes;
using aliasguard::autograd::differentiable_view_problem;
using aliasguard::autograd::storage_alias_problem;

constexpr AliasNames kNames{"tensor", "base", "base's storage"};

using aliasguard::testing::make_wrapper;

std::string problem_of(const at::Tensor& tensor, const at::Tensor& base) {
  return storage_alias_problem(tensor, base, kNames).value_or("");
}

TEST(CheckedStorageNbytes, MatchesTheBytesAContiguousTensorNeeds) {
  EXPECT_EQ(checked_storage_nbytes({2, 3}, {3, 1}, 0, 4), 24);
  EXPECT_EQ(checked_storage_nbytes({2, 3}, {3, 1}, 5, 4), 44);
  EXPECT_EQ(checked_storage_nbytes({4}, {0}, 0, 8), 8); // expanded
  EXPECT_EQ(checked_storage_nbytes({0, 7}, {7, 1}, 100, 4), 0); // empty
  EXPECT_EQ(checked_storage_nbytes({}, {}, 3, 2), 8); // 0-d
}

TEST(CheckedStorageNbytes, RefusesOverflowAndNegativeValues) {
  constexpr int64_t kHuge = int64_t{1} << 62;
  EXPECT_EQ(checked_storage_nbytes({2}, {kHuge}, 0, 4), std::nullopt);
  EXPECT_EQ(checked_storage_nbytes({3}, {kHuge}, 0, 1), std::nullopt);
  EXPECT_EQ(
      checked_storage_nbytes({1}, {1}, std::numeric_limits<int64_t>::max(), 1),
      std::nullopt);
  EXPECT_EQ(checked_storage_nbytes({2}, {-1}, 4, 4), std::nullopt);
  EXPECT_EQ(checked_storage_nbytes({2}, {1}, -1, 4), std::nullopt);
  EXPECT_EQ(checked_storage_nbytes({2}, {1, 1}, 0, 4), std::nullopt);
}

TEST(StorageAlias, InBoundsRealStorageIsAccepted) {
  const at::Tensor base = at::zeros({6});
  const at::Tensor tensor = at::zeros({2, 3});
  EXPECT_EQ(storage_alias_problem(tensor, base, kNames), std::nullopt);
  EXPECT_EQ(
      storage_alias_problem(make_wrapper({6}, {1}, 24), base, kNames),
      std::nullopt);
}

TEST(StorageAlias, DenseTensorGivenAPlaceholderIsRefused) {
  // Once a crash: the dense tensor would read a null data pointer.
  const at::Tensor wrapper = make_wrapper({4}, {1}, 16);
  EXPECT_NE(
      problem_of(at::zeros({1000}), wrapper).find("placeholder"),
      std::string::npos);
  // Placeholder to placeholder is fine: no data is read through either.
  EXPECT_EQ(
      storage_alias_problem(make_wrapper({4}, {1}, 16), wrapper, kNames),
      std::nullopt);
}

TEST(StorageAlias, OverflowingStridesAreRefused) {
  // Once a crash: 2**62 * 4 bytes wraps around int64.
  const at::Tensor wrapper = make_wrapper({2}, {int64_t{1} << 62}, 16);
  const std::string problem = problem_of(wrapper, at::zeros({4}));
  EXPECT_NE(problem.find("more bytes than int64"), std::string::npos)
      << problem;
}

TEST(StorageAlias, WrapperLargerThanTheStorageIsRefused) {
  // Once a crash: a (1 << 24,) wrapper over a 16-byte storage.
  const at::Tensor wrapper = make_wrapper({int64_t{1} << 24}, {1}, 0);
  const std::string problem = problem_of(wrapper, at::zeros({4}));
  EXPECT_NE(
      problem.find("need 67108864 bytes of storage but base's storage has 16"),
      std::string::npos)
      << problem;
}

TEST(StorageAlias, LayoutAndDeviceAreChecked) {
  const at::Tensor sparse = at::zeros({4}).to_sparse();
  EXPECT_NE(
      problem_of(sparse, at::zeros({4})).find("layout Sparse"),
      std::string::npos);
  EXPECT_NE(
      problem_of(at::zeros({4}), sparse).find("no storage"), std::string::npos);
  const at::Tensor meta =
      at::empty({4}, at::TensorOptions().device(c10::kMeta));
  EXPECT_NE(
      problem_of(meta, at::zeros({4})).find("is on meta"), std::string::npos);
}

TEST(DifferentiableView, DtypeMustMatchOrBeTheComplexPairWithItsViewFn) {
  const at::Tensor base = at::zeros({4});
  const at::Tensor complex = at::zeros({2}, at::kComplexFloat);
  EXPECT_EQ(
      differentiable_view_problem(at::zeros({4}), base, false, kNames),
      std::nullopt);
  EXPECT_EQ(
      differentiable_view_problem(complex, base, /*has_view_fn=*/true, kNames),
      std::nullopt);
  EXPECT_NE(
      differentiable_view_problem(complex, base, /*has_view_fn=*/false, kNames),
      std::nullopt);
  const auto problem = differentiable_view_problem(
      at::zeros({2}, at::kDouble), base, false, kNames);
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find("dtype Double"), std::string::npos) << *problem;
}

TEST(DifferentiableView, LayoutsMustBeStrided) {
  const at::Tensor sparse = at::zeros({4}).to_sparse();
  const auto problem =
      differentiable_view_problem(at::zeros({4}), sparse, false, kNames);
  ASSERT_TRUE(problem.has_value());
  EXPECT_NE(problem->find("layout Sparse"), std::string::npos) << *problem;
}

} // namespace
