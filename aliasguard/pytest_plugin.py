"""pytest plugin: run every test under :func:`aliasguard.audit` and report every aliasing violation.

::

    pytest -p aliasguard.pytest_plugin --aliasguard-audit tests/          # report at the end
    pytest -p aliasguard.pytest_plugin --aliasguard-audit=strict tests/   # and fail the tests that trigger one
    pytest ... --aliasguard-audit --aliasguard-audit-json=audit.json

``--aliasguard-audit`` is a flag and the strict mode is written with ``=``
(``--aliasguard-audit strict`` would read ``strict`` as a test path, and is
refused saying so). The JSON report's folder must exist; it is checked before
any test runs.

``pip install aliasguard`` registers the plugin as a ``pytest11`` entry point, so
``-p aliasguard.pytest_plugin`` is only needed with an in-tree checkout. Without
``--aliasguard-audit`` the plugin does nothing: the entry point
(``aliasguard_pytest``) imports neither aliasguard nor torch until asked to
audit (``-p no:aliasguard`` disables it altogether).

Each test's setup, call and teardown run under ``aliasguard.audit(report=...)``
in report mode, as do the threads the test starts (through
``threading.Thread``). At the end of the session the terminal summary holds one
table of the distinct violations (de-duplicated by op, class or mode, kind and
source line, with counts), grouped by op and by the class or mode responsible,
each with one example test, then one sentence per entry saying what to change.
In strict mode a test that triggered a violation fails, with its own table.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Generator, Optional

import pytest

if TYPE_CHECKING:
    from aliasguard._report import AuditReport

# The options and the registration live in the entry-point module, which
# does not import aliasguard; loading this module (``-p``) loads them too.
from aliasguard_pytest import pytest_addoption, pytest_configure  # noqa: E402,F401


class AuditPlugin:
    """The per-session state: the session's report, the test being audited."""

    def __init__(self, config: pytest.Config, strict: bool, kernels: bool = False) -> None:
        import aliasguard  # deferred: only sessions that audit import torch

        self._aliasguard = aliasguard
        self.config = config
        self.strict = strict
        self.kernels = kernels
        self.report: AuditReport = aliasguard.AuditReport()
        self._retained = False
        # Absolute, so that a test changing the working directory does not move the report.
        path = config.getoption("--aliasguard-audit-json")
        self.json_path: Optional[str] = os.path.abspath(path) if path else None

    # --- the session ----------------------------------------------------------------

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # Registering the audit's fallback updates every operator's dispatch
        # table; keep it registered for the session instead of once per phase.
        self._aliasguard._C._retain_alias_audit_fallback()
        self._retained = True

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self._retained:
            self._retained = False
            self._aliasguard._C._release_alias_audit_fallback()

    # --- each test -------------------------------------------------------------------

    def _audited(self, item: pytest.Item) -> Generator[None, Any, Any]:
        from aliasguard._aliasing import _audit_new_threads

        report = self._aliasguard.AuditReport(context=item.nodeid)
        try:
            with self._aliasguard.audit(report=report, kernels=self.kernels), _audit_new_threads(report):
                result = yield
        finally:
            self.report.merge(report)
            item.stash.setdefault(_TEST_REPORT, self._aliasguard.AuditReport(context=item.nodeid)).merge(report)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._audited(item))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        result = yield from self._audited(item)
        if self.strict:
            found = item.stash.get(_TEST_REPORT, None)
            if found:
                pytest.fail(found.format(title=f"aliasguard audit (strict) of {item.nodeid}"), pytrace=False)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._audited(item))

    # --- the end of the session ------------------------------------------------------

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.section("aliasguard audit")
        terminalreporter.write_line(self.report.format())
        path = self.json_path
        if path:
            try:
                with open(path, "w", encoding="utf-8") as file:
                    file.write(self.report.to_json())
            except OSError as error:  # checked before the run; the folder may have gone since
                terminalreporter.write_line(
                    f"aliasguard audit: could not write the JSON report to {path}: {error.strerror or error}",
                    red=True,
                )
            else:
                terminalreporter.write_line(f"aliasguard audit: JSON report written to {path}")


_TEST_REPORT = pytest.StashKey["AuditReport"]()
