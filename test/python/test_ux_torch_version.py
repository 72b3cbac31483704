"""The build refuses a torch outside the supported range before building anything.

The range lives once, in pyproject.toml's dependencies; ``cmake/CheckTorchVersion.cmake``
reads it and stops the configure (FATAL_ERROR) for any other torch, naming the
version found, the range and what to do. The tests run the check as a CMake
script with made-up versions, and a real configure against an interpreter
whose ``torch`` is a stand-in module: no test installs or removes a torch.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECK = REPO_ROOT / "cmake" / "CheckTorchVersion.cmake"
CMAKE = shutil.which("cmake")

pytestmark = pytest.mark.skipif(CMAKE is None, reason="cmake is not on PATH")


def _check(version: str) -> subprocess.CompletedProcess[str]:
    assert CMAKE is not None
    return subprocess.run(
        [CMAKE, f"-DTORCH_VERSION={version}", "-P", str(CHECK)], capture_output=True, text=True, timeout=60
    )


def _flat(text: str) -> str:
    return " ".join(text.split())  # CMake wraps long messages


def _pyproject_range() -> tuple[str, str]:
    tomllib = pytest.importorskip("tomllib")
    dependencies = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch_dependency,) = [d for d in dependencies if d.startswith("torch")]
    match = re.fullmatch(r"torch>=([\d.]+),<([\d.]+)", torch_dependency)
    assert match, torch_dependency
    return match.group(1), match.group(2)


@pytest.mark.parametrize("version", ["2.13.0", "2.13.0+cpu", "2.14.1", "2.14.1+cu130", "2.14.0rc1"])
def test_supported_torch_passes(version: str) -> None:
    result = _check(version)
    assert result.returncode == 0, result.stderr
    assert f"torch {version} is supported (torch>=2.13,<2.15)" in result.stdout + result.stderr


@pytest.mark.parametrize("version", ["2.15.0", "2.15.0a0+git1234", "2.16.1+cpu", "2.12.1", "1.13.1"])
def test_unsupported_torch_stops_the_configure(version: str) -> None:
    result = _check(version)
    assert result.returncode != 0
    err = _flat(result.stderr)
    assert "CMake Error" in err
    assert f"found torch {version} (given as TORCH_VERSION), outside the supported range torch>=2.13,<2.15" in err
    assert 'pip install "torch>=2.13,<2.15"' in err  # what to do
    assert "README.md (Tested versions)" in err and "docs/design.md (How to add a torch version)" in err


@pytest.mark.parametrize("version", ["", "banana", "v2.13"])
def test_unreadable_version_is_named(version: str) -> None:
    result = _check(version)
    assert result.returncode != 0
    assert f'cannot read the torch version "{version}"' in _flat(result.stderr)


def test_script_without_a_version_prints_its_usage() -> None:
    assert CMAKE is not None
    result = subprocess.run([CMAKE, "-P", str(CHECK)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "usage: cmake -DTORCH_VERSION=<torch.__version__> -P" in _flat(result.stderr)


def test_range_is_the_one_in_pyproject() -> None:
    # The check reads the range from pyproject.toml: its bounds are the edges.
    low, high = _pyproject_range()
    assert _check(f"{low}.0").returncode == 0
    assert _check(f"{high}.0").returncode != 0
    assert f"torch>={low},<{high}" in _flat(_check(f"{high}.0").stderr)


# A stand-in for torch: enough for the interpreter query of TorchFromPython.cmake.
FAKE_TORCH = textwrap.dedent(
    """
    import types

    __version__ = {version!r}
    _C = types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True)
    version = types.SimpleNamespace(cuda=None)
    """
)


def test_configure_against_an_unsupported_torch_fails_before_building(tmp_path: pathlib.Path) -> None:
    assert CMAKE is not None
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    fake = pathlib.Path(site) / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_TORCH.format(version="2.15.0"))
    build = tmp_path / "build"
    result = subprocess.run(
        [CMAKE, "-S", str(REPO_ROOT), "-B", str(build), f"-DPython_EXECUTABLE={python}"],
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0, result.stdout
    err = _flat(result.stderr)
    assert f"found torch 2.15.0 for {python} (at {fake}), outside the supported range torch>=2.13,<2.15" in err, err
    assert not (build / "build.ninja").exists() and not (build / "Makefile").exists()


def test_wheel_requires_the_range_not_a_pin() -> None:
    # The documented choice (pyproject.toml): the wheel's torch requirement is
    # the static range, never a pin to the build's torch, so pip keeps any
    # supported torch; the import checks the exact version.
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert "dependencies" not in project.get("dynamic", [])
    low, high = _pyproject_range()
    assert project["dependencies"] == [f"torch>={low},<{high}"]
