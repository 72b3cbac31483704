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

.PHONY: setup build demo test test-cpp test-python bench clean sanitize

setup: $(VENV)/.ready /usr/include/gtest/gtest.h /usr/include/benchmark/benchmark.h

# torch is pinned exactly: any range would let pip fetch a multi-GB CUDA build.
$(VENV)/.ready: requirements-dev.txt
	test -x $(PY) || $(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

/usr/include/gtest/gtest.h /usr/include/benchmark/benchmark.h:
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

test: test-cpp test-python

bench: build
	$(PY) bench/run_benchmarks.py

# The C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer, in their
# own build directory (see ALIASGUARD_SANITIZE in CMakeLists.txt). libtorch
# keeps allocations alive until exit by design: leak detection is off.
SANITIZE_BUILD := build-sanitize
SANITIZER_ENV := ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

sanitize: setup
	test -f $(SANITIZE_BUILD)/build.ninja || cmake -S . -B $(SANITIZE_BUILD) -G Ninja \
		-DPython_EXECUTABLE=$(abspath $(PY)) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DALIASGUARD_SANITIZE=ON -DALIASGUARD_BUILD_BENCH=OFF
	$(SANITIZER_ENV) flock /tmp/aliasguard-build.lock cmake --build $(SANITIZE_BUILD) -j $(JOBS)
	cd $(SANITIZE_BUILD) && $(SANITIZER_ENV) ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD) $(SANITIZE_BUILD) aliasguard/*.so
