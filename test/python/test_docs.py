"""tools/check_docs.py: the docs and the code's Notes point at things that exist.

The checker runs over a small made-up tree for each kind of finding, then over
this repository. Findings in files owned elsewhere that were still open when
this test was written are listed in ``OPEN_ELSEWHERE``, each an
``xfail(strict=True)`` test that starts failing once the finding is fixed
(then remove it from the list).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_docs", ROOT / "tools" / "check_docs.py")
assert _spec is not None and _spec.loader is not None
check_docs = importlib.util.module_from_spec(_spec)
sys.modules["check_docs"] = check_docs
_spec.loader.exec_module(check_docs)

# Spelled in two parts so that this file holds no tracker number itself.
TRACKER = "issu" + "e 7"


def _tree(tmp_path: Path, files: dict) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _kinds(findings) -> list:
    return [(f.path, f.line, f.kind) for f in findings]


# --- each check on a made-up tree -------------------------------------------------------


def test_paths_in_backticks_must_exist(tmp_path):
    root = _tree(
        tmp_path,
        {
            "torch/csrc/utils/a.h": "",
            "torch/csrc/utils/a.cpp": "",
            "bench/b.py": "",
            "README.md": "Run `bench/b.py` and `PYTHONPATH=. python bench/missing.py`.\n",
            "docs/x.md": "`torch/csrc/utils/a.{h,cpp}` and `torch/csrc/utils/gone.{h,cpp}`; `aliasguard/*.py`\n"
            "```\nnot checked: `tools/in_a_fence.py`\n```\n"
            "upstream's `torch/utils/checkpoint.py` is PyTorch's.\n"
            "| folder | upstream home |\n|---|---|\n| `bench/` | `aten/src/ATen/native/TensorShape.cpp` |\n",
        },
    )
    findings = check_docs.check_paths(root)
    assert _kinds(findings) == [
        ("README.md", 1, "path"),
        ("docs/x.md", 1, "path"),
        ("docs/x.md", 1, "path"),
        ("docs/x.md", 1, "path"),
    ]
    messages = " ".join(f.message for f in findings)
    assert "bench/missing.py" in messages
    assert "torch/csrc/utils/gone.h" in messages and "torch/csrc/utils/gone.cpp" in messages
    assert "aliasguard/*.py" in messages  # a glob with no match


def test_architecture_file_table_checks_bare_names_relative_to_the_cell(tmp_path):
    root = _tree(
        tmp_path,
        {
            "aliasguard/_views.py": "",
            "aliasguard/checkpoint.py": "",
            "top_level.py": "",
            "docs/architecture.md": "| file | one job |\n|---|---|\n"
            "| `aliasguard/_views.py`, `checkpoint.py`, `_gone.py` | the API |\n"
            "| `top_level.py` | root |\n",
        },
    )
    findings = check_docs.check_paths(root)
    assert _kinds(findings) == [("docs/architecture.md", 3, "path")]
    assert "_gone.py" in findings[0].message


def test_note_pointers_must_name_a_defined_note(tmp_path):
    root = _tree(
        tmp_path,
        {
            "a.cpp": "// Note [Defined]\n// ~~~~~~~~~~~~~~\n// text\nint x;  // See Note [Defined]\n"
            '  "see Note [Split "\n  "literal]"\n',
            "b.py": "# Note [Split literal]\n# ~~~~~~~~~~~~~~~~~~~~\n# See Note [Wrapped\n# name]\n",
            "c.h": "// Note [Wrapped name]\n// ~~~~~\n// Note [No underline]\n// text\n",
            "d.md": "See Note [Nowhere].\n",
            "build/e.cpp": "// See Note [Ignored in build]\n",
        },
    )
    findings = check_docs.check_notes(root)
    assert _kinds(findings) == [("c.h", 3, "note"), ("d.md", 1, "note")]


def test_note_in_file_pointers_in_docs(tmp_path):
    root = _tree(
        tmp_path,
        {
            "torch/csrc/utils/alias_audit.cpp": "// Note [Alias audit]\n// ~~~~~~~~~~~~~~~~~~~~\n",
            "docs/x.md": "see `// Note [Alias audit]` in `torch/csrc/utils/alias_audit.cpp`;\n"
            "see `// Note [Alias audit]` in\n`torch/csrc/utils/alias_correction.cpp`.\n",
        },
    )
    findings = check_docs.check_notes(root)
    assert _kinds(findings) == [("docs/x.md", 2, "note-file")]
    assert "torch/csrc/utils/alias_audit.cpp" in findings[0].message


def test_markdown_links_and_anchors(tmp_path):
    root = _tree(
        tmp_path,
        {
            "README.md": "[a](docs/a.md) [b](docs/b.md) [c](https://example.com) [d](docs/a.md#the-api-f4)\n"
            "[e](docs/a.md#gone) [f](#install)\n\n## Install\n",
            "docs/a.md": "# A\n\n## The API (F4)\n\n```\n## not a heading\n```\n[up](../README.md#install)\n",
        },
    )
    findings = check_docs.check_links(root)
    assert _kinds(findings) == [("README.md", 1, "link"), ("README.md", 2, "link")]
    assert "docs/b.md" in findings[0].message and "#gone" in findings[1].message


def test_tracker_numbers(tmp_path):
    root = _tree(
        tmp_path,
        {"a.py": f'"""Fixes {TRACKER.upper()}."""\n', "b.md": "an issue 7x; issue #7\n", "build/c.py": TRACKER},
    )
    files = [root / "a.py", root / "b.md", root / "build" / "c.py"]
    findings = check_docs.check_tracker_numbers(root, files)
    assert _kinds(findings) == [("a.py", 1, "tracker")]


def test_brace_expansion():
    assert check_docs.expand_braces("a/track_views.{h,cpp}") == ["a/track_views.h", "a/track_views.cpp"]
    assert check_docs.expand_braces("x{1,2}y{a,b}") == ["x1ya", "x1yb", "x2ya", "x2yb"]
    assert check_docs.expand_braces("plain.py") == ["plain.py"]


# --- this repository ------------------------------------------------------------------------

# Findings in files this test's author does not own, as (path, kind, text in
# the message). Line numbers are left out: they move with unrelated edits.
OPEN_ELSEWHERE: list[tuple[str, str, str]] = []


def _matches(finding, known) -> bool:
    path, kind, text = known
    return finding.path == path and finding.kind == kind and text in finding.message


@pytest.fixture(scope="module")
def repo_findings():
    return check_docs.check_all(ROOT)


def test_repository_has_no_other_findings(repo_findings):
    unexpected = [f for f in repo_findings if not any(_matches(f, k) for k in OPEN_ELSEWHERE)]
    assert not unexpected, "\n".join(map(str, unexpected))


@pytest.mark.parametrize(
    "known",
    [
        pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=f"open: {k[0]}: {k[1]} {k[2]}".strip()))
        for k in OPEN_ELSEWHERE
    ],
    ids=[f"{k[0]}:{k[1]}" for k in OPEN_ELSEWHERE],
)
def test_open_finding_elsewhere_is_fixed(repo_findings, known):
    assert not [f for f in repo_findings if _matches(f, known)]


def test_command_line_exit_status(tmp_path):
    clean = _tree(tmp_path / "clean", {"README.md": "# x\n"})
    dirty = _tree(tmp_path / "dirty", {"README.md": "[a](missing.md)\n"})
    script = str(ROOT / "tools" / "check_docs.py")
    ok = subprocess.run([sys.executable, script, "--root", str(clean)], capture_output=True, text=True)
    bad = subprocess.run([sys.executable, script, "--root", str(dirty)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert bad.returncode == 1 and "README.md:1: link:" in bad.stdout


def _core_headers() -> list:
    return [
        path
        for folder in ("c10", "aten", "torch")
        for path in sorted((ROOT / folder).rglob("*.h"))
        if not path.name.startswith("python_")
    ]


def test_architecture_names_every_hook_the_core_calls_up_through():
    """Every hook setter (a ``set_*`` taking a callback or hook table) and every abstract class
    of the core's headers is in architecture.md's table of upward calls, and nothing else is."""
    import re

    section = (ROOT / "docs" / "architecture.md").read_text().split("## Where the core calls up", 1)[1]
    section = section.split("\n## ", 1)[0]
    hooks = set()
    for header in _core_headers():
        text = header.read_text()
        for name, parameter in re.findall(r"ALIASGUARD_API void (set_\w+)\(\s*(?:const )?(\w+)", text):
            if parameter != "bool":
                hooks.add(name)
        for name, body in re.findall(r"class ALIASGUARD_API (\w+)(?: final)?(?: : [^{]*)? \{(.*?)\n\};", text, re.S):
            if re.search(r"\bvirtual\b[^;]*\)[^;]*= 0;", body):
                hooks.add(name)
    assert {"set_fast_path_hooks", "FastPathPolicy", "WriteChecker"} <= hooks  # the scan finds them
    missing = sorted(h for h in hooks if f"`{h}`" not in section)
    assert not missing, f"docs/architecture.md's 'Where the core calls up' does not name {missing}"
    named = set(re.findall(r"^\| `(\w+)`", section, re.M))
    assert named <= hooks, f"the table names hooks the core no longer has: {sorted(named - hooks)}"
