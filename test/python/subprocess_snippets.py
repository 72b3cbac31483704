"""Run a Python snippet in a fresh interpreter, for tests of crash-prone paths.

A segfault in the test process would kill the whole pytest run; in a child it
fails one test. The child gets the repository on ``sys.path`` (so it imports
the in-tree ``aliasguard``) and the same interpreter as the tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class SnippetResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def signal_name(self) -> str | None:
        """The signal that killed the child (e.g. ``"SIGSEGV"``), or None."""
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def describe(self) -> str:
        how = f"killed by {self.signal_name}" if self.signal_name else f"exit code {self.returncode}"
        return f"child {how}\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr[-4000:]}"


def run_snippet(code: str, *, timeout: float = 120.0, env: dict[str, str] | None = None) -> SnippetResult:
    """Run ``code`` (dedented) with ``python -c`` in a new process and return how it ended.

    The child runs with ``faulthandler`` on, so a crash leaves a Python
    traceback on stderr for the failure message.
    """
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (REPO_ROOT, child_env.get("PYTHONPATH", "")) if p
    )
    child_env["PYTHONFAULTHANDLER"] = "1"
    if env:
        child_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env,
        cwd=REPO_ROOT,
    )
    return SnippetResult(proc.returncode, proc.stdout, proc.stderr)


def assert_clean_exit(result: SnippetResult) -> None:
    """The child was not killed by a signal and exited with status 0."""
    assert result.signal_name is None, result.describe()
    assert result.returncode == 0, result.describe()
