"""Crash-prone paths, each in its own interpreter.

Every case here either crashed the interpreter (segfault) or built a tensor
whose memory or gradients are wrong. Each runs in a child process
(``subprocess_snippets.run_snippet``), so a regression to a crash fails one
test instead of killing the run. Each test asserts that the child exited
normally, that the bad request was refused with a clear error naming the
problem, and that the tensors involved were left as they were.

All of them are fixed (the one may-alias check in
``torch/csrc/autograd/storage_alias.cpp``); a case whose fix has not landed
would be ``xfail(strict=True)`` here.
"""

from __future__ import annotations

import re

import pytest

from subprocess_snippets import assert_clean_exit, run_snippet

# Shared prelude: a wrapper subclass with placeholder storage and a helper
# that reads every element of a tensor's memory with dispatch disabled, the
# way a kernel would (this is where a bad storage or geometry crashes).
PRELUDE = """
import re, sys
import torch
import aliasguard
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

class W(torch.Tensor):
    @staticmethod
    def __new__(cls, shape, strides=None, dtype=torch.float32, elem=None):
        return torch.Tensor._make_wrapper_subclass(
            cls, shape, strides=strides, dtype=dtype, device="cpu")
    def __init__(self, shape, strides=None, dtype=torch.float32, elem=None):
        self.elem = elem
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = tree_map_only(W, lambda t: t.elem, (args, kwargs or {}))
        out = func(*args, **kwargs)
        return tree_map_only(torch.Tensor, lambda t: W(t.shape, t.stride(), t.dtype, t), out)

def read_all(t):
    with no_dispatch(), torch._C.DisableTorchFunctionSubclass():
        return float(torch.Tensor.sum(torch.Tensor.as_subclass(t, torch.Tensor).float()))

def report(exc):
    print(f"REFUSED {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
"""


def _refused(result, exc_types: tuple[str, ...], pattern: str) -> None:
    assert_clean_exit(result)
    m = re.search(r"^REFUSED (\w+): (.*)$", result.stdout, re.MULTILINE)
    assert m, f"the request was accepted instead of refused\n{result.describe()}"
    assert m.group(1) in exc_types, result.describe()
    assert re.search(pattern, m.group(2), re.IGNORECASE), result.describe()
    assert "UNCHANGED" in result.stdout, result.describe()


def test_alias_storage_from_placeholder_base_is_refused():
    result = run_snippet(PRELUDE + """
t = torch.zeros(1000)
storage_before = t.untyped_storage()._cdata
try:
    torch.mark_as_view(t, W((4,)), alias_storage=True)
    print("ACCEPTED")
except Exception as e:
    report(e)
if t.untyped_storage()._cdata == storage_before and not t._is_view():
    print("UNCHANGED")
print("sum", t.sum().item())   # crashed here: the dense tensor had the wrapper's null-data storage
""")
    _refused(result, ("RuntimeError",), r"storage|placeholder|wrapper|data")


def test_alias_storage_geometry_overflow_is_refused():
    # Only an accepted wrapper is read: a refused one keeps its placeholder
    # storage, and reading a wrapper's placeholder crashes stock PyTorch too.
    result = run_snippet(PRELUDE + """
base = torch.zeros(4)                       # 16 bytes
w = W((2,), strides=(2**62,))
sizes, strides = w.shape, w.stride()
try:
    torch.mark_as_view(w, base, alias_storage=True)
    print("ACCEPTED")
    print("read", read_all(w))              # reads 2**62 elements past a 16-byte storage
except Exception as e:
    report(e)
if w.shape == sizes and w.stride() == strides and not w._is_view():
    print("UNCHANGED")
""")
    _refused(result, ("RuntimeError",), r"storage|bound|overflow|size|reach")


def test_correction_leaves_a_view_wrapper_larger_than_its_input_as_stock():
    # Giving the wrapper its input's 16 bytes would let a kernel read 64 MiB
    # past them. The automatic correction leaves it its own placeholder, as
    # stock does (reading a placeholder with dispatch disabled crashes stock
    # too, so this case does not read it); audit() refuses it.
    result = run_snippet(PRELUDE + """
class BigViewMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.view.default:
            return W((1 << 24,), elem=out)
        return out

x = torch.arange(4.0)
version_before = x._version
with BigViewMode():
    v = x.view(4)
print("OWN STORAGE", v.untyped_storage()._cdata != x.untyped_storage()._cdata)
try:
    with aliasguard.audit(), BigViewMode():
        x.view(4)
    print("ACCEPTED")
except Exception as e:
    report(e)
if x._version == version_before and x.tolist() == [0.0, 1.0, 2.0, 3.0]:
    print("UNCHANGED")
""")
    assert "OWN STORAGE True" in result.stdout, result.describe()
    _refused(result, ("AliasingError",), r"aten::view")


def test_explicit_correct_aliasing_refuses_oversized_view():
    result = run_snippet(PRELUDE + """
x = torch.arange(4.0)
out = W((1 << 24,), elem=x.view(4))
try:
    v = aliasguard.correct_aliasing(torch.ops.aten.view.default, (x, [4]), {}, out)
    print("ACCEPTED")
    print("read", read_all(v))
except Exception as e:
    report(e)
if x.tolist() == [0.0, 1.0, 2.0, 3.0] and out.shape == (1 << 24,):
    print("UNCHANGED")
""")
    _refused(result, ("AliasingError", "RuntimeError"), r"aten::view|storage|bound|size")


def test_differentiable_view_across_dtypes_is_refused():
    result = run_snippet(PRELUDE + """
base = torch.zeros(4, requires_grad=True)
t = base.detach().view(torch.float64)       # same memory, other dtype
try:
    torch.mark_as_view(t, base)
    print("ACCEPTED")
    (t.sum() * 1.0).backward()
    print("grad", base.grad)
except Exception as e:
    report(e)
if not t._is_view() and t.grad_fn is None and base.grad is None:
    print("UNCHANGED")
""")
    _refused(result, ("RuntimeError", "TypeError", "ValueError"), r"dtype|float")


def test_non_differentiable_view_across_dtypes_keeps_working():
    # What stock allows (view(dtype) is a non-differentiable view) must keep
    # working: only the version counter is shared.
    result = run_snippet(PRELUDE + """
base = torch.zeros(4)
t = base.view(torch.int32).clone().view(torch.float32)   # own memory
u = base.detach().view(torch.int32)
torch.mark_as_view(u, base, is_bw_differentiable=False, is_fw_differentiable=False)
u.add_(1)
print("shared", aliasguard.shares_version_counter(u, base), base._version)
""")
    assert_clean_exit(result)
    assert "shared True 1" in result.stdout, result.describe()


def test_view_of_sparse_base_is_refused():
    result = run_snippet(PRELUDE + """
i = torch.tensor([[0, 1], [1, 0]])
base = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0]), (2, 2)).requires_grad_()
w = W((2, 2))
try:
    torch.mark_as_view(w, base)
    print("ACCEPTED")
except Exception as e:
    report(e)
if not w._is_view() and base.grad is None:
    print("UNCHANGED")
""")
    _refused(result, ("RuntimeError", "TypeError", "ValueError"), r"sparse|layout|strided")


def test_sparse_tensor_alias_storage_is_refused():
    result = run_snippet(PRELUDE + """
base = torch.zeros(4)
i = torch.tensor([[0, 1]])
s = torch.sparse_coo_tensor(i, torch.tensor([1.0, 2.0]), (4,))
try:
    torch.mark_as_view(s, base, alias_storage=True)
    print("ACCEPTED")
    print("dense", s.to_dense())
except Exception as e:
    report(e)
if not s._is_view() and s.is_sparse and s.to_dense().tolist() == [1.0, 2.0, 0.0, 0.0]:
    print("UNCHANGED")
""")
    _refused(result, ("RuntimeError", "TypeError", "ValueError"), r"sparse|layout|strided")


def test_run_snippet_reports_a_crash():
    # The helper itself: a child killed by a signal is reported as such, so
    # the tests above can tell a crash from an error.
    result = run_snippet("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert result.signal_name == "SIGSEGV"
    with pytest.raises(AssertionError, match="killed by SIGSEGV"):
        assert_clean_exit(result)
