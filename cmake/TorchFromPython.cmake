# Torch, taken from the Python interpreter the package is built for.
#
# Note [Finding torch without find_package(Torch)]
# torch's own TorchConfig.cmake pulls in Caffe2's CUDA detection whenever the
# installed wheel is a CUDA build, and then insists on a CUDA toolkit, although
# aliasguard compiles no CUDA code and only needs torch's headers and its host
# libraries. So we ask the interpreter itself where torch lives, which C++ ABI
# it was compiled with and which version it is, and describe that as imported
# targets. The interpreter runs with -E (PYTHONPATH ignored) from a folder in
# the build tree, so the repository's own `torch/` source folder can never
# shadow the installed package.
#
# Provides:
#   aliasguard::torch         headers, ABI flag, c10 + torch_cpu + torch
#   aliasguard::torch_python  the above plus torch_python (Python extension only)
#   ALIASGUARD_TORCH_VERSION  torch.__version__ of the torch compiled against,
#                             inside the supported range (CheckTorchVersion.cmake)
#   ALIASGUARD_TORCH_MIN, ALIASGUARD_TORCH_MAX  that range, [MIN, MAX)
#   ALIASGUARD_TORCH_CXX11_ABI 0 or 1
#   ALIASGUARD_TORCH_LIBRARY_DIR, TORCH_INSTALL_PREFIX (torch's package folder)
#   TORCH_LIBRARIES, TORCH_PYTHON_LIBRARY (the same targets, under the names
#   find_package(Torch) uses)

if(NOT Python_EXECUTABLE)
  message(FATAL_ERROR "TorchFromPython.cmake needs Python_EXECUTABLE (call find_package(Python) first)")
endif()

# ALIASGUARD_TORCH_MIN / _MAX (read from pyproject.toml, so editing the range
# there reconfigures), aliasguard_check_torch_version() and
# aliasguard_torch_not_found(), shared with the build backend's early check.
include("${CMAKE_CURRENT_LIST_DIR}/CheckTorchVersion.cmake")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${CMAKE_CURRENT_LIST_DIR}/../pyproject.toml")

set(_ag_query_dir "${CMAKE_CURRENT_BINARY_DIR}/CMakeFiles/aliasguard-torch-query")
file(MAKE_DIRECTORY "${_ag_query_dir}")
execute_process(
  COMMAND "${Python_EXECUTABLE}" -E -c [=[
import os, sys
try:
    import torch
except ImportError as e:
    sys.stderr.write(f"{type(e).__name__}: {e}\n")
    sys.exit(3)
root = os.path.dirname(os.path.abspath(torch.__file__))
print(torch.__version__)
print(root)
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(torch.version.cuda or "")
]=]
  WORKING_DIRECTORY "${_ag_query_dir}"
  RESULT_VARIABLE _ag_rc
  OUTPUT_VARIABLE _ag_out
  ERROR_VARIABLE _ag_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)

if(NOT _ag_rc EQUAL 0)
  string(STRIP "${_ag_err}" _ag_err)
  aliasguard_torch_not_found("${Python_EXECUTABLE}" "${_ag_err}")
endif()

string(REPLACE "\n" ";" _ag_lines "${_ag_out}")
list(LENGTH _ag_lines _ag_n)
if(_ag_n LESS 3)
  message(FATAL_ERROR "Unexpected answer from ${Python_EXECUTABLE} about torch:\n${_ag_out}\n${_ag_err}")
endif()
list(GET _ag_lines 0 ALIASGUARD_TORCH_VERSION)
list(GET _ag_lines 1 TORCH_INSTALL_PREFIX)
list(GET _ag_lines 2 ALIASGUARD_TORCH_CXX11_ABI)
set(_ag_cuda "")
if(_ag_n GREATER 3)
  list(GET _ag_lines 3 _ag_cuda)
endif()
set(ALIASGUARD_TORCH_LIBRARY_DIR "${TORCH_INSTALL_PREFIX}/lib")

# A torch outside the supported range stops the configure here, before
# anything is built (see Note [Supported torch range]).
aliasguard_check_torch_version("${ALIASGUARD_TORCH_VERSION}"
  "for ${Python_EXECUTABLE} (at ${TORCH_INSTALL_PREFIX})")
if(_ag_cuda)
  set(_ag_kind "CUDA ${_ag_cuda} wheel; no CUDA toolkit needed")
else()
  set(_ag_kind "CPU build")
endif()
message(STATUS "aliasguard: torch ${ALIASGUARD_TORCH_VERSION} (${_ag_kind}) at ${TORCH_INSTALL_PREFIX}, "
               "_GLIBCXX_USE_CXX11_ABI=${ALIASGUARD_TORCH_CXX11_ABI}")

# Reinstalling torch into the same environment re-runs this query on the next
# build, so the recorded version never goes stale.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${TORCH_INSTALL_PREFIX}/version.py")

foreach(_ag_lib c10 torch_cpu torch torch_python)
  find_library(ALIASGUARD_LIB_${_ag_lib} ${_ag_lib}
    PATHS "${ALIASGUARD_TORCH_LIBRARY_DIR}" NO_DEFAULT_PATH NO_CACHE)
  if(NOT ALIASGUARD_LIB_${_ag_lib})
    message(FATAL_ERROR "lib${_ag_lib}.so not found in ${ALIASGUARD_TORCH_LIBRARY_DIR}: is the torch there complete?")
  endif()
endforeach()

if(NOT TARGET aliasguard::torch)
  add_library(aliasguard::torch INTERFACE IMPORTED)
  set_target_properties(aliasguard::torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES
      "${TORCH_INSTALL_PREFIX}/include;${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include"
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${ALIASGUARD_TORCH_CXX11_ABI}"
    INTERFACE_LINK_LIBRARIES "${ALIASGUARD_LIB_c10};${ALIASGUARD_LIB_torch_cpu};${ALIASGUARD_LIB_torch}")
  add_library(aliasguard::torch_python INTERFACE IMPORTED)
  set_target_properties(aliasguard::torch_python PROPERTIES
    INTERFACE_LINK_LIBRARIES "aliasguard::torch;${ALIASGUARD_LIB_torch_python}")
endif()

set(TORCH_LIBRARIES aliasguard::torch)
set(TORCH_PYTHON_LIBRARY aliasguard::torch_python)
