# The README's two commands: `make demo` and `make test`. Both set up what is
# missing (venv, torch 2.13.0, GoogleTest, Google Benchmark), build with CMake,
# then run. Re-running is fast: set-up steps are skipped when done and the
# build is incremental.

PYTHON_BOOTSTRAP ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUILD := build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))

.PHONY: setup build demo test test-cpp test-python lint bench clean

setup: $(VENV)/.ready /usr/include/gtest/gtest.h /usr/include/benchmark/benchmark.h /usr/bin/clang-format

# torch is pinned exactly: any range would let pip fetch a multi-GB CUDA build.
$(VENV)/.ready: requirements-dev.txt
	test -x $(PY) || $(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

/usr/include/gtest/gtest.h /usr/include/benchmark/benchmark.h /usr/bin/clang-format:
	tools/install_system_deps.sh

$(BUILD)/build.ninja: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) -G Ninja -DPython_EXECUTABLE=$(abspath $(PY)) -DCMAKE_BUILD_TYPE=Release

build: $(BUILD)/build.ninja
	flock /tmp/aliasguard-build.lock cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(PY) -m aliasguard

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-python: build
	$(PY) -m pytest test/python

# clang-format (.clang-format) on the C++, ruff on all Python, mypy over the
# typed package (pyproject.toml); a few seconds, no build needed.
LINT_CXX = $(shell find c10 aten torch test/cpp bench -name '*.cpp' -o -name '*.h')
lint: $(VENV)/.ready /usr/bin/clang-format
	@echo "clang-format --dry-run --Werror ($(words $(LINT_CXX)) C++ files)"
	@clang-format --dry-run --Werror $(LINT_CXX)
	$(PY) -m ruff check .
	$(PY) -m mypy

test: lint test-cpp test-python

bench: build
	$(PY) bench/run_benchmarks.py

clean:
	rm -rf $(BUILD) aliasguard/*.so
