"""pytest plugin: collect garbage after every test, in every mode.

Used by tools/run_upstream_suites.py for all modes alike. Some upstream tests
that fail on the running torch leave objects with finalizers behind (a
``torch.library.Library`` whose ``_destroy`` raised keeps its namespace
registered until its finalizer runs); when that finalizer runs depends on the
garbage collector's timing, which differs between processes that import
different modules, so the next test that registers the same namespace passed
in one mode and failed in another. Collecting after each test runs them at
the same point in every mode.
"""

import gc
import sys

import pytest


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    # pytest keeps the last failure's traceback (and so its frames' locals)
    # for post-mortem debugging; drop it so that those objects can go.
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    gc.collect()
