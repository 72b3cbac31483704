#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/VersionCounterUtils.h>
#include <torch/csrc/autograd/mark_as_view.h>
#include <torch/csrc/autograd/storage_alias.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>
#include <torch/csrc/utils/alias_audit.h>
#include <torch/csrc/utils/alias_correction.h>
#include <torch/library.h>

#include "wrapper_tensor.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using aliasguard::utils::AliasingError;
using aliasguard::utils::correct_aliasing;
using aliasguard::utils::SchemaAliasAnalysis;

using aliasguard::testing::make_wrapper;

// A view made below autograd, the way code in __torch_dispatch__ makes one:
// same storage, fresh version counter.
at::Tensor view_below_autograd(const at::Tensor& base, at::IntArrayRef sizes) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return base.view(sizes);
}

bool shares_counter(const at::Tensor& a, const at::Tensor& b) {
  return aliasguard::shares_version_counter(
      *a.unsafeGetTensorImpl(), *b.unsafeGetTensorImpl());
}

bool same_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.unsafeGetTensorImpl()->unsafe_storage().is_alias_of(
      b.unsafeGetTensorImpl()->unsafe_storage());
}

const c10::FunctionSchema& schema_of(
    const char* name,
    const char* overload = "") {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow(name, overload)
      .schema();
}

// Runs `body`, expects AliasingError, returns it for inspection.
template <typename Body>
AliasingError expect_aliasing_error(Body&& body) {
  try {
    body();
  } catch (const AliasingError& error) {
    return error;
  }
  ADD_FAILURE() << "expected AliasingError";
  return AliasingError(
      "", 0, "", aliasguard::utils::AliasViolation::kWrongType, "");
}

TEST(AliasCorrection, WrapperViewOfWrapperTakesItsStorageAndCounter) {
  at::Tensor input = make_wrapper({2, 3});
  at::Tensor output = make_wrapper({3, 2});
  output.unsafeGetTensorImpl()->set_sizes_and_strides(
      at::IntArrayRef{3, 2}, at::IntArrayRef{1, 3});
  ASSERT_FALSE(same_storage(input, output));
  torch::jit::Stack rets{output};
  correct_aliasing(schema_of("aten::t"), {input}, rets);
  EXPECT_TRUE(rets[0].toTensor().is_same(output));
  EXPECT_TRUE(same_storage(input, output));
  EXPECT_TRUE(shares_counter(input, output));
  EXPECT_EQ(output.sizes(), at::IntArrayRef({3, 2}));
  EXPECT_EQ(output.strides(), at::IntArrayRef({1, 3}));
}

TEST(AliasCorrection, WrapperViewOfRealTensorTakesRealStorage) {
  at::Tensor input = at::arange(6, at::kFloat);
  at::Tensor output = make_wrapper({2, 3});
  torch::jit::Stack rets{output};
  correct_aliasing(
      schema_of("aten::view"),
      {input, c10::IValue(std::vector<int64_t>{2, 3})},
      rets);
  EXPECT_TRUE(same_storage(input, output));
  EXPECT_TRUE(shares_counter(input, output));
  EXPECT_FALSE(aliasguard::autograd::has_placeholder_storage(output));
  EXPECT_EQ(output.sizes(), at::IntArrayRef({2, 3}));
}

TEST(AliasCorrection, RealViewBelowAutogradGetsInputCounter) {
  at::Tensor input = at::ones({4});
  at::Tensor output = view_below_autograd(input, {2, 2});
  ASSERT_FALSE(shares_counter(input, output));
  torch::jit::Stack rets{output};
  correct_aliasing(
      schema_of("aten::view"),
      {input, c10::IValue(std::vector<int64_t>{2, 2})},
      rets);
  EXPECT_TRUE(shares_counter(input, output));
  const auto before = output._version();
  input.add_(1);
  EXPECT_EQ(output._version(), before + 1);
}

TEST(AliasCorrection, CopyAnsweringViewIsRefusedAndNothingChanges) {
  at::Tensor input = at::ones({4});
  at::Tensor copy = input.clone().view({2, 2});
  const auto* storage_before =
      copy.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  torch::jit::Stack rets{copy};
  const AliasingError error = expect_aliasing_error([&] {
    correct_aliasing(
        schema_of("aten::view"),
        {input, c10::IValue(std::vector<int64_t>{2, 2})},
        rets);
  });
  EXPECT_EQ(error.op(), "aten::view");
  EXPECT_EQ(error.return_index(), 0u);
  EXPECT_EQ(error.argument(), "self");
  const std::string message = error.what_without_backtrace();
  EXPECT_NE(message.find("aten::view: return 0"), std::string::npos) << message;
  EXPECT_NE(message.find("'self'"), std::string::npos) << message;
  EXPECT_FALSE(shares_counter(input, copy));
  EXPECT_EQ(
      copy.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl(),
      storage_before);
}

TEST(AliasCorrection, ErrorInLaterReturnLeavesEarlierReturnsUnchanged) {
  SchemaAliasAnalysis analysis(torch::jit::parseSchema(
      "t::f(Tensor(a) x, Tensor(b) y) -> (Tensor(a), Tensor(b))"));
  at::Tensor x = make_wrapper({2});
  at::Tensor fixable = make_wrapper({2});
  at::Tensor y = at::ones({2});
  at::Tensor copy = at::ones({2});
  torch::jit::Stack rets{fixable, copy};
  const AliasingError error = expect_aliasing_error([&] {
    correct_aliasing(analysis, {x, y}, rets);
  });
  EXPECT_EQ(error.return_index(), 1u);
  EXPECT_EQ(error.argument(), "y");
  EXPECT_FALSE(same_storage(x, fixable));
  EXPECT_FALSE(shares_counter(x, fixable));
}

TEST(AliasCorrection, ListViewsAliasTheirInput) {
  at::Tensor input = make_wrapper({4});
  std::vector<at::Tensor> pieces{make_wrapper({2}), make_wrapper({2})};
  torch::jit::Stack rets{c10::List<at::Tensor>(pieces)};
  correct_aliasing(schema_of("aten::split", "Tensor"), {input, 2, 0}, rets);
  for (const at::Tensor& piece : pieces) {
    EXPECT_TRUE(same_storage(input, piece));
    EXPECT_TRUE(shares_counter(input, piece));
  }
}

TEST(AliasCorrection, ListViewWithACopyIsRefusedNamingTheElement) {
  at::Tensor input = at::arange(4, at::kFloat);
  std::vector<at::Tensor> pieces{
      view_below_autograd(input, {4}), at::zeros({2})};
  torch::jit::Stack rets{c10::List<at::Tensor>(pieces)};
  const AliasingError error = expect_aliasing_error([&] {
    correct_aliasing(schema_of("aten::unbind", "int"), {input, 0}, rets);
  });
  EXPECT_NE(
      std::string(error.what_without_backtrace()).find("list element 1"),
      std::string::npos);
  EXPECT_FALSE(shares_counter(input, pieces[0])); // planned, never applied
}

TEST(AliasCorrection, InPlaceReturnIsReplacedByItsArgument) {
  at::Tensor self = make_wrapper({3});
  at::Tensor returned = make_wrapper({3});
  torch::jit::Stack rets{returned};
  correct_aliasing(
      schema_of("aten::add_", "Tensor"), {self, at::ones({3}), 1}, rets);
  EXPECT_TRUE(rets[0].toTensor().is_same(self));
}

TEST(AliasCorrection, OutReturnIsReplacedByOut) {
  at::Tensor a = at::ones({3});
  at::Tensor out = at::empty({3});
  at::Tensor alias_of_out = view_below_autograd(out, {3});
  torch::jit::Stack rets{alias_of_out};
  correct_aliasing(schema_of("aten::add", "out"), {a, a, 1, out}, rets);
  EXPECT_TRUE(rets[0].toTensor().is_same(out));
}

TEST(AliasCorrection, InPlaceAnsweredWithNewMemoryIsRefused) {
  at::Tensor self = at::ones({3});
  at::Tensor fresh = at::ones({3});
  torch::jit::Stack rets{fresh};
  const AliasingError error = expect_aliasing_error([&] {
    correct_aliasing(schema_of("aten::add_", "Tensor"), {self, self, 1}, rets);
  });
  EXPECT_EQ(error.argument(), "self");
  EXPECT_TRUE(rets[0].toTensor().is_same(fresh));
}

TEST(AliasCorrection, ReturningAnotherArgumentIsRefused) {
  at::Tensor a = make_wrapper({3});
  at::Tensor out = make_wrapper({3});
  torch::jit::Stack rets{a};
  const AliasingError error = expect_aliasing_error([&] {
    correct_aliasing(schema_of("aten::add", "out"), {a, a, 1, out}, rets);
  });
  EXPECT_NE(
      std::string(error.what_without_backtrace()).find("is argument 'self'"),
      std::string::npos)
      << error.what_without_backtrace();

  // A view answered with another argument would make that argument alias.
  at::Tensor other = make_wrapper({3});
  torch::jit::Stack view_rets{other};
  const auto& storage_before = other.unsafeGetTensorImpl()->unsafe_storage();
  expect_aliasing_error([&] {
    correct_aliasing(schema_of("aten::view_as"), {a, other}, view_rets);
  });
  EXPECT_TRUE(other.unsafeGetTensorImpl()->unsafe_storage().is_alias_of(
      storage_before));
}

// See Note [What a write return may be]: a handler ending in a bare
// `return` gets its argument handed back, as stock does.
TEST(AliasCorrection, NoneWriteReturnIsReplacedByItsArgument) {
  at::Tensor self = at::ones({3});
  torch::jit::Stack rets{c10::IValue()};
  correct_aliasing(schema_of("aten::add_", "Tensor"), {self, self, 1}, rets);
  ASSERT_TRUE(rets[0].isTensor());
  EXPECT_TRUE(rets[0].toTensor().is_same(self));
}

// See Note [Results of the wrong type are torch's to report].
TEST(AliasCorrection, ReturnsOfTheWrongTypeAreLeftAlone) {
  at::Tensor self = at::ones({3});
  const auto version =
      self.unsafeGetTensorImpl()->version_counter().current_version();
  torch::jit::Stack write_rets{c10::IValue(3)};
  correct_aliasing(
      schema_of("aten::add_", "Tensor"), {self, self, 1}, write_rets);
  ASSERT_TRUE(write_rets[0].isInt());
  EXPECT_EQ(write_rets[0].toInt(), 3);
  torch::jit::Stack view_rets{c10::IValue(std::string("arf"))};
  correct_aliasing(
      schema_of("aten::view"),
      {self, c10::IValue(std::vector<int64_t>{3})},
      view_rets);
  EXPECT_TRUE(view_rets[0].isString());
  torch::jit::Stack list_rets{self};
  correct_aliasing(schema_of("aten::split", "Tensor"), {self, 1, 0}, list_rets);
  EXPECT_TRUE(list_rets[0].toTensor().is_same(self));
  EXPECT_EQ(
      self.unsafeGetTensorImpl()->version_counter().current_version(), version);
}

TEST(AliasCorrection, InPlaceViewOpUpdatesWrapperArgumentMetadata) {
  at::Tensor self = make_wrapper({2, 3});
  at::Tensor returned = make_wrapper({3, 2});
  returned.unsafeGetTensorImpl()->set_sizes_and_strides(
      at::IntArrayRef{3, 2}, at::IntArrayRef{1, 3});
  torch::jit::Stack rets{returned};
  correct_aliasing(schema_of("aten::t_"), {self}, rets);
  EXPECT_TRUE(rets[0].toTensor().is_same(self));
  EXPECT_EQ(self.sizes(), at::IntArrayRef({3, 2}));
  EXPECT_EQ(self.strides(), at::IntArrayRef({1, 3}));
}

// See Note [What a write return may be]: a real argument's metadata is its
// own; what the handler returned does not change it, and it is handed back.
TEST(AliasCorrection, RealArgumentIsHandedBackWhateverSizesWereReturned) {
  at::Tensor self = at::ones({2, 3});
  at::Tensor transposed = view_below_autograd(self, {3, 2});
  torch::jit::Stack rets{transposed};
  correct_aliasing(schema_of("aten::t_"), {self}, rets);
  EXPECT_TRUE(rets[0].toTensor().is_same(self));
  EXPECT_EQ(self.sizes(), at::IntArrayRef({2, 3}));

  // A 0-d wrapper answering index_put_ on a real 3x3 tensor.
  at::Tensor x = at::zeros({3, 3});
  at::Tensor wrapper = make_wrapper(at::IntArrayRef{});
  const c10::Storage placeholder = wrapper.unsafeGetTensorImpl()->storage();
  torch::jit::Stack index_rets{wrapper};
  c10::List<std::optional<at::Tensor>> indices;
  indices.push_back(at::zeros({1}, at::kLong));
  correct_aliasing(
      schema_of("aten::index_put_"),
      {x, indices, at::ones({1}), false},
      index_rets);
  EXPECT_TRUE(index_rets[0].toTensor().is_same(x));
  EXPECT_EQ(x.sizes(), at::IntArrayRef({3, 3}));
  EXPECT_EQ(wrapper.dim(), 0);
  EXPECT_TRUE(
      wrapper.unsafeGetTensorImpl()->storage().is_alias_of(placeholder));
}

TEST(AliasCorrection, WrittenListIsReturnedElementwise) {
  SchemaAliasAnalysis analysis(torch::jit::parseSchema(
      "t::f(Tensor[](a!) inputs, str op) -> Tensor[](a!)"));
  std::vector<at::Tensor> inputs{make_wrapper({2}), make_wrapper({3})};
  std::vector<at::Tensor> outputs{make_wrapper({2}), make_wrapper({3})};
  const std::vector<c10::IValue> args{
      c10::IValue(c10::List<at::Tensor>(inputs)),
      c10::IValue(std::string("sum"))};
  torch::jit::Stack rets{c10::List<at::Tensor>(outputs)};
  correct_aliasing(analysis, args, rets);
  const auto returned = rets[0].toTensorList();
  ASSERT_EQ(returned.size(), 2u);
  EXPECT_TRUE(returned.get(0).is_same(inputs[0]));
  EXPECT_TRUE(returned.get(1).is_same(inputs[1]));

  // A list of another length: the argument list is handed back, its
  // wrappers untouched. See Note [What a write return may be]
  torch::jit::Stack short_rets{c10::List<at::Tensor>({make_wrapper({5})})};
  correct_aliasing(analysis, args, short_rets);
  const auto handed_back = short_rets[0].toTensorList();
  ASSERT_EQ(handed_back.size(), 2u);
  EXPECT_TRUE(handed_back.get(0).is_same(inputs[0]));
  EXPECT_EQ(inputs[0].sizes(), at::IntArrayRef({2}));
}

TEST(AliasCorrection, PlaceholderOnAnotherDeviceIsRefused) {
  at::Tensor input = at::ones({2});
  at::Tensor output = make_wrapper({2}, c10::Device(c10::kMeta));
  torch::jit::Stack rets{output};
  const AliasingError error = expect_aliasing_error(
      [&] { correct_aliasing(schema_of("aten::alias"), {input}, rets); });
  EXPECT_NE(
      std::string(error.what_without_backtrace()).find("meta"),
      std::string::npos);
}

TEST(AliasCorrection, WrapperViewBeyondItsInputIsRefusedUnchanged) {
  // A (1 << 24,) wrapper for a view of 4 floats: once a crash.
  at::Tensor input = at::ones({4});
  at::Tensor output = make_wrapper({int64_t{1} << 24});
  const c10::StorageImpl* storage_before =
      output.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  torch::jit::Stack rets{output};
  const AliasingError error = expect_aliasing_error([&] {
    correct_aliasing(
        schema_of("aten::view"),
        {input, c10::IValue(std::vector<int64_t>{int64_t{1} << 24})},
        rets);
  });
  EXPECT_NE(
      std::string(error.what_without_backtrace())
          .find("need 67108864 bytes of storage but the storage of argument "
                "'self' has 16"),
      std::string::npos)
      << error.what_without_backtrace();
  EXPECT_EQ(
      output.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl(),
      storage_before);
}

TEST(AliasCorrection, InferenceTensorsKeepTheirCounters) {
  c10::InferenceMode inference;
  at::Tensor input = at::ones({4});
  at::Tensor output = view_below_autograd(input, {2, 2});
  torch::jit::Stack rets{output};
  correct_aliasing(
      schema_of("aten::view"),
      {input, c10::IValue(std::vector<int64_t>{2, 2})},
      rets);
  EXPECT_TRUE(rets[0].toTensor().is_same(output));
}

TEST(AliasCorrection, ReturnsWithoutAliasInfoAreUntouched) {
  at::Tensor input = make_wrapper({2});
  at::Tensor output = make_wrapper({2});
  torch::jit::Stack rets{output};
  correct_aliasing(schema_of("aten::clone"), {input, c10::IValue()}, rets);
  EXPECT_TRUE(rets[0].toTensor().is_same(output));
  EXPECT_FALSE(same_storage(input, output));
}

TEST(AliasCorrection, WrongArityIsAPlainError) {
  torch::jit::Stack rets{at::ones({2})};
  try {
    correct_aliasing(schema_of("aten::view"), {at::ones({2})}, rets);
    ADD_FAILURE() << "expected an error";
  } catch (const AliasingError&) {
    ADD_FAILURE() << "arity is a usage error, not an aliasing one";
  } catch (const c10::Error& error) {
    EXPECT_NE(
        std::string(error.what_without_backtrace())
            .find("expected 2 arguments"),
        std::string::npos);
  }
}

// --- audit ------------------------------------------------------------------

SchemaAliasAnalysis analysis_of(const char* name, const char* overload = "") {
  return SchemaAliasAnalysis(schema_of(name, overload));
}

TEST(AliasAudit, FreshOutputSharingMemoryIsReported) {
  at::Tensor a = at::ones({4});
  at::Tensor b = at::ones({4});
  const auto add = analysis_of("aten::add", "Tensor");
  const AliasingError error = expect_aliasing_error([&] {
    aliasguard::utils::audit_aliasing(
        add, {a, b, 1}, {view_below_autograd(b, {4})}, true);
  });
  EXPECT_EQ(error.argument(), "other");
  expect_aliasing_error([&] {
    aliasguard::utils::audit_aliasing(add, {a, b, 1}, {a}, true);
  });
  aliasguard::utils::audit_aliasing(add, {a, b, 1}, {at::ones({4})}, true);
}

TEST(AliasAudit, ViewBeyondItsStorageIsReported) {
  // See Note [May a tensor alias a storage]: the audit asks the same check.
  at::Tensor a = at::ones({4});
  at::Tensor view = view_below_autograd(a, {4});
  const auto analysis = analysis_of("aten::alias");
  aliasguard::utils::audit_aliasing(analysis, {a}, {view}, false);
  view.unsafeGetTensorImpl()->set_sizes_contiguous({8});
  const AliasingError error = expect_aliasing_error(
      [&] { aliasguard::utils::audit_aliasing(analysis, {a}, {view}, false); });
  EXPECT_NE(
      std::string(error.what_without_backtrace())
          .find("is not a valid view: the sizes, strides and storage offset "
                "of the returned view need 32 bytes"),
      std::string::npos)
      << error.what_without_backtrace();
}

TEST(AliasAudit, EmptyOutputsAndUnsafeViewAreExempt) {
  at::Tensor empty = at::ones({0});
  aliasguard::utils::audit_aliasing(
      analysis_of("aten::clone"), {empty, c10::IValue()}, {empty}, true);
  at::Tensor a = at::ones({4});
  aliasguard::utils::audit_aliasing(
      analysis_of("aten::_unsafe_view"),
      {a, c10::IValue(std::vector<int64_t>{2, 2})},
      {view_below_autograd(a, {2, 2})},
      true);
}

TEST(AliasAudit, ViewWithOwnCounterReportedOnlyWhenCountersMustBeShared) {
  at::Tensor a = at::ones({4});
  at::Tensor view = view_below_autograd(a, {2, 2});
  const auto analysis = analysis_of("aten::view");
  const c10::IValue size(std::vector<int64_t>{2, 2});
  aliasguard::utils::audit_aliasing(
      analysis, {a, size}, {view}, /*views_share_version_counter=*/false);
  expect_aliasing_error([&] {
    aliasguard::utils::audit_aliasing(analysis, {a, size}, {view}, true);
  });
  expect_aliasing_error([&] {
    aliasguard::utils::audit_aliasing(
        analysis, {a, size}, {a.clone().view({2, 2})}, false);
  });
}

TEST(AliasAudit, WriteMustReturnItsArgument) {
  at::Tensor a = at::ones({4});
  const auto analysis = analysis_of("aten::add_", "Tensor");
  aliasguard::utils::audit_aliasing(analysis, {a, a, 1}, {a}, true);
  expect_aliasing_error([&] {
    aliasguard::utils::audit_aliasing(
        analysis, {a, a, 1}, {view_below_autograd(a, {4})}, true);
  });
}

TEST(AliasAudit, UnknownReturnsAreNotChecked) {
  SchemaAliasAnalysis analysis(
      torch::jit::parseSchema("t::f(Tensor x) -> Tensor(*)"));
  at::Tensor a = at::ones({2});
  aliasguard::utils::audit_aliasing(analysis, {a}, {a.clone()}, true);
}

TORCH_LIBRARY(aliasguard_audit_test, m) {
  m.def("returns_input(Tensor self) -> Tensor");
  m.def("copying_view(Tensor(a) self) -> Tensor(a)");
  m.def("honest_view(Tensor(a) self) -> Tensor(a)");
  m.def("honest_clone(Tensor self) -> Tensor");
}

TORCH_LIBRARY_IMPL(aliasguard_audit_test, CPU, m) {
  m.impl("returns_input", [](const at::Tensor& self) { return self; });
  m.impl("copying_view", [](const at::Tensor& self) { return self.clone(); });
  m.impl("honest_view", [](const at::Tensor& self) { return self.alias(); });
  m.impl("honest_clone", [](const at::Tensor& self) { return self.clone(); });
}

at::Tensor call_test_op(const char* name, const at::Tensor& self) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow(name, "")
      .typed<at::Tensor(const at::Tensor&)>()
      .call(self);
}

namespace ag = aliasguard::utils;

struct AuditGuard {
  explicit AuditGuard(bool check_kernels = false)
      : check_kernels_(check_kernels) {
    ag::enter_alias_audit(check_kernels_);
  }
  ~AuditGuard() {
    ag::exit_alias_audit(check_kernels_);
  }
  AuditGuard(const AuditGuard&) = delete;
  AuditGuard& operator=(const AuditGuard&) = delete;

 private:
  bool check_kernels_;
};

bool audit_fallback_registered() {
  return c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(
      c10::DispatchKey::DeferredInit);
}

TEST(AliasAuditFallback, RegisteredOnlyWhileAScopeIsOpen) {
  EXPECT_FALSE(ag::is_alias_audit_enabled());
  EXPECT_FALSE(audit_fallback_registered());
  {
    AuditGuard outer;
    EXPECT_TRUE(ag::is_alias_audit_enabled());
    EXPECT_TRUE(audit_fallback_registered());
    {
      AuditGuard inner;
      EXPECT_EQ(ag::alias_audit_depth(), 2u);
    }
    EXPECT_TRUE(ag::is_alias_audit_enabled());
  }
  EXPECT_FALSE(ag::is_alias_audit_enabled());
  EXPECT_FALSE(audit_fallback_registered());
  EXPECT_EQ(ag::alias_audit_scopes(), 0u);
}

TEST(AliasAuditFallback, ScopesEndingOutOfOrderLeaveTheThreadAsItWas) {
  auto first = std::make_unique<AuditGuard>();
  auto second = std::make_unique<AuditGuard>();
  first.reset(); // ends before the scope opened after it
  EXPECT_TRUE(ag::is_alias_audit_enabled());
  second.reset();
  EXPECT_FALSE(ag::is_alias_audit_enabled());
  EXPECT_FALSE(audit_fallback_registered());
}

TEST(AliasAuditFallback, RetainingKeepsTheFallbackWithoutAuditingTheThread) {
  ag::retain_alias_audit_fallback();
  EXPECT_TRUE(audit_fallback_registered());
  EXPECT_FALSE(ag::is_alias_audit_enabled());
  {
    AuditGuard audit;
    EXPECT_TRUE(ag::is_alias_audit_enabled());
  }
  EXPECT_TRUE(audit_fallback_registered()); // still retained
  ag::release_alias_audit_fallback();
  EXPECT_FALSE(audit_fallback_registered());
  EXPECT_THROW(ag::release_alias_audit_fallback(), c10::Error);
}

TEST(AliasAuditFallback, ExitWithoutEnterIsAnError) {
  EXPECT_THROW(ag::exit_alias_audit(), c10::Error);
  EXPECT_EQ(ag::alias_audit_scopes(), 0u);
}

TEST(AliasAuditFallback, RefusesAKeyTakenBySomeoneElse) {
  auto handle = c10::Dispatcher::singleton().registerFallback(
      c10::DispatchKey::DeferredInit,
      c10::KernelFunction::makeFallthrough(),
      "another user of the key");
  try {
    ag::enter_alias_audit();
    ADD_FAILURE() << "expected an error";
  } catch (const c10::Error& error) {
    EXPECT_NE(
        std::string(error.what()).find("DeferredInit"), std::string::npos);
  }
  EXPECT_FALSE(ag::is_alias_audit_enabled());
  EXPECT_EQ(ag::alias_audit_scopes(), 0u);
}

TEST(AliasAuditFallback, StockOpsPassIncludingBackward) {
  AuditGuard audit(/*check_kernels=*/true);
  at::Tensor x = at::randn({4, 4}).set_requires_grad(true);
  at::Tensor y = x.view({16}).mul(2).view({4, 4}).t().matmul(x);
  auto pieces = y.split(2);
  at::Tensor z = pieces[0].sum() + pieces[1].relu().sum();
  at::Tensor buffer = at::zeros({4, 4});
  buffer.add_(1).transpose_(0, 1);
  at::add_out(buffer, buffer, buffer);
  z.backward();
  EXPECT_TRUE(x.grad().defined());
}

TEST(AliasAuditFallback, ChecksKernelsOnlyWhenAsked) {
  at::Tensor x = at::ones({3});
  EXPECT_TRUE(
      call_test_op("aliasguard_audit_test::returns_input", x).is_same(x));
  {
    // See Note [Alias audit]: a plain tensor's op reaches no
    // __torch_dispatch__, so only its kernel could break the schema.
    AuditGuard audit;
    EXPECT_TRUE(
        call_test_op("aliasguard_audit_test::returns_input", x).is_same(x));
    call_test_op("aliasguard_audit_test::copying_view", x);
  }
  {
    AuditGuard audit(/*check_kernels=*/true);
    const AliasingError error = expect_aliasing_error(
        [&] { call_test_op("aliasguard_audit_test::returns_input", x); });
    EXPECT_EQ(error.op(), "aliasguard_audit_test::returns_input");
    EXPECT_EQ(error.argument(), "self");
    EXPECT_EQ(error.kind(), ag::AliasViolation::kFreshIsArgument);
    const AliasingError copy = expect_aliasing_error(
        [&] { call_test_op("aliasguard_audit_test::copying_view", x); });
    EXPECT_EQ(copy.kind(), ag::AliasViolation::kViewCopy);
    call_test_op("aliasguard_audit_test::honest_view", x);
    call_test_op("aliasguard_audit_test::honest_clone", x);
  }
}

[[noreturn]] bool throw_runtime_error(
    const AliasingError& error,
    c10::ArrayRef<c10::IValue> /*args*/) {
  throw std::runtime_error(std::string("reported: ") + error.op());
}

int recorded_violations = 0;
bool record_violation(
    const AliasingError& /*error*/,
    c10::ArrayRef<c10::IValue> /*args*/) {
  ++recorded_violations;
  return true;
}

TEST(AliasAuditFallback, KernelChecksLastWhileAnyScopeAsksForThem) {
  const at::Tensor x = at::ones({3});
  auto kernels = std::make_unique<AuditGuard>(/*check_kernels=*/true);
  {
    AuditGuard plain;
    expect_aliasing_error(
        [&] { call_test_op("aliasguard_audit_test::returns_input", x); });
  }
  kernels.reset();
  AuditGuard plain;
  call_test_op("aliasguard_audit_test::returns_input", x);
  // Ending a kernel-checking scope that was never opened changes nothing.
  EXPECT_THROW(ag::exit_alias_audit(/*check_kernels=*/true), c10::Error);
  EXPECT_EQ(ag::alias_audit_depth(), 1u);
}

TEST(AliasAuditFallback, ReporterMayReplaceTheException) {
  ag::set_alias_audit_error_reporter(&throw_runtime_error);
  AuditGuard audit(/*check_kernels=*/true);
  try {
    call_test_op("aliasguard_audit_test::returns_input", at::ones({2}));
    ADD_FAILURE() << "expected the reporter's exception";
  } catch (const std::runtime_error& error) {
    EXPECT_EQ(
        std::string(error.what()),
        "reported: aliasguard_audit_test::returns_input");
  }
  ag::set_alias_audit_error_reporter(nullptr);
  expect_aliasing_error([&] {
    call_test_op("aliasguard_audit_test::returns_input", at::ones({2}));
  });
}

TEST(AliasAuditFallback, AReporterThatRecordsLetsTheResultStand) {
  ag::set_alias_audit_error_reporter(&record_violation);
  recorded_violations = 0;
  at::Tensor x = at::ones({2});
  {
    AuditGuard audit(/*check_kernels=*/true);
    EXPECT_TRUE(
        call_test_op("aliasguard_audit_test::returns_input", x).is_same(x));
    call_test_op("aliasguard_audit_test::honest_clone", x);
  }
  ag::set_alias_audit_error_reporter(nullptr);
  EXPECT_EQ(recorded_violations, 1);
}

TEST(AliasAuditFallback, UnsafeSplitsShareMemoryByDesign) {
  AuditGuard audit(/*check_kernels=*/true);
  at::Tensor x = at::randn({6});
  EXPECT_EQ(at::unsafe_split(x, 2).size(), 3u);
  EXPECT_EQ(at::unsafe_split_with_sizes(x, {2, 4}).size(), 2u);
  EXPECT_EQ(at::unsafe_chunk(x, 3).size(), 3u);
}

} // namespace
