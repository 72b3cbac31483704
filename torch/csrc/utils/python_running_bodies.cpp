#include <torch/csrc/utils/python_running_bodies.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/running_bodies.h>

#include <chrono>

namespace py = pybind11;

namespace aliasguard::utils {
namespace {

// How long one wait lasts before the GIL is taken again to run signal
// handlers: a KeyboardInterrupt must still reach a waiting thread.
constexpr std::chrono::milliseconds kWaitSlice{50};

} // namespace

// See Note [Installing and uninstalling while bodies run]
bool enter_explicit_body() {
  while (!enter_body()) {
    {
      const py::gil_scoped_release no_gil;
      wait_until_bodies_open(kWaitSlice);
    }
    if (PyErr_CheckSignals() != 0) {
      return false;
    }
  }
  return true;
}

void init_running_bodies_bindings(py::module& m) {
  m.def("_body_running_on_this_thread", &body_running_on_this_thread);
  m.def("_threads_in_bodies", &threads_in_bodies);
  m.def("_close_bodies", &close_bodies);
  m.def("_open_bodies", &open_bodies);
  // Returns whether no body runs, after waiting at most `timeout` seconds
  // with the GIL released (the bodies waited for are Python code).
  m.def(
      "_wait_for_no_running_bodies",
      [](double timeout) {
        const auto slice =
            std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::duration<double>(timeout));
        const py::gil_scoped_release no_gil;
        return wait_for_no_running_bodies(slice);
      },
      py::arg("timeout"));
}

} // namespace aliasguard::utils
