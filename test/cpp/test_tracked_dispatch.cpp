// The C++ pieces behind automatic view tracking in __torch_dispatch__
// bodies: the core's TrackedDispatchBody, views made in a tracked scope
// building their grad_fn from their base, settling written arguments' versions,
// the written arguments of a schema, and what alias correction does with view
// metadata made below autograd. The wrapper that uses them is tested from
// Python (test/python/test_auto_tracking.py).

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/VersionCounterUtils.h>
#include <torch/csrc/autograd/track_views.h>
#include <torch/csrc/utils/alias_correction.h>
#include <torch/csrc/utils/op_correction_info.h>
#include <torch/csrc/utils/schema_alias_analysis.h>
#include <torch/csrc/utils/tracked_dispatch_body.h>

#include <vector>

namespace {

using aliasguard::utils::AliasingError;
using aliasguard::utils::CorrectionOptions;
using aliasguard::utils::OpValueRef;

TEST(WrittenVersions, UndoOneBumpTakesBackOneWriteOfWhatMoved) {
  at::Tensor written = at::ones({2});
  at::Tensor untouched = at::ones({2});
  const auto untouched_before = untouched._version();
  aliasguard::WrittenVersions versions;
  versions.remember(*written.unsafeGetTensorImpl());
  versions.remember(*untouched.unsafeGetTensorImpl());
  const auto before = written._version();
  written.add_(1);
  written.add_(1);
  at::Tensor view = written.view({2});
  EXPECT_EQ(view._version(), before + 2);
  versions.undo_one_bump();
  // The second write stays counted: a version recorded between the two
  // writes (before + 1) must not match again once the outer bump comes.
  EXPECT_EQ(written._version(), before + 1);
  EXPECT_EQ(view._version(), before + 1); // one counter for the alias group
  EXPECT_EQ(untouched._version(), untouched_before);
}

TEST(WrittenVersions, UndoOneBumpAfterOneWriteLeavesTheCountForTheOuterBump) {
  at::Tensor written = at::ones({2});
  aliasguard::WrittenVersions versions;
  versions.remember(*written.unsafeGetTensorImpl());
  const auto before = written._version();
  written.add_(1);
  versions.undo_one_bump();
  EXPECT_EQ(written._version(), before);
}

TEST(WrittenVersions, BumpToOnePerWriteCountsAWriteNobodyCounted) {
  at::Tensor moved = at::ones({2});
  at::Tensor unmoved = at::ones({2});
  const auto moved_before = moved._version();
  const auto unmoved_before = unmoved._version();
  aliasguard::WrittenVersions versions;
  versions.remember(*moved.unsafeGetTensorImpl());
  versions.remember(*unmoved.unsafeGetTensorImpl());
  moved.add_(1);
  versions.bump_to_one_per_write();
  EXPECT_EQ(moved._version(), moved_before + 1);
  EXPECT_EQ(unmoved._version(), unmoved_before + 1);
}

TEST(WrittenVersions, BumpToOnePerWriteCountsEachListedAliasOnce) {
  // _foreach_add_([a, a], 1) and _foreach_mul_ of two halves of one base
  // bump the shared counter twice at top level.
  at::Tensor a = at::zeros({2});
  at::Tensor base = at::zeros({4});
  at::Tensor low = base.narrow(0, 0, 2);
  at::Tensor high = base.narrow(0, 2, 2);
  const auto a_before = a._version();
  const auto base_before = base._version();
  aliasguard::WrittenVersions versions;
  versions.remember(*a.unsafeGetTensorImpl());
  versions.remember(*a.unsafeGetTensorImpl());
  versions.remember(*low.unsafeGetTensorImpl());
  versions.remember(*high.unsafeGetTensorImpl());
  low.add_(1); // the body counted one of the two writes itself
  versions.bump_to_one_per_write();
  EXPECT_EQ(a._version(), a_before + 2);
  EXPECT_EQ(base._version(), base_before + 2);
  EXPECT_EQ(high._version(), base_before + 2);
}

TEST(WrittenVersions, InferenceTensorsAreSkipped) {
  at::Tensor inference;
  {
    c10::InferenceMode guard;
    inference = at::ones({2});
  }
  aliasguard::WrittenVersions versions;
  versions.remember(*inference.unsafeGetTensorImpl());
  EXPECT_TRUE(versions.empty());
  versions.undo_one_bump();
  versions.bump_to_one_per_write(); // nothing to do, nothing thrown
}

std::vector<size_t> written_arguments(const char* name, const char* overload) {
  const auto analysis = aliasguard::utils::schema_alias_analysis(
      c10::OperatorName(name, overload));
  EXPECT_NE(analysis, nullptr) << name;
  return analysis ? analysis->written_arguments() : std::vector<size_t>{};
}

TEST(SchemaAliasAnalysis, WrittenArgumentsReturnedOrNot) {
  EXPECT_EQ(
      written_arguments("aten::add_", "Tensor"), (std::vector<size_t>{0}));
  EXPECT_EQ(written_arguments("aten::add", "out"), (std::vector<size_t>{3}));
  EXPECT_EQ(
      written_arguments("aten::_foreach_add_", "Scalar"),
      (std::vector<size_t>{0}));
  // running_mean, running_var: written, not returned.
  EXPECT_EQ(
      written_arguments("aten::_native_batch_norm_legit", ""),
      (std::vector<size_t>{3, 4}));
  EXPECT_TRUE(written_arguments("aten::sin", "").empty());
  EXPECT_TRUE(written_arguments("aten::view", "").empty());
}

const aliasguard::utils::SchemaAliasAnalysis& analysis_of(
    const char* name,
    const char* overload) {
  static std::vector<
      std::shared_ptr<const aliasguard::utils::SchemaAliasAnalysis>>
      keep;
  keep.push_back(aliasguard::utils::schema_alias_analysis(
      c10::OperatorName(name, overload)));
  return *keep.back();
}

CorrectionOptions below_a_view_kernel() {
  CorrectionOptions options;
  options.outer_kernel_marks_views = true;
  return options;
}

TEST(ViewMetadataBelowAutograd, ViewOfTheInputIsHandedBackWithoutMetadata) {
  at::Tensor x = at::randn({4});
  at::Tensor out = x.view({2, 2}); // through ADInplaceOrView: a real view
  ASSERT_TRUE(out.is_view());
  const c10::IValue size(std::vector<int64_t>{2, 2});
  const std::vector<OpValueRef> args{OpValueRef(x), OpValueRef::other("list")};
  const std::vector<OpValueRef> rets{OpValueRef(out)};
  aliasguard::utils::correct_aliasing_borrowed(
      analysis_of("aten::view", ""), args, rets, below_a_view_kernel());
  EXPECT_FALSE(out.is_view());
  EXPECT_EQ(out.unsafeGetTensorImpl()->autograd_meta(), nullptr);
  EXPECT_TRUE(aliasguard::shares_version_counter(
      *out.unsafeGetTensorImpl(), *x.unsafeGetTensorImpl()));
  EXPECT_TRUE(out.storage().is_alias_of(x.storage()));
}

TEST(ViewMetadataBelowAutograd, LeftAloneWithoutAnOuterKernel) {
  at::Tensor x = at::randn({4});
  at::Tensor out = x.view({2, 2});
  const std::vector<OpValueRef> args{OpValueRef(x), OpValueRef::other("list")};
  const std::vector<OpValueRef> rets{OpValueRef(out)};
  aliasguard::utils::correct_aliasing_borrowed(
      analysis_of("aten::view", ""), args, rets);
  EXPECT_TRUE(out.is_view());
}

TEST(ViewMetadataBelowAutograd, ViewWithAGradFnKeepsItsMetadata) {
  const c10::AutoGradMode grad_mode(true);
  at::Tensor x = at::randn({4}).set_requires_grad(true);
  at::Tensor out = x.view({2, 2}); // made above autograd: ViewBackward
  ASSERT_NE(out.grad_fn(), nullptr);
  const std::vector<OpValueRef> args{OpValueRef(x), OpValueRef::other("list")};
  const std::vector<OpValueRef> rets{OpValueRef(out)};
  aliasguard::utils::correct_aliasing_borrowed(
      analysis_of("aten::view", ""), args, rets, below_a_view_kernel());
  EXPECT_TRUE(out.is_view());
  EXPECT_NE(out.grad_fn(), nullptr);
}

TEST(ViewMetadataBelowAutograd, ViewOfAnotherTensorIsAnErrorAndChangesNothing) {
  at::Tensor other = at::randn({4});
  at::Tensor x = at::randn({4}); // other memory, other counter
  at::Tensor out = other.view({2, 2});
  const std::vector<OpValueRef> args{OpValueRef(x), OpValueRef::other("list")};
  const std::vector<OpValueRef> rets{OpValueRef(out)};
  try {
    aliasguard::utils::correct_aliasing_borrowed(
        analysis_of("aten::view", ""), args, rets, below_a_view_kernel());
    FAIL() << "expected AliasingError";
  } catch (const AliasingError& error) {
    EXPECT_EQ(error.op(), "aten::view");
    EXPECT_EQ(error.return_index(), 0u);
    EXPECT_EQ(error.argument(), "self");
    EXPECT_NE(
        std::string(error.what()).find("view of another tensor"),
        std::string::npos);
  }
  EXPECT_TRUE(out.is_view());
  EXPECT_TRUE(aliasguard::shares_version_counter(
      *out.unsafeGetTensorImpl(), *other.unsafeGetTensorImpl()));
}

TEST(ViewMetadataBelowAutograd, ViewOfAnotherAliasOfTheInputsMemoryIsRepaired) {
  // What a body answering a view op on `x.data` returns. See Note [What
  // correction refuses].
  at::Tensor other = at::randn({4});
  at::Tensor x = at::empty({0});
  x.set_(other.storage(), 0, {4}, {1}); // same memory, a counter of its own
  at::Tensor out = other.view({2, 2});
  const std::vector<OpValueRef> args{OpValueRef(x), OpValueRef::other("list")};
  const std::vector<OpValueRef> rets{OpValueRef(out)};
  aliasguard::utils::correct_aliasing_borrowed(
      analysis_of("aten::view", ""), args, rets, below_a_view_kernel());
  EXPECT_FALSE(out.is_view()); // dropped: the kernel above marks it
  EXPECT_TRUE(aliasguard::shares_version_counter(
      *out.unsafeGetTensorImpl(), *x.unsafeGetTensorImpl()));
}

TEST(ViewMetadataBelowAutograd, ListElementsAreEachHandedBack) {
  at::Tensor x = at::randn({4});
  std::vector<at::Tensor> pieces = x.split(2);
  const std::vector<const at::Tensor*> elements{&pieces[0], &pieces[1]};
  const std::vector<OpValueRef> args{
      OpValueRef(x), OpValueRef::other("int"), OpValueRef::other("int")};
  const std::vector<OpValueRef> rets{OpValueRef::list(elements)};
  aliasguard::utils::correct_aliasing_borrowed(
      analysis_of("aten::split", "Tensor"), args, rets, below_a_view_kernel());
  for (const at::Tensor& piece : pieces) {
    EXPECT_FALSE(piece.is_view());
    EXPECT_TRUE(aliasguard::shares_version_counter(
        *piece.unsafeGetTensorImpl(), *x.unsafeGetTensorImpl()));
  }
}

TEST(ViewMetadataBelowAutograd, MaybeViewOpsMayAnswerWithACopy) {
  at::Tensor x = at::randn({4});
  at::Tensor copy = x.to(at::kDouble);
  const auto& to = analysis_of("aten::to", "dtype");
  std::vector<OpValueRef> args;
  for (size_t i = 0; i < to.num_arguments(); ++i) {
    args.push_back(i == 0 ? OpValueRef(x) : OpValueRef::other("bool"));
  }
  const std::vector<OpValueRef> rets{OpValueRef(copy)};
  EXPECT_THROW(
      aliasguard::utils::correct_aliasing_borrowed(to, args, rets),
      AliasingError);
  CorrectionOptions options;
  options.view_may_be_a_copy = true;
  aliasguard::utils::correct_aliasing_borrowed(to, args, rets, options);
  EXPECT_FALSE(aliasguard::shares_version_counter(
      *copy.unsafeGetTensorImpl(), *x.unsafeGetTensorImpl()));
}

} // namespace

namespace {

aliasguard::utils::OpCorrectionInfo info_of(
    const char* name,
    const char* overload) {
  const auto op =
      c10::Dispatcher::singleton().findOp(c10::OperatorName(name, overload));
  EXPECT_TRUE(op.has_value()) << name;
  return aliasguard::utils::op_correction_info(*op);
}

} // namespace

TEST(TrackedDispatchBody, TakesBackTheBodysBumpOfAnOpWithAnInplaceKernel) {
  const auto info = info_of("aten::add_", "Tensor");
  EXPECT_EQ(
      info.write_counting, aliasguard::utils::WriteCounting::kOuterKernelBumps);
  at::Tensor x = at::zeros({2});
  const auto before = x._version();
  {
    const at::AutoDispatchBelowADInplaceOrView below;
    aliasguard::utils::TrackedDispatchBody body(&info, &info, true, true);
    ASSERT_TRUE(body.wants_written_tensors());
    body.remember_written(*x.unsafeGetTensorImpl());
    {
      const aliasguard::utils::TrackedDispatchBody::Scope scope(body);
      x.add_(at::ones({2})); // tracked: its ADInplaceOrView kernel bumps
      EXPECT_EQ(x._version(), before + 1);
    }
    body.settle();
  }
  EXPECT_EQ(x._version(), before); // the outer kernel's bump is still to come
}

TEST(TrackedDispatchBody, RunsAsStockUnderInferenceModeAndWhenNotCorrected) {
  const auto info = info_of("aten::view", "");
  {
    const c10::InferenceMode inference;
    const aliasguard::utils::TrackedDispatchBody body(&info, &info, true, true);
    EXPECT_FALSE(body.options().tracked);
    EXPECT_FALSE(body.options().outer_kernel_marks_views);
  }
  const at::AutoDispatchBelowADInplaceOrView below;
  const aliasguard::utils::TrackedDispatchBody uncorrected(
      &info, &info, false, true);
  EXPECT_FALSE(uncorrected.options().tracked);
  const aliasguard::utils::TrackedDispatchBody corrected(
      &info, &info, true, true);
  EXPECT_TRUE(corrected.options().tracked);
  EXPECT_TRUE(corrected.options().outer_kernel_marks_views);
}

TEST(TrackedDispatchBody, ExplicitCorrectionReadsTheBodyOfItsOwnOp) {
  const auto view = info_of("aten::view", "");
  const auto t = info_of("aten::t", "");
  const at::AutoDispatchBelowADInplaceOrView below;
  const aliasguard::utils::TrackedDispatchBody body(&view, &view, true, true);
  const aliasguard::utils::TrackedDispatchBody::Scope scope(body);
  EXPECT_TRUE(aliasguard::utils::explicit_correction_options(&view, view)
                  .outer_kernel_marks_views);
  // Another op corrected from inside the body is not the body's own.
  EXPECT_FALSE(aliasguard::utils::explicit_correction_options(&t, t)
                   .outer_kernel_marks_views);
}

TEST(TrackViewsBelowAutograd, ViewOfALeafBuildsItsGradFnFromTheBase) {
  const c10::AutoGradMode grad_mode(true);
  at::Tensor x = at::randn({4}).set_requires_grad(true);
  at::Tensor untracked;
  at::Tensor tracked;
  {
    const at::AutoDispatchBelowADInplaceOrView below;
    untracked = x.view({2, 2}); // stock: a plain alias
    const aliasguard::autograd::TrackViewsGuard guard;
    tracked = x.view({2, 2});
  }
  EXPECT_FALSE(untracked.requires_grad());
  ASSERT_TRUE(tracked.is_view());
  ASSERT_NE(tracked.grad_fn(), nullptr)
      << "a view that requires grad must not be a leaf";
  tracked.sum().backward();
  EXPECT_TRUE(at::equal(x.grad(), at::ones({4})));
  EXPECT_TRUE(aliasguard::autograd::has_tracked_view_kernels());
}
