"""``python -m aliasguard audit [--json FILE] SCRIPT [args...]``: run a script under the alias audit.

The script runs as ``__main__`` (``sys.argv`` is ``[SCRIPT, *args]``, its
directory first on ``sys.path``) inside ``aliasguard.audit(report=...)``, threads
it starts included. Afterwards the report (the same table as the pytest
plugin's) goes to stderr, and with ``--json FILE`` to FILE as JSON. FILE's
folder must exist: it is checked before the script runs (exit status 2).

Exit status: 2 for a usage error (no such script, a JSON report that cannot
be written); the script's own when it failed (an uncaught exception: 1);
otherwise 1 if a violation was found, else 0.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from typing import Optional, Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m aliasguard audit",
        description="Run a Python script under aliasguard.audit() in report mode and print every "
        "aliasing violation its tensor subclasses and modes commit.",
    )
    parser.add_argument(
        "--json",
        metavar="FILE",
        help="also write the report to FILE as JSON (overwritten); FILE's folder must exist, which is "
        "checked before the script runs",
    )
    parser.add_argument(
        "--kernels",
        action="store_true",
        help="also check kernels (ops that reach no __torch_dispatch__), as aliasguard.audit(kernels=True)",
    )
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    options = _parser().parse_args(argv)
    if not os.path.isfile(options.script):
        print(f"python -m aliasguard audit: no such script: {options.script}", file=sys.stderr)
        return 2

    json_path = os.path.abspath(options.json) if options.json is not None else None
    import aliasguard
    from aliasguard._aliasing import _audit_new_threads
    from aliasguard._report import json_report_path_problem

    if options.json is not None:
        problem = json_report_path_problem(options.json)
        if problem is not None:
            print(f"python -m aliasguard audit: --json {options.json}: {problem}", file=sys.stderr)
            return 2

    report = aliasguard.AuditReport(context=options.script)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [options.script, *options.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(options.script)))
    status = 0
    try:
        with aliasguard.audit(report=report, kernels=options.kernels), _audit_new_threads(report):
            runpy.run_path(options.script, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
    except BaseException:  # the script's failure is reported like Python would, then the audit
        traceback.print_exc()
        status = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path

    print(report.format(title=f"aliasguard audit of {options.script}"), file=sys.stderr)
    if json_path is not None:
        try:
            with open(json_path, "w", encoding="utf-8") as file:
                file.write(report.to_json())
        except OSError as error:  # checked before the run; the folder may have gone since
            print(
                f"python -m aliasguard audit: could not write the JSON report to {options.json}: "
                f"{error.strerror or error}",
                file=sys.stderr,
            )
            return 2
    if status != 0:
        return status
    return 1 if report else 0
