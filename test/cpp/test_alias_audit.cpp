#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/VersionCounterUtils.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/csrc/utils/alias_audit.h>

#include "wrapper_tensor.h"

#include <string>
#include <vector>

// The audit's judgement of inner tensors: which copies are reported at once,
// which are watched until written (Note [Inner tensors of traceable
// wrappers]), and wrapper views judged by a judge rather than by their
// placeholder storage (Note [Wrapper views judged by their inner tensors]).

namespace {

using aliasguard::testing::make_wrapper;
using aliasguard::utils::AliasingError;
using aliasguard::utils::AliasSite;
using aliasguard::utils::AliasViolation;
using aliasguard::utils::InnerTensorLeaf;
using aliasguard::utils::SchemaAliasAnalysis;

const SchemaAliasAnalysis& slice_analysis() {
  static const SchemaAliasAnalysis analysis(torch::jit::parseSchema(
      "t::slice(Tensor(a) self, int start, int end) -> Tensor(a)"));
  return analysis;
}

const AliasSite& slice_site() {
  static const AliasSite site{slice_analysis(), 0, 0};
  return site;
}

// An audit scope of this thread for the length of a test.
struct AuditScope {
  AuditScope() {
    aliasguard::utils::enter_alias_audit();
  }
  ~AuditScope() {
    aliasguard::utils::exit_alias_audit();
  }
};

struct State {
  at::Tensor wrapper = make_wrapper({8});
  at::Tensor codes = at::zeros({8});
  at::Tensor qmap = at::linspace(-1, 1, 16);

  std::vector<InnerTensorLeaf> leaves() const {
    return {{"codes", codes}, {"qmap", qmap}};
  }
  // A slice that shares the codes and keeps a copy of the table.
  std::vector<InnerTensorLeaf> slice_leaves() const {
    return {{"codes", codes.slice(0, 2, 6)}, {"qmap", qmap.clone()}};
  }
};

TEST(AliasAuditInnerTensors, ViewWhoseInnerDataIsAllCopiedIsReportedAtOnce) {
  const AuditScope scope;
  const State state;
  const std::vector<InnerTensorLeaf> copies = {
      {"codes", state.codes.clone()}, {"qmap", state.qmap.clone()}};
  try {
    aliasguard::utils::audit_inner_view(
        slice_site(), state.wrapper, copies, state.leaves());
    ADD_FAILURE() << "expected AliasingError";
  } catch (const AliasingError& error) {
    EXPECT_EQ(error.kind(), AliasViolation::kViewInnerCopy);
  }
  EXPECT_EQ(aliasguard::utils::watched_inner_copies(), 0u);
}

TEST(AliasAuditInnerTensors, PrivateCopyIsReportedOnlyOnceWritten) {
  const AuditScope scope;
  const State state;
  const std::vector<InnerTensorLeaf> slice = state.slice_leaves();
  aliasguard::utils::audit_inner_view(
      slice_site(), state.wrapper, slice, state.leaves());
  // Checked twice (before and after a judge, say): watched once.
  aliasguard::utils::audit_inner_view(
      slice_site(), state.wrapper, slice, state.leaves());
  EXPECT_EQ(aliasguard::utils::watched_inner_copies(), 1u);
  state.codes.add_(1); // shared with the slice: no divergence
  aliasguard::utils::report_diverged_inner_copies();
  EXPECT_EQ(aliasguard::utils::watched_inner_copies(), 1u);
  // A write to the copy (the slice decodes differently now) is reported by
  // the audit fallback right after the op that wrote.
  try {
    slice[1].tensor.mul_(2);
    ADD_FAILURE() << "expected AliasingError";
  } catch (const AliasingError& error) {
    EXPECT_EQ(error.kind(), AliasViolation::kViewInnerCopy);
    EXPECT_NE(
        std::string(error.what_without_backtrace()).find("inner tensor 'qmap'"),
        std::string::npos);
  }
  EXPECT_EQ(aliasguard::utils::watched_inner_copies(), 0u);
}

TEST(
    AliasAuditInnerTensors,
    WriteToTheInputsTensorIsReportedAndWatchesEndWithTheScope) {
  const State state;
  {
    const AuditScope scope;
    aliasguard::utils::audit_inner_view(
        slice_site(), state.wrapper, state.slice_leaves(), state.leaves());
    EXPECT_THROW(state.qmap.neg_(), AliasingError);
    aliasguard::utils::audit_inner_view(
        slice_site(), state.wrapper, state.slice_leaves(), state.leaves());
    EXPECT_EQ(aliasguard::utils::watched_inner_copies(), 1u);
  }
  EXPECT_EQ(aliasguard::utils::watched_inner_copies(), 0u);
  // Without a scope of its own, the thread cannot watch: reported at once.
  EXPECT_THROW(
      aliasguard::utils::audit_inner_view(
          slice_site(), state.wrapper, state.slice_leaves(), state.leaves()),
      AliasingError);
}

int judged = 0;
bool judge_shared(const AliasSite&, const at::Tensor&, const at::Tensor&) {
  ++judged;
  return true;
}
bool judge_blind(const AliasSite&, const at::Tensor&, const at::Tensor&) {
  ++judged;
  return false;
}

TEST(
    AliasAuditInnerTensors,
    WrapperViewsWithOwnPlaceholdersAreJudgedWhenAsked) {
  const SchemaAliasAnalysis analysis(
      torch::jit::parseSchema("t::split(Tensor(a) self) -> Tensor(a)[]"));
  const at::Tensor input = make_wrapper({4});
  const at::Tensor part = make_wrapper({2}); // a placeholder of its own
  aliasguard::share_version_counter(
      *part.unsafeGetTensorImpl(), *input.unsafeGetTensorImpl());
  const c10::IValue parts(std::vector<at::Tensor>{part});
  judged = 0;
  aliasguard::utils::set_wrapper_view_judge(&judge_shared);
  aliasguard::utils::audit_aliasing(analysis, {input}, {parts}, true, true);
  EXPECT_EQ(judged, 1);
  // Not asked (the result of a corrected __torch_dispatch__): the storage.
  EXPECT_THROW(
      aliasguard::utils::audit_aliasing(analysis, {input}, {parts}, true),
      AliasingError);
  EXPECT_EQ(judged, 1);
  aliasguard::utils::set_wrapper_view_judge(&judge_blind);
  try {
    aliasguard::utils::audit_aliasing(analysis, {input}, {parts}, true, true);
    ADD_FAILURE() << "expected AliasingError";
  } catch (const AliasingError& error) {
    EXPECT_EQ(error.kind(), AliasViolation::kViewStorage);
  }
  EXPECT_EQ(judged, 2);
  aliasguard::utils::set_wrapper_view_judge(nullptr);
}

} // namespace

// See Note [Repaired or not].
namespace {

using aliasguard::utils::AliasViolation;
using aliasguard::utils::judge_audited_result;

std::optional<AliasingError> violation(AliasViolation kind, const char* what) {
  return AliasingError("aten::view", 0, "self", kind, what);
}

std::string what_of(const std::optional<AliasingError>& error) {
  return error ? error->what() : "";
}

TEST(JudgeAuditedResult, CleanResultReportsNothing) {
  const auto judgement = judge_audited_result({}, {}, {});
  EXPECT_FALSE(judgement.repaired || judgement.unrepaired || judgement.raise);
}

TEST(JudgeAuditedResult, GoneAfterTheCorrectionWasRepaired) {
  const auto before = violation(AliasViolation::kViewVersionCounter, "before");
  const auto judgement = judge_audited_result(before, {}, {});
  EXPECT_NE(what_of(judgement.repaired).find("before"), std::string::npos);
  EXPECT_FALSE(judgement.unrepaired || judgement.raise);
}

TEST(
    JudgeAuditedResult,
    RefusalReportsTheHandlersViolationAndRaisesTheRefusal) {
  const auto before = violation(AliasViolation::kViewCopy, "before");
  const auto refusal = violation(AliasViolation::kViewStorage, "refusal");
  auto judgement = judge_audited_result(before, refusal, {});
  EXPECT_FALSE(judgement.repaired);
  EXPECT_NE(what_of(judgement.unrepaired).find("before"), std::string::npos);
  EXPECT_NE(what_of(judgement.raise).find("refusal"), std::string::npos);
  // Nothing found before: the refusal is reported itself.
  judgement = judge_audited_result({}, refusal, {});
  EXPECT_NE(what_of(judgement.unrepaired).find("refusal"), std::string::npos);
}

TEST(JudgeAuditedResult, StillFoundAfterIsNotRepaired) {
  const auto before = violation(AliasViolation::kViewVersionCounter, "before");
  const auto same_kind =
      violation(AliasViolation::kViewVersionCounter, "after");
  auto judgement = judge_audited_result(before, {}, same_kind);
  EXPECT_FALSE(judgement.repaired); // one report, as not repaired
  EXPECT_NE(what_of(judgement.unrepaired).find("after"), std::string::npos);
  EXPECT_NE(what_of(judgement.raise).find("after"), std::string::npos);
  // Another kind after: the first was repaired, the second was not.
  const auto other_kind = violation(AliasViolation::kViewInnerCopy, "inner");
  judgement = judge_audited_result(before, {}, other_kind);
  EXPECT_NE(what_of(judgement.repaired).find("before"), std::string::npos);
  EXPECT_NE(what_of(judgement.unrepaired).find("inner"), std::string::npos);
}

} // namespace
