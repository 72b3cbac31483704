#!/usr/bin/env bash
# Checks the system packages a step needs, and installs the missing ones from
# Debian when it can (root, or password-less sudo). Otherwise it stops and
# names them.
#   tools/check_system_deps.sh build   compiler, Python headers, venv
#   tools/check_system_deps.sh lint    + clang-format
#   tools/check_system_deps.sh test    + GoogleTest
#   tools/check_system_deps.sh bench   + Google Benchmark
# ALIASGUARD_INSTALL_SYSTEM_DEPS=0 only reports, even as root.
# ALIASGUARD_SYSTEM_INCLUDE_DIR (default /usr/include) is where the GoogleTest
# and Google Benchmark headers are looked for.
set -euo pipefail
step="${1:-build}"
python="${PYTHON_BOOTSTRAP:-python3}"
include="${ALIASGUARD_SYSTEM_INCLUDE_DIR:-/usr/include}"
missing=()

command -v g++ >/dev/null 2>&1 || missing+=(g++)
# Python.h for the extension module, and the venv module for .venv.
if ! "$python" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then
  missing+=(python3-dev)
fi
"$python" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
case "$step" in
  build) ;;
  lint) command -v clang-format >/dev/null 2>&1 || missing+=(clang-format) ;;
  test) [ -f "$include/gtest/gtest.h" ] || missing+=(libgtest-dev) ;;
  bench) [ -f "$include/benchmark/benchmark.h" ] || missing+=(libbenchmark-dev) ;;
  *) echo "usage: $0 build|lint|test|bench" >&2; exit 2 ;;
esac
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "${ALIASGUARD_INSTALL_SYSTEM_DEPS:-1}" = 0 ]; then
  why="ALIASGUARD_INSTALL_SYSTEM_DEPS=0"
elif [ "$(id -u)" = 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  why="this user is neither root nor has password-less sudo"
fi
if [ -n "${why:-}" ]; then
  echo "aliasguard: \`make $step\` needs these Debian packages, which are not installed:" >&2
  echo "    ${missing[*]}" >&2
  echo "Not installing them ($why). Install them as root, then run make again:" >&2
  echo "    apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "Installing ${missing[*]} from Debian"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
