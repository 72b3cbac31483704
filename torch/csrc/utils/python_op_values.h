#pragma once

#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/aliasing_error.h>
#include <torch/csrc/utils/op_values.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/python_torch_internals.h>

#include <string>
#include <utility>
#include <vector>

// An op's arguments and results given as Python objects (what a
// __torch_dispatch__ receives and returns), seen as the OpValueRefs the C++
// checks take. Shared by the correction (python_alias_correction.cpp), the
// audit of a result (python_dispatch_audit.cpp) and the explicit call
// (python_explicit_correction.cpp).

namespace aliasguard::utils {

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
    if (!PyLong_Check(obj) &&
        internals::is_tensor_object(obj)) { // ints are common
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
      if (!is_none &&
          (PyLong_Check(item) || !internals::is_tensor_object(item))) {
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

// Whether `out` holds one value per return of a multi-return op.
inline bool has_one_value_per_return(PyObject* out, size_t num_returns) {
  return (PyTuple_Check(out) || PyList_Check(out)) &&
      PySequence_Fast_GET_SIZE(out) == static_cast<Py_ssize_t>(num_returns);
}

// The returns of `out` (borrowed from it), one per schema return.
inline c10::SmallVector<PyObject*, 4> split_returns(
    const SchemaAliasAnalysis& analysis,
    PyObject* out) {
  const size_t num_returns = analysis.returns().size();
  c10::SmallVector<PyObject*, 4> outputs;
  if (num_returns == 1) {
    outputs.push_back(out);
    return outputs;
  }
  if ((!PyTuple_Check(out) && !PyList_Check(out)) ||
      PySequence_Fast_GET_SIZE(out) != static_cast<Py_ssize_t>(num_returns)) {
    throw_aliasing_error(
        analysis,
        0,
        std::nullopt,
        AliasViolation::kWrongType,
        std::string("cannot be found: the op returned a ") +
            Py_TYPE(out)->tp_name + ", but its schema has " +
            std::to_string(num_returns) + " returns");
  }
  for (size_t i = 0; i < num_returns; ++i) {
    outputs.push_back(PySequence_Fast_GET_ITEM(out, i));
  }
  return outputs;
}

// TypeErrors for args/kwargs of the wrong type.
inline void check_args_kwargs(PyObject* args, PyObject* kwargs) {
  if (!PyTuple_Check(args) && !PyList_Check(args)) {
    throw pybind11::type_error(
        std::string("args must be a tuple, got ") + Py_TYPE(args)->tp_name);
  }
  if (kwargs != Py_None && !PyDict_Check(kwargs)) {
    throw pybind11::type_error(
        std::string("kwargs must be a dict or None, got ") +
        Py_TYPE(kwargs)->tp_name);
  }
}

} // namespace aliasguard::utils
