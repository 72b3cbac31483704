"""The ``pytest11`` entry point of aliasguard's pytest plugin (see ``aliasguard.pytest_plugin``).

Installed packages' pytest plugins load in every pytest session of their
environment. Importing aliasguard imports torch and changes its behaviour, so
this module, which is what the entry point loads, only declares the options;
aliasguard is imported when ``--aliasguard-audit`` is given.
"""

from __future__ import annotations

import pytest

_MODES = ("report", "strict")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("aliasguard", "aliasguard alias audit")
    if any(option.names() == ["--aliasguard-audit"] for option in group.options):
        return  # both the entry point and `-p aliasguard.pytest_plugin` are loaded
    group.addoption(
        "--aliasguard-audit",
        action="store",
        nargs="?",
        const="report",
        default=None,
        choices=_MODES,
        metavar="report|strict",
        help="run every test under aliasguard.audit() and report every aliasing violation at the end; "
        "=strict also fails the tests that trigger one",
    )
    group.addoption(
        "--aliasguard-audit-json",
        action="store",
        default=None,
        metavar="FILE",
        help="with --aliasguard-audit: also write the report to FILE as JSON",
    )
    group.addoption(
        "--aliasguard-audit-kernels",
        action="store_true",
        default=False,
        help="with --aliasguard-audit: also check kernels (ops that reach no __torch_dispatch__), "
        "as aliasguard.audit(kernels=True)",
    )


def pytest_configure(config: pytest.Config) -> None:
    mode = config.getoption("--aliasguard-audit")
    if mode is None:
        for needs_audit in ("--aliasguard-audit-json", "--aliasguard-audit-kernels"):
            if config.getoption(needs_audit):
                raise pytest.UsageError(f"{needs_audit} needs --aliasguard-audit")
        return
    if config.pluginmanager.has_plugin("aliasguard-audit"):
        return
    from aliasguard.pytest_plugin import AuditPlugin

    plugin = AuditPlugin(config, strict=mode == "strict", kernels=config.getoption("--aliasguard-audit-kernels"))
    config.pluginmanager.register(plugin, "aliasguard-audit")
