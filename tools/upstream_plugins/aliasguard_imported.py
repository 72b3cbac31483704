"""pytest plugin: import aliasguard before any test module is collected.

Used by tools/run_upstream_suites.py (``-p aliasguard_imported``) to run an
upstream PyTorch test file exactly as a user would after ``import aliasguard``.
"""

import aliasguard  # noqa: F401  (the import is the whole point)


def pytest_report_header(config):
    return f"aliasguard {aliasguard.__version__} imported (alias correction on)"
