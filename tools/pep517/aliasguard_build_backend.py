"""aliasguard's PEP 517 build backend: scikit-build-core, after a torch check.

``pyproject.toml`` names this module (``[build-system] backend-path``). Every
hook is ``scikit_build_core.build``'s, but those that report a wheel's
metadata (``prepare_metadata_for_build_wheel``/``_editable``) or the wheel's
build requirements first check the torch of the interpreter that builds:
``cmake/CheckTorchVersion.cmake`` in script mode, the same range (read from
pyproject.toml), rule and messages as the configure. A torch outside the range,
or none, stops the hook there, before pip has the metadata: pip never resolves
the dependency ``torch>=MIN,<MAX`` and so never downloads another torch (GBs
with its CUDA wheels) only to see the configure stop (the note on the
supported torch range at the top of cmake/CheckTorchVersion.cmake).

The interpreter checked is ``sys.executable``, the one scikit-build-core hands
CMake as ``Python_EXECUTABLE``; the script runs it with ``-E`` like the
configure does, so in pip's isolated build environment it sees the torch the
configure would see. Its version is read from the package metadata, without
importing torch.

``build_wheel`` itself runs no early check: its configure runs the same check
before anything is built, and ``build_sdist`` needs no torch.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

ConfigSettings = dict[str, str | list[str]] | None

CHECK_SCRIPT = Path(__file__).resolve().parents[2] / "cmake" / "CheckTorchVersion.cmake"


def _backend() -> ModuleType:
    """scikit-build-core's backend, imported only once torch has passed."""
    return importlib.import_module("scikit_build_core.build")


def _runs(cmake: str) -> bool:
    # A PATH `cmake` may be the entry point of a cmake package installed for
    # another environment, which fails inside pip's isolated one.
    try:
        return subprocess.run([cmake, "--version"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _find_cmake() -> str | None:
    """The cmake scikit-build-core would run: $CMAKE_EXECUTABLE, the cmake
    package's, or cmake/cmake3 on PATH; the first that runs."""
    candidates = []
    if os.environ.get("CMAKE_EXECUTABLE"):
        candidates.append(os.environ["CMAKE_EXECUTABLE"])
    try:
        bin_dir = getattr(importlib.import_module("cmake"), "CMAKE_BIN_DIR", None)
    except ImportError:
        bin_dir = None
    if bin_dir:
        candidates.append(str(Path(bin_dir) / "cmake"))
    candidates += [found for found in map(shutil.which, ("cmake", "cmake3")) if found]
    return next((c for c in candidates if _runs(c)), None)


def _cmake_message(stderr: str) -> str:
    """The text of CMake's FATAL_ERROR, without its "CMake Error at" header and
    call stack, which only point into this repository's CMake files."""
    lines = stderr.strip("\n").splitlines()
    if lines and re.match(r"CMake Error at .*\(message\):$", lines[0]):
        body = []
        for line in lines[1:]:
            if line.startswith("Call Stack (most recent call first):"):
                break
            body.append(line)
        return re.sub(r"\n{3,}", "\n\n", textwrap.dedent("\n".join(body)).strip())
    return stderr.strip()


def check_torch(*, cmake_required: bool = True) -> None:
    """Stops (SystemExit) unless the building interpreter's torch is in the
    supported range. Without a CMake, `cmake_required` decides: the build
    requirements are asked for first (and bring CMake when it is missing), the
    metadata only once they are installed."""
    cmake = _find_cmake()
    if cmake is None:
        if not cmake_required:
            return
        sys.stderr.write(
            "aliasguard: CMake (>= 3.22) not found: aliasguard builds with CMake, which also checks its torch.\n"
            "Install the build requirements, then build again:\n"
            "  pip install scikit-build-core cmake ninja\n"
            "  pip install --no-build-isolation .\n"
        )
        raise SystemExit(1)
    result = subprocess.run(
        [cmake, f"-DPython_EXECUTABLE={sys.executable}", "-P", str(CHECK_SCRIPT)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        sys.stdout.flush()
        sys.stderr.write(_cmake_message(result.stderr or result.stdout) + "\n")
        raise SystemExit(1)
    sys.stdout.write(result.stdout)


def get_requires_for_build_wheel(config_settings: ConfigSettings = None) -> list[str]:
    check_torch(cmake_required=False)
    return list(_backend().get_requires_for_build_wheel(config_settings))


def get_requires_for_build_editable(config_settings: ConfigSettings = None) -> list[str]:
    check_torch(cmake_required=False)
    return list(_backend().get_requires_for_build_editable(config_settings))


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: ConfigSettings = None) -> str:
    check_torch()
    return str(_backend().prepare_metadata_for_build_wheel(metadata_directory, config_settings))


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: ConfigSettings = None) -> str:
    check_torch()
    return str(_backend().prepare_metadata_for_build_editable(metadata_directory, config_settings))


def build_wheel(
    wheel_directory: str, config_settings: ConfigSettings = None, metadata_directory: str | None = None
) -> str:
    return str(_backend().build_wheel(wheel_directory, config_settings, metadata_directory))


def build_editable(
    wheel_directory: str, config_settings: ConfigSettings = None, metadata_directory: str | None = None
) -> str:
    return str(_backend().build_editable(wheel_directory, config_settings, metadata_directory))


def get_requires_for_build_sdist(config_settings: ConfigSettings = None) -> list[str]:
    return list(_backend().get_requires_for_build_sdist(config_settings))


def build_sdist(sdist_directory: str, config_settings: ConfigSettings = None) -> str:
    return str(_backend().build_sdist(sdist_directory, config_settings))
