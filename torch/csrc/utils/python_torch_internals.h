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
