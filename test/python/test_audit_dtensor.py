"""audit(): list-returning views of wrappers that no alias correction touched.

torch dispatches DTensor in C++, bypassing its ``__torch_dispatch__`` (so
aliasguard's correction never runs on it): a single view return gets its
input's storage there, each wrapper of split/chunk/unbind keeps a placeholder
of its own. The audit judges such views by their inner tensors. See
Note [Wrapper views judged by their inner tensors].
"""

from __future__ import annotations

import pytest
import torch
from real_client_workloads import gloo_world_of_one
from torch.utils._pytree import tree_map_only

import aliasguard
from aliasguard import AliasingError, AuditReport

aten = torch.ops.aten


def _tp_attention(x, w_qkv, w_out):
    """Tensor-parallel style attention: one fused projection split into q, k, v."""
    qkv = torch.nn.functional.linear(x, w_qkv)
    q, k, v = qkv.chunk(3, dim=-1)
    scores = (q @ k.transpose(-2, -1)).softmax(dim=-1)
    heads = (scores @ v).split(4, dim=-1)
    out = torch.nn.functional.linear(torch.cat(heads, dim=-1), w_out)
    rows = out.unbind(0)
    return torch.stack([r.sum(0) for r in rows])


def test_tensor_parallel_attention_on_dtensor_equals_the_run_without_audit():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    with gloo_world_of_one():
        mesh = init_device_mesh("cpu", (1,))
        torch.manual_seed(0)
        x = distribute_tensor(torch.randn(2, 5, 8), mesh, [Replicate()])
        w_qkv = distribute_tensor(torch.randn(24, 8), mesh, [Shard(0)]).requires_grad_()
        w_out = distribute_tensor(torch.randn(8, 8), mesh, [Replicate()]).requires_grad_()
        expected = _tp_attention(x, w_qkv, w_out).full_tensor()
        with aliasguard.audit(report=AuditReport()) as report:
            got = _tp_attention(x, w_qkv, w_out)
            got.sum().backward()
            parts = x.split(2, dim=-1) + x.unbind(1)
        assert not report, report.format()
        torch.testing.assert_close(got.full_tensor(), expected, rtol=0, atol=0)
        assert all(isinstance(p, DTensor) for p in parts)
        # The judge found the data shared: a write through a part reaches x.
        parts[0].mul_(0)
        assert x.to_local()[..., :2].abs().sum().item() == 0
        with aliasguard.audit():  # raise mode
            q, k, v = torch.nn.functional.linear(x, w_qkv).chunk(3, dim=-1)
            x.unbind(0)
        assert q.shape == k.shape == v.shape == (2, 5, 8)


def _dispatch(cls, func, types, args=(), kwargs=None):
    args, kwargs = tree_map_only(Bypassed, lambda t: t.elem, (args, kwargs or {}))
    out = func(*args, **kwargs)
    if cls.copy_views and func is aten.split.Tensor:
        out = [t.clone() for t in out]
    return tree_map_only(torch.Tensor, cls, out)


class Bypassed(torch.Tensor):
    """A traceable wrapper whose ``__torch_dispatch__`` is assigned after the class was made, so
    aliasguard does not wrap it (as torch bypasses DTensor's): results reach the audit uncorrected,
    each wrapper with its own placeholder storage."""

    copy_views = False

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype, strides=elem.stride())

    def __init__(self, elem):
        self.elem = elem

    def __tensor_flatten__(self):
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner, ctx, size, stride):
        return Bypassed(inner["elem"])


class CopyingBypassed(Bypassed):
    copy_views = True


class OpaqueBypassed(Bypassed):
    """Not traceable: the audit cannot see its inner tensor."""

    __tensor_flatten__ = None  # type: ignore[assignment]


for _cls in (Bypassed, CopyingBypassed, OpaqueBypassed):
    _cls.__torch_dispatch__ = classmethod(_dispatch)  # type: ignore[assignment]


def test_uncorrected_list_views_sharing_inner_data_pass():
    x = Bypassed(torch.randn(6))
    with aliasguard.audit():
        parts = x.split(2)
        x.unbind(0)
    assert parts[0].untyped_storage()._cdata != x.untyped_storage()._cdata  # uncorrected indeed
    parts[1].elem.fill_(7)
    assert x.elem[2:4].tolist() == [7.0, 7.0]


def test_uncorrected_list_views_of_copied_inner_data_are_reported():
    with pytest.raises(AliasingError, match="inner tensor 'elem' shares no memory") as info:
        with aliasguard.audit():
            CopyingBypassed(torch.randn(6)).split(2)
    assert (info.value.op, info.value.kind) == ("aten::split.Tensor", "view_inner_copy")


def test_uncorrected_views_that_cannot_be_seen_into_are_reported_by_storage():
    with pytest.raises(AliasingError, match="does not share the storage") as info:
        with aliasguard.audit():
            OpaqueBypassed(torch.randn(6)).split(2)
    assert info.value.kind == "view_storage"

