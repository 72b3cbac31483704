#include <gtest/gtest.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function_schema.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/csrc/utils/schema_alias_analysis.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

using aliasguard::utils::ReturnAlias;
using aliasguard::utils::ReturnAliasKind;
using aliasguard::utils::schema_alias_analysis;
using aliasguard::utils::SchemaAliasAnalysis;

std::shared_ptr<const SchemaAliasAnalysis> aten(
    const char* name,
    const char* overload = "") {
  auto analysis = schema_alias_analysis(c10::OperatorName(name, overload));
  EXPECT_NE(analysis, nullptr) << name << "." << overload;
  return analysis;
}

SchemaAliasAnalysis parsed(const char* schema) {
  return SchemaAliasAnalysis(torch::jit::parseSchema(schema));
}

void expect_alias(
    const ReturnAlias& alias,
    ReturnAliasKind kind,
    std::optional<size_t> argument,
    bool is_list = false) {
  EXPECT_EQ(alias.kind, kind)
      << aliasguard::utils::return_alias_kind_name(alias.kind);
  EXPECT_EQ(alias.aliased_argument(), argument);
  EXPECT_EQ(alias.is_list, is_list);
}

TEST(SchemaAliasAnalysis, ViewOpsAliasSelf) {
  for (const auto& [name, overload] :
       std::vector<std::pair<const char*, const char*>>{
           {"aten::view", ""},
           {"aten::transpose", "int"},
           {"aten::t", ""},
           {"aten::alias", ""},
           {"aten::detach", ""},
           {"aten::expand", ""},
           {"aten::as_strided", ""},
           {"aten::select", "int"},
           {"aten::slice", "Tensor"}}) {
    auto analysis = aten(name, overload);
    ASSERT_EQ(analysis->returns().size(), 1u) << name;
    expect_alias(analysis->returns()[0], ReturnAliasKind::kView, 0);
    EXPECT_EQ(analysis->argument_name(0), "self");
    EXPECT_TRUE(analysis->has_view_returns());
    EXPECT_FALSE(analysis->has_write_returns());
    EXPECT_TRUE(analysis->has_aliasing_returns());
  }
}

TEST(SchemaAliasAnalysis, InPlaceOpWritesSelf) {
  auto analysis = aten("aten::add_", "Tensor");
  ASSERT_EQ(analysis->returns().size(), 1u);
  expect_alias(analysis->returns()[0], ReturnAliasKind::kWrite, 0);
  EXPECT_TRUE(analysis->returns()[0].is_write());
  EXPECT_TRUE(analysis->has_write_returns());
  EXPECT_FALSE(analysis->has_view_returns());
  EXPECT_EQ(analysis->op_name(), "aten::add_.Tensor");
}

TEST(SchemaAliasAnalysis, OutOverloadWritesOut) {
  auto analysis = aten("aten::add", "out");
  ASSERT_EQ(analysis->returns().size(), 1u);
  const size_t out = *analysis->returns()[0].aliased_argument();
  EXPECT_EQ(analysis->argument_name(out), "out");
  EXPECT_TRUE(analysis->argument_is_kwarg_only(out));
  EXPECT_FALSE(analysis->argument_is_kwarg_only(0));
  expect_alias(analysis->returns()[0], ReturnAliasKind::kWrite, out);
}

TEST(SchemaAliasAnalysis, MultiOutputOutOverloadWritesEachOut) {
  // max.dim_max(..., *, Tensor(a!) max, Tensor(b!) max_values) -> (a!, b!)
  auto analysis = aten("aten::max", "dim_max");
  ASSERT_EQ(analysis->returns().size(), 2u);
  const auto& returns = analysis->returns();
  EXPECT_EQ(analysis->argument_name(*returns[0].aliased_argument()), "max");
  EXPECT_EQ(
      analysis->argument_name(*returns[1].aliased_argument()), "max_values");
  EXPECT_TRUE(returns[0].is_write());
  EXPECT_TRUE(returns[1].is_write());
}

TEST(SchemaAliasAnalysis, ListReturningViewsAliasSelfElementwise) {
  for (const auto& [name, overload] :
       std::vector<std::pair<const char*, const char*>>{
           {"aten::split", "Tensor"},
           {"aten::split_with_sizes", ""},
           {"aten::unbind", "int"},
           {"aten::chunk", ""}}) {
    auto analysis = aten(name, overload);
    ASSERT_EQ(analysis->returns().size(), 1u) << name;
    expect_alias(
        analysis->returns()[0], ReturnAliasKind::kView, 0, /*is_list=*/true);
  }
}

TEST(SchemaAliasAnalysis, FreshReturnsHaveNoAlias) {
  for (const auto& [name, overload] :
       std::vector<std::pair<const char*, const char*>>{
           {"aten::add", "Tensor"}, {"aten::clone", ""}, {"aten::mm", ""}}) {
    auto analysis = aten(name, overload);
    expect_alias(analysis->returns()[0], ReturnAliasKind::kFresh, std::nullopt);
    EXPECT_FALSE(analysis->has_aliasing_returns()) << name;
  }
  auto multi = aten("aten::max", "dim");
  ASSERT_EQ(multi->returns().size(), 2u);
  for (const auto& alias : multi->returns()) {
    expect_alias(alias, ReturnAliasKind::kFresh, std::nullopt);
  }
}

TEST(SchemaAliasAnalysis, MixedTupleReturns) {
  auto analysis = parsed(
      "t::f(Tensor(a) x, Tensor y, *, Tensor(b!) out) -> (Tensor(a), "
      "Tensor(b!), Tensor)");
  ASSERT_EQ(analysis.returns().size(), 3u);
  expect_alias(analysis.returns()[0], ReturnAliasKind::kView, 0);
  expect_alias(analysis.returns()[1], ReturnAliasKind::kWrite, 2);
  expect_alias(analysis.returns()[2], ReturnAliasKind::kFresh, std::nullopt);
  EXPECT_TRUE(analysis.has_view_returns());
  EXPECT_TRUE(analysis.has_write_returns());
  EXPECT_EQ(analysis.op_name(), "t::f");
  EXPECT_EQ(analysis.num_arguments(), 3u);
}

TEST(SchemaAliasAnalysis, OptionalViewReturn) {
  auto analysis = parsed("t::f(Tensor(a) x) -> Tensor(a)?");
  expect_alias(analysis.returns()[0], ReturnAliasKind::kView, 0);
}

TEST(SchemaAliasAnalysis, WrittenListReturnedAsIs) {
  auto analysis = parsed("t::f(Tensor[](a!) inputs, str op) -> Tensor[](a!)");
  expect_alias(
      analysis.returns()[0], ReturnAliasKind::kWrite, 0, /*is_list=*/true);
}

TEST(SchemaAliasAnalysis, AmbiguousAnnotationsAreUnknown) {
  // Each of these says "may alias" without saying what.
  for (const char* schema : {
           "t::f(Tensor(a) x, Tensor(b) y) -> Tensor(a|b)",
           "t::f(Tensor x) -> Tensor(*)",
           "t::f(Tensor(a) x, Tensor(a) y) -> Tensor(a)",
           "t::f(Tensor x) -> Tensor(a)",
           "t::f(Generator(a!) g) -> Generator(a!)",
           "t::f(Tensor(a)[] xs) -> Tensor(a)",
           "t::f(Tensor(a) x) -> Tensor[](a!)",
       }) {
    auto analysis = parsed(schema);
    expect_alias(
        analysis.returns()[0],
        ReturnAliasKind::kUnknown,
        std::nullopt,
        analysis.returns()[0].is_list);
    EXPECT_FALSE(analysis.has_aliasing_returns()) << schema;
  }
}

TEST(SchemaAliasAnalysis, ArgumentFlowingIntoWildcardStillNamesItsSet) {
  // split's `Tensor(a -> *) self`: before set a, after set wildcard.
  auto analysis = parsed("t::f(Tensor(a -> *) self) -> Tensor(a)[]");
  expect_alias(
      analysis.returns()[0], ReturnAliasKind::kView, 0, /*is_list=*/true);
}

TEST(SchemaAliasAnalysisCache, SameAnalysisForHandleAndName) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::view", "");
  auto by_handle = schema_alias_analysis(op);
  auto by_name = schema_alias_analysis(c10::OperatorName("aten::view", ""));
  EXPECT_EQ(by_handle.get(), by_name.get());
  EXPECT_EQ(schema_alias_analysis(op).get(), by_handle.get());
}

TEST(SchemaAliasAnalysisCache, UnknownOperatorIsNull) {
  EXPECT_EQ(
      schema_alias_analysis(c10::OperatorName("aten::no_such_op", "")),
      nullptr);
}

TEST(SchemaAliasAnalysisCache, ConcurrentLookupsAgree) {
  const c10::OperatorName name("aten::unbind", "int");
  std::vector<const SchemaAliasAnalysis*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < 1000; ++k) {
        seen[i] = schema_alias_analysis(name).get();
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  for (const auto* analysis : seen) {
    EXPECT_EQ(analysis, seen[0]);
  }
}

TEST(SchemaAliasAnalysisCache, DeregistrationDropsTheEntry) {
  const c10::OperatorName name("aliasguard_cache_test::f", "");
  const uint64_t generation =
      aliasguard::utils::schema_alias_analysis_generation();
  {
    torch::Library library(
        torch::Library::DEF,
        "aliasguard_cache_test",
        std::nullopt,
        __FILE__,
        __LINE__);
    library.def("f(Tensor(a) x) -> Tensor(a)");
    auto analysis = schema_alias_analysis(name);
    ASSERT_NE(analysis, nullptr);
    EXPECT_EQ(analysis->returns()[0].kind, ReturnAliasKind::kView);
  }
  EXPECT_GT(aliasguard::utils::schema_alias_analysis_generation(), generation);
  EXPECT_EQ(schema_alias_analysis(name), nullptr);
  {
    torch::Library library(
        torch::Library::DEF,
        "aliasguard_cache_test",
        std::nullopt,
        __FILE__,
        __LINE__);
    library.def("f(Tensor x) -> Tensor");
    auto analysis = schema_alias_analysis(name);
    ASSERT_NE(analysis, nullptr);
    EXPECT_EQ(analysis->returns()[0].kind, ReturnAliasKind::kFresh);
  }
}

} // namespace
