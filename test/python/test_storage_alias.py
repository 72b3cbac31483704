"""The one "may this tensor alias that storage" check.

Each case that used to crash the interpreter runs in a subprocess, so that a
regression fails one test instead of killing the run.
"""

import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import aliasguard
from aliasguard import AliasingError
from aliasguard.testing import WrapperTensor

PRELUDE = """
import torch
import aliasguard
from aliasguard.testing import WrapperTensor

class W(torch.Tensor):
    @staticmethod
    def __new__(cls, size, strides=None, storage_size=None):
        return torch.Tensor._make_wrapper_subclass(
            cls, size, strides=strides, storage_size=storage_size, dtype=torch.float32)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)
"""


def run_case(body: str) -> str:
    """Runs PRELUDE + body in a fresh interpreter; returns its stdout (must exit cleanly)."""
    result = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_dense_tensor_is_not_given_a_wrappers_null_storage():
    out = run_case(
        """
        t = torch.zeros(1000)
        before = (t.untyped_storage()._cdata, t._is_view())
        try:
            torch.mark_as_view(t, W((4,)), alias_storage=True)
        except RuntimeError as error:
            print("refused:", error)
        assert (t.untyped_storage()._cdata, t._is_view()) == before
        print(t.sum().item())
        """
    )
    assert "refused: mark_as_view(alias_storage=True): tensor is a tensor with data" in out
    assert "placeholder" in out
    assert out.strip().endswith("0.0")


def test_overflowing_strides_are_refused():
    out = run_case(
        """
        w = W((2,), strides=(2**62,), storage_size=16)
        try:
            torch.mark_as_view(w, torch.zeros(4), alias_storage=True)
        except RuntimeError as error:
            print("refused:", error)
        """
    )
    assert "refused:" in out and "more bytes than int64" in out


@pytest.mark.parametrize("explicit", [False, True], ids=["automatic", "correct_aliasing"])
def test_correction_refuses_a_wrapper_view_larger_than_its_input(explicit):
    out = run_case(
        f"""
        from torch.utils._python_dispatch import TorchDispatchMode

        class Huge(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is torch.ops.aten.view.default:
                    out = W((1 << 24,))
                    return aliasguard.correct_aliasing(func, args, kwargs, out) if {explicit} else out
                return func(*args, **(kwargs or {{}}))

        x = torch.zeros(4)
        try:
            with Huge():
                x.view(4)
        except aliasguard.AliasingError as error:
            print("refused:", error)
        """
    )
    if explicit:
        assert "refused: aten::view: return 0 is a wrapper tensor with placeholder storage" in out
        assert "need 67108864 bytes of storage but the storage of argument 'self' has 16" in out
    else:  # left alone, as stock leaves it: see Note [What correction refuses]
        assert "refused" not in out


def test_automatic_correction_leaves_a_wrapper_view_it_cannot_repair_as_stock():
    x = torch.zeros(4)

    class Answer(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.view.default:
                return WrapperTensor(torch.zeros(8))
            return func(*args, **(kwargs or {}))

    before = (x._version, x.untyped_storage()._cdata)
    with Answer():
        y = x.view(8)
    assert y.untyped_storage()._cdata != x.untyped_storage()._cdata  # its own placeholder
    assert aliasguard.shares_version_counter(x, y)  # the counter is still given
    assert (x._version, x.untyped_storage()._cdata) == before
    with pytest.raises(AliasingError, match="does not share the storage"), aliasguard.audit():
        with Answer():
            x.view(8)


def test_differentiable_view_of_another_dtype_is_refused():
    base = torch.zeros(4, dtype=torch.float32)
    t = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="has dtype Double but base has dtype Float"):
        torch.mark_as_view(t, base, alias_storage=True)
    assert not t._is_view() and t.untyped_storage()._cdata != base.untyped_storage()._cdata
    # Not differentiable: only the counter is shared, as view(dtype) does.
    torch.mark_as_view(t, base, alias_storage=True, is_bw_differentiable=False, is_fw_differentiable=False)
    assert aliasguard.shares_version_counter(t, base)


def test_complex_pair_is_a_differentiable_view_only_with_its_view_fn():
    base = torch.zeros(2, dtype=torch.complex64, requires_grad=True)

    def real_alias():
        return torch.empty(0).set_(base.untyped_storage(), 0, (2, 2), (2, 1))

    # as_strided replay on the complex base would read past its end.
    with pytest.raises(RuntimeError, match="has dtype Float but base has dtype ComplexFloat"):
        torch.mark_as_view(real_alias(), base)
    alias = torch.mark_as_view(real_alias(), base, view_fn=torch.view_as_real)
    assert alias._base is base
    (alias * torch.tensor([1.0, 2.0])).sum().backward()
    assert torch.equal(base.grad, torch.tensor([1 + 2j, 1 + 2j], dtype=torch.complex64))


def test_sparse_tensor_cannot_alias_a_dense_storage():
    sparse = torch.zeros(4).to_sparse()
    with pytest.raises(RuntimeError, match="tensor has layout Sparse"):
        torch.mark_as_view(sparse, torch.zeros(4), alias_storage=True)


def test_wrapper_cannot_be_a_differentiable_view_of_a_sparse_base():
    base = torch.zeros(4).to_sparse().requires_grad_()
    with pytest.raises(RuntimeError, match="layout Sparse"):
        torch.mark_as_view(WrapperTensor(torch.zeros(4)), base)


def test_correction_gives_an_in_bounds_wrapper_view_its_input_storage():
    x = torch.zeros(4)

    class Answer(TorchDispatchMode):
        def __init__(self, numel):
            super().__init__()
            self.numel = numel

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.view.default:
                return WrapperTensor(torch.zeros(self.numel))
            return func(*args, **(kwargs or {}))

    with Answer(4):
        y = x.view(4)
    assert y.untyped_storage()._cdata == x.untyped_storage()._cdata
    assert aliasguard.shares_version_counter(x, y)
    before = (x._version, x.untyped_storage()._cdata)
    with pytest.raises(AliasingError, match="need 32 bytes of storage but the storage of argument 'self' has 16"):
        with Answer(8):
            aliasguard.correct_aliasing(torch.ops.aten.view.default, (x, [8]), {}, WrapperTensor(torch.zeros(8)))
    assert (x._version, x.untyped_storage()._cdata) == before


def test_views_of_a_jagged_nested_tensor_pass_its_storage_on():
    # A jagged tensor made from its values gets their storage (the correction
    # of _nested_view_from_jagged); its own views (transpose) must be able to
    # take it on. Refusing them made every NJT transpose fail with aliasguard.
    values = torch.randn(6, 3, requires_grad=True)
    nt = torch.nested.nested_tensor_from_jagged(values, offsets=torch.tensor([0, 2, 6]))
    t = nt.transpose(1, 2)
    assert t.shape[1] == 3
    assert t.untyped_storage().data_ptr() == values.untyped_storage().data_ptr()
    back = t.transpose(1, 2)
    torch.testing.assert_close(back.values(), values)
    back.sin().values().sum().backward()
    torch.testing.assert_close(values.grad, values.detach().cos())
    with aliasguard.audit():
        nt.detach().transpose(1, 2).transpose(1, 2)
