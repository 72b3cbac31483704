"""pytest plugin: run every test inside ``aliasguard.audit()``.

Used by tools/run_upstream_suites.py (``-p aliasguard_audited``). The fixture is
autouse, so it also wraps ``unittest.TestCase`` methods; any alias violation the
audit sees while a test body runs fails that test with ``AliasingError``.
"""

import pytest

import aliasguard


def pytest_report_header(config):
    return f"aliasguard {aliasguard.__version__} imported; every test inside aliasguard.audit()"


@pytest.fixture(autouse=True)
def _aliasguard_audit_every_test():
    with aliasguard.audit():
        yield
