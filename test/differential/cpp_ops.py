"""The custom ops registered from C++ (``TORCH_LIBRARY``) that the tests load: test/cpp/differential_test_ops.cpp.

The build makes one library per namespace, ``agdiff_cpp_before`` and ``agdiff_cpp_after``, in
``$ALIASGUARD_TEST_OPS_DIR`` (the Makefile sets it to ``$(BUILD)/test_ops``), else in ``build/test_ops`` of
this checkout; a pip build does not make them. Each holds ``mutate(Tensor(a!) x) -> Tensor(a!)``,
``mutate_list(Tensor(a!)[] xs) -> ()``, ``view(Tensor(a) x) -> Tensor(a)`` and
``view_list(Tensor(a) x) -> Tensor(a)[]``. A missing library raises ``TestOpsNotBuilt``: a test or scenario
that needs one fails, never passes or vanishes.

Nothing here imports aliasguard.
"""

from __future__ import annotations

import os
from typing import Any

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAMESPACES = ("agdiff_cpp_before", "agdiff_cpp_after")
OPS = ("mutate", "mutate_list", "view", "view_list")


class TestOpsNotBuilt(RuntimeError):
    """The library of C++ test ops is not where the build puts it."""


def library_dir() -> str:
    return os.environ.get("ALIASGUARD_TEST_OPS_DIR") or os.path.join(REPO, "build", "test_ops")


def library_path(namespace: str) -> str:
    path = os.path.join(library_dir(), f"lib{namespace}.so")
    if not os.path.isfile(path):
        raise TestOpsNotBuilt(f"{path} is missing: `make build` builds the C++ test ops there "
                              "(ALIASGUARD_TEST_OPS_DIR names another folder)")
    return path


def is_loaded(namespace: str) -> bool:
    return any(name.startswith(namespace + "::") for name in torch._C._dispatch_get_all_op_names())


def load(namespace: str) -> Any:
    """Loads the namespace's library (once per process) and returns ``torch.ops.<namespace>``."""
    if not is_loaded(namespace):
        torch.ops.load_library(library_path(namespace))
    return getattr(torch.ops, namespace)
