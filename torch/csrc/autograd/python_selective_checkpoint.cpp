// Python face of selective activation checkpointing (SAC): the per-op work
// of aliasguard.checkpoint's two dispatch modes.
//
// Note [SAC dispatch without Python frames]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torch calls a TorchDispatchMode through the Python dispatch key: it looks
// up `__torch_dispatch__` on the mode object and calls it with (func, types,
// args, kwargs). That attribute need not be a Python function: the modes in
// aliasguard/checkpoint.py set it, on the class, to the C functions below,
// wrapped in an `instancemethod` so that they bind to the mode like a method.
// Per op they do what the Python modes did, with no Python frame in between:
// look the op up in a per-OpOverload table (computed once from its schema),
// run it through `OpOverload._op` (the C++ callable `OpOverload.__call__`
// forwards to), ask the policy (for a list, a set lookup; for a function, one
// direct call with a SelectiveCheckpointContext built without running its
// __init__), detach and keep the outputs, and check writes against the cache
// in O(1) (see Note [SAC cache keyed by version counter]). What happens
// rarely (errors, saved-tensors hooks, outputs that are not a tensor or a
// plain tuple/list) calls back into small Python helpers of checkpoint.py.
//
// Alias correction wraps Python `__torch_dispatch__` functions; these are
// not, so they run each op as the wrapper runs a body (see Note [SAC modes
// correct as a wrapped __torch_dispatch__]).

#include <torch/csrc/autograd/python_selective_checkpoint.h>

#include <c10/core/VersionCounterUtils.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/selective_checkpoint.h>
#include <torch/csrc/autograd/selective_checkpoint_fast_path.h>
#include <torch/csrc/utils/python_alias_correction.h>
#include <torch/csrc/utils/python_dispatch_call.h>
#include <torch/csrc/utils/python_op_arguments.h>
#include <torch/csrc/utils/python_torch_internals.h>
#include <torch/csrc/utils/python_tracked_dispatch.h>
#include <torch/csrc/utils/running_bodies.h>
#include <torch/csrc/utils/schema_alias_analysis.h>

#include <frameobject.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace aliasguard::autograd {
namespace {

// Objects of checkpoint.py and torch the dispatch functions need, handed over
// once by _sac_configure. Leaked: no Py_DECREF after interpreter shutdown.
struct Config {
  py::object ignored_ops; // frozenset: SAC_IGNORED_OPS
  py::object op_overload_type; // torch._ops.OpOverload
  py::object has_effects; // op -> bool
  py::object context_type; // SelectiveCheckpointContext
  py::object policy_type; // CheckpointPolicy
  py::object must_save;
  py::object prefer_save;
  py::object prefer_recompute;
  py::object coerce_policy; // (policy, func) -> CheckpointPolicy or raise
  py::object forward_error; // (func, cached_op, index, cached_at) -> raise
  py::object recompute_error; // (cached_op, index, cached_at, expected, found)
  py::object missing_error; // (func, calls, forward_calls) -> raise
  py::object consumed_error; // (func) -> raise
  py::object detach_tree; // out -> (cached value, [tensors])
  py::object pack_value; // (value, pack) -> packed value
  py::object unpack_value; // (packed value, unpack) -> value
  py::object top_hooks; // () -> the innermost saved-tensors hooks or None
  py::object user_hooks; // (mode) -> (pack, unpack) or None
  std::vector<std::string> library_prefixes; // torch's and aliasguard's dirs
  py::object state_attribute; // "_sac", interned
  py::object is_recompute_name; // "is_recompute"
  py::object op_output_name; // "op_output"
  bool ready = false;
};

Config& config() {
  static auto* instance = new Config();
  return *instance;
}

// What the dispatch functions need to know about an op, computed on first
// sight. Only touched with the GIL held.
struct OpInfo {
  py::object func; // the key: keeps its address from being reused
  py::object call; // OpOverload._op, or func itself
  bool ignored = false;
  bool has_effects = false;
  // What the schema allows; see Note [Which op calls SAC may cache]. A
  // higher-order op (no schema) is treated as pure.
  SacOpTraits traits;
  // traits.written_arguments, as the Python call passes them: (position,
  // name, kwarg-only).
  struct Written {
    Py_ssize_t position;
    py::object name;
    bool kwarg_only;
  };
  std::vector<Written> written;
};

std::unordered_map<PyObject*, std::unique_ptr<OpInfo>>& op_table() {
  static auto* table =
      new std::unordered_map<PyObject*, std::unique_ptr<OpInfo>>();
  return *table;
}

// The op's SacOpTraits, from the one alias analysis (see
// torch/csrc/utils/schema_alias_analysis.h), and where its written arguments
// are in a call.
void read_schema(OpInfo& info) {
  const std::optional<c10::OperatorName> name =
      internals::operator_name_of(info.func.ptr());
  if (!name) {
    return; // no dispatcher operator: treated as pure
  }
  const std::shared_ptr<const utils::SchemaAliasAnalysis> analysis =
      utils::schema_alias_analysis(*name);
  if (!analysis) {
    return; // a schema the dispatcher no longer knows: treated as pure
  }
  info.traits = sac_op_traits(*name, *analysis);
  for (const size_t i : info.traits.written_arguments) {
    PyObject* argument_name =
        PyUnicode_FromString(analysis->argument_name(i).c_str());
    if (argument_name == nullptr) {
      throw python_error();
    }
    PyUnicode_InternInPlace(&argument_name);
    info.written.push_back(
        {static_cast<Py_ssize_t>(i),
         py::reinterpret_steal<py::object>(argument_name),
         analysis->argument_is_kwarg_only(i)});
  }
}

const OpInfo& op_info(PyObject* func) {
  auto& table = op_table();
  auto it = table.find(func);
  if (it != table.end()) {
    return *it->second;
  }
  const Config& cfg = config();
  auto info = std::make_unique<OpInfo>();
  info->func = py::reinterpret_borrow<py::object>(func);
  const int ignored = PySet_Contains(cfg.ignored_ops.ptr(), func);
  if (ignored < 0) {
    PyErr_Clear(); // unhashable: not one of the ignored ops
  }
  info->ignored = ignored == 1;
  const int is_overload = PyObject_IsInstance(func, cfg.op_overload_type.ptr());
  if (is_overload < 0) {
    throw python_error();
  }
  if (is_overload == 1) {
    info->call = internals::operator_callable_of(func);
    read_schema(*info);
  } else {
    info->call = info->func; // a higher-order op: no schema, treated as pure
  }
  py::object effects = py::reinterpret_steal<py::object>(
      PyObject_CallOneArg(cfg.has_effects.ptr(), func));
  if (!effects) {
    throw python_error();
  }
  info->has_effects = PyObject_IsTrue(effects.ptr()) == 1;
  return *table.emplace(func, std::move(info)).first->second;
}

// One cached op call: the value handed back at recompute and where the user's
// code ran the op (formatted only for messages).
struct EntryValue {
  py::object value; // None once consumed
  py::object unpack; // the user's unpack hook when `value` is packed
  py::object code; // code object of the user's frame, or None
  int line = 0;
};

struct SacState {
  SelectiveCheckpointCache cache;
  std::vector<EntryValue> values;
  py::object policy_fn; // None for a list policy
  // The ops of a list policy, by identity: OpOverload hashes in Python, and
  // compares by identity (one object per overload), so a set of pointers
  // answers the same without a Python call.
  py::object saved_ops; // keeps the pointers below valid
  std::unordered_set<PyObject*> saved_op_ptrs;
  // CheckpointPolicy members (singletons) the running torch overrides for
  // effectful ops; see _torch_sac_semantics.py.
  py::object effect_overrides;
  std::vector<PyObject*> effect_override_ptrs;
  bool allow_mutation = false;

  bool effect_overridden(PyObject* policy) const {
    return std::find(
               effect_override_ptrs.begin(),
               effect_override_ptrs.end(),
               policy) != effect_override_ptrs.end();
  }
};

const char* kStateCapsule = "aliasguard.SacState";

SacState* state_of_capsule(PyObject* capsule) {
  auto* state =
      static_cast<SacState*>(PyCapsule_GetPointer(capsule, kStateCapsule));
  if (state == nullptr) {
    throw python_error();
  }
  return state;
}

SacState* state_of_mode(PyObject* mode) {
  py::object capsule = py::reinterpret_steal<py::object>(
      PyObject_GetAttr(mode, config().state_attribute.ptr()));
  if (!capsule) {
    throw python_error();
  }
  return state_of_capsule(capsule.ptr()); // the mode keeps it alive
}

// The innermost frame outside torch and aliasguard: (code, line).
std::pair<py::object, int> user_frame() {
  return internals::innermost_user_frame(config().library_prefixes);
}

std::string location(const EntryValue& entry) {
  return internals::code_location(entry.code, entry.line);
}

bool is_tensor(PyObject* obj) {
  return internals::is_tensor_object(obj);
}

// Calls `fn(*args)`; always throws: the helpers raise the error to report.
[[noreturn]] void raise_through(
    const py::object& fn,
    std::initializer_list<py::handle> args) {
  py::tuple packed(args.size());
  size_t i = 0;
  for (py::handle arg : args) {
    packed[i++] = py::reinterpret_borrow<py::object>(arg);
  }
  PyObject* result = PyObject_Call(fn.ptr(), packed.ptr(), nullptr);
  Py_XDECREF(result);
  if (!PyErr_Occurred()) {
    PyErr_SetString(
        PyExc_SystemError, "aliasguard.checkpoint: an error helper returned");
  }
  throw python_error();
}

// Note [SAC modes correct as a wrapped __torch_dispatch__]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The modes' __torch_dispatch__ is a C function, which the automatic
// correction does not wrap (it wraps Python functions), so each op is run
// here the way the wrapper runs a body: inside the core's TrackedDispatchBody
// (its op and entry state recorded, the written versions settled), then
// corrected with the options that body gives, by the same C++ calls, without
// going back through Python. The modes opt out of view tracking
// (`__aliasguard_track_views__ = False` in checkpoint.py): a tracked body
// would count versions differently from the ones the cache compares. The
// audit does not check the modes' results (they were never audited): the
// ops they run are checked where they are answered.
py::object run_op(
    PyObject* mode,
    const OpInfo& info,
    PyObject* args,
    PyObject* kwargs) {
  // Admitted as a wrapped body is; see Note [Installing and uninstalling
  // while bodies run].
  const bool correct =
      info.traits.has_annotated_returns && utils::correction_applies(mode);
  std::optional<utils::RunningBody> running;
  if (correct) {
    running.emplace();
  }
  if (!correct || !running->admitted()) {
    PyObject* out = PyObject_Call(
        info.call.ptr(), args, kwargs == Py_None ? nullptr : kwargs);
    if (out == nullptr) {
      throw python_error();
    }
    return py::reinterpret_steal<py::object>(out);
  }
  utils::TrackedDispatchCall body(
      mode, info.func.ptr(), args, kwargs, /*correct=*/true);
  py::object out = py::reinterpret_steal<py::object>(
      body.call_with(info.call.ptr(), args, kwargs));
  if (!out) {
    throw python_error();
  }
  PyObject* corrected = utils::corrected_result(
      mode,
      info.func.ptr(),
      body.entry(),
      args,
      kwargs,
      out.ptr(),
      /*correct=*/true,
      /*audit=*/false,
      body.options(),
      utils::reported_violation_mark());
  if (corrected == nullptr) {
    throw python_error();
  }
  return py::reinterpret_steal<py::object>(corrected);
}

// Every tensor an op writes, by its schema's Tensor(a!) arguments.
template <typename F>
void for_each_written(
    const OpInfo& info,
    PyObject* args,
    PyObject* kwargs,
    F&& visit) {
  const Py_ssize_t num_args = PyTuple_GET_SIZE(args);
  for (const auto& written : info.written) {
    PyObject* value = nullptr;
    if (!written.kwarg_only && written.position < num_args) {
      value = PyTuple_GET_ITEM(args, written.position);
    } else if (kwargs != nullptr && kwargs != Py_None) {
      value = PyDict_GetItemWithError(kwargs, written.name.ptr());
      if (value == nullptr && PyErr_Occurred()) {
        throw python_error();
      }
    }
    if (value == nullptr) {
      continue;
    }
    if (is_tensor(value)) {
      visit(THPVariable_Unpack(value));
    } else if (PyList_Check(value) || PyTuple_Check(value)) { // Tensor(a!)[]
      py::object items =
          py::reinterpret_steal<py::object>(PySequence_Fast(value, ""));
      if (!items) {
        throw python_error();
      }
      for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items.ptr()); ++i) {
        PyObject* item = PySequence_Fast_GET_ITEM(items.ptr(), i);
        if (is_tensor(item)) {
          visit(THPVariable_Unpack(item));
        }
      }
    }
  }
}

// Refuses a write to the memory of a cached output; nothing ran yet.
void check_forward_write(
    SacState& state,
    const OpInfo& info,
    PyObject* args,
    PyObject* kwargs) {
  for_each_written(info, args, kwargs, [&](const at::Tensor& tensor) {
    if (!tensor.defined()) {
      return;
    }
    auto found = state.cache.find_cached(*tensor.unsafeGetTensorImpl());
    if (!found) {
      return;
    }
    const auto cached_op = reinterpret_cast<PyObject*>(
        const_cast<void*>(state.cache.entry_op(found->entry)));
    const std::string cached_at = location(state.values.at(found->entry));
    raise_through(
        config().forward_error,
        {info.func,
         cached_op,
         py::int_(found->output_index),
         py::str(cached_at)});
  });
}

// See Note [A batched matmul's result shares the cached counter].
void share_unsafe_view_counter(
    const SelectiveCheckpointCache& cache,
    PyObject* out,
    PyObject* args) {
  if (PyTuple_GET_SIZE(args) == 0 || !is_tensor(out) ||
      !is_tensor(PyTuple_GET_ITEM(args, 0))) {
    return;
  }
  cache.share_counter_if_cached(
      THPVariable_Unpack(PyTuple_GET_ITEM(args, 0)), THPVariable_Unpack(out));
}

// Whether `policy_fn(ctx, func, *args, **kwargs)` says to keep the output
// `out` of one call (a bool means MUST_SAVE / PREFER_RECOMPUTE; anything
// else goes through checkpoint.py's coercion, which raises). Shared by the
// mode path and the fast path's function policies. `effect_overridden`: the
// running torch keeps effectful ops whatever the policy says.
bool policy_fn_saves(
    PyObject* policy_fn,
    PyObject* func,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out,
    bool has_effects,
    const SacState* effects) {
  const Config& cfg = config();
  py::object ctx = internals::new_checkpoint_context(
      cfg.context_type.ptr(),
      cfg.is_recompute_name.ptr(),
      cfg.op_output_name.ptr(),
      out);
  const Py_ssize_t num_args = PyTuple_GET_SIZE(args);
  py::object call_args =
      py::reinterpret_steal<py::object>(PyTuple_New(num_args + 2));
  if (!call_args) {
    throw python_error();
  }
  PyTuple_SET_ITEM(call_args.ptr(), 0, ctx.release().ptr());
  PyTuple_SET_ITEM(call_args.ptr(), 1, Py_NewRef(func));
  for (Py_ssize_t i = 0; i < num_args; ++i) {
    PyTuple_SET_ITEM(
        call_args.ptr(), i + 2, Py_NewRef(PyTuple_GET_ITEM(args, i)));
  }
  py::object policy = py::reinterpret_steal<py::object>(PyObject_Call(
      policy_fn, call_args.ptr(), kwargs == Py_None ? nullptr : kwargs));
  if (!policy) {
    throw python_error();
  }
  if (Py_TYPE(policy.ptr()) !=
      reinterpret_cast<PyTypeObject*>(cfg.policy_type.ptr())) {
    policy = py::reinterpret_steal<py::object>(PyObject_CallFunctionObjArgs(
        cfg.coerce_policy.ptr(), policy.ptr(), func, nullptr));
    if (!policy) {
      throw python_error();
    }
  }
  if (policy.ptr() == cfg.must_save.ptr() ||
      policy.ptr() == cfg.prefer_save.ptr()) {
    return true;
  }
  return has_effects && effects != nullptr &&
      effects->effect_overridden(policy.ptr());
}

// True when the policy says to keep the op's output.
bool policy_saves(
    SacState& state,
    const OpInfo& info,
    PyObject* func,
    PyObject* args,
    PyObject* kwargs,
    PyObject* out) {
  if (state.policy_fn.is_none()) {
    if (state.saved_op_ptrs.count(func) != 0) {
      return true; // MUST_SAVE
    }
    // PREFER_RECOMPUTE, unless the running torch keeps effectful ops.
    return info.has_effects &&
        state.effect_overridden(config().prefer_recompute.ptr());
  }
  return policy_fn_saves(
      state.policy_fn.ptr(), func, args, kwargs, out, info.has_effects, &state);
}

// Detached outputs (a tensor, or an exact tuple/list of tensors and other
// objects) and the tensors among them; anything else goes through Python.
py::object detach_outputs(
    PyObject* out,
    std::vector<const at::Tensor*>& tensors) {
  if (is_tensor(out)) {
    py::object detached = py::reinterpret_steal<py::object>(
        THPVariable_Wrap(THPVariable_Unpack(out).detach()));
    if (!detached) {
      throw python_error();
    }
    tensors.push_back(&THPVariable_Unpack(detached.ptr()));
    return detached;
  }
  const bool is_tuple = PyTuple_CheckExact(out);
  if (is_tuple || PyList_CheckExact(out)) {
    const Py_ssize_t size =
        is_tuple ? PyTuple_GET_SIZE(out) : PyList_GET_SIZE(out);
    bool flat = true;
    for (Py_ssize_t i = 0; i < size && flat; ++i) {
      PyObject* item =
          is_tuple ? PyTuple_GET_ITEM(out, i) : PyList_GET_ITEM(out, i);
      flat = !(PyTuple_Check(item) || PyList_Check(item) || PyDict_Check(item));
    }
    if (flat) {
      py::object copy = py::reinterpret_steal<py::object>(
          is_tuple ? PyTuple_New(size) : PyList_New(size));
      if (!copy) {
        throw python_error();
      }
      std::vector<PyObject*> detached_items;
      for (Py_ssize_t i = 0; i < size; ++i) {
        PyObject* item =
            is_tuple ? PyTuple_GET_ITEM(out, i) : PyList_GET_ITEM(out, i);
        PyObject* kept = is_tensor(item)
            ? THPVariable_Wrap(THPVariable_Unpack(item).detach())
            : Py_NewRef(item);
        if (kept == nullptr) {
          throw python_error();
        }
        if (is_tuple) {
          PyTuple_SET_ITEM(copy.ptr(), i, kept);
        } else {
          PyList_SET_ITEM(copy.ptr(), i, kept);
        }
        if (is_tensor(kept)) {
          tensors.push_back(&THPVariable_Unpack(kept));
        } else {
          tensors.push_back(nullptr);
        }
      }
      return copy;
    }
  }
  // A pytree of another shape (higher-order ops, structseqs): Python flattens.
  py::object pair = py::reinterpret_steal<py::object>(
      PyObject_CallOneArg(config().detach_tree.ptr(), out));
  if (!pair) {
    throw python_error();
  }
  py::tuple result = pair.cast<py::tuple>();
  for (py::handle leaf : result[1].cast<py::list>()) {
    tensors.push_back(
        is_tensor(leaf.ptr()) ? &THPVariable_Unpack(leaf.ptr()) : nullptr);
  }
  // result[1]'s tensors are inside result[0], which the entry keeps.
  return result[0];
}

void cache_outputs(
    SacState& state,
    PyObject* mode,
    PyObject* func,
    PyObject* out) {
  std::vector<const at::Tensor*> tensors;
  EntryValue entry;
  entry.value = detach_outputs(out, tensors);
  // `tensors` point into the detached value: keep it alive until the cache
  // has read their counters, even if a pack hook replaces entry.value.
  const py::object detached = entry.value;
  std::tie(entry.code, entry.line) = user_frame();
  entry.unpack = py::none();
  // With the user's saved-tensors hooks in force (and asked for), the cache
  // keeps what their pack hook makes of the outputs; the counters still
  // watch the outputs themselves. The hooks run before anything is recorded;
  // a hook that raises makes this call one the recompute runs again (the op
  // itself succeeded), so the cache and `values` stay index-aligned and the
  // recompute's calls keep matching the forward's.
  try {
    const Config& cfg = config();
    py::object top = py::reinterpret_steal<py::object>(
        PyObject_CallNoArgs(cfg.top_hooks.ptr()));
    if (!top) {
      throw python_error();
    }
    if (!top.is_none()) {
      py::object hooks = py::reinterpret_steal<py::object>(
          PyObject_CallOneArg(cfg.user_hooks.ptr(), mode));
      if (!hooks) {
        throw python_error();
      }
      if (!hooks.is_none()) {
        py::tuple pair = hooks.cast<py::tuple>();
        py::object packed =
            py::reinterpret_steal<py::object>(PyObject_CallFunctionObjArgs(
                cfg.pack_value.ptr(),
                entry.value.ptr(),
                pair[0].ptr(),
                nullptr));
        if (!packed) {
          throw python_error();
        }
        entry.value = std::move(packed);
        entry.unpack = pair[1];
      }
    }
  } catch (...) {
    state.cache.record_recompute(func);
    throw;
  }
  // The push_back after record_cached must not throw: make room first,
  // growing geometrically (reserve(size + 1) would copy every entry each time).
  if (state.values.size() == state.values.capacity()) {
    state.values.reserve(2 * state.values.size() + 8);
  }
  state.cache.record_cached(func, tensors);
  state.values.push_back(std::move(entry)); // cannot throw: room was made
}

struct DispatchArgs {
  PyObject* mode;
  PyObject* func;
  PyObject* args; // a tuple
  PyObject* kwargs; // a dict or None
};

// (self, func, types, args=(), kwargs=None), positionally or by keyword;
// a malformed call is a TypeError (torch never makes one).
DispatchArgs parse_dispatch_args(
    PyObject* const* stack,
    Py_ssize_t nargs,
    PyObject* kwnames) {
  const utils::TorchDispatchArguments read =
      utils::read_torch_dispatch_arguments(stack, nargs, kwnames, nullptr);
  if (read.too_many_positional) {
    throw torch::TypeError("__torch_dispatch__() takes at most 5 arguments");
  }
  if (read.unknown_keyword != nullptr) {
    const char* name = PyUnicode_AsUTF8(read.unknown_keyword);
    if (name == nullptr) {
      PyErr_Clear();
    }
    throw torch::TypeError(
        std::string(
            "__torch_dispatch__() got an unexpected keyword argument '") +
        (name == nullptr ? "?" : name) + "'");
  }
  if (read.owner == nullptr || read.func == nullptr) {
    throw torch::TypeError("__torch_dispatch__() missing self or func");
  }
  static PyObject* empty = PyTuple_New(0);
  PyObject* args = read.args == nullptr ? empty : read.args;
  if (!PyTuple_Check(args)) {
    throw torch::TypeError("__torch_dispatch__(): args must be a tuple");
  }
  PyObject* kwargs = read.kwargs == nullptr ? Py_None : read.kwargs;
  if (kwargs != Py_None && !PyDict_Check(kwargs)) {
    throw torch::TypeError(
        "__torch_dispatch__(): kwargs must be a dict or None");
  }
  return {read.owner, read.func, args, kwargs};
}

// What both modes' __torch_dispatch__ share: parse the call, run ignored ops
// straight through (they never touch the cache), then hand the op and the
// mode's state to `body`. A template so that each entry stays one direct call.
template <typename Body>
PyObject* sac_dispatch(
    PyObject* const* stack,
    size_t nargsf,
    PyObject* kwnames,
    Body&& body) {
  HANDLE_TH_ERRORS
  const DispatchArgs call =
      parse_dispatch_args(stack, PyVectorcall_NARGS(nargsf), kwnames);
  const OpInfo& info = op_info(call.func);
  if (info.ignored) {
    return run_op(call.mode, info, call.args, call.kwargs).release().ptr();
  }
  return body(call, info, *state_of_mode(call.mode));
  END_HANDLE_TH_ERRORS
}

PyObject* forward_dispatch_body(
    const DispatchArgs& call,
    const OpInfo& info,
    SacState& state) {
  if (!info.written.empty() && !state.allow_mutation &&
      state.cache.has_cached_outputs()) {
    check_forward_write(state, info, call.args, call.kwargs);
  }
  py::object out = run_op(call.mode, info, call.args, call.kwargs);
  if (info.traits.is_unsafe_view) {
    share_unsafe_view_counter(state.cache, out.ptr(), call.args);
  }
  const bool save =
      policy_saves(state, info, call.func, call.args, call.kwargs, out.ptr());
  // See Note [Which op calls SAC may cache].
  if (save && info.traits.may_cache()) {
    cache_outputs(state, call.mode, call.func, out.ptr());
  } else {
    state.cache.record_recompute(call.func);
  }
  return out.release().ptr();
}

PyObject* recompute_dispatch_body(
    const DispatchArgs& call,
    const OpInfo& info,
    SacState& state) {
  const auto slot = state.cache.next_call(call.func);
  using Kind = SelectiveCheckpointCache::SlotKind;
  switch (slot.kind) {
    case Kind::kRecompute:
      return run_op(call.mode, info, call.args, call.kwargs).release().ptr();
    case Kind::kMissing:
      raise_through(
          config().missing_error,
          {call.func,
           py::int_(slot.call_index + 1),
           py::int_(slot.forward_calls)});
    case Kind::kConsumed:
      raise_through(config().consumed_error, {call.func});
    case Kind::kCached:
      break;
  }
  EntryValue& entry = state.values.at(slot.entry);
  if (!state.allow_mutation) {
    if (auto change = state.cache.changed_output(slot.entry)) {
      raise_through(
          config().recompute_error,
          {call.func,
           py::int_(change->output_index),
           py::str(location(entry)),
           py::int_(change->expected),
           py::int_(change->found)});
    }
  }
  py::object value = std::move(entry.value);
  entry.value = py::none();
  state.cache.consume(slot.entry);
  if (!entry.unpack.is_none()) {
    PyObject* unpacked = PyObject_CallFunctionObjArgs(
        config().unpack_value.ptr(), value.ptr(), entry.unpack.ptr(), nullptr);
    entry.unpack = py::none();
    return unpacked; // nullptr with the hook's error set
  }
  return value.release().ptr();
}

PyObject* forward_dispatch(
    PyObject* /*unused*/,
    PyObject* const* stack,
    size_t nargsf,
    PyObject* kwnames) {
  return sac_dispatch(stack, nargsf, kwnames, forward_dispatch_body);
}

PyObject* recompute_dispatch(
    PyObject* /*unused*/,
    PyObject* const* stack,
    size_t nargsf,
    PyObject* kwnames) {
  return sac_dispatch(stack, nargsf, kwnames, recompute_dispatch_body);
}

PyMethodDef forward_def = {
    "_sac_forward_dispatch",
    reinterpret_cast<PyCFunction>(
        reinterpret_cast<void (*)()>(forward_dispatch)),
    METH_FASTCALL | METH_KEYWORDS,
    "__torch_dispatch__ of aliasguard.checkpoint's forward mode"};
PyMethodDef recompute_def = {
    "_sac_recompute_dispatch",
    reinterpret_cast<PyCFunction>(
        reinterpret_cast<void (*)()>(recompute_dispatch)),
    METH_FASTCALL | METH_KEYWORDS,
    "__torch_dispatch__ of aliasguard.checkpoint's recompute mode"};

// A builtin that binds to the instance it is looked up on, like a function.
py::object as_method(PyMethodDef* def) {
  py::object fn = py::reinterpret_steal<py::object>(
      PyCFunction_NewEx(def, nullptr, nullptr));
  if (!fn) {
    throw python_error();
  }
  py::object method =
      py::reinterpret_steal<py::object>(PyInstanceMethod_New(fn.ptr()));
  if (!method) {
    throw python_error();
  }
  return method;
}

py::object intern(const char* text) {
  PyObject* name = PyUnicode_FromString(text);
  if (name == nullptr) {
    throw python_error();
  }
  PyUnicode_InternInPlace(&name);
  return py::reinterpret_steal<py::object>(name);
}

// --- The fast path's hooks (see Note [SAC below autograd]) ---------------
// The kernel runs with or without the GIL (torch's bindings release it
// around an op), so each hook takes it.

struct CallSite {
  py::object code; // code object of the user's frame, or None
  int line = 0;
};

void* capture_call_site() {
  if (!Py_IsInitialized()) {
    return nullptr;
  }
  py::gil_scoped_acquire gil;
  auto [code, line] = user_frame();
  return new CallSite{std::move(code), line};
}

void release_call_site(void* site) {
  auto* call_site = static_cast<CallSite*>(site);
  if (!Py_IsInitialized()) {
    call_site->code.release(); // no Py_DECREF after interpreter shutdown
    delete call_site;
    return;
  }
  py::gil_scoped_acquire gil;
  delete call_site;
}

std::string describe_call_site(void* site) {
  py::gil_scoped_acquire gil;
  auto* call_site = static_cast<CallSite*>(site);
  EntryValue entry;
  entry.code = call_site->code;
  entry.line = call_site->line;
  return location(entry);
}

// Calls checkpoint.py's helper, which raises; carries its error through C++.
[[noreturn]] void raise_from_helper(const char* helper, const py::tuple& args) {
  {
    py::gil_scoped_acquire gil;
    py::object fn = py::module_::import("aliasguard.checkpoint").attr(helper);
    PyObject* result = PyObject_Call(fn.ptr(), args.ptr(), nullptr);
    Py_XDECREF(result);
    if (!PyErr_Occurred()) {
      PyErr_Format(
          PyExc_RuntimeError,
          "aliasguard.checkpoint.%s returned instead of raising",
          helper);
    }
  }
  python_error error;
  error.persist();
  throw error;
}

void raise_fast_mutation(const FastPathMutation& mutation) {
  py::gil_scoped_acquire gil;
  raise_from_helper(
      "_raise_fast_path_mutation",
      py::make_tuple(
          mutation.cached_op,
          mutation.output_index,
          mutation.cached_at,
          mutation.expected_version,
          mutation.found_version,
          mutation.in_forward));
}

void raise_fast_write(const FastPathWrite& write) {
  py::gil_scoped_acquire gil;
  raise_from_helper(
      "_raise_fast_path_write",
      py::make_tuple(
          write.writing_op,
          write.cached_op,
          write.output_index,
          write.cached_at));
}

void raise_fast_missing(
    const std::string& op,
    size_t calls,
    size_t forward_calls) {
  py::gil_scoped_acquire gil;
  raise_from_helper(
      "_raise_fast_path_missing", py::make_tuple(op, calls, forward_calls));
}

void raise_fast_consumed(const std::string& op) {
  py::gil_scoped_acquire gil;
  raise_from_helper("_raise_fast_path_consumed", py::make_tuple(op));
}

const FastPathHooks& python_fast_path_hooks() {
  static const FastPathHooks hooks = [] {
    FastPathHooks h;
    h.capture_call_site = &capture_call_site;
    h.release_call_site = &release_call_site;
    h.describe_call_site = &describe_call_site;
    h.raise_mutation = &raise_fast_mutation;
    h.raise_write = &raise_fast_write;
    h.raise_missing = &raise_fast_missing;
    h.raise_consumed = &raise_fast_consumed;
    return h;
  }();
  return hooks;
}

const char* kFastStateCapsule = "aliasguard.FastPathRegion";

FastPathRegion& fast_region(py::handle capsule) {
  auto* region = static_cast<FastPathRegion*>(
      PyCapsule_GetPointer(capsule.ptr(), kFastStateCapsule));
  if (region == nullptr) {
    throw python_error();
  }
  return *region;
}

// A policy function asked by the fast path for the calls of its named ops.
// See Note [Function policies below autograd]. The fast path is only taken
// where no torch version overrides policies for effectful ops, so the
// answer is the policy's own.
class PythonFastPathPolicy final : public FastPathPolicy {
 public:
  // `ops[i]` is the OpOverload of `handles[i]`.
  PythonFastPathPolicy(
      py::object policy_fn,
      std::vector<c10::OperatorHandle> handles,
      std::vector<py::object> ops)
      : policy_fn_(std::move(policy_fn)),
        handles_(std::move(handles)),
        ops_(std::move(ops)) {}

  ~PythonFastPathPolicy() override {
    const py::gil_scoped_acquire gil;
    policy_fn_ = py::object();
    ops_.clear();
  }

  bool saves(
      const c10::OperatorHandle& op,
      c10::ArrayRef<c10::IValue> arguments,
      c10::ArrayRef<c10::IValue> outputs) override {
    const py::gil_scoped_acquire gil;
    PyObject* func = nullptr;
    for (size_t i = 0; i < handles_.size() && func == nullptr; ++i) {
      if (handles_[i] == op) {
        func = ops_[i].ptr();
      }
    }
    TORCH_INTERNAL_ASSERT(func != nullptr, "a fast-path op without its policy");
    auto [args, kwargs] = utils::python_arguments(op.schema(), arguments);
    py::object out = utils::python_returns(outputs);
    return policy_fn_saves(
        policy_fn_.ptr(),
        func,
        args.ptr(),
        kwargs.ptr(),
        out.ptr(),
        /*has_effects=*/false,
        /*effects=*/nullptr);
  }

 private:
  py::object policy_fn_;
  std::vector<c10::OperatorHandle> handles_;
  std::vector<py::object> ops_;
};

c10::OperatorHandle find_op(
    const std::string& name,
    const std::string& overload) {
  auto op = c10::Dispatcher::singleton().findOp({name, overload});
  if (!op.has_value()) {
    throw py::value_error(
        "aliasguard.checkpoint: no operator " + name +
        (overload.empty() ? "" : "." + overload) + " in the dispatcher");
  }
  return *op;
}

} // namespace

void init_selective_checkpoint_bindings(py::module_& m) {
  m.def("_sac_configure", [m](py::dict options) mutable {
    Config& cfg = config();
    auto take = [&](const char* key) -> py::object {
      if (!options.contains(key)) {
        throw py::key_error(std::string("_sac_configure: missing ") + key);
      }
      return options[key];
    };
    cfg.ignored_ops = take("ignored_ops");
    cfg.op_overload_type = take("op_overload_type");
    cfg.has_effects = take("has_effects");
    cfg.context_type = take("context_type");
    cfg.policy_type = take("policy_type");
    cfg.must_save = take("must_save");
    cfg.prefer_save = take("prefer_save");
    cfg.prefer_recompute = take("prefer_recompute");
    cfg.coerce_policy = take("coerce_policy");
    cfg.forward_error = take("forward_error");
    cfg.recompute_error = take("recompute_error");
    cfg.missing_error = take("missing_error");
    cfg.consumed_error = take("consumed_error");
    cfg.detach_tree = take("detach_tree");
    cfg.pack_value = take("pack_value");
    cfg.unpack_value = take("unpack_value");
    cfg.top_hooks = take("top_hooks");
    cfg.user_hooks = take("user_hooks");
    cfg.library_prefixes =
        take("library_prefixes").cast<std::vector<std::string>>();
    cfg.state_attribute = intern("_sac");
    cfg.is_recompute_name = intern("is_recompute");
    cfg.op_output_name = intern("op_output");
    cfg.ready = true;
  });

  // The shared state of one checkpointed region's two modes.
  m.def(
      "_sac_new_state",
      [](py::object policy_fn,
         py::object saved_ops,
         py::object effect_overrides,
         bool allow_mutation) {
        auto state = std::make_unique<SacState>();
        state->policy_fn = std::move(policy_fn);
        state->saved_ops = std::move(saved_ops);
        for (py::handle op : state->saved_ops) {
          state->saved_op_ptrs.insert(op.ptr());
        }
        state->effect_overrides = std::move(effect_overrides);
        for (py::handle policy : state->effect_overrides) {
          state->effect_override_ptrs.push_back(policy.ptr());
        }
        state->allow_mutation = allow_mutation;
        PyObject* capsule =
            PyCapsule_New(state.get(), kStateCapsule, [](PyObject* obj) {
              delete static_cast<SacState*>(
                  PyCapsule_GetPointer(obj, kStateCapsule));
            });
        if (capsule == nullptr) {
          throw python_error();
        }
        state.release();
        return py::reinterpret_steal<py::object>(capsule);
      },
      py::arg("policy_fn"),
      py::arg("saved_ops"),
      py::arg("effect_overrides"),
      py::arg("allow_mutation"));
  m.def("_sac_end_forward", [](py::handle capsule) {
    state_of_capsule(capsule.ptr())->cache.end_forward();
  });
  m.def("_sac_begin_recompute", [](py::handle capsule) {
    state_of_capsule(capsule.ptr())->cache.begin_recompute();
  });
  // (op, value or None once consumed, "file:line") per cached op call.
  m.def("_sac_entries", [](py::handle capsule) {
    SacState& state = *state_of_capsule(capsule.ptr());
    py::list entries;
    for (size_t i = 0; i < state.values.size(); ++i) {
      auto* op = reinterpret_cast<PyObject*>(
          const_cast<void*>(state.cache.entry_op(i)));
      entries.append(py::make_tuple(
          py::reinterpret_borrow<py::object>(op),
          state.values[i].value,
          location(state.values[i])));
    }
    return entries;
  });
  // --- the fast path (see Note [SAC below autograd]) ---
  set_fast_path_hooks(&python_fast_path_hooks());
  // Why an op cannot be cached below autograd; "" when it can.
  m.def(
      "_sac_fast_skip_reason",
      [](const std::string& name, const std::string& overload) {
        return fast_path_skip_reason(find_op(name, overload));
      });
  // `ops`: (name, overload, OpOverload) per op the region may cache;
  // `policy_fn`: None to cache every call of them (a list policy), or the
  // function asked per call (see Note [Function policies below autograd]).
  m.def(
      "_sac_fast_new_state",
      [](const std::vector<std::tuple<std::string, std::string, py::object>>&
             ops,
         bool allow_mutation,
         py::object policy_fn) {
        std::vector<c10::OperatorHandle> handles;
        std::vector<py::object> overloads;
        for (const auto& [name, overload, op] : ops) {
          handles.push_back(find_op(name, overload));
          overloads.push_back(op);
        }
        std::unique_ptr<FastPathPolicy> policy;
        if (!policy_fn.is_none()) {
          policy = std::make_unique<PythonFastPathPolicy>(
              std::move(policy_fn), handles, std::move(overloads));
        }
        auto region = std::make_unique<FastPathRegion>(
            handles, allow_mutation, std::move(policy));
        PyObject* capsule =
            PyCapsule_New(region.get(), kFastStateCapsule, [](PyObject* obj) {
              delete static_cast<FastPathRegion*>(
                  PyCapsule_GetPointer(obj, kFastStateCapsule));
            });
        if (capsule == nullptr) {
          throw python_error();
        }
        region.release();
        return py::reinterpret_steal<py::object>(capsule);
      },
      py::arg("ops"),
      py::arg("allow_mutation"),
      py::arg("policy_fn") = py::none());
  m.def("_sac_fast_enter_forward", [](py::handle capsule) {
    fast_region(capsule).enter_forward();
  });
  m.def("_sac_fast_exit_forward", [](py::handle capsule, bool check) {
    fast_region(capsule).exit_forward(check);
  });
  m.def("_sac_fast_enter_recompute", [](py::handle capsule) {
    fast_region(capsule).enter_recompute();
  });
  m.def("_sac_fast_exit_recompute", [](py::handle capsule) {
    fast_region(capsule).exit_recompute();
  });
  // ("ns::op.overload", outputs tuple or None once used, "file:line").
  m.def("_sac_fast_entries", [](py::handle capsule) {
    py::list result;
    for (const auto& entry : fast_region(capsule).entries()) {
      py::object outputs = py::none();
      if (!entry.outputs.empty()) {
        py::tuple values(entry.outputs.size());
        for (size_t i = 0; i < entry.outputs.size(); ++i) {
          values[i] = utils::python_value(entry.outputs[i]);
        }
        outputs = values;
      }
      result.append(py::make_tuple(entry.op, outputs, entry.cached_at));
    }
    return result;
  });
  m.def("_sac_fast_release_kernels", &release_fast_path_kernels);
  m.def("_sac_fast_num_kernels", &num_fast_path_kernels);
  m.def("_sac_write_guard_is_on", &is_write_guard_on);
  m.def("_sac_write_guard_num_kernels", &num_write_guard_kernels);
  m.def("_sac_write_guard_unavailable_reason", &write_guard_unavailable_reason);
  m.def(
      "_test_set_write_guard",
      &set_write_guard_enabled_for_testing,
      py::arg("enabled"));
  m.def("_sac_fast_num_open_regions", &num_open_fast_path_regions);
  m.attr("_sac_forward_dispatch") = as_method(&forward_def);
  m.attr("_sac_recompute_dispatch") = as_method(&recompute_def);
}

} // namespace aliasguard::autograd
