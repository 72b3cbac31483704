"""Scenarios whose results must be the same with and without aliasguard.

Imports nothing from aliasguard: test_auto_tracking.py runs this module in a
process that imports aliasguard first and in one that does not (stock), and
compares what ``collect()`` returns, bit for bit.

    python tracking_scenarios.py OUT.pt [--aliasguard]
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map_only, tree_unflatten

aten = torch.ops.aten


# Not aliasguard.testing.PassThroughMode: besides forwarding each op, this one
# keeps a view of every output made in its body, which the tracking scenarios
# need (those views must be tracked).
class PassThroughMode(TorchDispatchMode):
    """Runs every op unchanged, keeping a view of every tensor output (what a
    cache below autograd does)."""

    def __init__(self):
        super().__init__()
        self.kept = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.dim() > 0:
                self.kept.append(t.view_as(t))
        return out


class Wrapper(torch.Tensor):
    """A wrapper subclass holding one plain tensor; no alias bookkeeping."""

    @staticmethod
    def __new__(cls, elem, *, requires_grad=False):
        return torch.Tensor._make_wrapper_subclass(
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            device=elem.device,
            requires_grad=requires_grad,
        )

    def __init__(self, elem, *, requires_grad=False):
        self.elem = elem

    def __repr__(self):
        return f"Wrapper({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda t: t.elem  # noqa: E731
        out = func(*tree_map_only(cls, unwrap, args), **tree_map_only(cls, unwrap, kwargs or {}))
        flat, spec = tree_flatten(out)
        return tree_unflatten([cls(t) if isinstance(t, torch.Tensor) else t for t in flat], spec)


def in_place_ops():
    """(name, setup, op): op mutates what setup returns; versions are read on
    every tensor setup returns."""

    def two_by_three():
        return (torch.randn(2, 3),)

    def with_other():
        return torch.randn(2, 3), torch.randn(2, 3)

    def norm_stats():
        return torch.randn(4, 3), torch.zeros(3), torch.ones(3)

    return [
        ("add_", two_by_three, lambda x: x.add_(1)),
        ("mul_", two_by_three, lambda x: x.mul_(2)),
        ("copy_", with_other, lambda x, y: x.copy_(y)),
        ("out=", with_other, lambda x, y: torch.add(y, 1, out=x)),
        ("t_", two_by_three, lambda x: x.t_()),
        ("view then add_", two_by_three, lambda x: x[0].add_(1)),
        ("index_put_", two_by_three, lambda x: x.index_put_((torch.tensor([1]),), torch.tensor(5.0))),
        ("_foreach_add_", with_other, lambda x, y: torch._foreach_add_([x, y], 1.0)),
        ("batch_norm stats", norm_stats, lambda x, m, v: F.batch_norm(x, m, v, training=True)),
        ("two in-place ops", two_by_three, lambda x: x.add_(1).mul_(2)),
    ]


def version_deltas():
    """Version change of each argument, for each op: at top level, through a
    mode and through a wrapper subclass."""
    results = {}
    for name, setup, op in in_place_ops():
        for where in ("top level", "mode", "wrapper"):
            tensors = setup()
            if where == "wrapper":
                tensors = tuple(Wrapper(t) for t in tensors)
            before = [t._version for t in tensors]
            if where == "mode":
                with PassThroughMode():
                    op(*tensors)
            else:
                op(*tensors)
            results[(name, where)] = [t._version - b for t, b in zip(tensors, before)]
    return results


def model_step(x, w1, w2):
    """Views, multi-output views, indexing and in-place ops on intermediates."""
    h = x @ w1
    h = h.view(2, 4, 3).transpose(1, 2)
    a, b = h.split(2, dim=2)
    rows = h.unbind(0)
    h = a.relu() * b.sigmoid() + rows[1][:, :2]
    h = h.reshape(2, 6)
    h.mul_(0.5)
    h = h.t().contiguous()[1:]
    y = h.t() @ w2
    y.add_(1.0)
    return y.tanh().sum()


def gradients():
    results = {}
    for where in ("top level", "mode", "wrapper"):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 5, generator=g)
        w1 = torch.randn(5, 12, generator=g)
        w2 = torch.randn(5, 3, generator=g)
        if where == "wrapper":
            x, w1, w2 = (Wrapper(t, requires_grad=True) for t in (x, w1, w2))
        else:
            x, w1, w2 = (t.requires_grad_() for t in (x, w1, w2))
        if where == "mode":
            with PassThroughMode():
                loss = model_step(x, w1, w2)
                loss.backward()
        else:
            loss = model_step(x, w1, w2)
            loss.backward()
        grads = [t.grad for t in (x, w1, w2)]
        if where == "wrapper":
            grads = [t.elem for t in grads]
            loss = loss.elem
        results[where] = (loss.detach().clone(), [t.clone() for t in grads])
    return results


def two_tensor_gradients():
    from torch.testing._internal.two_tensor import TwoTensor

    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 4, generator=g, requires_grad=True)
    b = torch.randn(3, 4, generator=g, requires_grad=True)
    x = TwoTensor(a, b)
    v = x.view(4, 3).t()
    y = (v * 2 + 1).sin() + x.split(2)[0].sum()
    y = y.clone()
    y.mul_(3)
    y.sum().backward()
    return x.grad.a.clone(), x.grad.b.clone()


def forward_gradients():
    """Forward-mode tangents of model_step's views, at top level and through a mode."""
    import torch.autograd.forward_ad as fwAD

    results = {}
    for where in ("top level", "mode"):
        g = torch.Generator().manual_seed(2)
        x, w1, w2 = torch.randn(2, 5, generator=g), torch.randn(5, 12, generator=g), torch.randn(5, 3, generator=g)
        tangent = torch.randn(2, 5, generator=g)
        with fwAD.dual_level():
            dual = fwAD.make_dual(x, tangent)
            if where == "mode":
                with PassThroughMode():
                    out = model_step(dual, w1, w2)
            else:
                out = model_step(dual, w1, w2)
            results[where] = fwAD.unpack_dual(out).tangent.clone()
    return results


def collect():
    torch.manual_seed(0)
    return {
        "version_deltas": version_deltas(),
        "gradients": gradients(),
        "two_tensor_gradients": two_tensor_gradients(),
        "forward_gradients": forward_gradients(),
    }


if __name__ == "__main__":
    if "--aliasguard" in sys.argv:
        import aliasguard  # noqa: F401
    torch.save(collect(), sys.argv[1])


class WritesTwice(TorchDispatchMode):
    """Answers add_ with two writes, recording the version between them."""

    def __init__(self):
        super().__init__()
        self.between = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is aten.add_.Tensor:
            self.between = args[0]._version
            args[0].mul_(1)
        return out
