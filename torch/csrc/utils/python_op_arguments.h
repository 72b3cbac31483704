#pragma once

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>
#include <torch/csrc/utils/pybind.h>

#include <utility>

// A boxed call seen from Python: what a __torch_dispatch__ or a checkpoint
// policy function receives for the same call made through the dispatcher.
// Used where C++ code below autograd asks Python about one call (the
// selective checkpoint fast path's function policies).

namespace aliasguard::utils {

// Note [Boxed arguments as a __torch_dispatch__ sees them]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torch hands a Python handler (args, kwargs) built from the stack by the
// schema: positional arguments up to the first keyword-only one, without the
// trailing ones that equal their defaults; keyword-only arguments that differ
// from their defaults as kwargs; ScalarType, Layout and MemoryFormat as
// torch.dtype, torch.layout and torch.memory_format objects rather than the
// integers the stack holds. A policy written against a dispatch mode indexes
// `args` and reads `kwargs`, so the fast path builds the same shape.
std::pair<pybind11::tuple, pybind11::dict> python_arguments(
    const c10::FunctionSchema& schema,
    c10::ArrayRef<c10::IValue> arguments);

// One value as Python sees it (a tensor, a list of tensors, a scalar, None
// for an undefined tensor), with no schema to say which enum an int is.
pybind11::object python_value(const c10::IValue& value);

// One value per return: the value itself for one return, else a tuple.
pybind11::object python_returns(c10::ArrayRef<c10::IValue> returns);

} // namespace aliasguard::utils
