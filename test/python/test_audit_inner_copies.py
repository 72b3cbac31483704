"""audit(): inner tensors of traceable wrappers that a view handler copies.

A view whose data is a copy is reported at once; a view that shares its
input's data but keeps a private copy of some other inner tensor (torchao's
quantized optimizer states clone their constant lookup table when sliced) is
reported only once that copy, or the input's tensor it stands for, is written.
See Note [Inner tensors of traceable wrappers].
"""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch

import aliasguard
from aliasguard import AliasingError, AuditReport

aten = torch.ops.aten

HAVE_TORCHAO = importlib.util.find_spec("torchao") is not None


class QuantState(torch.Tensor):
    """A quantized state in the shape of torchao's OptimState8bit: ``codes`` and ``scale`` hold the
    data, ``qmap`` is a constant lookup table. Its slice handler slices the data and clones ``qmap``."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, codes, scale, qmap):
        return torch.Tensor._make_wrapper_subclass(cls, codes.shape, dtype=torch.float32)

    def __init__(self, codes, scale, qmap):
        self.codes, self.scale, self.qmap = codes, scale, qmap

    def __tensor_flatten__(self):
        return ["codes", "scale", "qmap"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return QuantState(inner["codes"], inner["scale"], inner["qmap"])

    @classmethod
    def zeros(cls, n):
        return cls(torch.zeros(n, dtype=torch.uint8), torch.ones(n), torch.linspace(-1, 1, 256))

    def dequantize(self):
        return self.qmap[self.codes.long()] * self.scale

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is aten.slice.Tensor:
            x, dim, start, end = args[:4]
            return cls(x.codes[start:end], x.scale[start:end], x.qmap.clone())
        if func is aten.copy_.default:
            dst, src = args
            codes = torch.bucketize(src / dst.scale, dst.qmap).clamp(max=255).to(torch.uint8)
            dst.codes.copy_(codes)
            return dst
        raise NotImplementedError(func)


def test_a_copied_constant_is_not_reported_while_nothing_writes_it():
    state = QuantState.zeros(8)
    expected = state.dequantize()[2:6]
    with aliasguard.audit():
        part = state[2:6]
        got = part.dequantize()
        part.copy_(torch.full((4,), 0.5))  # writes the shared codes, not qmap
    torch.testing.assert_close(got, expected)
    assert state.codes[2:6].tolist() == part.codes.tolist() and state.codes[2:6].unique().item() != 0
    with aliasguard.audit(report=AuditReport()) as report:
        state[2:6].copy_(torch.zeros(4))
    assert [v.kind for v in report.violations()] == ["view_storage"]  # the wrapper's: repaired


def test_a_write_to_the_copy_is_reported_naming_the_view_op():
    state = QuantState.zeros(8)
    with pytest.raises(AliasingError, match="inner tensor 'qmap' shares no memory") as info:
        with aliasguard.audit():
            part = state[2:6]
            part.qmap.mul_(2)  # the view and its input now decode differently
    assert (info.value.kind, info.value.op) == ("view_inner_copy", "aten::slice.Tensor")
    assert not torch.equal(part.qmap, state.qmap)

    with aliasguard.audit(report=AuditReport()) as report:
        state[2:6].qmap.add_(1)
    [entry] = [v for v in report.violations() if v.kind == "view_inner_copy"]
    assert entry.op == "aten::slice.Tensor" and entry.owner.endswith("QuantState")
    assert not entry.repaired


def test_a_write_to_the_inputs_tensor_is_reported():
    state = QuantState.zeros(8)
    with aliasguard.audit(report=AuditReport()) as report:
        part = state[0:4]
        state.scale.mul_(2)  # shared with the view: no divergence
        assert not [v for v in report.violations() if v.kind == "view_inner_copy"]
        state.qmap.neg_()  # the input's table, which the view copied
    assert [v.op for v in report.violations() if v.kind == "view_inner_copy"] == ["aten::slice.Tensor"]
    del part


def test_watches_end_with_the_scope():
    state = QuantState.zeros(8)
    with aliasguard.audit():
        part = state[2:6]
    with aliasguard.audit():
        part.qmap.mul_(2)  # the view was made in a scope that has ended
    part.qmap.mul_(2)


class CopyingState(QuantState):
    """QuantState whose slice handler copies every inner tensor: a view op answered with a copy."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is aten.slice.Tensor:
            x, dim, start, end = args[:4]
            return cls(x.codes[start:end].clone(), x.scale[start:end].clone(), x.qmap.clone())
        return super().__torch_dispatch__(func, types, args, kwargs)

    @classmethod
    def slice_of(cls, state):
        copying = cls(state.codes, state.scale, state.qmap)
        return copying[2:6]


def test_a_view_whose_data_is_all_copied_is_reported_at_once():
    state = CopyingState.zeros(8)
    with pytest.raises(AliasingError, match="writes through the view never reach the input's data") as info:
        with aliasguard.audit():
            state[2:6]
    assert info.value.kind == "view_inner_copy"


def test_reshape_that_copies_a_jagged_tensor_in_inference_mode_is_not_reported():
    # reshape is CompositeImplicitAutograd: in inference mode it reaches NJT's __torch_dispatch__, which copies a
    # non-contiguous input, as reshape does for plain tensors.
    nt = torch.nested.nested_tensor(
        [torch.randn(2, 3, 4), torch.randn(5, 3, 4)], layout=torch.jagged, requires_grad=True
    ).transpose(-1, -2)
    with aliasguard.audit(), torch.inference_mode():
        copied = nt.reshape([2, -1, 12])
    assert not copied._is_view() and copied.values().data_ptr() != nt.values().data_ptr()
    # Positive control in the same kind of scope: a view op that may not copy, answered with copies.
    state = QuantState.zeros(8)
    with pytest.raises(AliasingError, match="never reach the input's data") as info:
        with aliasguard.audit(), torch.inference_mode():
            nt.reshape([2, -1, 12])
            CopyingState.slice_of(state)
    assert (info.value.kind, info.value.op) == ("view_inner_copy", "aten::slice.Tensor")


@pytest.mark.skipif(not HAVE_TORCHAO, reason="torchao is not installed (optional)")
@pytest.mark.parametrize("name", ["OptimState4bit", "OptimState8bit"])
@pytest.mark.parametrize("shape", [(4096,), (256, 256)])
def test_torchao_optimizer_state_slices(name, shape):
    # torchao's own test_low_bit_optim.py::test_subclass_slice, under audit().
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torchao.optim as optim

    subclass = getattr(optim.subclass_4bit if "4bit" in name else optim.subclass_8bit, name)
    tensor = subclass.zeros(shape)
    offset = shape[0] // 2
    with aliasguard.audit():
        torch.testing.assert_close(tensor.dequantize()[:offset], tensor[:offset].dequantize())
        torch.testing.assert_close(tensor.dequantize()[offset : offset * 2], tensor[offset : offset * 2].dequantize())
    with pytest.raises(AliasingError, match="inner tensor 'qmap'"):
        with aliasguard.audit():
            tensor[:offset].qmap.mul_(2)
