#pragma once

#include <Python.h>

#include <ATen/core/operator_name.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <vector>

// The CPython and torch-Python internals the bindings use, one Note each (the
// C++ ones are in torch_internals.h). All need the GIL. Their self-test is
// python_torch_internals_self_test(), run at import with the C++ one.

namespace aliasguard::internals {

// Note [Class attribute lookup without descriptors]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The per-class opt-out flag (`__aliasguard_fixup__ = False`) is read on
// every corrected __torch_dispatch__. _PyType_Lookup reads it through the
// type's method cache, without running descriptors or allocating: an order
// of magnitude cheaper than PyObject_GetAttr on the hot path. It is
// CPython's internal (underscore) API, present in every CPython 3.x, but not
// in the limited API. Upstream: PyType_GetDict + PyDict_GetItem on each class
// of the MRO would be the public spelling, at a higher cost. Borrowed
// reference, or nullptr when absent (no exception set).
inline PyObject* lookup_class_attribute(PyTypeObject* type, PyObject* name) {
  return _PyType_Lookup(type, name);
}

// Note [Type version tags]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// CPython gives a class a new nonzero tp_version_tag after every change to it
// or to one of its bases (PyType_Modified clears it, the next _PyType_Lookup
// assigns a fresh one) and never gives two states of any classes the same
// nonzero tag; 0 means none is assigned. Its own method cache rests on that
// promise. The opt-out reader rests on it too: it remembers what it read from
// a class under that class's tag, so a corrected __torch_dispatch__ does not
// look its flags up through the global method cache on every call, where
// they would evict torch's own entries. The field is documented "for
// internal use only"; it has been in PyTypeObject since CPython 2.6.
// Upstream: PyUnstable_Type_AssignVersionTag (3.12+) is the only public
// spelling, and reading the tag stays internal.
inline unsigned int type_version_tag(PyTypeObject* type) {
  return type->tp_version_tag;
}

// Note [Tensor instance check]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// THPVariable_Check calls PyObject_IsInstance, whose __instancecheck__ lookup
// allocates a bound method per call. torch's TensorBase metaclass does not
// customize instance checks, so a subtype check against THPVariableClass
// (torch_python's global for torch._C.TensorBase) gives the same answer at a
// fraction of the cost. Upstream: THPVariable_CheckExact-style fast checks
// are internal to torch_python too.
inline bool is_tensor_object(PyObject* obj) {
  return PyObject_TypeCheck(
      obj, reinterpret_cast<PyTypeObject*>(THPVariableClass));
}

// Note [Operator of an OpOverload]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A __torch_dispatch__ receives `func`, a torch._ops.OpOverload; its
// dispatcher operator is named by `func._schema.name` and
// `func._schema.overload_name` (both attributes of torch._C.FunctionSchema;
// `_schema` is private to OpOverload). Reading the names and looking the
// operator up in the C++ cache happens once per OpOverload object (see
// Note [Per-OpOverload analysis cache]). Upstream: an OpOverload attribute
// holding the OperatorHandle, usable from C++. nullopt when `func` has no
// such schema (a HigherOrderOperator, anything else); no exception is left
// set. An exception that is not an Exception (KeyboardInterrupt, SystemExit)
// raised while reading the schema propagates as python_error.
std::optional<c10::OperatorName> operator_name_of(PyObject* func);

// Note [Calling an OpOverload's operator directly]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// OpOverload.__call__ is a Python frame around `self._op(*args, **kwargs)`;
// `_op` (private) is the torch._C builtin that dispatches the operator. The
// checkpoint's per-op path calls `_op` to save that frame on every op.
// Upstream: OpOverload exposing its C callable. New reference; throws
// python_error when `func` has no `_op`.
pybind11::object operator_callable_of(PyObject* func);

// Note [Walking the Python stack for the user's line]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Errors name the user's source line: the innermost frame whose file is not
// under one of `library_prefixes` (torch's and aliasguard's folders).
// PyEval_GetFrame / PyFrame_GetBack / PyFrame_GetCode are public C API;
// PyCodeObject::co_filename is a field of a struct outside the stable ABI,
// read directly because the attribute lookup (the public spelling) would run
// on every cached op. Upstream: none needed in C++; Python's traceback module
// does the same walk. The only walk in aliasguard: the Python side
// (checkpoint.py's call sites, the audit report's locations) calls it through
// _C._innermost_user_frame with its own prefixes. Returns the code object
// (None when every frame is a library's) and the line.
std::pair<pybind11::object, int> innermost_user_frame(
    const std::vector<std::string>& library_prefixes);
// "file:line" of a code object returned above.
std::string code_location(const pybind11::object& code, int line);

// Note [make_fx tracing is seen through fx's flag]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// make_fx's ProxyTorchDispatchMode runs each op with itself popped from its
// mode slot, so a tensor subclass's __torch_dispatch__ reached from there
// sees no tracing infrastructure in the dispatch state (see Note [Tracing
// infrastructure is left alone]). make_fx traces through fx's
// Tracer.trace, which sets fx's "is tracing" flag in
// torch.fx._symbolic_trace for the whole trace (export's and AOTAutograd's
// traces too). Two layouts, read without calling Python code:
//   * torch 2.13: a module global, _is_fx_tracing_flag, a bool;
//   * torch 2.14: a threading.local, _is_fx_tracing_tls, whose attribute
//     `flag` is set per thread (its __dict__ is the calling thread's).
// The layout is found once, at first use. Upstream: a thread-local "tracing"
// bit in the dispatch state, or an infra marker that stays set while an
// infrastructure mode's handler runs. False when neither layout is there;
// the self-test sets the flag through the layout found and checks that it
// is read back, so a change of either layout fails the import.
bool fx_tracing_active();

// Note [A SelectiveCheckpointContext without its __init__]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A policy function receives a
// torch.utils.checkpoint.SelectiveCheckpointContext per op. Its __init__ is a
// Python frame that sets `is_recompute`; we build the object with
// object.__new__ and set `is_recompute` (and, where the running torch's
// policies read it, `op_output`) ourselves. Upstream: a C constructor, or the
// context passed as a struct. New reference.
pybind11::object new_checkpoint_context(
    PyObject* context_type,
    PyObject* is_recompute_name,
    PyObject* op_output_name,
    PyObject* op_output);

// One line per internal above that no longer behaves as relied on.
std::vector<std::string> python_torch_internals_self_test();

// Binds the C++ switches aliasguard.install() / uninstall() use that have no
// other binding: the detach kernel's dispatcher registrations
// (`_set_detach_keep_version_counter`,
// `_is_detach_keep_version_counter_registered`,
// `_detach_keep_version_counter_keys`; see Note [Reversible detach
// registration] in DetachKeepVersionCounter.cpp).
void init_install_bindings(pybind11::module_& m);

} // namespace aliasguard::internals
