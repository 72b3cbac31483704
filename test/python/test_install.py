"""Set-up errors a user meets: an unbuilt checkout, a build for another torch,
a configure against an interpreter without torch, and the package metadata.

Each import runs in a subprocess on a copy of the package, so the process that
runs the tests keeps its own aliasguard.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import aliasguard

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = pathlib.Path(aliasguard.__file__).resolve().parent

# Prints the ImportError's message, and whether any aliasguard library was
# loaded before it was raised.
IMPORT_PROBE = textwrap.dedent(
    """
    import sys
    try:
        import aliasguard
    except ImportError as e:
        print("ImportError:", e)
        print("_C loaded:", "aliasguard._C" in sys.modules)
        sys.exit(1)
    print("imported")
    """
)


def _copy_package(dest: pathlib.Path, *, libraries: bool, build_info: bool) -> pathlib.Path:
    pkg = dest / "aliasguard"
    pkg.mkdir(parents=True)
    for f in PACKAGE.iterdir():
        if f.name == "_build_info.py":
            if build_info:
                shutil.copy2(f, pkg / f.name)
        elif f.suffix == ".py" or (libraries and f.suffix == ".so"):
            shutil.copy2(f, pkg / f.name)
    return pkg


def _import_in(path: pathlib.Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(path))
    return subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE],
        cwd=path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_build_records_running_torch() -> None:
    from aliasguard import _build_info

    assert _build_info.TORCH_VERSION == torch.__version__
    assert _build_info.TORCH_CXX11_ABI == torch._C._GLIBCXX_USE_CXX11_ABI


def test_copy_of_built_package_imports(tmp_path: pathlib.Path) -> None:
    # The control for the tests below: the same copy, unaltered, imports.
    _copy_package(tmp_path, libraries=True, build_info=True)
    result = _import_in(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "imported"


@pytest.mark.parametrize("build_info", [False, True], ids=["unconfigured", "configured-not-compiled"])
def test_unbuilt_checkout_says_to_build(tmp_path: pathlib.Path, build_info: bool) -> None:
    _copy_package(tmp_path, libraries=False, build_info=build_info)
    result = _import_in(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("ImportError: aliasguard is not built; run `make build`"), result.stdout
    assert "circular import" not in result.stdout
    assert lines[1] == "_C loaded: False"


def test_build_for_another_torch_is_refused(tmp_path: pathlib.Path) -> None:
    pkg = _copy_package(tmp_path, libraries=True, build_info=True)
    info = pkg / "_build_info.py"
    text = info.read_text()
    assert f'TORCH_VERSION = "{torch.__version__}"' in text
    info.write_text(text.replace(f'TORCH_VERSION = "{torch.__version__}"', 'TORCH_VERSION = "2.13.99"'))
    result = _import_in(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        f"ImportError: aliasguard was built against torch 2.13.99 but torch {torch.__version__} is imported"
    ), result.stdout
    assert "make build" in lines[0]
    assert "pip install --no-build-isolation" in lines[0]
    # Refused before any of the libraries built for the other torch is loaded.
    assert lines[1] == "_C loaded: False"


def test_configure_without_torch_names_interpreter_and_fix(tmp_path: pathlib.Path) -> None:
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not on PATH")
    # A fresh venv of the same Python has no torch. PYTHONPATH points at the
    # repository, whose own torch/ folder must not pass for the real package.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run(
        [cmake, "-S", str(REPO_ROOT), "-B", str(tmp_path / "build"), f"-DPython_EXECUTABLE={python}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    err = " ".join(result.stderr.split())  # CMake wraps long messages
    assert f"aliasguard builds against the torch installed for {python}" in err, result.stderr
    assert "cannot import torch" in err
    assert "No module named 'torch'" in err
    assert "pip install --no-build-isolation ." in err


def test_package_metadata() -> None:
    tomllib = pytest.importorskip("tomllib")
    requirements = pytest.importorskip("packaging.requirements")
    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    (torch_req,) = [
        requirements.Requirement(r) for r in meta["dependencies"] if requirements.Requirement(r).name == "torch"
    ]
    # A range, not a pin: the user's torch stays, and the torch under test is in it.
    assert not any(s.operator in ("==", "===") for s in torch_req.specifier), torch_req
    assert torch_req.specifier.contains(torch.__version__.split("+")[0]), (torch_req, torch.__version__)
    assert all(torch_req.specifier.contains(v) for v in ("2.13.0", "2.14.1", "2.15.0"))  # README: Install
    assert not torch_req.specifier.contains("2.16.0")
    assert meta["requires-python"] == ">=3.10"
    assert meta["license"] == "BSD-3-Clause"
    assert (REPO_ROOT / "LICENSE").read_text().startswith("BSD 3-Clause License")


def _check_system_deps(step: str, include_dir: pathlib.Path) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ,
        ALIASGUARD_SYSTEM_INCLUDE_DIR=str(include_dir),
        ALIASGUARD_INSTALL_SYSTEM_DEPS="0",
        PYTHON_BOOTSTRAP=sys.executable,
    )
    return subprocess.run(
        [str(REPO_ROOT / "tools" / "check_system_deps.sh"), step],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("step", "package", "header"),
    [("test", "libgtest-dev", "gtest/gtest.h"), ("bench", "libbenchmark-dev", "benchmark/benchmark.h")],
)
def test_missing_system_packages_are_named(
    tmp_path: pathlib.Path, step: str, package: str, header: str
) -> None:
    # Without the headers, the step stops and names the exact Debian package.
    result = _check_system_deps(step, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"`make {step}` needs these Debian packages" in result.stderr
    assert f"    apt-get install {package}\n" in result.stderr
    other = {"libgtest-dev", "libbenchmark-dev"} - {package}
    assert not any(o in result.stderr for o in other)
    # `make build` / `make demo` need neither.
    assert _check_system_deps("build", tmp_path).returncode == 0
    # With the header there, the step goes ahead.
    (tmp_path / header).parent.mkdir(parents=True)
    (tmp_path / header).write_text("")
    result = _check_system_deps(step, tmp_path)
    assert result.returncode == 0, result.stderr
