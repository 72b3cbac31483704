#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/VersionCounterUtils.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/mark_as_view.h>
#include <torch/csrc/autograd/variable.h>

#include "wrapper_tensor.h"

namespace {

using aliasguard::autograd::mark_as_view;
using aliasguard::autograd::MarkAsViewOptions;
using torch::autograd::CreationMeta;

// A tensor sharing base's memory with no autograd metadata: what a view op
// returns below autograd.
at::Tensor plain_alias(const at::Tensor& base) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return base.view(base.sizes());
}

bool shares_counter(const at::Tensor& a, const at::Tensor& b) {
  return aliasguard::shares_version_counter(
      *a.unsafeGetTensorImpl(), *b.unsafeGetTensorImpl());
}

TEST(MarkAsView, MakesAViewSharingTheCounter) {
  at::Tensor base = at::arange(4, at::kFloat);
  at::Tensor alias = plain_alias(base);
  ASSERT_FALSE(alias.is_view());
  ASSERT_FALSE(shares_counter(alias, base));

  const at::Tensor& marked = mark_as_view(alias, base);
  EXPECT_TRUE(marked.is_same(alias));
  EXPECT_TRUE(alias.is_view());
  EXPECT_TRUE(alias._base().is_same(base));
  EXPECT_TRUE(shares_counter(alias, base));
  EXPECT_EQ(
      torch::autograd::impl::get_view_autograd_meta(alias)->get_creation_meta(),
      CreationMeta::DEFAULT);
}

TEST(MarkAsView, InplaceOnBaseBumpsTheView) {
  at::Tensor base = at::arange(4, at::kFloat);
  at::Tensor alias = plain_alias(base);
  mark_as_view(alias, base);
  const auto before = alias._version();
  base.add_(1);
  EXPECT_EQ(alias._version(), before + 1);
}

TEST(MarkAsView, ViewOfAViewPointsAtTheRootBase) {
  at::Tensor root = at::arange(4, at::kFloat);
  at::Tensor middle = root.view({2, 2});
  ASSERT_TRUE(middle.is_view());
  at::Tensor alias = plain_alias(middle);
  mark_as_view(alias, middle);
  EXPECT_TRUE(alias._base().is_same(root));
}

TEST(MarkAsView, GradientsReachTheBase) {
  at::Tensor base = at::arange(4, at::kDouble).set_requires_grad(true);
  at::Tensor alias = plain_alias(base);
  mark_as_view(alias, base);
  ASSERT_TRUE(alias.requires_grad());
  ASSERT_TRUE(alias.grad_fn()) << "a marked view must not act as a leaf";

  at::Tensor reference_base = base.detach().clone().set_requires_grad(true);
  at::Tensor reference_view = reference_base.view({4});

  (alias * alias).sum().backward();
  (reference_view * reference_view).sum().backward();
  ASSERT_TRUE(base.grad().defined());
  EXPECT_TRUE(at::allclose(base.grad(), reference_base.grad()));
  EXPECT_TRUE(at::allclose(base.grad(), 2 * base.detach()));
}

TEST(MarkAsView, GradientsFollowViewFnReplay) {
  at::Tensor base = at::arange(6, at::kDouble).set_requires_grad(true);
  at::Tensor alias;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    alias = base.view({2, 3}).t();
  }
  int replays = 0;
  MarkAsViewOptions options;
  options.view_fn = [&replays](const at::Tensor& b) {
    ++replays;
    return b.view({2, 3}).t();
  };
  mark_as_view(alias, base, options);
  (alias * at::arange(6, at::kDouble).view({3, 2})).sum().backward();
  EXPECT_GE(replays, 1);
  EXPECT_TRUE(at::allclose(
      base.grad(), at::arange(6, at::kDouble).view({3, 2}).t().reshape({6})));
}

TEST(MarkAsView, NonDifferentiableViewSharesOnlyTheCounter) {
  at::Tensor base = at::ones({2}).set_requires_grad(true);
  at::Tensor alias = plain_alias(base);
  MarkAsViewOptions options;
  options.is_bw_differentiable = false;
  options.is_fw_differentiable = false;
  mark_as_view(alias, base, options);
  EXPECT_TRUE(shares_counter(alias, base));
  EXPECT_FALSE(alias.is_view());
  EXPECT_FALSE(alias.requires_grad());
}

TEST(MarkAsView, AliasStorageForPlaceholderlessTensor) {
  at::Tensor base = at::arange(6, at::kFloat);
  at::Tensor other = at::zeros({2}, at::kFloat);
  const std::vector<int64_t> sizes{2};
  const std::vector<int64_t> strides{2};
  other.unsafeGetTensorImpl()->set_sizes_and_strides(
      sizes, strides, std::optional<int64_t>(1));
  MarkAsViewOptions options;
  options.alias_storage = true;
  mark_as_view(other, base, options);
  EXPECT_TRUE(other.is_view());
  EXPECT_EQ(other.storage_offset(), 1);
  EXPECT_TRUE(at::equal(other, at::tensor({1.f, 3.f})));
}

// Every refusal leaves the tensor exactly as it was.
struct Snapshot {
  explicit Snapshot(const at::Tensor& t)
      : impl(t.unsafeGetTensorImpl()),
        meta(impl->autograd_meta()),
        storage(impl->unsafe_storage().unsafeGetStorageImpl()),
        version(t._version()) {}
  bool operator==(const Snapshot&) const = default;
  c10::TensorImpl* impl;
  c10::AutogradMetaInterface* meta;
  c10::StorageImpl* storage;
  int64_t version;
};

void expect_refused(
    const at::Tensor& tensor,
    const at::Tensor& base,
    const std::string& message_part,
    MarkAsViewOptions options = {}) {
  const Snapshot before(tensor);
  const bool was_view = tensor.is_view();
  const bool shared_before = shares_counter(tensor, base);
  try {
    mark_as_view(tensor, base, std::move(options));
    ADD_FAILURE() << "expected mark_as_view to refuse: " << message_part;
  } catch (const c10::Error& e) {
    EXPECT_NE(
        std::string(e.what_without_backtrace()).find(message_part),
        std::string::npos)
        << e.what_without_backtrace();
  }
  EXPECT_TRUE(Snapshot(tensor) == before);
  EXPECT_EQ(tensor.is_view(), was_view);
  EXPECT_EQ(shares_counter(tensor, base), shared_before);
}

TEST(MarkAsView, RefusesALeafRequiringGrad) {
  at::Tensor base = at::ones({2});
  at::Tensor alias = plain_alias(base).set_requires_grad(true);
  expect_refused(alias, base, "leaf that requires grad");
}

TEST(MarkAsView, RefusesAnExistingView) {
  at::Tensor base = at::ones({2});
  at::Tensor other_base = at::ones({2});
  at::Tensor view = other_base.view({2});
  expect_refused(view, base, "already a view");
}

TEST(MarkAsView, RefusesATensorWithGradFn) {
  at::Tensor leaf = at::ones({2}).set_requires_grad(true);
  at::Tensor product = leaf * 2;
  expect_refused(product, product.detach(), "has a grad_fn (MulBackward1)");
}

TEST(MarkAsView, RefusesForeignStorage) {
  expect_refused(at::ones({2}), at::ones({2}), "does not share base's storage");
}

TEST(MarkAsView, RefusesItself) {
  at::Tensor base = at::ones({2});
  expect_refused(base, base, "same tensor");
}

TEST(MarkAsView, RefusesAliasStorageOutOfBounds) {
  at::Tensor base = at::ones({2});
  MarkAsViewOptions options;
  options.alias_storage = true;
  expect_refused(at::ones({3}), base, "need 12 bytes", std::move(options));
}

TEST(MarkAsView, RefusesADifferentiableViewOfAnotherDtype) {
  at::Tensor base = at::ones({4});
  at::Tensor other = at::zeros({2}, at::kDouble);
  MarkAsViewOptions options;
  options.alias_storage = true;
  expect_refused(
      other,
      base,
      "has dtype Double but base has dtype Float",
      std::move(options));
}

TEST(MarkAsView, RefusesADenseTensorForAPlaceholderStorage) {
  const at::Tensor wrapper = aliasguard::testing::make_wrapper({4});
  MarkAsViewOptions options;
  options.alias_storage = true;
  expect_refused(at::zeros({1000}), wrapper, "placeholder", std::move(options));
}

TEST(MarkAsView, RefusesNonDifferentiableWithCreationMeta) {
  at::Tensor base = at::ones({2});
  MarkAsViewOptions options;
  options.is_bw_differentiable = false;
  options.is_fw_differentiable = false;
  options.creation_meta = CreationMeta::NO_GRAD_MODE;
  expect_refused(plain_alias(base), base, "creation_meta DEFAULT", options);
}

TEST(MarkAsView, RefusesInferenceTensors) {
  at::Tensor inference;
  {
    c10::InferenceMode guard;
    inference = at::ones({2});
  }
  at::Tensor normal = at::ones({2});
  EXPECT_THROW(mark_as_view(plain_alias(normal), inference), c10::Error);
  EXPECT_THROW(mark_as_view(inference, normal), c10::Error);
}

TEST(MarkAsView, CreationMetaNames) {
  EXPECT_EQ(
      aliasguard::autograd::creation_meta_from_name("NO_GRAD_MODE"),
      CreationMeta::NO_GRAD_MODE);
  EXPECT_STREQ(
      aliasguard::autograd::creation_meta_name(CreationMeta::INFERENCE_MODE),
      "INFERENCE_MODE");
  EXPECT_THROW(
      aliasguard::autograd::creation_meta_from_name("DEFAULTS"),
      c10::ValueError);
}

TEST(MarkAsView, CreationMetaFollowsGradMode) {
  at::Tensor base = at::ones({2});
  at::Tensor alias = plain_alias(base);
  {
    at::NoGradGuard no_grad;
    mark_as_view(alias, base);
  }
  EXPECT_EQ(
      torch::autograd::impl::get_view_autograd_meta(alias)->get_creation_meta(),
      CreationMeta::NO_GRAD_MODE);
}

} // namespace
