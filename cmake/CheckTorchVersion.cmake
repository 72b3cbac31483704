# The torch releases aliasguard supports, and the check that stops a build
# against any other.
#
# Note [Supported torch range]
# The range is the `torch>=MIN,<MAX` entry of `dependencies` in
# pyproject.toml, read from there so that widening it (docs/design.md, "How to
# add a torch version") is one edit. The wheel keeps that range as its
# dependency rather than pinning the exact torch it was built against: pip then
# leaves every supported torch in place, and `import aliasguard` refuses a
# torch other than the one built against (aliasguard/_build_info.py). A torch
# outside the range must stop the build at once: building and installing
# anyway would let pip resolve the range and download another torch over the
# user's. And it must stop before pip reads the package's metadata, or pip
# resolves the range first and downloads another torch (GBs of CUDA wheels)
# only to see the configure stop: the build backend
# (tools/pep517/aliasguard_build_backend.py) runs this file in script
# mode on the building interpreter before anything else.
#
# Three uses:
#   include(CheckTorchVersion)  then  aliasguard_check_torch_version(<version> <where>)
#   cmake -DPython_EXECUTABLE=/path/to/python -P cmake/CheckTorchVersion.cmake
#       (the build backend: checks that interpreter's torch, read from its
#       package metadata without importing it; exit 0 when supported)
#   cmake -DTORCH_VERSION=2.15.0 -P cmake/CheckTorchVersion.cmake   (tests; exit 0 when supported)

set(_ag_pyproject "${CMAKE_CURRENT_LIST_DIR}/../pyproject.toml")
if(NOT EXISTS "${_ag_pyproject}")
  message(FATAL_ERROR "CheckTorchVersion.cmake: ${_ag_pyproject} not found; it holds the supported torch range.")
endif()
file(STRINGS "${_ag_pyproject}" _ag_dependencies REGEX "^dependencies[ \t]*=")
string(REGEX MATCH "\"torch>=([0-9]+\\.[0-9]+(\\.[0-9]+)?),<([0-9]+\\.[0-9]+(\\.[0-9]+)?)\"" _ag_range "${_ag_dependencies}")
if(NOT _ag_range)
  message(FATAL_ERROR
    "CheckTorchVersion.cmake: no \"torch>=MIN,<MAX\" entry in the dependencies of ${_ag_pyproject} "
    "(found: ${_ag_dependencies}).")
endif()
set(ALIASGUARD_TORCH_MIN "${CMAKE_MATCH_1}")
set(ALIASGUARD_TORCH_MAX "${CMAKE_MATCH_3}")

# Stops the configure or the script (FATAL_ERROR) unless `version` (torch.__version__, e.g.
# 2.13.0+cpu) is in [ALIASGUARD_TORCH_MIN, ALIASGUARD_TORCH_MAX). `where`
# names the torch in the message (the interpreter it belongs to).
function(aliasguard_check_torch_version version where)
  string(REGEX MATCH "^[0-9]+\\.[0-9]+(\\.[0-9]+)?" _release "${version}")
  set(_range "torch>=${ALIASGUARD_TORCH_MIN},<${ALIASGUARD_TORCH_MAX}")
  set(_fix
    "Install a supported torch for the interpreter that builds aliasguard, e.g.\n"
    "  pip install \"${_range}\"\n"
    "then build again. The tested releases are listed in README.md (Tested versions), "
    "and how to support another release in docs/design.md (How to add a torch version).")
  if(NOT _release)
    message(FATAL_ERROR
      "aliasguard: cannot read the torch version \"${version}\" ${where}. "
      "aliasguard supports ${_range}.\n" ${_fix})
  endif()
  if(_release VERSION_LESS ALIASGUARD_TORCH_MIN OR _release VERSION_GREATER_EQUAL ALIASGUARD_TORCH_MAX)
    message(FATAL_ERROR
      "aliasguard: found torch ${version} ${where}, outside the supported range "
      "${_range} (torch ${ALIASGUARD_TORCH_MIN} up to, not including, ${ALIASGUARD_TORCH_MAX}). "
      "The build stops here, so pip installs nothing and leaves that torch in place.\n" ${_fix})
  endif()
endfunction()

# Stops (FATAL_ERROR): `python`, the interpreter aliasguard is built for,
# cannot import torch; `error` is what it said.
function(aliasguard_torch_not_found python error)
  message(FATAL_ERROR
    "aliasguard builds against the torch installed for ${python}, "
    "but that interpreter cannot import torch:\n  ${error}\n\n"
    "Install torch (torch>=${ALIASGUARD_TORCH_MIN},<${ALIASGUARD_TORCH_MAX}) for this interpreter first, "
    "then build with:\n"
    "  pip install scikit-build-core cmake ninja\n"
    "  pip install --no-build-isolation .\n"
    "or, from a source checkout, `make build` (which sets up .venv itself). "
    "To build for another interpreter, pass -DPython_EXECUTABLE=/path/to/python.")
endfunction()

# Sets `out_version` to the version of the torch that `python` would import
# and `out_root` to that package's folder, without importing torch (seconds):
# from the metadata pip keeps for it, the same that pip's resolver reads, or by
# importing it where no metadata belongs to that folder. Like the configure's
# query (cmake/TorchFromPython.cmake), `python` runs with -E (PYTHONPATH
# ignored, as pip's isolated build environment sets it) from a folder without
# a `torch/`. Stops with aliasguard_torch_not_found() when there is no torch.
function(aliasguard_torch_version_of python out_version out_root)
  execute_process(
    COMMAND "${python}" -E -c [=[
import importlib.metadata as metadata
import importlib.util
import os
import sys

spec = importlib.util.find_spec("torch")
if spec is None or not spec.submodule_search_locations:
    sys.stderr.write("ModuleNotFoundError: No module named 'torch'\n")
    sys.exit(3)
root = os.path.abspath(list(spec.submodule_search_locations)[0])
try:
    dist = metadata.distribution("torch")
    ours = os.path.realpath(str(dist.locate_file("torch"))) == os.path.realpath(root)
except metadata.PackageNotFoundError:
    ours = False
if ours:
    version = dist.version
else:
    try:
        import torch
    except ImportError as e:
        sys.stderr.write(f"{type(e).__name__}: {e}\n")
        sys.exit(3)
    version = torch.__version__
print(version)
print(root)
]=]
    WORKING_DIRECTORY "${CMAKE_CURRENT_FUNCTION_LIST_DIR}"
    RESULT_VARIABLE _rc
    OUTPUT_VARIABLE _out
    ERROR_VARIABLE _err
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0)
    string(STRIP "${_err}" _err)
    if(_err STREQUAL "")
      set(_err "${python} exited with ${_rc}")
    endif()
    aliasguard_torch_not_found("${python}" "${_err}")
  endif()
  string(REPLACE "\n" ";" _lines "${_out}")
  list(LENGTH _lines _n)
  if(NOT _n EQUAL 2)
    message(FATAL_ERROR "Unexpected answer from ${python} about torch:\n${_out}\n${_err}")
  endif()
  list(GET _lines 0 _version)
  list(GET _lines 1 _root)
  set(${out_version} "${_version}" PARENT_SCOPE)
  set(${out_root} "${_root}" PARENT_SCOPE)
endfunction()

# Script mode (cmake -P): check TORCH_VERSION, or the torch of Python_EXECUTABLE.
if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(DEFINED TORCH_VERSION)
    aliasguard_check_torch_version("${TORCH_VERSION}" "(given as TORCH_VERSION)")
    message(STATUS "aliasguard: torch ${TORCH_VERSION} is supported (torch>=${ALIASGUARD_TORCH_MIN},<${ALIASGUARD_TORCH_MAX})")
  elseif(DEFINED Python_EXECUTABLE)
    aliasguard_torch_version_of("${Python_EXECUTABLE}" _ag_version _ag_root)
    aliasguard_check_torch_version("${_ag_version}" "for ${Python_EXECUTABLE} (at ${_ag_root})")
    message(STATUS "aliasguard: torch ${_ag_version} is supported (torch>=${ALIASGUARD_TORCH_MIN},<${ALIASGUARD_TORCH_MAX}), "
                   "for ${Python_EXECUTABLE} (at ${_ag_root})")
  else()
    message(FATAL_ERROR "usage: cmake -DTORCH_VERSION=<torch.__version__> -P ${CMAKE_CURRENT_LIST_FILE}\n"
                        "   or: cmake -DPython_EXECUTABLE=<python> -P ${CMAKE_CURRENT_LIST_FILE}")
  endif()
endif()
