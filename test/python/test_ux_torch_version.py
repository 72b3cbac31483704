"""The build refuses a torch outside the supported range before building anything,
and before pip looks for another torch.

The range lives once, in pyproject.toml's dependencies; ``cmake/CheckTorchVersion.cmake``
reads it and stops the configure (FATAL_ERROR) for any other torch, naming the
version found, the range and what to do. The build backend
(``tools/pep517/aliasguard_build_backend.py``) runs the same script on
the building interpreter before pip has the package's metadata. The tests run
the check as a CMake script with made-up versions, a real configure, and pip
itself (no network), against interpreters whose ``torch`` is a stand-in
module: no test installs or removes a real torch.
"""

from __future__ import annotations

import functools
import importlib.util
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


@pytest.mark.parametrize(
    "version", ["2.13.0", "2.13.0+cpu", "2.14.1", "2.14.1+cu130", "2.14.0rc1", "2.15.0", "2.15.1+cu130"]
)
def test_supported_torch_passes(version: str) -> None:
    result = _check(version)
    assert result.returncode == 0, result.stderr
    assert f"torch {version} is supported (torch>=2.13,<2.16)" in result.stdout + result.stderr


@pytest.mark.parametrize("version", ["2.16.0", "2.16.0a0+git1234", "2.17.1+cpu", "2.12.1", "1.13.1"])
def test_unsupported_torch_stops_the_configure(version: str) -> None:
    result = _check(version)
    assert result.returncode != 0
    err = _flat(result.stderr)
    assert "CMake Error" in err
    assert f"found torch {version} (given as TORCH_VERSION), outside the supported range torch>=2.13,<2.16" in err
    assert 'pip install "torch>=2.13,<2.16"' in err  # what to do
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


def _venv(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A venv of this Python without pip and without torch: (python, site-packages)."""
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
    return python, pathlib.Path(site)


def _install_fake_torch(
    site: pathlib.Path, version: str, *, metadata: bool = True, module_version: str | None = None
) -> pathlib.Path:
    """The stand-in torch, with the metadata pip keeps for an installed
    distribution unless `metadata` is false; `module_version` makes
    torch.__version__ differ from it."""
    fake = site / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(FAKE_TORCH.format(version=module_version or version))
    if metadata:
        dist_info = site / f"torch-{version}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        (dist_info / "top_level.txt").write_text("torch\n")
        (dist_info / "INSTALLER").write_text("pip\n")
        (dist_info / "RECORD").write_text("")
    return fake


def _env_without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_configure_against_an_unsupported_torch_fails_before_building(tmp_path: pathlib.Path) -> None:
    assert CMAKE is not None
    python, site = _venv(tmp_path)
    fake = _install_fake_torch(site, "2.16.0", metadata=False)
    build = tmp_path / "build"
    result = subprocess.run(
        [CMAKE, "-S", str(REPO_ROOT), "-B", str(build), f"-DPython_EXECUTABLE={python}"],
        env=_env_without_pythonpath(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0, result.stdout
    err = _flat(result.stderr)
    assert f"found torch 2.16.0 for {python} (at {fake}), outside the supported range torch>=2.13,<2.16" in err, err
    assert not (build / "build.ninja").exists() and not (build / "Makefile").exists()


def _check_interpreter(python: pathlib.Path) -> subprocess.CompletedProcess[str]:
    assert CMAKE is not None
    return subprocess.run(
        [CMAKE, f"-DPython_EXECUTABLE={python}", "-P", str(CHECK)],
        env=_env_without_pythonpath(),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("installed", "metadata"), [("2.15.0", True), ("2.14.1+cu130", False)], ids=["metadata", "import"]
)
def test_interpreter_check_reads_the_version_without_importing(
    tmp_path: pathlib.Path, installed: str, metadata: bool
) -> None:
    # The build backend's check: the torch of the given interpreter, from the
    # metadata pip keeps (importing this torch would fail), or imported where
    # there is none.
    python, site = _venv(tmp_path)
    fake = _install_fake_torch(site, installed, metadata=metadata)
    if metadata:
        (fake / "__init__.py").write_text("raise RuntimeError('torch was imported')\n")
    result = _check_interpreter(python)
    assert result.returncode == 0, result.stderr
    assert f"torch {installed} is supported (torch>=2.13,<2.16), for {python} (at {fake})" in _flat(result.stdout)


def test_interpreter_check_stops_an_unsupported_torch(tmp_path: pathlib.Path) -> None:
    python, site = _venv(tmp_path)
    fake = _install_fake_torch(site, "2.16.0", module_version="2.13.0")  # the metadata is what counts
    result = _check_interpreter(python)
    assert result.returncode != 0
    err = _flat(result.stderr)
    assert f"found torch 2.16.0 for {python} (at {fake}), outside the supported range torch>=2.13,<2.16" in err, err


# pip, as a user runs it, on the repository, in a venv whose torch is the stand-in:
# never with the network (--no-index, an empty --find-links, no pip configuration).
# `pip --python` runs this pip for the venv's interpreter, as if installed there.
@functools.cache
def _pip_has_python_option() -> bool:
    cmd = [sys.executable, "-m", "pip", "--python", sys.executable, "--version"]
    return subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0


def _pip(
    tmp_path: pathlib.Path, python: pathlib.Path, *args: str, path: str | None = None
) -> subprocess.CompletedProcess[str]:
    if not _pip_has_python_option():
        pytest.skip("this pip has no --python (pip >= 22.3)")
    empty = tmp_path / "no-packages"
    empty.mkdir(exist_ok=True)
    env = {k: v for k, v in _env_without_pythonpath().items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    if path is not None:
        env["PATH"] = path
        env.pop("CMAKE_EXECUTABLE", None)
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *args]
        + ["--no-build-isolation", "--no-index", "--find-links", str(empty), "--no-cache-dir", str(REPO_ROOT)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


# Stands in for scikit-build-core's backend (not installed in the venv):
# metadata as pyproject.toml gives it, and a wheel with nothing in it.
FAKE_SCIKIT_BUILD_CORE = textwrap.dedent(
    """
    import os
    import zipfile

    DIST_INFO = "aliasguard-0.1.0.dist-info"
    METADATA = "Metadata-Version: 2.1\\nName: aliasguard\\nVersion: 0.1.0\\n" + "".join(
        f"Requires-Dist: {{r}}\\n" for r in {dependencies!r}
    )
    WHEEL = "Wheel-Version: 1.0\\nGenerator: fake\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"


    def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
        os.makedirs(os.path.join(metadata_directory, DIST_INFO))
        for name, text in (("METADATA", METADATA), ("WHEEL", WHEEL)):
            with open(os.path.join(metadata_directory, DIST_INFO, name), "w") as f:
                f.write(text)
        return DIST_INFO


    def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
        name = "aliasguard-0.1.0-py3-none-any.whl"
        with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
            z.writestr(DIST_INFO + "/METADATA", METADATA)
            z.writestr(DIST_INFO + "/WHEEL", WHEEL)
            z.writestr(DIST_INFO + "/RECORD", "")
        return name
    """
)


def _install_fake_backend(site: pathlib.Path) -> None:
    # So that only the check stands between pip and the metadata: without it,
    # pip would get the metadata and resolve the range.
    backend = site / "scikit_build_core"
    backend.mkdir()
    (backend / "__init__.py").write_text("")
    low, high = _pyproject_range()
    (backend / "build.py").write_text(FAKE_SCIKIT_BUILD_CORE.format(dependencies=[f"torch>={low},<{high}"]))


@pytest.mark.parametrize(
    ("command", "installed"),
    [("install", "2.16.0"), ("install", "2.12.1+cu126"), ("wheel --no-deps", "2.16.0")],
)
def test_pip_stops_an_unsupported_torch_before_looking_for_another(
    tmp_path: pathlib.Path, command: str, installed: str
) -> None:
    # The build backend checks torch before pip has the metadata, so pip never
    # resolves the dependency torch>=MIN,<MAX: without the check, pip would
    # look for another torch (here: "No matching distribution found for
    # torch"; on a user's machine, a download of GBs) before the configure
    # stops, and `pip wheel --no-deps` would build the wheel.
    python, site = _venv(tmp_path)
    fake = _install_fake_torch(site, installed)
    _install_fake_backend(site)
    out = tmp_path / "wheels"
    args = command.split() + (["--wheel-dir", str(out)] if command.startswith("wheel") else [])
    result = _pip(tmp_path, python, *args)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    low, high = _pyproject_range()
    assert (
        f"aliasguard: found torch {installed} for {python} (at {fake}), "
        f"outside the supported range torch>={low},<{high}" in _flat(output)
    ), output
    assert f'pip install "torch>={low},<{high}"' in output
    assert "Preparing metadata (pyproject.toml) did not run successfully" in _flat(output)
    assert "No matching distribution" not in output and "Building wheel" not in output
    assert "CMake Error at" not in output  # the message alone, not CMake's frame around it
    assert not out.exists() or not list(out.iterdir())
    assert (site / f"torch-{installed}.dist-info").is_dir()


def test_pip_without_torch_names_the_interpreter(tmp_path: pathlib.Path) -> None:
    python, site = _venv(tmp_path)
    _install_fake_backend(site)
    result = _pip(tmp_path, python, "install")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    flat = _flat(output)
    assert f"aliasguard builds against the torch installed for {python}, but that interpreter cannot import" in flat
    assert "No module named 'torch'" in flat
    assert "pip install --no-build-isolation ." in flat
    assert "No matching distribution" not in output


def test_pip_without_cmake_says_what_to_install(tmp_path: pathlib.Path) -> None:
    # Without CMake the check cannot run: the metadata is refused all the
    # same (the build would fail), naming the build requirements.
    python, site = _venv(tmp_path)
    _install_fake_torch(site, "2.16.0")
    _install_fake_backend(site)
    result = _pip(tmp_path, python, "install", path=str(python.parent))
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "aliasguard: CMake (>= 3.22) not found" in output
    assert "pip install scikit-build-core cmake ninja" in output
    assert "No matching distribution" not in output


def test_pip_keeps_a_supported_torch_and_wheel_needs_no_deps(tmp_path: pathlib.Path) -> None:
    # With a supported torch (the range's newest) the check lets the backend
    # through: pip resolves the range against the installed torch and plans
    # to install aliasguard alone. `pip wheel` ignores what is installed and
    # would fetch torch and its dependencies as well, hence README's
    # `pip wheel --no-deps .`, which saves aliasguard's wheel only.
    python, site = _venv(tmp_path)
    newest = "2.15.0"
    _install_fake_torch(site, newest)
    _install_fake_backend(site)

    result = _pip(tmp_path, python, "install", "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Would install aliasguard-0.1.0" in result.stdout
    assert "torch-" not in result.stdout.split("Would install")[-1]

    out = tmp_path / "wheels"
    result = _pip(tmp_path, python, "wheel", "--wheel-dir", str(out))
    assert result.returncode != 0
    assert "No matching distribution found for torch" in result.stdout + result.stderr

    result = _pip(tmp_path, python, "wheel", "--no-deps", "--wheel-dir", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["aliasguard-0.1.0-py3-none-any.whl"]
    assert (site / f"torch-{newest}.dist-info").is_dir()


def test_backend_has_every_hook() -> None:
    # The wrapper stands in for scikit_build_core.build: each PEP 517 hook
    # must be there (without prepare_metadata_for_build_wheel pip would
    # build the whole wheel to read the metadata).
    tomllib = pytest.importorskip("tomllib")
    build_system = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["build-system"]
    (backend_path,) = build_system["backend-path"]
    module = build_system["build-backend"]
    spec = importlib.util.spec_from_file_location(module, REPO_ROOT / backend_path / f"{module}.py")
    assert spec is not None and spec.loader is not None
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    for hook in (
        "build_wheel",
        "build_sdist",
        "build_editable",
        "get_requires_for_build_wheel",
        "get_requires_for_build_sdist",
        "get_requires_for_build_editable",
        "prepare_metadata_for_build_wheel",
        "prepare_metadata_for_build_editable",
    ):
        assert callable(getattr(backend, hook, None)), hook


def test_wheel_requires_the_range_not_a_pin() -> None:
    # The documented choice (pyproject.toml): the wheel's torch requirement is
    # the static range, never a pin to the build's torch, so pip keeps any
    # supported torch; the import checks the exact version.
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert "dependencies" not in project.get("dynamic", [])
    low, high = _pyproject_range()
    assert project["dependencies"] == [f"torch>={low},<{high}"]
