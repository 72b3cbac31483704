"""F3: torch.mark_as_view."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import aliasguard
from aliasguard import mark_as_view, shares_version_counter
from aliasguard.testing import WrapperTensor


def plain_alias(base, *shape, transpose=False):
    """A tensor sharing base's memory, with its own version counter and no
    autograd metadata: what a view op returns below autograd."""
    geometry = base.detach().view(*(shape or base.shape))
    if transpose:
        geometry = geometry.t()
    alias = torch.empty(0, dtype=base.dtype).set_(
        base.untyped_storage(), base.storage_offset(), geometry.shape, geometry.stride()
    )
    assert not shares_version_counter(alias, base)
    return alias


def test_torch_attribute_is_installed():
    assert torch.mark_as_view is aliasguard.mark_as_view


def test_marks_in_place_and_returns_tensor():
    base = torch.arange(4.0)
    alias = plain_alias(base, 2, 2)
    assert not alias._is_view()
    assert not shares_version_counter(alias, base)
    result = torch.mark_as_view(alias, base)
    assert result is alias
    assert alias._is_view()
    assert alias._base is base
    assert shares_version_counter(alias, base)
    version = alias._version
    base.add_(1)
    assert alias._version == version + 1


def test_base_of_a_view_is_the_root():
    root = torch.arange(4.0)
    middle = root.view(2, 2)
    alias = plain_alias(root, 2, 2)
    mark_as_view(alias, middle)
    assert alias._base is root


def test_reproduction_with_mark_as_view():
    saved = {}

    class SaveMode(TorchDispatchMode):
        # Opted out of automatic tracking, which would make the
        # alias a view already: the stock situation mark_as_view repairs.
        __aliasguard_track_views__ = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.sin.default:
                saved["t"] = torch.mark_as_view(torch.ops.aten.alias.default(out), out)
            return out

    with SaveMode():
        b = torch.sin(torch.tensor(1.0))
    version = saved["t"]._version
    b.mul_(2)
    assert saved["t"]._version > version


@pytest.mark.parametrize("shape", [(6,), (2, 3), (3, 2)])
def test_gradients_match_a_real_view(shape):
    def through_real_view(x):
        return x.view(*shape) * 3

    def through_marked_view(x):
        alias = plain_alias(x, *shape)
        return torch.mark_as_view(alias, x) * 3

    x = torch.randn(6, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(through_marked_view, (x,))
    (g_real,) = torch.autograd.grad(through_real_view(x).pow(2).sum(), x)
    (g_marked,) = torch.autograd.grad(through_marked_view(x).pow(2).sum(), x)
    torch.testing.assert_close(g_marked, g_real)


def test_marked_view_is_not_a_leaf():
    x = torch.randn(3, requires_grad=True)
    alias = torch.mark_as_view(plain_alias(x), x)
    assert alias.requires_grad
    assert alias.grad_fn is not None
    assert not alias.is_leaf


def test_view_fn_is_used_for_replay():
    calls = []

    def view_fn(base):
        calls.append(base)
        return base.view(2, 3).t()

    x = torch.randn(6, dtype=torch.double, requires_grad=True)
    alias = torch.mark_as_view(plain_alias(x, 2, 3, transpose=True), x, view_fn=view_fn)
    weight = torch.randn(3, 2, dtype=torch.double)
    (alias * weight).sum().backward()
    assert calls and calls[0] is x
    torch.testing.assert_close(x.grad, weight.t().reshape(6))


def test_inplace_on_base_rebuilds_grad_fn():
    x = torch.randn(4, dtype=torch.double, requires_grad=True)
    y = x * 1
    alias = torch.mark_as_view(plain_alias(y), y)
    y.mul_(2)
    alias.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))


def test_creation_meta_names():
    base = torch.ones(2)
    alias = torch.mark_as_view(plain_alias(base), base, creation_meta="NO_GRAD_MODE")
    assert alias._is_view()


def test_no_grad_marks_like_a_no_grad_view():
    x = torch.ones(2, requires_grad=True)
    with torch.no_grad():
        real = x.view(2)
        marked = torch.mark_as_view(plain_alias(x), x)
    assert marked.requires_grad == real.requires_grad
    assert (marked.grad_fn is None) == (real.grad_fn is None)
    with pytest.raises(RuntimeError) as real_error:
        real.mul_(2)
    with pytest.raises(RuntimeError) as marked_error:
        marked.mul_(2)
    assert "no_grad" in str(real_error.value)
    assert "no_grad" in str(marked_error.value)


def test_inference_mode_refuses_inference_tensors():
    with torch.inference_mode():
        base = torch.ones(2)
        with pytest.raises(RuntimeError, match="inference tensor"):
            torch.mark_as_view(base.view(2), base)


def test_non_differentiable_view_shares_counter_only():
    x = torch.ones(2, requires_grad=True)
    alias = torch.mark_as_view(
        plain_alias(x), x, is_bw_differentiable=False, is_fw_differentiable=False
    )
    assert shares_version_counter(alias, x)
    assert not alias._is_view()
    assert not alias.requires_grad


def test_alias_storage_for_a_wrapper_subclass():
    class Wrapper(WrapperTensor):
        @classmethod
        def on_dispatch(cls, func, unwrapped_args, out):
            raise AssertionError(f"unexpected {func}")

    base = Wrapper(torch.ones(4))
    out = Wrapper(torch.ones(4))
    assert out.untyped_storage()._cdata != base.untyped_storage()._cdata
    torch.mark_as_view(out, base, alias_storage=True)
    assert out.untyped_storage()._cdata == base.untyped_storage()._cdata
    assert out._base is base
    assert out.shape == (4,)
    assert shares_version_counter(out, base)


def test_wrapper_without_real_storage_is_accepted_without_alias_storage():
    from torch.testing._internal.two_tensor import TwoTensor

    base = TwoTensor(torch.ones(2), torch.ones(2))
    out = TwoTensor(torch.ones(2), torch.ones(2))
    torch.mark_as_view(out, base)
    assert out._base is base


# --- refusals: each names its cause and changes nothing ----------------------


def snapshot(t):
    return (
        t._is_view(),
        t.requires_grad,
        t.grad_fn,
        t._version,
        t.untyped_storage()._cdata,
        t.shape,
        t.stride(),
        t.storage_offset(),
    )


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda base: plain_alias(base).requires_grad_(), "leaf that requires grad"),
        (lambda base: torch.ones(2).view(2), "already a view"),
        (lambda base: torch.ones(2, requires_grad=True) * 2, "has a grad_fn"),
        (lambda base: torch.ones(2), "does not share base's storage"),
        (lambda base: base, "same tensor"),
    ],
    ids=["leaf", "view", "grad_fn", "storage", "self"],
)
def test_refusals(make, message):
    base = torch.ones(2)
    tensor = make(base)
    before = snapshot(tensor)
    base_before = snapshot(base)
    with pytest.raises(RuntimeError, match=message):
        torch.mark_as_view(tensor, base)
    assert snapshot(tensor) == before
    assert snapshot(base) == base_before


def test_refusal_of_tensor_that_had_requires_grad():
    base = torch.ones(2)
    tensor = plain_alias(base).requires_grad_().requires_grad_(False)
    with pytest.raises(RuntimeError, match="already has autograd metadata"):
        torch.mark_as_view(tensor, base)
    assert not tensor._is_view()


@pytest.mark.parametrize("tensor_arg, base_arg, name", [(1, "t", "tensor"), ("t", [1.0], "base")])
def test_non_tensor_arguments(tensor_arg, base_arg, name):
    t = torch.ones(2)
    args = [t if a == "t" else a for a in (tensor_arg, base_arg)]
    with pytest.raises(TypeError, match=f"{name} must be a Tensor"):
        torch.mark_as_view(*args)
    assert not t._is_view()


def test_unknown_creation_meta():
    base = torch.ones(2)
    tensor = plain_alias(base)
    with pytest.raises(ValueError, match="unknown creation_meta 'SOMETIMES'"):
        torch.mark_as_view(tensor, base, creation_meta="SOMETIMES")
    assert not tensor._is_view()
    assert not shares_version_counter(tensor, base)


def test_view_fn_not_callable():
    base = torch.ones(2)
    tensor = plain_alias(base)
    with pytest.raises(TypeError, match="view_fn must be callable"):
        torch.mark_as_view(tensor, base, view_fn=3)
    assert not tensor._is_view()


def test_alias_storage_out_of_bounds():
    base = torch.ones(2)
    tensor = torch.ones(3)
    before = snapshot(tensor)
    with pytest.raises(RuntimeError, match="need 12 bytes of storage but base's storage has 8"):
        torch.mark_as_view(tensor, base, alias_storage=True)
    assert snapshot(tensor) == before
