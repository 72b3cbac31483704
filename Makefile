# The README's commands: `make demo`, `make test`, `make bench` and
# `make test-torch TORCH=<version>`. Each sets up what is missing (a venv with
# torch and the tools; GoogleTest / Google Benchmark only for test / bench),
# configures with CMake, builds only what it needs, then runs. Re-running is
# fast: set-up is skipped when done and the build is incremental.

PYTHON_BOOTSTRAP ?= python3
VENV ?= .venv
# What goes into $(VENV) besides the tools (see requirements-dev.txt).
TORCH_REQUIREMENT ?= -r requirements-dev.txt
VENV_ABS := $(abspath $(VENV))
PY := $(VENV_ABS)/bin/python
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
export PATH := $(VENV_ABS)/bin:$(PATH)
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
# Where the build puts the custom ops registered from C++ that the tests load
# (test/differential/cpp_ops.py).
export ALIASGUARD_TEST_OPS_DIR := $(abspath $(BUILD))/test_ops

.PHONY: setup build demo test test-cpp test-python lint bench test-torch clean sanitize test-differential

setup: $(VENV)/.ready

$(VENV)/.ready: requirements-dev.txt requirements-test.txt
	tools/check_system_deps.sh build
	test -x $(PY) || $(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH_REQUIREMENT)
	touch $@

# configure(OPTION=VALUE...): (re)configure when the build folder is new or an
# option differs from its cache. Tests and benchmarks stay off until asked for.
define configure
	@mkdir -p $(BUILD)
	@if [ ! -f $(BUILD)/build.ninja ] $(foreach o,$(1),|| ! grep -q '^$(firstword $(subst =, ,$(o))):BOOL=$(lastword $(subst =, ,$(o)))$$' $(BUILD)/CMakeCache.txt); then \
	  echo "cmake -S . -B $(BUILD) $(foreach o,$(1),-D$(o))"; \
	  cmake -S . -B $(BUILD) -G Ninja -DPython_EXECUTABLE=$(PY) -DCMAKE_BUILD_TYPE=Release $(foreach o,$(1),-D$(o)); \
	fi
endef

# The lock lives in the build folder: two makes in one checkout wait for each
# other, and nothing outside the checkout is touched.
define compile
	flock $(BUILD)/.build.lock cmake --build $(BUILD) -j $(JOBS) $(1)
endef

build: setup
	$(call configure,)
	$(call compile,)

demo: build
	$(PY) -m aliasguard

test-cpp: setup
	tools/check_system_deps.sh test
	$(call configure,ALIASGUARD_BUILD_TESTS=ON)
	$(call compile,)
	cd $(BUILD) && ctest --output-on-failure --no-tests=error -j $(JOBS)

test-python: build
	$(PY) -m pytest test/python

# clang-format (.clang-format) on the C++, ruff on all Python, mypy over the
# typed package (pyproject.toml); a few seconds, no build needed.
LINT_CXX = $(shell find c10 aten torch test/cpp bench -name '*.cpp' -o -name '*.h')
lint: setup
	tools/check_system_deps.sh lint
	@echo "clang-format --dry-run --Werror ($(words $(LINT_CXX)) C++ files)"
	@clang-format --dry-run --Werror $(LINT_CXX)
	$(PY) -m ruff check .
	$(PY) -m mypy

test: lint test-cpp sanitize test-python

# The differential harness over every scenario (docs/differential.md): each runs
# in a stock process and in one that imports aliasguard, and every difference
# must be intended. One worker pair (two processes); the default configuration
# alone takes 15 to 30 minutes on 2 cores, the other five add the aliasguard
# side's time once each.
# `make test` runs a bounded sample of it (test/python/test_differential.py).
# Every scenario in every configuration (DIFF_CONFIG=default for the default one alone), then each mutant
# (a feature switched off) on the scenarios its rules are listed for: each must fail, its rules missing.
DIFF_CONFIG ?= all
test-differential: build
	$(PY) test/differential/run.py --jobs 1 --progress --config $(DIFF_CONFIG) --json $(BUILD)/differential.json
	$(PY) test/differential/run.py --jobs 1 --check-mutants

bench: setup
	tools/check_system_deps.sh bench
	$(call configure,ALIASGUARD_BUILD_BENCH=ON)
	$(call compile,)
	$(PY) bench/run_benchmarks.py

# The C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer, in their
# own build directory (see ALIASGUARD_SANITIZE in CMakeLists.txt). libtorch
# keeps allocations alive until exit by design: leak detection is off.
SANITIZE_BUILD := build-sanitize
SANITIZER_ENV := ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

sanitize: setup
	tools/check_system_deps.sh test
	cmake -S . -B $(SANITIZE_BUILD) -G Ninja \
		-DPython_EXECUTABLE=$(abspath $(PY)) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DALIASGUARD_SANITIZE=ON -DALIASGUARD_BUILD_TESTS=ON -DALIASGUARD_BUILD_BENCH=OFF
	$(SANITIZER_ENV) cmake --build $(SANITIZE_BUILD) -j $(JOBS) --target aliasguard_cpp_tests
	cd $(SANITIZE_BUILD) && $(SANITIZER_ENV) ctest --output-on-failure --no-tests=error -j $(JOBS)

# The whole suite against another torch, e.g. `make test-torch TORCH=2.14.1`:
# its own venv (.venv-torch-$(TORCH)) and its own build folder
# (build-torch-$(TORCH)), which holds a mirror of this working tree (tracked
# and untracked, not ignored files), because the build puts its libraries into
# the package folder and the default build's must stay untouched. The mirror
# keeps modification times, so a rerun rebuilds only what changed.
# TORCH_VARIANT names a second venv for the same version (e.g. `cu` for the
# CUDA wheel of a version this machine also has as a local CPU wheel; pip
# keeps what the venv has, so prepare that venv first: docs/testing.md).
TORCH ?=
TORCH_VARIANT ?=
TORCH_TAG := $(TORCH)$(if $(TORCH_VARIANT),-$(TORCH_VARIANT))
MATRIX := build-torch-$(TORCH_TAG)
test-torch:
	@if [ -z "$(TORCH)" ]; then echo "usage: make test-torch TORCH=<torch version, e.g. 2.14.1> [TORCH_VARIANT=<name>]" >&2; exit 2; fi
	tools/mirror_worktree.sh $(MATRIX)/src
	env -u PYTHONPATH $(MAKE) -C $(MATRIX)/src test VENV=$(CURDIR)/.venv-torch-$(TORCH_TAG) \
	  TORCH_REQUIREMENT="torch==$(TORCH) -r requirements-test.txt"

clean:
	rm -rf $(BUILD) $(SANITIZE_BUILD) aliasguard/*.so aliasguard/_build_info.py
