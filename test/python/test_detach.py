"""F1: detach below autograd keeps the version counter."""

import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import aliasguard
from aliasguard import shares_version_counter
from aliasguard.testing import PassThroughMode, WrapperTensor


class SaveOutputMode(TorchDispatchMode):
    """Caches the output of one op inside __torch_dispatch__, as SAC does."""

    def __init__(self, target, how):
        super().__init__()
        self.target = target
        self.how = how
        self.saved = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is self.target:
            self.saved = self.how(out)
        return out


def test_reproduction_from_design_detach():
    a = torch.tensor(1.0)
    mode = SaveOutputMode(torch.ops.aten.sin.default, lambda out: out.detach())
    with mode:
        b = torch.sin(a)
    saved = mode.saved
    assert b.data_ptr() == saved.data_ptr()
    assert shares_version_counter(saved, b)
    version = saved._version
    b.mul_(2)
    assert saved._version > version


def test_mutating_the_detached_copy_bumps_the_original():
    mode = SaveOutputMode(torch.ops.aten.cos.default, lambda out: out.detach())
    with mode:
        b = torch.cos(torch.ones(3))
    version = b._version
    mode.saved.add_(1)
    assert b._version == version + 1


def test_detach_in_wrapper_subclass_shares_inner_counter():
    captured = {}

    class Wrapper(WrapperTensor):
        @classmethod
        def on_dispatch(cls, func, unwrapped_args, out):
            if func is torch.ops.aten.detach.default:
                captured["input"] = unwrapped_args[0]
                captured["output"] = out

    w = Wrapper(torch.ones(2))
    w.detach()
    assert shares_version_counter(captured["input"], captured["output"])
    version = captured["output"]._version
    captured["input"].add_(1)
    assert captured["output"]._version == version + 1


def test_data_keeps_a_fresh_counter():
    a = torch.ones(2)
    d = a.data
    assert not shares_version_counter(a, d)
    version = d._version
    a.add_(1)
    assert d._version == version


def test_top_level_detach_unchanged():
    a = torch.ones(2, requires_grad=True)
    d = a.detach()
    assert not d.requires_grad
    assert d.grad_fn is None
    assert not d._is_view()
    assert shares_version_counter(a, d)


def test_requires_grad_of_result_below_autograd():
    leaf = torch.ones(2, requires_grad=True)
    mode = SaveOutputMode(torch.ops.aten.mul.Tensor, lambda out: out.detach())
    with mode:
        (leaf * 2).sum()
    assert not mode.saved.requires_grad


def test_inference_tensors_unchanged():
    with torch.inference_mode():
        a = torch.ones(2)
        d = a.detach()
    assert d.is_inference()
    with pytest.raises(RuntimeError, match="Inference tensors do not track version counter"):
        d._version  # noqa: B018
    assert not shares_version_counter(a, d)


def test_sparse_coo_detach():
    s = torch.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,))
    mode = SaveOutputMode(torch.ops.aten.detach.default, lambda out: out)
    with mode:
        d = s.detach()
    assert d.is_sparse
    assert torch.equal(d.to_dense(), s.to_dense())
    assert d._values().data_ptr() == s._values().data_ptr()


def test_meta_detach():
    m = torch.empty(2, 3, device="meta")
    with SaveOutputMode(torch.ops.aten.detach.default, lambda out: out):
        d = m.detach()
    assert d.is_meta
    assert d.shape == (2, 3)


def _nested_detach_below_autograd():
    # The inner mode detaches a nested tensor inside its __torch_dispatch__
    # (below autograd); the detach reaches the outer pass-through mode, whose
    # nested kernel (stock: aliasguard leaves nested tensors' detach alone)
    # builds the result with a fresh counter. Only alias correction of the
    # outer mode's result (aten::detach returns a view) can make it share.
    nt = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    inner = SaveOutputMode(torch.ops.aten.mul.Tensor, lambda out: out.detach())
    with PassThroughMode(), inner:
        product = nt * 2
    return product, inner.saved


def test_nested_detach_below_autograd_shares_the_version_counter():
    product, saved = _nested_detach_below_autograd()
    assert saved.is_nested
    assert [t.shape for t in saved.unbind()] == [(2,), (3,)]
    assert shares_version_counter(saved, product)
    version = saved._version
    product.add_(1)
    assert saved._version == version + 1


def test_nested_detach_below_autograd_without_correction_gets_a_fresh_counter():
    # Stock behaviour, which the test above must differ from.
    previous = aliasguard.set_alias_correction(False)
    try:
        product, saved = _nested_detach_below_autograd()
    finally:
        aliasguard.set_alias_correction(previous)
    assert not shares_version_counter(saved, product)


def test_cpu_kernel_registered_composite_kept():
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::detach", "CPU")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(
        "aten::detach", "CompositeExplicitAutograd"
    )
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::detach", "Meta")


def test_import_prints_no_override_warning():
    result = subprocess.run(
        [sys.executable, "-c", "import aliasguard"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Overriding a previously registered kernel" not in result.stderr
    assert "Warning" not in result.stderr, result.stderr


def test_no_grad_below_autograd_still_shares():
    mode = SaveOutputMode(torch.ops.aten.sin.default, lambda out: out.detach())
    with torch.no_grad(), mode:
        b = torch.sin(torch.ones(2))
    assert shares_version_counter(mode.saved, b)


def test_package_exposes_version():
    assert aliasguard.__version__
