#include <torch/csrc/utils/python_op_cache.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/python_torch_internals.h>

#include <array>
#include <cstdint>
#include <unordered_map>
#include <utility>

namespace py = pybind11;

namespace aliasguard::utils {

// Note [Per-OpOverload analysis cache]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Keyed by the OpOverload object itself: a pointer hash, no string work, on
// the path every op takes. Entries hold a strong reference to their key so
// the address cannot be reused by another object, and the analysis' argument
// names as interned Python strings for kwargs lookups. Only touched with the
// GIL held. When the C++ cache drops an operator (deregistration) its
// generation changes and we start over. Leaked, like the C++ cache, so that
// no Py_DECREF runs after interpreter shutdown.
namespace {

// Direct-mapped in front of `entries`, by the key's address: the entry of the
// op last seen in each slot, checked before the hash map (whose lookup is a
// division and two dependent loads on every corrected op). Emptied whenever
// `entries` is; an entry stays where `entries` owns it, so a slot never
// outlives it.
struct RecentOp {
  PyObject* func = nullptr;
  const PyOpEntry* entry = nullptr;
};

struct PyOpCache {
  std::unordered_map<PyObject*, std::unique_ptr<const PyOpEntry>> entries;
  std::vector<std::unique_ptr<const PyOpEntry>> retired;
  uint64_t generation = 0;
  int running = 0; // corrections in progress, re-entrant through Python
  std::array<RecentOp, 64> recent{};
};

PyOpCache& py_op_cache() {
  static auto* cache = new PyOpCache();
  return *cache;
}

RecentOp& recent_slot(PyOpCache& cache, PyObject* func) {
  // Python objects are 16-byte aligned.
  return cache
      .recent[(reinterpret_cast<uintptr_t>(func) >> 4) % cache.recent.size()];
}

// The C++ cache dropped an operator: start over (see the Note above).
ALIASGUARD_COLD void flush(PyOpCache& cache, uint64_t generation) {
  for (auto& [key, entry] : cache.entries) {
    cache.retired.push_back(std::move(entry));
  }
  cache.entries.clear();
  cache.recent.fill(RecentOp{});
  cache.generation = generation;
  if (cache.running == 0) {
    cache.retired.clear();
  }
}

// The first time `func` is seen (since the last flush).
ALIASGUARD_COLD const PyOpEntry& add_entry(PyOpCache& cache, PyObject* func) {
  auto entry = std::make_unique<PyOpEntry>();
  if (const auto name = internals::operator_name_of(func)) {
    if (const auto handle = c10::Dispatcher::singleton().findOp(*name);
        handle.has_value() && handle->hasSchema()) {
      static_cast<OpCorrectionInfo&>(*entry) = op_correction_info(*handle);
    }
  }
  entry->func = py::reinterpret_borrow<py::object>(func);
  if (entry->analysis) {
    for (size_t i = 0; i < entry->analysis->num_arguments(); ++i) {
      PyObject* name =
          PyUnicode_FromString(entry->analysis->argument_name(i).c_str());
      if (name == nullptr) {
        throw python_error();
      }
      PyUnicode_InternInPlace(&name);
      entry->argument_names.push_back(py::reinterpret_steal<py::object>(name));
    }
  }
  return *cache.entries.insert_or_assign(func, std::move(entry)).first->second;
}

} // namespace

ALIASGUARD_HOT RunningCorrection::RunningCorrection() {
  ++py_op_cache().running;
}

ALIASGUARD_HOT RunningCorrection::~RunningCorrection() {
  PyOpCache& cache = py_op_cache();
  if (--cache.running == 0 && !cache.retired.empty()) {
    cache.retired.clear();
  }
}

ALIASGUARD_HOT const PyOpEntry& op_entry(PyObject* func) {
  PyOpCache& cache = py_op_cache();
  const uint64_t generation = schema_alias_analysis_generation();
  if (cache.generation != generation) {
    flush(cache, generation);
  }
  RecentOp& recent = recent_slot(cache, func);
  if (recent.func == func) {
    return *recent.entry;
  }
  auto it = cache.entries.find(func);
  const PyOpEntry& entry =
      it != cache.entries.end() ? *it->second : add_entry(cache, func);
  recent = {func, &entry};
  return entry;
}

ALIASGUARD_HOT PyObject* argument_object(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    size_t index) {
  const SchemaAliasAnalysis& analysis = *entry.analysis;
  if (!analysis.argument_is_kwarg_only(index) &&
      static_cast<Py_ssize_t>(index) < PySequence_Fast_GET_SIZE(args)) {
    return PySequence_Fast_GET_ITEM(args, index);
  }
  if (kwargs == nullptr || kwargs == Py_None) {
    return nullptr;
  }
  PyObject* value =
      PyDict_GetItemWithError(kwargs, entry.argument_names[index].ptr());
  if (value == nullptr && PyErr_Occurred()) {
    throw python_error();
  }
  return value;
}

} // namespace aliasguard::utils
