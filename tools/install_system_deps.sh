#!/usr/bin/env bash
# GoogleTest, Google Benchmark and clang-format (make lint) come from Debian;
# install them when missing.
set -euo pipefail
if [ -f /usr/include/gtest/gtest.h ] && [ -f /usr/include/benchmark/benchmark.h ] &&
  [ -x /usr/bin/clang-format ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libgtest-dev libbenchmark-dev clang-format >/dev/null
