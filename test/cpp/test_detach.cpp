#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/detach_compositeexplicitautograd_dispatch.h>
#include <aten/src/ATen/native/DetachKeepVersionCounter.h>
#include <c10/core/VersionCounterUtils.h>
#include <torch/csrc/autograd/variable.h>

namespace {

TEST(DetachBelowAutograd, SharesVersionCounterThroughDispatcher) {
  at::Tensor a = at::ones({3});
  at::Tensor detached;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    detached = a.detach();
  }
  EXPECT_TRUE(aliasguard::shares_version_counter(
      *a.unsafeGetTensorImpl(), *detached.unsafeGetTensorImpl()));
  const auto before = detached._version();
  a.add_(1);
  EXPECT_EQ(detached._version(), before + 1);
  detached.mul_(2);
  EXPECT_EQ(a._version(), before + 2);
}

TEST(DetachBelowAutograd, StockKernelWouldNotShare) {
  // The CompositeExplicitAutograd kernel we shadow gives a fresh counter: this
  // is the bug aliasguard fixes, kept visible so the test above means
  // something.
  at::Tensor a = at::ones({3});
  at::Tensor stock;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    stock = at::compositeexplicitautograd::detach(a);
  }
  EXPECT_FALSE(aliasguard::shares_version_counter(
      *a.unsafeGetTensorImpl(), *stock.unsafeGetTensorImpl()));
}

TEST(DetachBelowAutograd, RegisteredForCpuWithoutReplacingComposite) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::detach", "");
  EXPECT_TRUE(op.hasKernelForDispatchKey(c10::DispatchKey::CPU));
  EXPECT_TRUE(
      op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd));
  EXPECT_FALSE(op.hasKernelForDispatchKey(c10::DispatchKey::Meta));
}

TEST(DetachBelowAutograd, ResultIsDetachedAlias) {
  at::Tensor a = at::arange(6, at::kFloat).view({2, 3});
  at::Tensor d = aliasguard::native::detach_keep_version_counter(a);
  EXPECT_FALSE(d.is_same(a));
  EXPECT_EQ(d.data_ptr(), a.data_ptr());
  EXPECT_EQ(d.sizes(), a.sizes());
  EXPECT_EQ(d.strides(), a.strides());
  EXPECT_FALSE(d.requires_grad());
}

TEST(DetachBelowAutograd, TopLevelDetachUnchanged) {
  at::Tensor a = at::ones({2}).set_requires_grad(true);
  at::Tensor d = a.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(aliasguard::shares_version_counter(
      *a.unsafeGetTensorImpl(), *d.unsafeGetTensorImpl()));
  EXPECT_FALSE(d.is_view());
}

TEST(DetachBelowAutograd, InferenceTensorHasNoCounter) {
  at::Tensor a;
  at::Tensor d;
  {
    c10::InferenceMode guard;
    a = at::ones({2});
    d = a.detach();
  }
  EXPECT_TRUE(d.is_inference());
  EXPECT_FALSE(d.unsafeGetTensorImpl()->version_counter().enabled());
}

TEST(DetachBelowAutograd, ChainedDetachesShareOneCounter) {
  // Each detach below autograd hands on the very counter it was given (not a
  // copy of its value): a bump through the last is seen by the first.
  at::Tensor a = at::zeros({2});
  at::Tensor last;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    last = a.detach().detach().detach();
  }
  EXPECT_TRUE(aliasguard::shares_version_counter(
      *a.unsafeGetTensorImpl(), *last.unsafeGetTensorImpl()));
  const auto before = a._version();
  last.add_(1);
  EXPECT_EQ(a._version(), before + 1);
}

} // namespace
