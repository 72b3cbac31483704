// aliasguard._C: thin bindings over the C++ API; every function here unpacks
// Python objects, calls one C++ function and packs the result.

#include <c10/core/VersionCounterUtils.h>
#include <c10/util/Exception.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/mark_as_view.h>
#include <torch/csrc/autograd/python_selective_checkpoint.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/track_views.h>
#include <torch/csrc/utils/dispatch_state.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/python_alias_correction.h>
#include <torch/csrc/utils/python_aliasing_error.h>
#include <torch/csrc/utils/python_corrected_dispatch.h>
#include <torch/csrc/utils/python_explicit_correction.h>
#include <torch/csrc/utils/python_running_bodies.h>
#include <torch/csrc/utils/python_schema_alias_analysis.h>
#include <torch/csrc/utils/python_torch_internals.h>
#include <torch/csrc/utils/python_tracked_dispatch.h>
#include <torch/csrc/utils/running_bodies.h>
#include <torch/csrc/utils/torch_internals.h>

#include <memory>
#include <string>

namespace py = pybind11;

namespace aliasguard::utils {
namespace {

const at::Tensor& unpack_tensor(
    py::handle obj,
    const char* function,
    const char* argument) {
  if (!THPVariable_Check(obj.ptr())) {
    throw py::type_error(
        std::string(function) + "(): " + argument + " must be a Tensor, got " +
        Py_TYPE(obj.ptr())->tp_name);
  }
  return THPVariable_Unpack(obj.ptr());
}

// The user's callable outlives this call (autograd keeps it in the view's
// metadata) and may be released on a thread that does not hold the GIL.
autograd::ViewReplayFn wrap_view_fn(py::object view_fn) {
  std::shared_ptr<py::object> holder(
      new py::object(std::move(view_fn)), [](py::object* callable) {
        py::gil_scoped_acquire gil;
        delete callable;
      });
  return [holder](const at::Tensor& base) -> at::Tensor {
    py::gil_scoped_acquire gil;
    py::object result =
        (*holder)(py::reinterpret_steal<py::object>(THPVariable_Wrap(base)));
    if (!THPVariable_Check(result.ptr())) {
      throw py::type_error(
          std::string("mark_as_view(): view_fn must return a Tensor, got ") +
          Py_TYPE(result.ptr())->tp_name);
    }
    return THPVariable_Unpack(result.ptr());
  };
}

// A real bool: pybind11's bool caster would take None as False.
bool unpack_bool(py::handle obj, const char* function, const char* argument) {
  if (!PyBool_Check(obj.ptr())) {
    throw py::type_error(
        std::string(function) + "(): " + argument + " must be a bool, got " +
        Py_TYPE(obj.ptr())->tp_name);
  }
  return obj.ptr() == Py_True;
}

// The UTF-8 text of a str; a ValueError naming the argument when it has none
// (a lone surrogate), where a pybind11 cast would say "Unable to cast".
std::string unpack_text(
    py::handle obj,
    const char* function,
    const char* argument) {
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(obj.ptr(), &size);
  if (text == nullptr) {
    PyErr_Clear();
    throw py::value_error(
        std::string(function) + "(): " + argument +
        " is not valid text (it cannot be encoded as UTF-8)");
  }
  return std::string(text, size);
}

py::object mark_as_view(
    py::object tensor,
    py::object base,
    py::object is_bw_differentiable,
    py::object is_fw_differentiable,
    py::object view_fn,
    py::object creation_meta,
    py::object alias_storage) {
  const at::Tensor& self = unpack_tensor(tensor, "mark_as_view", "tensor");
  const at::Tensor& base_tensor = unpack_tensor(base, "mark_as_view", "base");
  autograd::MarkAsViewOptions options;
  options.is_bw_differentiable =
      unpack_bool(is_bw_differentiable, "mark_as_view", "is_bw_differentiable");
  options.is_fw_differentiable =
      unpack_bool(is_fw_differentiable, "mark_as_view", "is_fw_differentiable");
  options.alias_storage =
      unpack_bool(alias_storage, "mark_as_view", "alias_storage");
  if (!view_fn.is_none()) {
    if (!PyCallable_Check(view_fn.ptr())) {
      throw py::type_error(
          std::string("mark_as_view(): view_fn must be callable, got ") +
          Py_TYPE(view_fn.ptr())->tp_name);
    }
    options.view_fn = wrap_view_fn(std::move(view_fn));
  }
  if (!creation_meta.is_none()) {
    if (!py::isinstance<py::str>(creation_meta)) {
      throw py::type_error(
          std::string("mark_as_view(): creation_meta must be a str, got ") +
          Py_TYPE(creation_meta.ptr())->tp_name);
    }
    options.creation_meta = autograd::creation_meta_from_name(
        unpack_text(creation_meta, "mark_as_view", "creation_meta"));
  }
  autograd::mark_as_view(self, base_tensor, std::move(options));
  return tensor;
}

// Both self-tests: see aliasguard/_torch_internals.py.
std::vector<std::string> torch_internals_self_test() {
  std::vector<std::string> problems = internals::torch_internals_self_test();
  for (std::string& problem : internals::python_torch_internals_self_test()) {
    problems.push_back(std::move(problem));
  }
  return problems;
}

} // namespace
} // namespace aliasguard::utils

PYBIND11_MODULE(_C, m) {
  using namespace aliasguard;
  m.doc() = "aliasguard C++ core";
  // First: every binding below throws through its translator.
  utils::init_aliasing_error(m);

  m.def(
      "_mark_as_view",
      &utils::mark_as_view,
      py::arg("tensor"),
      py::arg("base"),
      py::kw_only(),
      py::arg("is_bw_differentiable") = py::bool_(true),
      py::arg("is_fw_differentiable") = py::bool_(true),
      py::arg("view_fn") = py::none(),
      py::arg("creation_meta") = py::none(),
      py::arg("alias_storage") = py::bool_(false));

  m.def(
      "shares_version_counter",
      [](py::handle a, py::handle b) {
        return shares_version_counter(
            *utils::unpack_tensor(a, "shares_version_counter", "a")
                 .unsafeGetTensorImpl(),
            *utils::unpack_tensor(b, "shares_version_counter", "b")
                 .unsafeGetTensorImpl());
      },
      py::arg("a"),
      py::arg("b"));

  // track_views(): an explicit scope, one body from enable to restore (see
  // Note [Installing and uninstalling while bodies run]).
  m.def("_enable_view_tracking", [] {
    if (!utils::enter_explicit_body()) {
      throw python_error();
    }
    try {
      return autograd::enable_view_tracking();
    } catch (...) {
      utils::exit_body();
      throw;
    }
  });
  m.def(
      "_restore_view_tracking",
      [](bool was_excluded) {
        autograd::restore_view_tracking(was_excluded);
        if (utils::body_running_on_this_thread()) {
          utils::exit_body();
        }
      },
      py::arg("was_excluded"));
  m.def("_is_view_tracking_enabled", &autograd::is_view_tracking_enabled);
  m.def("_has_tracked_view_kernels", &autograd::has_tracked_view_kernels);
  m.def(
      "_release_tracked_view_kernels", &autograd::release_tracked_view_kernels);

  m.def("_functorch_transform_active", &utils::functorch_transform_active);
  m.def("_torch_internals_self_test", &utils::torch_internals_self_test);
  // The one walk of the Python stack for "where in the user's code" (see
  // Note [Walking the Python stack for the user's line]): (file, line) of the
  // innermost frame whose file starts with none of `skip`, or None.
  m.def(
      "_innermost_user_frame",
      [](const std::vector<std::string>& skip) -> py::object {
        auto [code, line] = internals::innermost_user_frame(skip);
        if (code.is_none()) {
          return py::none();
        }
        return py::make_tuple(code.attr("co_filename"), line);
      },
      py::arg("skip"));
  internals::init_install_bindings(m);

  utils::init_alias_correction_bindings(m);
  utils::init_explicit_correction_bindings(m);
  utils::init_corrected_dispatch(m);
  utils::init_tracked_dispatch(m);
  utils::init_running_bodies_bindings(m);
  utils::init_schema_alias_analysis_bindings(m);
  autograd::init_selective_checkpoint_bindings(m);
}
