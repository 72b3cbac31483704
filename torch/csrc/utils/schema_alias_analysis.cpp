#include <torch/csrc/utils/schema_alias_analysis.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function_schema.h>

#include <atomic>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <utility>

namespace aliasguard::utils {
namespace {

enum class TensorShape : uint8_t { kNone, kTensor, kTensorList };

// Tensor, Tensor? -> kTensor; Tensor[], Tensor?[] -> kTensorList.
TensorShape tensor_shape_of(const c10::TypePtr& type) {
  const c10::Type* unwrapped = type.get();
  if (const auto* optional = unwrapped->castRaw<c10::OptionalType>()) {
    unwrapped = optional->getElementType().get();
  }
  if (unwrapped->kind() == c10::TypeKind::TensorType) {
    return TensorShape::kTensor;
  }
  if (const auto* list = unwrapped->castRaw<c10::ListType>()) {
    const c10::Type* element = list->getElementType().get();
    if (const auto* optional = element->castRaw<c10::OptionalType>()) {
      element = optional->getElementType().get();
    }
    if (element->kind() == c10::TypeKind::TensorType) {
      return TensorShape::kTensorList;
    }
  }
  return TensorShape::kNone;
}

// The annotation that carries the alias sets: the value's own, or, for
// `Tensor(a)[]`, its elements' (see Note [Return alias kinds]).
const c10::AliasInfo* effective_alias_info(const c10::AliasInfo* info) {
  if (info == nullptr) {
    return nullptr;
  }
  if (!info->beforeSets().empty()) {
    return info;
  }
  if (!info->containedTypes().empty() &&
      !info->containedTypes().front().beforeSets().empty()) {
    return &info->containedTypes().front();
  }
  return nullptr;
}

// `Tensor(a!)`, or a list whose elements are written (`Tensor(a!)[]`).
bool annotation_writes(const c10::AliasInfo* info) {
  if (info == nullptr) {
    return false;
  }
  if (info->isWrite()) {
    return true;
  }
  for (const auto& contained : info->containedTypes()) {
    if (contained.isWrite()) {
      return true;
    }
  }
  return false;
}

bool argument_in_set(const c10::Argument& argument, c10::Symbol set) {
  const c10::AliasInfo* info = argument.alias_info();
  if (info == nullptr) {
    return false;
  }
  if (info->beforeSets().count(set) != 0) {
    return true;
  }
  for (const auto& contained : info->containedTypes()) {
    if (contained.beforeSets().count(set) != 0) {
      return true;
    }
  }
  return false;
}

ReturnAlias classify_return(
    const c10::FunctionSchema& schema,
    const c10::Argument& ret) {
  ReturnAlias result;
  result.annotated = ret.alias_info() != nullptr;
  result.annotated_write = annotation_writes(ret.alias_info());
  result.optional = ret.type()->kind() == c10::TypeKind::OptionalType;
  const TensorShape shape = tensor_shape_of(ret.type());
  const c10::AliasInfo* info = effective_alias_info(ret.alias_info());
  if (info == nullptr) {
    // A non-tensor return with an annotation (a Generator(a!)) is not ours
    // to reason about; an unannotated one is simply fresh.
    result.kind = (shape == TensorShape::kNone && ret.alias_info() != nullptr)
        ? ReturnAliasKind::kUnknown
        : ReturnAliasKind::kFresh;
    return result;
  }
  result.kind = ReturnAliasKind::kUnknown;
  if (shape == TensorShape::kNone || info->beforeSets().size() != 1 ||
      info->isWildcardBefore()) {
    return result;
  }
  const c10::Symbol set = *info->beforeSets().begin();
  std::optional<size_t> owner;
  const auto& arguments = schema.arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (!argument_in_set(arguments[i], set)) {
      continue;
    }
    if (owner.has_value()) {
      return result; // two arguments in one set: which one is unknowable
    }
    owner = i;
  }
  if (!owner.has_value()) {
    return result;
  }
  const bool is_list = shape == TensorShape::kTensorList;
  const bool argument_is_list =
      tensor_shape_of(arguments[*owner].type()) == TensorShape::kTensorList;
  const bool is_write = info->isWrite();
  // Pairings with a meaning: a view of one tensor (or a list of views of
  // it), or the written argument returned as is (tensor or list).
  const bool meaningful =
      is_write ? (is_list == argument_is_list) : !argument_is_list;
  if (!meaningful) {
    return result;
  }
  result.kind = is_write ? ReturnAliasKind::kWrite : ReturnAliasKind::kView;
  result.argument = *owner;
  result.is_list = is_list;
  return result;
}

std::string qualified_op_name(const c10::FunctionSchema& schema) {
  if (schema.overload_name().empty()) {
    return schema.name();
  }
  return schema.name() + "." + schema.overload_name();
}

// Note [Caching schema alias analysis]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Keyed by operator name, read under a shared lock: lookups from many threads
// (the audit fallback runs on autograd worker threads too) never serialize.
// An operator's schema can change only by deregistering it and registering
// it again (torch.library fragments in tests do this), so a registration
// listener drops the entry on deregistration. The listener runs under the
// dispatcher's lock and takes ours; we never call into the dispatcher while
// holding ours, so the two locks are always taken in that order.
class AnalysisCache final : public c10::OpRegistrationListener {
 public:
  std::shared_ptr<const SchemaAliasAnalysis> find(
      const c10::OperatorName& name) {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = entries_.find(name);
    return it == entries_.end() ? nullptr : it->second;
  }

  std::shared_ptr<const SchemaAliasAnalysis> insert(
      const c10::OperatorName& name,
      std::shared_ptr<const SchemaAliasAnalysis> analysis) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    // Another thread may have won the race; keep the first.
    return entries_.try_emplace(name, std::move(analysis)).first->second;
  }

  uint64_t generation() const {
    return generation_.load(std::memory_order_acquire);
  }

  uint64_t registrations() const {
    return registrations_.load(std::memory_order_acquire);
  }

  void onOperatorRegistered(const c10::OperatorHandle& /*op*/) override {
    registrations_.fetch_add(1, std::memory_order_acq_rel);
  }

  void onOperatorDeregistered(const c10::OperatorHandle& op) override {
    registrations_.fetch_add(1, std::memory_order_acq_rel);
    std::unique_lock<std::shared_mutex> lock(mutex_);
    if (entries_.erase(op.operator_name()) != 0) {
      generation_.fetch_add(1, std::memory_order_acq_rel);
    }
  }

 private:
  std::shared_mutex mutex_;
  std::unordered_map<
      c10::OperatorName,
      std::shared_ptr<const SchemaAliasAnalysis>>
      entries_;
  std::atomic<uint64_t> generation_{0};
  // Every schema registered or deregistered, the ones that existed when the
  // listener was added included (the dispatcher replays them to it).
  std::atomic<uint64_t> registrations_{0};
};

AnalysisCache& analysis_cache() {
  // Leaked on purpose: the dispatcher owns the listener and may notify it
  // during static destruction, and entries may outlive main().
  static AnalysisCache* cache = [] {
    auto listener = std::make_unique<AnalysisCache>();
    AnalysisCache* raw = listener.get();
    new c10::RegistrationHandleRAII(
        c10::Dispatcher::singleton().addRegistrationListener(
            std::move(listener)));
    return raw;
  }();
  return *cache;
}

} // namespace

const char* return_alias_kind_name(ReturnAliasKind kind) {
  switch (kind) {
    case ReturnAliasKind::kFresh:
      return "fresh";
    case ReturnAliasKind::kView:
      return "view";
    case ReturnAliasKind::kWrite:
      return "write";
    case ReturnAliasKind::kUnknown:
      return "unknown";
  }
  return "invalid";
}

SchemaAliasAnalysis::SchemaAliasAnalysis(const c10::FunctionSchema& schema)
    : op_name_(qualified_op_name(schema)),
      schema_string_(c10::toString(schema)) {
  arguments_.reserve(schema.arguments().size());
  size_t tensor_arguments = 0;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::Argument& argument = schema.arguments()[i];
    arguments_.push_back(
        {argument.name(),
         argument.kwarg_only(),
         annotation_writes(argument.alias_info())});
    if (arguments_.back().written) {
      written_arguments_.push_back(i);
    }
    const TensorShape shape = tensor_shape_of(argument.type());
    if (shape != TensorShape::kNone) {
      ++tensor_arguments;
      if (shape == TensorShape::kTensor) {
        sole_tensor_argument_ = i;
      }
    }
  }
  if (tensor_arguments != 1) {
    sole_tensor_argument_ = std::nullopt;
  }
  returns_.reserve(schema.returns().size());
  for (const auto& ret : schema.returns()) {
    returns_.push_back(classify_return(schema, ret));
    has_view_returns_ |= returns_.back().kind == ReturnAliasKind::kView;
    has_write_returns_ |= returns_.back().kind == ReturnAliasKind::kWrite;
  }
}

std::shared_ptr<const SchemaAliasAnalysis> schema_alias_analysis(
    const c10::OperatorHandle& op) {
  AnalysisCache& cache = analysis_cache();
  const c10::OperatorName& name = op.operator_name();
  if (auto cached = cache.find(name)) {
    return cached;
  }
  // Computed outside the lock: it reads only the schema.
  return cache.insert(
      name, std::make_shared<const SchemaAliasAnalysis>(op.schema()));
}

std::shared_ptr<const SchemaAliasAnalysis> schema_alias_analysis(
    const c10::OperatorName& name) {
  if (auto cached = analysis_cache().find(name)) {
    return cached;
  }
  const auto op = c10::Dispatcher::singleton().findSchema(name);
  if (!op.has_value()) {
    return nullptr;
  }
  return schema_alias_analysis(*op);
}

uint64_t operator_registrations() {
  return analysis_cache().registrations();
}

ALIASGUARD_HOT uint64_t schema_alias_analysis_generation() {
  return analysis_cache().generation();
}

} // namespace aliasguard::utils
