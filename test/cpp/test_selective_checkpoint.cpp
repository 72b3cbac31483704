// SelectiveCheckpointCache: the forward index by version counter, and what
// the recompute finds. See Note [SAC cache keyed by version counter].

#include <torch/csrc/autograd/selective_checkpoint.h>

#include <c10/core/VersionCounterUtils.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/csrc/utils/schema_alias_analysis.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace {

using aliasguard::autograd::SelectiveCheckpointCache;
using Kind = SelectiveCheckpointCache::SlotKind;

int mm_key;
int sin_key;
const void* const kMm = &mm_key;
const void* const kSin = &sin_key;

TEST(
    SelectiveCheckpointCache,
    FindsCachedOutputThroughAnyTensorSharingItsCounter) {
  SelectiveCheckpointCache cache;
  at::Tensor first = at::randn({2, 2});
  at::Tensor second = at::randn({3});
  EXPECT_FALSE(cache.has_cached_outputs());
  cache.record_recompute(kSin);
  cache.record_cached(kMm, {&first});
  const size_t entry = cache.record_cached(kMm, {nullptr, &second});
  ASSERT_TRUE(cache.has_cached_outputs());

  // A view shares its base's counter: found, with the output's place.
  at::Tensor view = second.view({3});
  auto found = cache.find_cached(*view.unsafeGetTensorImpl());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->entry, entry);
  EXPECT_EQ(found->output_index, 1u);

  // A copy has a counter of its own.
  at::Tensor copy = second.clone();
  EXPECT_FALSE(cache.find_cached(*copy.unsafeGetTensorImpl()).has_value());

  cache.end_forward();
  EXPECT_FALSE(cache.has_cached_outputs());
  EXPECT_FALSE(cache.find_cached(*second.unsafeGetTensorImpl()).has_value());
}

TEST(SelectiveCheckpointCache, RecomputeWalksTheForwardCallsPerOp) {
  SelectiveCheckpointCache cache;
  at::Tensor out = at::randn({2});
  cache.record_recompute(kMm);
  const size_t entry = cache.record_cached(kMm, {&out});
  cache.end_forward();

  cache.begin_recompute();
  EXPECT_EQ(cache.next_call(kMm).kind, Kind::kRecompute);
  auto cached = cache.next_call(kMm);
  EXPECT_EQ(cached.kind, Kind::kCached);
  EXPECT_EQ(cached.entry, entry);
  EXPECT_FALSE(cache.changed_output(entry).has_value());
  cache.consume(entry);
  auto extra = cache.next_call(kMm);
  EXPECT_EQ(extra.kind, Kind::kMissing);
  EXPECT_EQ(extra.forward_calls, 2u);
  EXPECT_EQ(extra.call_index, 2u);
  EXPECT_EQ(cache.next_call(kSin).kind, Kind::kMissing);

  // A second backward starts over and finds the entry consumed.
  cache.begin_recompute();
  cache.next_call(kMm);
  EXPECT_EQ(cache.next_call(kMm).kind, Kind::kConsumed);
}

TEST(SelectiveCheckpointCache, ReportsTheFirstOutputWrittenAfterCaching) {
  SelectiveCheckpointCache cache;
  at::Tensor a = at::randn({2});
  at::Tensor b = at::randn({2});
  // randn fills in place: the version is not 0 to begin with.
  const uint32_t cached_version = b._version();
  const size_t entry = cache.record_cached(kMm, {&a, &b});
  cache.end_forward();
  b.add_(1);
  b.add_(1);
  auto change = cache.changed_output(entry);
  ASSERT_TRUE(change.has_value());
  EXPECT_EQ(change->output_index, 1u);
  EXPECT_EQ(change->expected, cached_version);
  EXPECT_EQ(change->found, cached_version + 2);
}

TEST(SelectiveCheckpointCache, InferenceTensorsAreNotWatched) {
  SelectiveCheckpointCache cache;
  at::Tensor inference;
  {
    c10::InferenceMode guard;
    inference = at::randn({2});
  }
  const size_t entry = cache.record_cached(kMm, {&inference});
  EXPECT_FALSE(cache.has_cached_outputs());
  EXPECT_FALSE(cache.find_cached(*inference.unsafeGetTensorImpl()).has_value());
  EXPECT_FALSE(cache.changed_output(entry).has_value());
}

} // namespace

namespace {

// See Note [A batched matmul's result shares the cached counter].
TEST(SelectiveCheckpointCache, UnsafeViewSharesTheCounterOnlyOfACachedInput) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  SelectiveCheckpointCache cache;
  at::Tensor cached = at::randn({2, 3, 4});
  at::Tensor other = at::randn({2, 3, 4});
  cache.record_cached(kMm, {&cached});

  at::Tensor from_other = at::_unsafe_view(other, {6, 4});
  cache.share_counter_if_cached(other, from_other);
  EXPECT_FALSE(aliasguard::shares_version_counter(
      *from_other.unsafeGetTensorImpl(), *other.unsafeGetTensorImpl()));

  at::Tensor from_cached = at::_unsafe_view(cached, {6, 4});
  ASSERT_FALSE(aliasguard::shares_version_counter(
      *from_cached.unsafeGetTensorImpl(), *cached.unsafeGetTensorImpl()));
  cache.share_counter_if_cached(cached, from_cached);
  EXPECT_TRUE(aliasguard::shares_version_counter(
      *from_cached.unsafeGetTensorImpl(), *cached.unsafeGetTensorImpl()));

  // A copy is never given a counter that is not its memory's.
  at::Tensor copy = cached.reshape({6, 4}).clone();
  cache.share_counter_if_cached(cached, copy);
  EXPECT_FALSE(aliasguard::shares_version_counter(
      *copy.unsafeGetTensorImpl(), *cached.unsafeGetTensorImpl()));
}

// See Note [Which op calls SAC may cache].
aliasguard::autograd::SacOpTraits traits_of(const char* schema) {
  const c10::FunctionSchema parsed = torch::jit::parseSchema(schema);
  return aliasguard::autograd::sac_op_traits(
      parsed.operator_name(), aliasguard::utils::SchemaAliasAnalysis(parsed));
}

TEST(SacOpTraits, OnlyOpsWithFreshReturnsAndNoWritesMayBeCached) {
  const auto mm = traits_of("t::mm(Tensor self, Tensor mat2) -> Tensor");
  EXPECT_TRUE(mm.may_cache());
  EXPECT_FALSE(mm.has_annotated_returns);

  const auto view =
      traits_of("t::view(Tensor(a) self, int[] size) -> Tensor(a)");
  EXPECT_FALSE(view.may_cache());
  EXPECT_TRUE(view.may_return_view);
  EXPECT_TRUE(view.has_annotated_returns);

  // A wildcard or union still may alias: never handed back as a fresh output.
  const auto to =
      traits_of("t::to(Tensor(a|b) self, int dtype) -> Tensor(a|b)");
  EXPECT_FALSE(to.may_cache());

  const auto add_ =
      traits_of("t::add_(Tensor(a!) self, Tensor other) -> Tensor(a!)");
  EXPECT_FALSE(add_.may_cache());
  EXPECT_FALSE(add_.may_return_view);
  EXPECT_EQ(add_.written_arguments, std::vector<size_t>{0});

  // Writes without returns (the _foreach_*_ family) and written out= lists.
  const auto foreach =
      traits_of("t::_foreach_add_(Tensor(a!)[] self, Tensor[] other) -> ()");
  EXPECT_FALSE(foreach.may_cache());
  EXPECT_EQ(foreach.written_arguments, std::vector<size_t>{0});
}

TEST(SacOpTraits, UnsafeViewIsRecognisedByNameOnlyForTheDefaultOverload) {
  EXPECT_TRUE(
      traits_of("aten::_unsafe_view(Tensor self, SymInt[] size) -> Tensor")
          .is_unsafe_view);
  EXPECT_FALSE(
      traits_of("aten::_unsafe_view.out(Tensor self, SymInt[] size, *, "
                "Tensor(a!) out) -> Tensor(a!)")
          .is_unsafe_view);
  EXPECT_FALSE(
      traits_of("t::_unsafe_view(Tensor self) -> Tensor").is_unsafe_view);
}

} // namespace
