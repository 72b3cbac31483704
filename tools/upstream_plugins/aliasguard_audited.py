"""pytest plugin: run every test inside ``aliasguard.audit()``.

Used by tools/run_upstream_suites.py (``-p aliasguard_audited``). The fixture is
autouse, so it also wraps ``unittest.TestCase`` methods; any alias violation the
audit sees while a test body runs fails that test with ``AliasingError``.
``--aliasguard-kernels`` audits with ``kernels=True``.
"""

import pytest

import aliasguard


def pytest_addoption(parser):
    parser.addoption("--aliasguard-kernels", action="store_true", help="audit with kernels=True")


def pytest_report_header(config):
    kernels = config.getoption("--aliasguard-kernels")
    return f"aliasguard {aliasguard.__version__} imported; every test inside aliasguard.audit(kernels={kernels})"


@pytest.fixture(autouse=True)
def _aliasguard_audit_every_test(request):
    with aliasguard.audit(kernels=request.config.getoption("--aliasguard-kernels")):
        yield
