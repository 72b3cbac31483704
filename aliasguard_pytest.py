"""The ``pytest11`` entry point of aliasguard's pytest plugin (see ``aliasguard.pytest_plugin``).

Installed packages' pytest plugins load in every pytest session of their
environment. Importing aliasguard imports torch and changes its behaviour, so
this module, which is what the entry point loads, only declares the options;
aliasguard is imported when ``--aliasguard-audit`` is given.
"""

from __future__ import annotations

import argparse

import pytest

_MODES = ("report", "strict")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aliasguard", "aliasguard alias audit")
    if any(option.names() == ["--aliasguard-audit"] for option in group.options):
        return  # both the entry point and `-p aliasguard.pytest_plugin` are loaded
    # Note [The audit option takes no separate value]
    # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    # A flag whose value is optional (nargs="?") takes the next word as its
    # value, so `--aliasguard-audit tests/` would read "tests/" as the mode.
    # `--aliasguard-audit` is therefore a plain flag, and each mode is an
    # option of its own whose name contains the "=": argparse looks an
    # argument up as a whole option name before it splits it at "=", so
    # `--aliasguard-audit=strict` is found as written and nothing after it
    # is consumed. Any other `--aliasguard-audit=VALUE` is refused by argparse
    # ("ignored explicit argument 'VALUE'").
    group.addoption(
        "--aliasguard-audit",
        action="store_const",
        const="report",
        default=None,
        dest="aliasguard_audit",
        help="run every test under aliasguard.audit() and report every aliasing violation at the end",
    )
    group.addoption(
        "--aliasguard-audit=strict",
        action="store_const",
        const="strict",
        dest="aliasguard_audit",
        help="as --aliasguard-audit, and also fail the tests that trigger a violation",
    )
    group.addoption(
        "--aliasguard-audit=report",
        action="store_const",
        const="report",
        dest="aliasguard_audit",
        help=argparse.SUPPRESS,  # the same as --aliasguard-audit; accepted for symmetry
    )
    group.addoption(
        "--aliasguard-audit-json",
        action="store",
        default=None,
        metavar="FILE",
        help="with --aliasguard-audit: also write the report to FILE as JSON at the end; FILE's folder "
        "must exist (checked before any test runs) and FILE is overwritten",
    )
    group.addoption(
        "--aliasguard-audit-kernels",
        action="store_true",
        default=False,
        help="with --aliasguard-audit: also check kernels (ops that reach no __torch_dispatch__), "
        "as aliasguard.audit(kernels=True)",
    )


def _mode_read_as_path(config: pytest.Config) -> str | None:
    """A mode written after a space (`--aliasguard-audit strict`), which pytest took for a test path."""
    for arg in config.args:
        if arg in _MODES and not (config.invocation_params.dir / arg).exists():
            return arg
    return None


def pytest_configure(config: pytest.Config) -> None:
    mode = config.getoption("aliasguard_audit")
    if mode is None:
        for needs_audit in ("--aliasguard-audit-json", "--aliasguard-audit-kernels"):
            if config.getoption(needs_audit):
                raise pytest.UsageError(f"{needs_audit} needs --aliasguard-audit")
        return
    if config.pluginmanager.has_plugin("aliasguard-audit"):
        return
    stray = _mode_read_as_path(config)
    if stray is not None:
        raise pytest.UsageError(
            f"'{stray}' was read as a test path: the audit mode is written with '=', "
            f"as --aliasguard-audit={stray}"
        )
    json_path = config.getoption("--aliasguard-audit-json")
    if json_path:
        from aliasguard._report import json_report_path_problem

        problem = json_report_path_problem(json_path)
        if problem is not None:
            raise pytest.UsageError(f"--aliasguard-audit-json {json_path}: {problem}")
    from aliasguard.pytest_plugin import AuditPlugin

    plugin = AuditPlugin(config, strict=mode == "strict", kernels=config.getoption("--aliasguard-audit-kernels"))
    config.pluginmanager.register(plugin, "aliasguard-audit")
