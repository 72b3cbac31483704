#pragma once

#include <torch/csrc/utils/pybind.h>

// The Python side of the running bodies (running_bodies.h): explicit scopes
// that wait with the GIL released, and uninstall()'s bindings. See Note
// [Installing and uninstalling while bodies run].

namespace aliasguard::utils {

// Enters a body for an explicit scope (track_views(), with_tracking()),
// waiting with the GIL released while the bodies are closed. False with a
// Python exception set when a signal handler raised meanwhile (Ctrl-C); the
// body was not entered then. Leave with exit_body().
bool enter_explicit_body();

// Registers _body_running_on_this_thread, _threads_in_bodies,
// _close_bodies, _open_bodies and _wait_for_no_running_bodies.
void init_running_bodies_bindings(pybind11::module& m);

} // namespace aliasguard::utils
