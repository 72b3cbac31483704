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
# outside the range must stop the configure at once: building and installing
# anyway would let pip resolve the range and download another torch over the
# user's.
#
# Two uses:
#   include(CheckTorchVersion)  then  aliasguard_check_torch_version(<version> <where>)
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

# Stops the configure (FATAL_ERROR) unless `version` (torch.__version__, e.g.
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

# Script mode (cmake -P): check TORCH_VERSION.
if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT DEFINED TORCH_VERSION)
    message(FATAL_ERROR "usage: cmake -DTORCH_VERSION=<torch.__version__> -P ${CMAKE_CURRENT_LIST_FILE}")
  endif()
  aliasguard_check_torch_version("${TORCH_VERSION}" "(given as TORCH_VERSION)")
  message(STATUS "aliasguard: torch ${TORCH_VERSION} is supported (torch>=${ALIASGUARD_TORCH_MIN},<${ALIASGUARD_TORCH_MAX})")
endif()
