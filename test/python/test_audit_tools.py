"""The audit as a tool: the pytest plugin (through pytester), ``python -m aliasguard audit``, and the
command line of ``python -m aliasguard``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

pytest_plugins = ("pytester",)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A small library with a deliberately buggy wrapper subclass and a correct one, as its authors would test it.
SUBCLASSES = textwrap.dedent(
    """
    import torch
    from torch.utils._python_dispatch import return_and_correct_aliasing
    from torch.utils._pytree import tree_map_only

    aten = torch.ops.aten


    class Wrapper(torch.Tensor):
        @staticmethod
        def __new__(cls, elem):
            return torch.Tensor._make_wrapper_subclass(
                cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype
            )

        def __init__(self, elem):
            self.elem = elem

        def __tensor_flatten__(self):
            return ["elem"], None

        @classmethod
        def __tensor_unflatten__(cls, inner, ctx, size, stride):
            return cls(inner["elem"])

        @classmethod
        def run(cls, func, args, kwargs):
            unwrap = lambda t: t.elem
            return func(*tree_map_only(cls, unwrap, args), **tree_map_only(cls, unwrap, kwargs))


    class GoodTensor(Wrapper):
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = tree_map_only(torch.Tensor, cls, cls.run(func, args, kwargs))
            return return_and_correct_aliasing(func, args, kwargs, out)


    class BuggyTensor(Wrapper):
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = cls.run(func, args, kwargs)
            if func is aten.view.default:
                out = out.clone()  # bug: the view copies the inner data
            if func is aten.add_.Tensor:
                return None  # bug: the in-place handler returns nothing
            return tree_map_only(torch.Tensor, cls, out)
    """
)

SUITE = textwrap.dedent(
    """
    import torch
    from subclasses import BuggyTensor, GoodTensor


    def test_buggy_view():
        x = BuggyTensor(torch.randn(4))
        x.view(2, 2)


    def test_buggy_inplace():
        x = BuggyTensor(torch.randn(4))
        x.add_(1)


    def test_good():
        x = GoodTensor(torch.randn(4))
        x.view(2, 2).t()
        x.add_(1)
        x.unbind(0)


    def test_plain():
        y = torch.randn(4, requires_grad=True)
        (y.view(2, 2) * 2).sum().backward()
    """
)


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makepyfile(subclasses=SUBCLASSES, test_lib=SUITE)
    # The subprocess imports the in-tree aliasguard (and the suite's own modules).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO_ROOT, str(pytester.path)]))
    return pytester


def _table_rows(output: str) -> list[str]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\s*#\s+op\s+class or mode", line))
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        rows.append(line)
    return rows


def test_plugin_reports_only_the_buggy_subclass(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess(
        "-p", "aliasguard.pytest_plugin", "--aliasguard-audit", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=4)
    output = result.stdout.str()
    assert "aliasguard audit" in output
    rows = _table_rows(output)
    assert all("subclasses.BuggyTensor" in row for row in rows), rows
    found = {(row.split()[1], row.split()[3]) for row in rows}
    assert found == {
        ("aten::view", "view_storage"),  # the wrapper's own storage: repaired by the correction
        ("aten::view", "view_inner_copy"),  # the copied inner data: not repairable
        ("aten::add_.Tensor", "write_not_argument"),  # None from an in-place handler
    }
    by_kind = {row.split()[3]: row for row in rows}
    assert " yes " in by_kind["view_storage"] and " no " in by_kind["view_inner_copy"]
    assert (
        "test_lib.py:7" in by_kind["view_inner_copy"] and "test_lib.py::test_buggy_view" in by_kind["view_inner_copy"]
    )
    assert "test_lib.py:12" in by_kind["write_not_argument"]
    assert "test_lib.py::test_buggy_inplace" in by_kind["write_not_argument"]
    assert "apply the view op to each inner tensor instead of copying it" in output
    assert "GoodTensor" not in output


def test_plugin_strict_fails_the_tests_that_trigger_a_violation(suite: pytest.Pytester) -> None:
    json_path = suite.path / "audit.json"
    result = suite.runpytest_subprocess(
        "-p",
        "aliasguard.pytest_plugin",
        "--aliasguard-audit=strict",
        f"--aliasguard-audit-json={json_path}",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["FAILED test_lib.py::test_buggy_view*", "FAILED test_lib.py::test_buggy_inplace*"])
    assert "aliasguard audit (strict) of test_lib.py::test_buggy_view" in result.stdout.str()
    data = json.loads(json_path.read_text())
    assert data["distinct"] == 3
    assert {v["example"] for v in data["violations"]} == {
        "test_lib.py::test_buggy_view",
        "test_lib.py::test_buggy_inplace",
    }


def test_entry_point_is_inert_without_the_option(suite: pytest.Pytester) -> None:
    # What `pip install` registers (aliasguard_pytest) must not import aliasguard, which changes torch.
    suite.makepyfile(
        test_inert="import sys\n\ndef test_aliasguard_not_imported():\n    assert 'aliasguard' not in sys.modules\n"
    )
    result = suite.runpytest_subprocess("-p", "aliasguard_pytest", "-p", "no:cacheprovider", "test_inert.py")
    result.assert_outcomes(passed=1)
    assert "aliasguard audit" not in result.stdout.str()
    audited = suite.runpytest_subprocess(
        "-p", "aliasguard_pytest", "--aliasguard-audit", "-p", "no:cacheprovider", "test_lib.py"
    )
    audited.assert_outcomes(passed=4)
    assert "3 distinct aliasing violations" in audited.stdout.str()
    bad = suite.runpytest_subprocess("-p", "aliasguard_pytest", "--aliasguard-audit-json=x.json")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "--aliasguard-audit-json needs --aliasguard-audit" in bad.stderr.str()


SCRIPT = textwrap.dedent(
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode


    class LazyClone(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.clone.default:
                return args[0]  # bug: clone answered with its input
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.view.default:
                return out.clone()  # bug: view answered with a copy
            return out


    x = torch.randn(4)
    with LazyClone():
        for _ in range(2):
            x.clone()
        x.view(2, 2)
    print("script finished")
    """
)


def _run_cli(*args: str, cwd: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    return subprocess.run(
        [sys.executable, "-m", "aliasguard", "audit", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_reports_both_violations_with_their_lines(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    json_path = tmp_path / "report.json"
    result = _run_cli("--json", str(json_path), "train.py", cwd=str(tmp_path))
    assert result.returncode == 1, result.stderr  # violations found
    assert "script finished" in result.stdout
    assert "2 distinct aliasing violations (3 occurrences)" in result.stderr
    data = json.loads(json_path.read_text())
    found = {(v["op"], v["kind"], v["location"], v["count"]) for v in data["violations"]}
    assert found == {
        ("aten::clone", "fresh_is_argument", "train.py:19", 2),
        ("aten::view", "view_copy", "train.py:20", 1),
    }
    assert all(v["owner"] == "mode __main__.LazyClone" for v in data["violations"])


def test_cli_passes_arguments_and_exit_status(tmp_path) -> None:
    script = tmp_path / "clean.py"
    script.write_text("import sys, torch\ntorch.randn(4).view(2, 2)\nprint(sys.argv[1:])\nsys.exit(int(sys.argv[1]))\n")
    ok = _run_cli("clean.py", "0", cwd=str(tmp_path))
    assert ok.returncode == 0 and "['0']" in ok.stdout and "no aliasing violations" in ok.stderr
    failing = _run_cli("clean.py", "3", cwd=str(tmp_path))
    assert failing.returncode == 3
    missing = _run_cli("nope.py", cwd=str(tmp_path))
    assert missing.returncode == 2 and "no such script: nope.py" in missing.stderr


KERNEL_SCRIPT = textwrap.dedent(
    """
    import torch

    lib = torch.library.Library("aliasguard_cli_kernels", "DEF")
    lib.define("returns_input(Tensor self) -> Tensor")
    lib.impl("returns_input", lambda t: t, "CPU")  # bug: a fresh return answered with the input
    torch.ops.aliasguard_cli_kernels.returns_input(torch.ones(2))
    """
)


def test_cli_checks_kernels_only_with_kernels(tmp_path) -> None:
    (tmp_path / "kernel.py").write_text(KERNEL_SCRIPT)
    default = _run_cli("kernel.py", cwd=str(tmp_path))
    assert default.returncode == 0 and "no aliasing violations" in default.stderr, default.stderr
    json_path = tmp_path / "kernels.json"
    checked = _run_cli("--kernels", "--json", str(json_path), "kernel.py", cwd=str(tmp_path))
    assert checked.returncode == 1, checked.stderr
    (violation,) = json.loads(json_path.read_text())["violations"]
    assert (violation["op"], violation["kind"], violation["location"]) == (
        "aliasguard_cli_kernels::returns_input",
        "fresh_is_argument",
        "kernel.py:7",
    )


def test_plugin_checks_kernels_only_with_the_kernels_option(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO_ROOT, str(pytester.path)]))
    pytester.makepyfile(test_kernel="def test_kernel():\n" + textwrap.indent(KERNEL_SCRIPT, "    "))
    common = ("-p", "aliasguard_pytest", "--aliasguard-audit=strict", "-p", "no:cacheprovider")
    pytester.runpytest_subprocess(*common).assert_outcomes(passed=1)
    pytester.runpytest_subprocess(*common, "--aliasguard-audit-kernels").assert_outcomes(failed=1)
    bad = pytester.runpytest_subprocess("-p", "aliasguard_pytest", "--aliasguard-audit-kernels")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "--aliasguard-audit-kernels needs --aliasguard-audit" in bad.stderr.str()


# --- command-line forms of the plugin ------------------------------------------------


@pytest.fixture
def suite_in_folder(suite: pytest.Pytester) -> pytest.Pytester:
    """The suite in tests/, and a failing test outside it that a path argument must leave out."""
    tests = suite.mkdir("tests")
    for name in ("subclasses.py", "test_lib.py"):
        (suite.path / name).rename(tests / name)
    suite.makepyfile(test_outside="def test_outside():\n    raise AssertionError('collected from outside tests/')\n")
    return suite


def test_plugin_flag_followed_by_a_path(suite_in_folder: pytest.Pytester) -> None:
    # The flag must not take the path for its value.
    result = suite_in_folder.runpytest_subprocess(
        "-p", "aliasguard.pytest_plugin", "--aliasguard-audit", "tests/", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=4)
    assert "3 distinct aliasing violations" in result.stdout.str()


@pytest.mark.parametrize("option, failed", [("--aliasguard-audit=strict", 2), ("--aliasguard-audit=report", 0)])
def test_plugin_mode_with_equals_followed_by_a_path(suite_in_folder: pytest.Pytester, option: str, failed: int) -> None:
    result = suite_in_folder.runpytest_subprocess(
        "-p", "aliasguard.pytest_plugin", option, "tests", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=4 - failed, failed=failed)
    assert "3 distinct aliasing violations" in result.stdout.str()


def test_plugin_mode_after_a_space_is_refused_naming_the_equals_form(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("-p", "aliasguard.pytest_plugin", "--aliasguard-audit", "strict")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "'strict' was read as a test path" in result.stderr.str()
    assert "--aliasguard-audit=strict" in result.stderr.str()


def test_plugin_unknown_mode_is_refused_naming_it(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("-p", "aliasguard.pytest_plugin", "--aliasguard-audit=loud", "test_lib.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert re.search(r"--aliasguard-audit.*'loud'", result.stderr.str()), result.stderr.str()


def test_plugin_help_lists_both_forms(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("-p", "aliasguard_pytest", "--help")
    assert result.ret == 0
    help_text = result.stdout.str()
    assert re.search(r"^\s+--aliasguard-audit\s+run every test", help_text, re.M), help_text
    assert re.search(r"^\s+--aliasguard-audit=strict\s", help_text, re.M), help_text
    assert "FILE's folder must exist" in help_text


def test_plugin_json_into_a_missing_folder_fails_before_any_test(suite: pytest.Pytester) -> None:
    marker = suite.path / "ran"
    suite.makepyfile(test_marker=f"def test_marker():\n    open({str(marker)!r}, 'w').close()\n")
    missing = suite.path / "no-such-folder" / "audit.json"
    result = suite.runpytest_subprocess(
        "-p", "aliasguard.pytest_plugin", "--aliasguard-audit", f"--aliasguard-audit-json={missing}", "test_marker.py"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    stderr = result.stderr.str()
    assert f"--aliasguard-audit-json {missing}: the folder {missing.parent} does not exist" in stderr
    assert "Traceback" not in stderr + result.stdout.str()
    assert not marker.exists(), "a test ran before the JSON path was refused"
    # A folder given for the file is refused too.
    audit = ("-p", "aliasguard.pytest_plugin", "--aliasguard-audit")
    folder = suite.runpytest_subprocess(*audit, f"--aliasguard-audit-json={suite.path}", "test_marker.py")
    assert folder.ret == pytest.ExitCode.USAGE_ERROR
    assert "is a folder; name a file in it" in folder.stderr.str()


def test_cli_json_into_a_missing_folder_fails_before_the_script(tmp_path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    result = _run_cli("--json", "out/report.json", "train.py", cwd=str(tmp_path))
    assert result.returncode == 2
    assert "--json out/report.json: the folder" in result.stderr and "out does not exist" in result.stderr
    assert "script finished" not in result.stdout  # the script never ran
    assert "Traceback" not in result.stderr


def test_cli_json_path_is_taken_before_the_script_changes_folder(tmp_path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "moves.py").write_text("import os\nos.chdir('elsewhere')\n")
    result = _run_cli("--json", "report.json", "moves.py", cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "report.json").read_text())["distinct"] == 0
    assert not (tmp_path / "elsewhere" / "report.json").exists()


# --- python -m aliasguard -------------------------------------------------------------


def _run_main(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aliasguard", *args],
        env={**os.environ, "PYTHONPATH": REPO_ROOT},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_main_help_prints_usage_and_runs_nothing(flag: str) -> None:
    result = _run_main(flag)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m aliasguard")
    assert "audit" in result.stdout and "demo" in result.stdout
    assert "The upstream issue's script" not in result.stdout  # the demo did not run


def test_main_unknown_command_is_an_error_naming_it() -> None:
    result = _run_main("audti", "train.py")
    assert result.returncode == 2
    assert "invalid choice: 'audti'" in result.stderr
    assert "The upstream issue's script" not in result.stdout


def test_main_audit_help_is_the_audit_usage() -> None:
    result = _run_main("audit", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m aliasguard audit")
