// Python face of alias correction and the alias audit. What runs once per
// __torch_dispatch__ (the _CorrectedDispatch wrapper, _correct_aliasing) is
// plain CPython vectorcall code: pybind11's argument handling alone would
// cost more than the whole correction of an op without alias annotations.

#include <torch/csrc/utils/python_alias_correction.h>
#include <torch/csrc/utils/python_c10_errors.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/operator_name.h>
#include <c10/core/VersionCounterUtils.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/alias_correction.h>

#include <structmember.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace torch::utils {
namespace {

PyObject* aliasing_error_type = nullptr; // aliasguard.AliasingError
PyObject* opt_out_attribute = nullptr; // "__aliasguard_fixup__", interned
// "__aliasguard_track_views__", interned
PyObject* tracking_opt_out_attribute = nullptr;
PyObject* empty_tuple = nullptr; // the default of a dispatch's `args`
std::atomic<bool> correction_enabled{true};
std::atomic<bool> view_tracking_enabled{true};

// Raises aliasguard.AliasingError (a RuntimeError) carrying the op, the
// return index and the argument as attributes. Never throws: it runs in
// exception handlers.
void set_python_aliasing_error(const AliasingError& error) {
  PyObject* instance = PyObject_CallFunction(
      aliasing_error_type, "s", error.what_without_backtrace());
  if (instance == nullptr) {
    return; // the failed call set its own error
  }
  PyObject* op = PyUnicode_FromString(error.op().c_str());
  PyObject* return_index = PyLong_FromSize_t(error.return_index());
  PyObject* argument = error.argument().empty()
      ? Py_NewRef(Py_None)
      : PyUnicode_FromString(error.argument().c_str());
  const bool ok = op != nullptr && return_index != nullptr &&
      argument != nullptr && PyObject_SetAttrString(instance, "op", op) == 0 &&
      PyObject_SetAttrString(instance, "return_index", return_index) == 0 &&
      PyObject_SetAttrString(instance, "argument", argument) == 0;
  Py_XDECREF(op);
  Py_XDECREF(return_index);
  Py_XDECREF(argument);
  if (ok) {
    PyErr_SetObject(aliasing_error_type, instance);
  }
  Py_DECREF(instance);
}

// The audit throws from inside the dispatcher, usually under one of torch's
// own bindings, which would turn a c10::Error into a plain RuntimeError; a
// python_error carrying our exception is restored as is instead.
[[noreturn]] void throw_python_aliasing_error(const AliasingError& error) {
  {
    py::gil_scoped_acquire gil;
    set_python_aliasing_error(error);
  }
  python_error python_exception;
  python_exception.persist(); // may cross to the thread that ran backward()
  throw python_exception;
}

// Note [Per-OpOverload analysis cache]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Keyed by the OpOverload object itself: a pointer hash, no string work, on
// the path every op takes. Entries hold a strong reference to their key so
// the address cannot be reused by another object, and the analysis' argument
// names as interned Python strings for kwargs lookups. Only touched with the
// GIL held. When the C++ cache drops an operator (deregistration) its
// generation changes and we start over. Leaked, like the C++ cache, so that
// no Py_DECREF runs after interpreter shutdown.
struct PyOpEntry {
  py::object func; // keeps the key's address from being reused
  // nullptr: not a dispatcher operator (a higher-order op, say).
  std::shared_ptr<const SchemaAliasAnalysis> analysis;
  std::vector<py::object> argument_names;
  // Set for ops whose one return is a view of their only tensor argument,
  // passed positionally at this index: the fast path of correct_result.
  std::optional<size_t> sole_view_argument;
  // The op has an ADInplaceOrView kernel: above a __torch_dispatch__ it marks
  // view returns and bumps written arguments. Read once: registering such a
  // kernel for an op already in use is not supported.
  bool has_inplace_or_view_kernel = false;
};

// A correction can run Python code (a wrapper's Python-customized sizes)
// that may flush the cache while an entry is in use; flushed entries are
// kept until no correction is running.
struct PyOpCache {
  std::unordered_map<PyObject*, std::unique_ptr<const PyOpEntry>> entries;
  std::vector<std::unique_ptr<const PyOpEntry>> retired;
  uint64_t generation = 0;
  int running = 0; // corrections in progress, re-entrant through Python
};

PyOpCache& py_op_cache() {
  static auto* cache = new PyOpCache();
  return *cache;
}

// Marks a correction in progress; see PyOpCache.
struct RunningCorrection {
  RunningCorrection() {
    ++py_op_cache().running;
  }
  ~RunningCorrection() {
    PyOpCache& cache = py_op_cache();
    if (--cache.running == 0 && !cache.retired.empty()) {
      cache.retired.clear();
    }
  }
  RunningCorrection(const RunningCorrection&) = delete;
  RunningCorrection& operator=(const RunningCorrection&) = delete;
};

std::optional<c10::OperatorName> operator_name_of(PyObject* func) {
  py::object schema = py::reinterpret_steal<py::object>(
      PyObject_GetAttrString(func, "_schema"));
  if (!schema) {
    PyErr_Clear();
    return std::nullopt;
  }
  py::object name = py::reinterpret_steal<py::object>(
      PyObject_GetAttrString(schema.ptr(), "name"));
  py::object overload = py::reinterpret_steal<py::object>(
      PyObject_GetAttrString(schema.ptr(), "overload_name"));
  if (!name || !overload || !PyUnicode_Check(name.ptr()) ||
      !PyUnicode_Check(overload.ptr())) {
    PyErr_Clear();
    return std::nullopt;
  }
  return c10::OperatorName(
      name.cast<std::string>(), overload.cast<std::string>());
}

// Valid until the end of the outermost RunningCorrection.
const PyOpEntry& op_entry(PyObject* func) {
  PyOpCache& cache = py_op_cache();
  const uint64_t generation = schema_alias_analysis_generation();
  if (cache.generation != generation) {
    for (auto& [key, entry] : cache.entries) {
      cache.retired.push_back(std::move(entry));
    }
    cache.entries.clear();
    cache.generation = generation;
    if (cache.running == 0) {
      cache.retired.clear();
    }
  }
  auto it = cache.entries.find(func);
  if (it != cache.entries.end()) {
    return *it->second;
  }
  auto entry = std::make_unique<PyOpEntry>();
  entry->func = py::reinterpret_borrow<py::object>(func);
  if (const auto name = operator_name_of(func)) {
    entry->analysis = schema_alias_analysis(*name);
    const auto handle = c10::Dispatcher::singleton().findOp(*name);
    entry->has_inplace_or_view_kernel = handle.has_value() &&
        handle->hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView);
  }
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
    const auto& returns = entry->analysis->returns();
    const auto sole = entry->analysis->sole_tensor_argument();
    if (returns.size() == 1 && returns[0].kind == ReturnAliasKind::kView &&
        !returns[0].is_list && sole == returns[0].argument &&
        !entry->analysis->argument_is_kwarg_only(*sole)) {
      entry->sole_view_argument = sole;
    }
  }
  return *cache.entries.insert_or_assign(func, std::move(entry)).first->second;
}

// Whether `attribute` is set to a false value on the owner's class (or a
// base class: the lookup follows the MRO).
bool opted_out(PyObject* owner, PyObject* attribute) {
  PyTypeObject* type = PyType_Check(owner)
      ? reinterpret_cast<PyTypeObject*>(owner)
      : Py_TYPE(owner);
  PyObject* flag = _PyType_Lookup(type, attribute); // borrowed
  if (flag == nullptr || flag == Py_True) {
    return false;
  }
  const int is_false = PyObject_Not(flag);
  if (is_false < 0) {
    PyErr_Clear(); // an unusable flag: keep correcting
    return false;
  }
  return is_false == 1;
}

// The Python object passed for schema argument `index`, or nullptr.
PyObject* argument_object(
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

// THPVariable_Check without PyObject_IsInstance, whose __instancecheck__
// lookup allocates a bound method per call: the same answer (TensorBase's
// metaclass does not customize instance checks) at a fraction of the cost.
bool is_tensor_object(PyObject* obj) {
  return PyObject_TypeCheck(
      obj, reinterpret_cast<PyTypeObject*>(THPVariableClass));
}

// OpValueRefs over Python objects, without touching any reference count;
// owns the element arrays of lists. Only tensors matter to aliasing.
class BorrowedObjects {
 public:
  OpValueRef borrow(PyObject* obj) {
    if (obj == nullptr || obj == Py_None) {
      return OpValueRef();
    }
    if (PyList_Check(obj) || PyTuple_Check(obj)) {
      return borrow_sequence(obj);
    }
    if (!PyLong_Check(obj) && is_tensor_object(obj)) { // ints are common
      return OpValueRef(THPVariable_Unpack(obj));
    }
    return OpValueRef::other(Py_TYPE(obj)->tp_name);
  }

 private:
  OpValueRef borrow_sequence(PyObject* obj) {
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(obj);
    std::vector<const at::Tensor*> tensors;
    for (Py_ssize_t i = 0; i < size; ++i) {
      PyObject* item = PySequence_Fast_GET_ITEM(obj, i);
      const bool is_none = item == Py_None;
      if (!is_none && (PyLong_Check(item) || !is_tensor_object(item))) {
        return OpValueRef::other(Py_TYPE(obj)->tp_name); // e.g. a size list
      }
      if (tensors.empty()) {
        tensors.reserve(size); // only now: most lists are sizes
      }
      tensors.push_back(is_none ? nullptr : &THPVariable_Unpack(item));
    }
    // Moving the vector keeps its buffer, which the ref points into.
    lists_.push_back(std::move(tensors));
    return OpValueRef::list(lists_.back());
  }

  std::vector<std::vector<const at::Tensor*>> lists_;
};

// Corrects (and, when auditing, checks) `out`, the result of `func` called
// with `args`/`kwargs`. Returns the object to hand back (new reference):
// `out`, or, for write returns, the caller's argument objects in their place.
PyObject* correct_result(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    bool correct,
    bool audit,
    const CorrectionOptions& options) {
  const SchemaAliasAnalysis& analysis = *entry.analysis;
  const auto& returns = analysis.returns();
  const size_t num_returns = returns.size();
  if (num_returns == 0) {
    return Py_NewRef(out);
  }
  // Borrowed: `out` keeps them alive.
  c10::SmallVector<PyObject*, 4> outputs;
  if (num_returns == 1) {
    outputs.push_back(out);
  } else {
    if ((!PyTuple_Check(out) && !PyList_Check(out)) ||
        PySequence_Fast_GET_SIZE(out) != static_cast<Py_ssize_t>(num_returns)) {
      throw_aliasing_error(
          analysis,
          0,
          std::nullopt,
          std::string("cannot be found: the op returned a ") +
              Py_TYPE(out)->tp_name + ", but its schema has " +
              std::to_string(num_returns) + " returns");
    }
    for (size_t i = 0; i < num_returns; ++i) {
      outputs.push_back(PySequence_Fast_GET_ITEM(out, i));
    }
  }

  BorrowedObjects borrowed;
  c10::SmallVector<PyObject*, 8> argument_objects;
  c10::SmallVector<OpValueRef, 8> arguments;
  for (size_t i = 0; i < analysis.num_arguments(); ++i) {
    argument_objects.push_back(argument_object(entry, args, kwargs, i));
    arguments.push_back(borrowed.borrow(argument_objects.back()));
  }
  c10::SmallVector<OpValueRef, 4> results;
  for (PyObject* output : outputs) {
    results.push_back(borrowed.borrow(output));
  }

  if (correct) {
    correct_aliasing_borrowed(analysis, arguments, results, options);
    for (size_t i = 0; i < num_returns; ++i) {
      if (returns[i].is_write()) {
        results[i] = arguments[returns[i].argument]; // what we hand back
      }
    }
  }
  if (audit) {
    audit_aliasing_borrowed(
        analysis, arguments, results, /*views_share_version_counter=*/true);
  }
  if (!correct || !analysis.has_write_returns()) {
    return Py_NewRef(out);
  }
  // Write returns come back as the caller's own argument objects.
  const auto handed_back = [&](size_t i) -> PyObject* {
    PyObject* argument = returns[i].is_write()
        ? argument_objects[returns[i].argument]
        : nullptr;
    return argument != nullptr ? argument : outputs[i];
  };
  if (num_returns == 1) {
    return Py_NewRef(handed_back(0));
  }
  const bool as_list = PyList_Check(out);
  PyObject* result =
      as_list ? PyList_New(num_returns) : PyTuple_New(num_returns);
  if (result == nullptr) {
    throw python_error();
  }
  for (size_t i = 0; i < num_returns; ++i) {
    PyObject* item = Py_NewRef(handed_back(i));
    if (as_list) {
      PyList_SET_ITEM(result, i, item);
    } else {
      PyTuple_SET_ITEM(result, i, item);
    }
  }
  if (!as_list && !PyTuple_CheckExact(out)) {
    // Keep a torch.return_types structseq what it was, when it can be
    // rebuilt from a sequence; a plain tuple serves the dispatcher as well.
    PyObject* typed =
        PyObject_CallOneArg(reinterpret_cast<PyObject*>(Py_TYPE(out)), result);
    if (typed != nullptr) {
      Py_DECREF(result);
      return typed;
    }
    PyErr_Clear();
  }
  return result;
}

// The fast path for the most common aliasing op: one view return of the only
// tensor argument (view, t, transpose, select, slice, expand, ...). Returns
// false, having done nothing, when the values are not the plain case (the
// general path then handles them, errors included).
bool correct_sole_view(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* out,
    const CorrectionOptions& options) {
  const size_t index = *entry.sole_view_argument;
  if (static_cast<Py_ssize_t>(index) >= PySequence_Fast_GET_SIZE(args)) {
    return false;
  }
  PyObject* input = PySequence_Fast_GET_ITEM(args, index);
  if (!is_tensor_object(input) || !is_tensor_object(out)) {
    return false;
  }
  correct_view_return(
      *entry.analysis,
      0,
      THPVariable_Unpack(input),
      THPVariable_Unpack(out),
      options);
  return true;
}

void check_args_kwargs(PyObject* args, PyObject* kwargs) {
  if (!PyTuple_Check(args) && !PyList_Check(args)) {
    throw py::type_error(
        std::string("args must be a tuple, got ") + Py_TYPE(args)->tp_name);
  }
  if (kwargs != Py_None && !PyDict_Check(kwargs)) {
    throw py::type_error(
        std::string("kwargs must be a dict or None, got ") +
        Py_TYPE(kwargs)->tp_name);
  }
}

// Every exception leaves as a Python exception, AliasingError as ours.
// (torch's HANDLE_TH_ERRORS would also buffer warnings, which costs a few
// thread-local round trips per call on the hot path and is not needed here.)
template <typename Body>
PyObject* translate_errors(Body&& body) {
  try {
    return body();
  } catch (const AliasingError& error) {
    set_python_aliasing_error(error);
  } catch (python_error& error) {
    error.restore();
  } catch (py::error_already_set& error) {
    error.restore();
  } catch (const py::builtin_exception& error) {
    error.set_error();
  } catch (torch::PyTorchError& error) {
    PyErr_SetString(error.python_type(), error.what());
  } catch (const c10::Error& error) {
    set_python_error_from_c10(error);
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
  return nullptr;
}

// What a corrected __torch_dispatch__ returns in place of `out` (borrowed),
// the result of `func(*args, **kwargs)`, for the op `entry` describes. New
// reference; nullptr with an exception set.
PyObject* corrected_result(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    bool correct,
    bool audit,
    const CorrectionOptions& options) {
  if (out == Py_NotImplemented || !entry.analysis ||
      (!audit && !entry.analysis->has_aliasing_returns())) {
    return Py_NewRef(out); // NotImplemented: the dispatcher asks someone else
  }
  return translate_errors([&]() -> PyObject* {
    check_args_kwargs(args, kwargs);
    if (correct && !audit && entry.sole_view_argument.has_value() &&
        correct_sole_view(entry, args, out, options)) {
      return Py_NewRef(out);
    }
    return correct_result(entry, args, kwargs, out, correct, audit, options);
  });
}

// Remembers the versions of the tensors `entry`'s op writes, as passed in
// `args`/`kwargs`. Silently remembers nothing for arguments it cannot read:
// the correction after the call reports malformed ones.
void remember_written_versions(
    const PyOpEntry& entry,
    PyObject* args,
    PyObject* kwargs,
    c10::WrittenVersions& written) {
  if ((!PyTuple_Check(args) && !PyList_Check(args)) ||
      (kwargs != Py_None && !PyDict_Check(kwargs))) {
    return;
  }
  for (const size_t index : entry.analysis->written_arguments()) {
    PyObject* value = argument_object(entry, args, kwargs, index);
    if (value == nullptr || value == Py_None) {
      continue;
    }
    if (is_tensor_object(value)) {
      written.remember(*THPVariable_Unpack(value).unsafeGetTensorImpl());
    } else if (PyList_Check(value) || PyTuple_Check(value)) {
      const Py_ssize_t size = PySequence_Fast_GET_SIZE(value);
      for (Py_ssize_t i = 0; i < size; ++i) {
        PyObject* item = PySequence_Fast_GET_ITEM(value, i);
        if (is_tensor_object(item)) {
          written.remember(*THPVariable_Unpack(item).unsafeGetTensorImpl());
        }
      }
    }
  }
}

// Note [Tracked __torch_dispatch__ bodies]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The ADInplaceOrView kernel above the Python key runs its op under
// AutoDispatchBelowADInplaceOrView, so a __torch_dispatch__ body runs with
// ADInplaceOrView excluded: views made there are plain aliases with fresh
// counters, in-place ops there bump nothing, and a tensor cached there (the
// upstream report, selective checkpointing) misses every later mutation. The
// wrapper re-enables the key for the body, as track_views() does, so those
// ops run their ADInplaceOrView kernels again (as_view, increment_version);
// autograd stays excluded. Only when the key was excluded on entry: otherwise
// the body already runs as stock.
//
// Two consequences need handling, both decided here because only the
// wrapper sees the body from the outside:
//   * views the body returns now carry view metadata, which the outer
//     kernel's as_view refuses: see Note [Views returned from below
//     autograd];
//   * an in-place op through a mode or subclass would be counted twice: once
//     by the body (the op's own ADInplaceOrView kernel, reached again when
//     the body calls func, or whatever writes the body does to the same
//     memory) and once by the outer kernel. See
//     Note [One bump per write through __torch_dispatch__].
// The automatic tracking depends on the correction to hand views back to the
// outer kernel, so a class or process without correction has no automatic
// tracking either.

// Note [One bump per write through __torch_dispatch__]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// At top level an in-place op bumps each argument it writes once. For ops
// with an ADInplaceOrView kernel that bump is made by the kernel, after the
// op returned, above the Python key; the kernel keeps that role: before the
// body runs we remember the version of every argument the schema marks
// written (Tensor(a!), returned or not), and when the body returns normally
// we set those counters back to where they were, so the outer kernel's bump
// is the only one and counts equal stock's (a cache that recorded a version
// inside the body, as torch's selective checkpointing does, sees exactly the
// version the op ends with). Ops without such a kernel (the _foreach_*_
// family) are counted at top level by the in-place ops their backend kernel
// runs, which a body below ADInplaceOrView never reaches for a wrapper
// argument (its inner tensors are written instead) and stock never counts
// there at all: for those, a written argument whose counter did not move is
// bumped once, so a mode and a wrapper count what top level counts. Only
// when the key was excluded on entry, i.e. below autograd. Only the counters
// of written arguments are touched: a write the body made to anything else is
// real and stays counted. When the body raises, nothing is settled: no outer
// bump will follow, and a write that happened before the exception must stay
// visible.
// Avoiding the inner bump instead would mean excluding ADInplaceOrView for
// exactly the body's call of the same op on the same arguments, which the
// wrapper cannot single out (the body may unwrap, redispatch or write through
// a view); setting back is exact and costs two loads per written argument.
// Counters only move through VariableVersion's own bump and set_version (the
// setter behind torch's _unsafe_set_version_counter), in c10::WrittenVersions.

// Note [The corrected __torch_dispatch__ wrapper]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// What replaces a class's __torch_dispatch__: calls the original, then
// corrects its result. A C type rather than a Python closure, because a
// Python frame alone costs about as much as correcting a view. It binds like
// a function (so it works as a plain method of a mode, and inside
// classmethod), and has a __dict__ for __wrapped__, __name__ and friends. The
// original is called with exactly the arguments received; the owner, func,
// args and kwargs for the correction are read from them by position or by
// their conventional names. `owner` is set for the staticmethod form, which
// receives no class.
struct CorrectedDispatch {
  PyObject_HEAD
  PyObject* fn;
  PyObject* owner; // nullptr: the first argument is the owner
  PyObject* dict;
  vectorcallfunc vectorcall;
};

PyTypeObject CorrectedDispatchType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// Argument `position` (counting the owner when it is passed), or the keyword
// `name`, or nullptr.
PyObject* call_argument(
    PyObject* const* argv,
    Py_ssize_t nargs,
    PyObject* kwnames,
    Py_ssize_t position,
    const char* name) {
  if (position < nargs) {
    return argv[position];
  }
  if (kwnames != nullptr) {
    const Py_ssize_t count = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < count; ++i) {
      if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, i), name) == 0) {
        return argv[nargs + i];
      }
    }
  }
  return nullptr;
}

// Re-enables ADInplaceOrView for a tracked body; restores the exclusion
// however the body ends. See Note [Tracked __torch_dispatch__ bodies].
class TrackedBody {
 public:
  explicit TrackedBody(bool active) : active_(active) {
    if (active_) {
      c10::impl::tls_set_dispatch_key_excluded(
          c10::DispatchKey::ADInplaceOrView, false);
    }
  }
  ~TrackedBody() {
    if (active_) {
      c10::impl::tls_set_dispatch_key_excluded(
          c10::DispatchKey::ADInplaceOrView, true);
    }
  }
  TrackedBody(const TrackedBody&) = delete;
  TrackedBody& operator=(const TrackedBody&) = delete;

 private:
  bool active_;
};

PyObject* corrected_dispatch_call(
    PyObject* callable,
    PyObject* const* argv,
    size_t nargsf,
    PyObject* kwnames) {
  auto* self = reinterpret_cast<CorrectedDispatch*>(callable);
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t shift = self->owner != nullptr ? 0 : 1;
  PyObject* owner = self->owner;
  if (owner == nullptr) {
    owner = nargs > 0 ? argv[0] : Py_None;
  }
  PyObject* func = call_argument(argv, nargs, kwnames, shift, "func");
  const bool audit = is_alias_audit_enabled();
  const bool correct = func != nullptr &&
      correction_enabled.load(std::memory_order_relaxed) &&
      !opted_out(owner, opt_out_attribute);
  if (func == nullptr || (!correct && !audit)) {
    return PyObject_Vectorcall(self->fn, argv, nargsf, kwnames); // stock
  }
  PyObject* args = call_argument(argv, nargs, kwnames, shift + 2, "args");
  PyObject* kwargs = call_argument(argv, nargs, kwnames, shift + 3, "kwargs");
  args = args != nullptr ? args : empty_tuple;
  kwargs = kwargs != nullptr ? kwargs : Py_None;

  // Below an ADInplaceOrView kernel (of this op, or of whatever C++ ran it).
  const bool below_inplace_or_view = c10::impl::tls_is_dispatch_key_excluded(
      c10::DispatchKey::ADInplaceOrView);
  const bool track = correct && below_inplace_or_view &&
      view_tracking_enabled.load(std::memory_order_relaxed) &&
      !opted_out(owner, tracking_opt_out_attribute);
  const RunningCorrection running; // keeps `entry` valid across the body
  const PyOpEntry* entry = nullptr;
  c10::WrittenVersions written;
  CorrectionOptions options;
  const bool ready = translate_errors([&]() -> PyObject* {
    entry = &op_entry(func);
    const bool outer_kernel =
        below_inplace_or_view && entry->has_inplace_or_view_kernel;
    options.outer_kernel_marks_views = correct && outer_kernel;
    options.tracked = track;
    options.view_may_be_a_copy = !entry->has_inplace_or_view_kernel;
    if (correct && below_inplace_or_view && entry->analysis) {
      remember_written_versions(*entry, args, kwargs, written);
    }
    return Py_None; // borrowed, only a success marker
  }) != nullptr;
  if (!ready) {
    return nullptr;
  }
  PyObject* out = nullptr;
  {
    const TrackedBody body(track);
    out = PyObject_Vectorcall(self->fn, argv, nargsf, kwnames);
  }
  if (out == nullptr) {
    return nullptr; // no outer bump follows: keep the body's
  }
  // See Note [One bump per write through __torch_dispatch__]
  if (!written.empty()) {
    if (entry->has_inplace_or_view_kernel) {
      written.rewind();
    } else {
      written.bump_unmoved();
    }
  }
  PyObject* result =
      corrected_result(*entry, args, kwargs, out, correct, audit, options);
  Py_DECREF(out);
  return result;
}

PyObject* corrected_dispatch_new(
    PyTypeObject* type,
    PyObject* args,
    PyObject* kwargs) {
  static const char* keywords[] = {"fn", "owner", nullptr};
  PyObject* fn = nullptr;
  PyObject* owner = nullptr;
  if (!PyArg_ParseTupleAndKeywords(
          args, kwargs, "O|O:_CorrectedDispatch", const_cast<char**>(keywords), &fn, &owner)) {
    return nullptr;
  }
  if (!PyCallable_Check(fn)) {
    PyErr_Format(PyExc_TypeError, "_CorrectedDispatch(): fn must be callable, got %s", Py_TYPE(fn)->tp_name);
    return nullptr;
  }
  auto* self = reinterpret_cast<CorrectedDispatch*>(type->tp_alloc(type, 0));
  if (self == nullptr) {
    return nullptr;
  }
  self->fn = Py_NewRef(fn);
  self->owner = owner == nullptr || owner == Py_None ? nullptr : Py_NewRef(owner);
  self->dict = nullptr;
  self->vectorcall = corrected_dispatch_call;
  return reinterpret_cast<PyObject*>(self);
}

int corrected_dispatch_traverse(PyObject* obj, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<CorrectedDispatch*>(obj);
  Py_VISIT(self->fn);
  Py_VISIT(self->owner);
  Py_VISIT(self->dict);
  return 0;
}

int corrected_dispatch_clear(PyObject* obj) {
  auto* self = reinterpret_cast<CorrectedDispatch*>(obj);
  Py_CLEAR(self->fn);
  Py_CLEAR(self->owner);
  Py_CLEAR(self->dict);
  return 0;
}

void corrected_dispatch_dealloc(PyObject* obj) {
  PyObject_GC_UnTrack(obj);
  corrected_dispatch_clear(obj);
  Py_TYPE(obj)->tp_free(obj);
}

// Binds like a function: a method of its instance, itself on the class.
PyObject* corrected_dispatch_get(PyObject* self, PyObject* obj, PyObject* /*type*/) {
  if (obj == nullptr || obj == Py_None) {
    return Py_NewRef(self);
  }
  return PyMethod_New(self, obj);
}

PyObject* corrected_dispatch_repr(PyObject* obj) {
  auto* self = reinterpret_cast<CorrectedDispatch*>(obj);
  return PyUnicode_FromFormat("<alias-corrected %R>", self->fn);
}

PyMemberDef corrected_dispatch_members[] = {
    {"__aliasguard_wrapped__", T_OBJECT, offsetof(CorrectedDispatch, fn), READONLY,
     "the __torch_dispatch__ whose results are corrected"},
    {"__aliasguard_owner__", T_OBJECT, offsetof(CorrectedDispatch, owner), READONLY,
     "the class of a staticmethod __torch_dispatch__, else None"},
    {nullptr, 0, 0, 0, nullptr}};

PyGetSetDef corrected_dispatch_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

void init_corrected_dispatch_type() {
  PyTypeObject& type = CorrectedDispatchType;
  type.tp_name = "aliasguard._C._CorrectedDispatch";
  type.tp_basicsize = sizeof(CorrectedDispatch);
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
      Py_TPFLAGS_METHOD_DESCRIPTOR;
  type.tp_doc =
      "_CorrectedDispatch(fn, owner=None): calls fn, then corrects the "
      "aliasing of its result (see aliasguard.correct_aliasing).";
  type.tp_new = corrected_dispatch_new;
  type.tp_dealloc = corrected_dispatch_dealloc;
  type.tp_traverse = corrected_dispatch_traverse;
  type.tp_clear = corrected_dispatch_clear;
  type.tp_call = PyVectorcall_Call;
  type.tp_vectorcall_offset = offsetof(CorrectedDispatch, vectorcall);
  type.tp_descr_get = corrected_dispatch_get;
  type.tp_repr = corrected_dispatch_repr;
  type.tp_dictoffset = offsetof(CorrectedDispatch, dict);
  type.tp_members = corrected_dispatch_members;
  type.tp_getset = corrected_dispatch_getset;
  if (PyType_Ready(&type) < 0) {
    throw python_error();
  }
}

// _correct_aliasing(func, args, kwargs, out): the explicit call; corrects
// whatever the global switch says.
PyObject* explicit_correct_aliasing(
    PyObject* /*module*/,
    PyObject* const* argv,
    Py_ssize_t argc) {
  if (argc != 4) {
    PyErr_Format(
        PyExc_TypeError,
        "correct_aliasing() takes 4 arguments (func, args, kwargs, out), got %zd",
        argc);
    return nullptr;
  }
  return translate_errors([&]() -> PyObject* {
    const RunningCorrection running;
    const PyOpEntry& entry = op_entry(argv[0]);
    if (!entry.analysis) {
      throw py::type_error(
          std::string("correct_aliasing(): func must be an OpOverload of a "
                      "registered operator (e.g. torch.ops.aten.view.default), "
                      "got ") +
          Py_TYPE(argv[0])->tp_name);
    }
    check_args_kwargs(argv[1], argv[2]);
    // Called at the end of a __torch_dispatch__, below autograd: an outer
    // ADInplaceOrView kernel will mark the views. At top level (autograd not
    // excluded) views made there keep their metadata.
    CorrectionOptions options;
    options.outer_kernel_marks_views = entry.has_inplace_or_view_kernel &&
        c10::impl::tls_local_dispatch_key_set().excluded_.has(
            c10::DispatchKey::AutogradFunctionality);
    options.tracked = options.outer_kernel_marks_views &&
        !c10::impl::tls_is_dispatch_key_excluded(
            c10::DispatchKey::ADInplaceOrView);
    options.view_may_be_a_copy = !entry.has_inplace_or_view_kernel;
    if (!entry.analysis->has_aliasing_returns() ||
        (entry.sole_view_argument.has_value() &&
         correct_sole_view(entry, argv[1], argv[3], options))) {
      return Py_NewRef(argv[3]);
    }
    return correct_result(
        entry,
        argv[1],
        argv[2],
        argv[3],
        /*correct=*/true,
        /*audit=*/false,
        options);
  });
}

// _call_tracked(op, *args, **kwargs): op(*args, **kwargs) with
// ADInplaceOrView re-enabled for that one call (aliasguard.with_tracking).
PyObject* call_tracked(
    PyObject* /*module*/,
    PyObject* const* argv,
    Py_ssize_t nargs,
    PyObject* kwnames) {
  if (nargs < 1) {
    PyErr_SetString(
        PyExc_TypeError, "_call_tracked(op, *args, **kwargs): op is missing");
    return nullptr;
  }
  const TrackedBody tracked(c10::impl::tls_is_dispatch_key_excluded(
      c10::DispatchKey::ADInplaceOrView));
  return PyObject_Vectorcall(argv[0], argv + 1, nargs - 1, kwnames);
}

PyMethodDef hot_methods[] = {
    {"_call_tracked",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(call_tracked)),
     METH_FASTCALL | METH_KEYWORDS,
     "_call_tracked(op, *args, **kwargs): op(*args, **kwargs) with "
     "ADInplaceOrView re-enabled"},
    {"_correct_aliasing",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(explicit_correct_aliasing)),
     METH_FASTCALL,
     "_correct_aliasing(func, args, kwargs, out) -> out, corrected"},
    {nullptr, nullptr, 0, nullptr}};

// (kind, argument index or None, argument name or None, is_list) per return.
py::list schema_alias_info(const std::string& name, const std::string& overload) {
  const auto analysis =
      schema_alias_analysis(c10::OperatorName(name, overload));
  if (!analysis) {
    throw py::value_error(
        "_schema_alias_info(): no operator " + name +
        (overload.empty() ? std::string() : "." + overload) +
        " is registered");
  }
  py::list result;
  for (const ReturnAlias& alias : analysis->returns()) {
    py::object argument = py::none();
    py::object argument_name = py::none();
    if (alias.aliases_argument()) {
      argument = py::int_(alias.argument);
      argument_name = py::str(analysis->argument_name(alias.argument));
    }
    result.append(py::make_tuple(
        return_alias_kind_name(alias.kind), argument, argument_name, alias.is_list));
  }
  return result;
}

void translate_aliasing_error(std::exception_ptr error) {
  try {
    if (error) {
      std::rethrow_exception(error);
    }
  } catch (const AliasingError& e) {
    set_python_aliasing_error(e);
  }
}

} // namespace

void init_alias_correction_bindings(pybind11::module& m) {
  aliasing_error_type = PyErr_NewExceptionWithDoc(
      "aliasguard.AliasingError",
      "An op's outputs do not alias its inputs the way its schema says, and "
      "cannot be made to. Attributes: op, return_index, argument.",
      PyExc_RuntimeError,
      nullptr);
  if (aliasing_error_type == nullptr) {
    throw python_error();
  }
  m.add_object("AliasingError", py::handle(aliasing_error_type));
  opt_out_attribute = PyUnicode_InternFromString("__aliasguard_fixup__");
  tracking_opt_out_attribute =
      PyUnicode_InternFromString("__aliasguard_track_views__");
  empty_tuple = PyTuple_New(0);
  if (opt_out_attribute == nullptr || tracking_opt_out_attribute == nullptr ||
      empty_tuple == nullptr ||
      PyModule_AddFunctions(m.ptr(), hot_methods) != 0) {
    throw python_error();
  }
  init_corrected_dispatch_type();
  m.add_object(
      "_CorrectedDispatch",
      py::handle(reinterpret_cast<PyObject*>(&CorrectedDispatchType)));
  // Registered after the module's own c10::Error translator, so tried first.
  py::register_local_exception_translator(&translate_aliasing_error);
  set_alias_audit_error_reporter(&throw_python_aliasing_error);

  m.def(
      "_set_alias_correction",
      [](bool enabled) { return correction_enabled.exchange(enabled); },
      py::arg("enabled"));
  m.def("_is_alias_correction_enabled", [] {
    return correction_enabled.load();
  });
  m.def(
      "_set_automatic_view_tracking",
      [](bool enabled) { return view_tracking_enabled.exchange(enabled); },
      py::arg("enabled"));
  m.def("_is_automatic_view_tracking_enabled", [] {
    return view_tracking_enabled.load();
  });
  m.def(
      "_set_alias_audit", &set_alias_audit_enabled, py::arg("enabled"));
  m.def("_is_alias_audit_enabled", &is_alias_audit_enabled);
  m.def(
      "_schema_alias_info",
      &schema_alias_info,
      py::arg("name"),
      py::arg("overload") = "");
}

} // namespace torch::utils
