#!/usr/bin/env python3
"""Run upstream PyTorch test files three ways and diff the outcomes.

    python tools/run_upstream_suites.py /tmp/upstream/test_python_dispatch.py ...

Each file runs in its own pytest process per mode (one process never sees two
modes):

* ``stock``      - plain torch, aliasguard never imported;
* ``aliasguard`` - ``import aliasguard`` before collection
  (``tools/upstream_plugins/aliasguard_imported.py``);
* ``audit``      - as ``aliasguard`` plus every test inside ``aliasguard.audit()``
  (``tools/upstream_plugins/aliasguard_audited.py``, an autouse fixture);
* ``audit_kernels`` - opt-in (``--modes``): every test inside
  ``aliasguard.audit(kernels=True)``, which also checks kernels that reach no
  ``__torch_dispatch__``; its extra failures are listed for information (the
  test kernels upstream registers that break their schemas on purpose), not
  counted as regressions.

Per-test outcomes come from pytest's JUnit XML. The report lists, per file, how
many tests passed in each mode, then the two lists that matter:

* tests that pass stock and do not pass with aliasguard imported;
* tests that pass with aliasguard imported and do not pass under ``audit()``.

A file whose collection fails (it imports something this torch does not have)
is reported as such, with the first error line, instead of being counted.

The upstream files are not part of this repository: fetch them elsewhere (e.g.
/tmp/upstream/) and pass their paths. ``--json`` writes the full per-test
outcomes for later diffing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PLUGINS = REPO / "tools" / "upstream_plugins"

MODES = {
    "stock": [],
    "aliasguard": ["-p", "aliasguard_imported"],
    "audit": ["-p", "aliasguard_audited"],
    "audit_kernels": ["-p", "aliasguard_audited", "--aliasguard-kernels"],
}

PASSED, FAILED, SKIPPED, MISSING = "passed", "failed", "skipped", "missing"


def _first_line(text: str | None) -> str:
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line[:300]
    return ""


def parse_junit(path: Path) -> dict[str, tuple[str, str]]:
    """Test id -> (outcome, first line of the failure message)."""
    results: dict[str, tuple[str, str]] = {}
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = PASSED, ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = FAILED
                message = _first_line(child.get("message")) or _first_line(child.text)
                break
            if child.tag == "skipped":
                outcome = SKIPPED
                message = _first_line(child.get("message"))
        # An error in teardown after a pass is reported as a second entry for
        # the same id; the worse outcome wins.
        if test_id in results and results[test_id][0] == FAILED:
            continue
        results[test_id] = (outcome, message)
    return results


def run_mode(
    test_file: Path,
    mode: str,
    out_dir: Path,
    python: str,
    workers: int,
    keyword: str | None,
    timeout: int,
) -> dict:
    junit = out_dir / f"{test_file.stem}.{mode}.xml"
    log = out_dir / f"{test_file.stem}.{mode}.log"
    junit.unlink(missing_ok=True)
    cmd = [
        python, "-m", "pytest", str(test_file), "-q", "-rN", "--tb=native",
        "-p", "no:cacheprovider", "-p", "collect_between_tests", f"--junitxml={junit}", *MODES[mode],
    ]
    if workers > 1:
        cmd += ["-n", str(workers)]
    if keyword:
        cmd += ["-k", keyword]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PLUGINS), str(REPO), env.get("PYTHONPATH", "")) if p
    )
    # Upstream's common_utils reads these; keep the runs quiet and CPU-only.
    env.setdefault("PYTORCH_TEST_SKIP_FAST", "0")
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    start = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, cwd=test_file.parent, env=env, capture_output=True, text=True,
            timeout=timeout,
        )
        rc, output, timed_out = proc.returncode, proc.stdout + proc.stderr, False
    except subprocess.TimeoutExpired as e:
        rc, timed_out = None, True
        output = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    elapsed = time.monotonic() - start
    log.write_text(output)
    summary = ""
    for line in reversed(output.splitlines()):
        if re.search(r"\d+ (passed|failed|error|errors|skipped)\b|no tests ran", line):
            summary = line.strip("= ").strip()
            break
    results = parse_junit(junit) if junit.exists() else {}
    collection_error = ""
    if rc in (2, 3, 4) or (not results and not timed_out):
        m = re.search(r"^E\s+(.*)$", output, re.MULTILINE)
        collection_error = m.group(1) if m else _first_line(output[-2000:])
    return {
        "mode": mode,
        "rc": rc,
        "timed_out": timed_out,
        "seconds": round(elapsed, 1),
        "summary": summary,
        "collection_error": collection_error,
        "results": results,
        "log": str(log),
    }


def count(results: dict[str, tuple[str, str]], outcome: str) -> int:
    return sum(1 for o, _ in results.values() if o == outcome)


def regressions(before: dict, after: dict) -> list[tuple[str, str]]:
    """Tests that passed in ``before`` and did not pass in ``after``."""
    out = []
    for test_id, (outcome, _) in sorted(before.items()):
        if outcome != PASSED:
            continue
        new_outcome, message = after.get(test_id, (MISSING, "not run"))
        if new_outcome != PASSED:
            out.append((test_id, f"[{new_outcome}] {message}"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="upstream test files")
    parser.add_argument("--modes", default="stock,aliasguard,audit")
    # Serial by default: some upstream tests depend on what ran before them
    # in the same process (test_python_dispatch's logging tests fail with a
    # TypeError after some others), and xdist's load balancing changes which
    # tests share a worker from one run to the next, so parallel runs of the
    # same mode disagree with each other.
    parser.add_argument("-n", "--workers", type=int, default=1, help="pytest-xdist workers (1: serial)")
    parser.add_argument(
        "-k", "--keyword", action="append", default=[],
        help="FILE_STEM=EXPR: pytest -k filter for one file (e.g. test_autograd=view)",
    )
    parser.add_argument("--timeout", type=int, default=1500, help="seconds per file and mode")
    parser.add_argument("--out", type=Path, default=Path("/tmp/upstream-results"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", type=Path, help="write all per-test outcomes here")
    args = parser.parse_args(argv)

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from {sorted(MODES)}")
    keywords = {}
    for item in args.keyword:
        stem, sep, expr = item.partition("=")
        if not sep:
            parser.error(f"-k takes FILE_STEM=EXPR, got {item!r}")
        keywords[stem] = expr
    args.out.mkdir(parents=True, exist_ok=True)

    report: dict[str, dict] = {}
    any_regression = False
    for test_file in args.files:
        test_file = test_file.resolve()
        if not test_file.is_file():
            print(f"{test_file}: no such file", file=sys.stderr)
            return 2
        runs = {}
        for mode in modes:
            run = run_mode(
                test_file, mode, args.out, args.python, args.workers,
                keywords.get(test_file.stem), args.timeout,
            )
            runs[mode] = run
            print(
                f"[{test_file.name} / {mode}] {run['seconds']}s rc={run['rc']}"
                f"{' TIMED OUT' if run['timed_out'] else ''}: {run['summary']}",
                flush=True,
            )
        report[test_file.name] = runs

    print("\n== per-file counts (passed / failed / skipped) ==")
    for name, runs in report.items():
        cells = []
        for mode, run in runs.items():
            res = run["results"]
            if run["collection_error"] and not res:
                cells.append(f"{mode}: NOT RUN ({run['collection_error']})")
            else:
                cells.append(
                    f"{mode}: {count(res, PASSED)}/{count(res, FAILED)}/{count(res, SKIPPED)}"
                )
        keyword = keywords.get(Path(name).stem)
        print(f"{name}{f' [-k {keyword}]' if keyword else ''}: " + "; ".join(cells))

    pairs = [("stock", "aliasguard", True), ("aliasguard", "audit", True), ("aliasguard", "audit_kernels", False)]
    for before, after, counts in pairs:
        if not any(before in runs and after in runs for runs in report.values()):
            continue
        print(f"\n== pass {before}, not pass {after}{'' if counts else ' (information only)'} ==")
        total = 0
        for name, runs in report.items():
            if before not in runs or after not in runs:
                continue
            regs = regressions(runs[before]["results"], runs[after]["results"])
            total += len(regs)
            for test_id, message in regs:
                print(f"{name}::{test_id}: {message}")
        print(f"({total} test(s))")
        any_regression |= counts and total > 0

    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=list))
    return 1 if any_regression else 0


if __name__ == "__main__":
    sys.exit(main())
