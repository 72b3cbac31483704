"""Real clients: results equal stock with aliasguard imported.

Each workload of ``real_client_workloads.py`` (TwoTensor, LoggingTensor,
nested jagged tensors, DTensor on a gloo world of one with tensor-parallel
attention, torchao int8 and its quantized optimizer states) runs here
with aliasguard imported - once with alias correction on, once inside
``aliasguard.audit()`` - and its outputs, gradients and updated parameters
must equal those of the same workload in a process that never imported
aliasguard. Then two in-place handlers that broke real clients.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys

import pytest
import torch
from torch.utils._pytree import tree_map_only

import aliasguard
import real_client_workloads as workloads

HERE = os.path.dirname(os.path.abspath(__file__))

HAVE_TORCHAO = importlib.util.find_spec("torchao") is not None
TORCHAO_SKIP = pytest.mark.skipif(
    not HAVE_TORCHAO,
    reason="torchao is not installed (optional: `pip install torchao`; 0.18.0 installs against torch 2.13)",
)

# Known aliasguard bugs: (workload, how) -> reason. xfail(strict=True).
KNOWN_BUGS: dict[tuple[str, str], str] = {}


@functools.lru_cache(maxsize=None)
def _stock(name: str, tmp_dir: str) -> dict:
    out = os.path.join(tmp_dir, f"{name}.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "real_client_workloads.py"), name, out],
        capture_output=True, text=True, timeout=300, cwd=HERE, env=env,
    )
    assert proc.returncode == 0, f"stock run of {name} failed:\n{proc.stderr[-3000:]}"
    return torch.load(out)


@pytest.fixture(scope="module")
def stock_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("stock"))


def _params():
    out = []
    for name in workloads.WORKLOADS:
        for how in ("correction", "audit"):
            marks = []
            if name.startswith("torchao"):
                marks.append(TORCHAO_SKIP)
            if (name, how) in KNOWN_BUGS:
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[(name, how)]))
            out.append(pytest.param(name, how, id=f"{name}-{how}", marks=marks))
    return out


@pytest.mark.parametrize("name,how", _params())
def test_workload_equals_stock(name, how, stock_dir):
    assert aliasguard.is_alias_correction_enabled()
    expected = _stock(name, stock_dir)
    if how == "audit":
        with aliasguard.audit():
            got = workloads.WORKLOADS[name]()
    else:
        got = workloads.WORKLOADS[name]()
    assert sorted(got) == sorted(expected)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0, msg=f"{name}: {key} differs from stock")


# --- in-place handlers that do not return their argument -------------------


class BareReturnTensor(torch.Tensor):
    """A wrapper whose in-place handlers write the inner tensor and end in a
    bare ``return`` (as torchao's quantized tensors do for ``copy_``). Stock
    PyTorch ignores what an in-place handler returns."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.copy_.default:
            args[0].elem.copy_(args[1].elem if isinstance(args[1], cls) else args[1])
            return
        args, kwargs = tree_map_only(cls, lambda t: t.elem, (args, kwargs))
        return tree_map_only(torch.Tensor, cls, func(*args, **kwargs))


def test_copy_handler_with_bare_return_returns_the_argument():
    dst = BareReturnTensor(torch.zeros(3))
    out = dst.copy_(torch.arange(3.0))
    assert out is dst
    assert dst.elem.tolist() == [0.0, 1.0, 2.0]


def test_load_state_dict_with_bare_return_copy():
    lin = torch.nn.Linear(3, 2, bias=False)
    lin.weight = torch.nn.Parameter(BareReturnTensor(torch.zeros(2, 3)), requires_grad=False)
    lin.load_state_dict({"weight": BareReturnTensor(torch.ones(2, 3))})
    assert lin.weight.elem.tolist() == [[1.0] * 3] * 2


@TORCHAO_SKIP
def test_torchao_load_state_dict():
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32))
    quantize_(model, Int8WeightOnlyConfig())
    x = torch.randn(2, 16)
    before = model(x)
    model.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(x), before)


def test_index_put_where_only_index_is_a_subclass():
    called = []

    class IndexTensor(torch.Tensor):
        @staticmethod
        def __new__(cls, elem):
            return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, device=elem.device)

        def __init__(self, elem):
            self.elem = elem

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            called.append(func)
            return IndexTensor(torch.tensor(3))

    x = torch.randn(3, 3)
    out = x.index_put_((IndexTensor(torch.tensor(0)),), torch.randn(1))
    assert called == [torch.ops.aten.index_put_.default]
    assert out is x
