"""audit(): workloads that must be quiet, each beside a positive control.

A quiet audit proves nothing unless the ops reached it: plain tensors reach
the audit only with ``kernels=True`` or through a ``__torch_dispatch__`` (a
pass-through mode). Each quiet workload here runs both ways, and the same
workload with one deliberately broken kernel added is reported, so a broken
audit fails these tests instead of passing them. The broken kernels are
registered here and shared with the other suites' quiet workloads
(``broken_view`` and ``aliasing_split``).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import pytest
import torch

import aliasguard
from aliasguard import AliasingError
from aliasguard.testing import PassThroughMode

_lib = torch.library.Library("aliasguard_audit_controls", "DEF")
# A view whose kernel answers with a copy: what the audit exists to report.
_lib.define("broken_view(Tensor(a) self) -> Tensor(a)")
_lib.impl("broken_view", lambda self: self.clone(), "CPU")
# unsafe_split's behaviour without its exemption: fresh returns that share
# the input's memory.
_lib.define("aliasing_split(Tensor self, int size) -> Tensor[]")
_lib.impl("aliasing_split", lambda self, size: [t.view_as(t) for t in self.split(size)], "CPU")

broken_view = torch.ops.aliasguard_audit_controls.broken_view.default
aliasing_split = torch.ops.aliasguard_audit_controls.aliasing_split.default


@contextlib.contextmanager
def _kernels() -> Iterator[None]:
    with aliasguard.audit(kernels=True):
        yield


@contextlib.contextmanager
def _pass_through() -> Iterator[None]:
    with aliasguard.audit(), PassThroughMode():
        yield


#: The two ways plain-tensor ops reach the audit.
REACHES_AUDIT: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "kernels": _kernels,
    "pass_through": _pass_through,
}


def assert_quiet_and_controlled(workload: Callable[[], object], how: str) -> None:
    """``workload`` runs quietly under the audit (``how``), and the same workload followed by a
    broken view kernel is reported, naming that kernel."""
    with REACHES_AUDIT[how]():
        workload()
    with pytest.raises(AliasingError, match="broken_view") as info:
        with REACHES_AUDIT[how]():
            workload()
            broken_view(torch.randn(3))
    assert info.value.kind == "view_copy"


@pytest.mark.parametrize("how", sorted(REACHES_AUDIT))
def test_controls_are_not_reported_without_reaching_the_audit(how):
    # What the other tests guard against: a scope that no plain op reaches.
    with aliasguard.audit():
        broken_view(torch.randn(3))
        aliasing_split(torch.randn(4), 2)
    with pytest.raises(AliasingError, match="aliasing_split") as info:
        with REACHES_AUDIT[how]():
            aliasing_split(torch.randn(4), 2)
    assert info.value.kind == "fresh_shares_memory"


@pytest.mark.parametrize("how", sorted(REACHES_AUDIT))
def test_unsafe_splits_share_memory_by_design(how):
    x = torch.randn(6, requires_grad=True)

    def workload():
        torch.unsafe_split(x, 2)
        torch.unsafe_chunk(x, 3)
        torch.unsafe_split_with_sizes(x, [2, 4])

    assert_quiet_and_controlled(workload, how)


def test_c10d_collectives_are_quiet():
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this build")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.ones(3)

        def workload():
            dist.broadcast(t, src=0)
            dist.all_reduce(t)
            dist.all_gather([torch.empty(3)], t)

        for how in sorted(REACHES_AUDIT):
            assert_quiet_and_controlled(workload, how)
        assert t.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()


class _AnswersWithItsInput(torch.utils._python_dispatch.TorchDispatchMode):
    """Answers one op with its first argument, whatever the schema says."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is self.op:
            return args[0]
        return func(*args, **(kwargs or {}))


def test_fresh_returns_of_composite_ops_answered_by_nested_jagged_tensors_are_quiet():
    # NJT's where() broadcasts its arguments below autograd; for equal shapes broadcast_tensors
    # (CompositeImplicitAutograd: its results may ignore the schema) hands them back.
    nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)
    cond = nt > 0
    with aliasguard.audit():
        out = torch.where(cond, nt, nt * 2)
    torch.testing.assert_close(out.values(), torch.where(cond.values(), nt.values(), nt.values() * 2))
    # Positive control in the same kind of scope: a fresh return of an op that is not composite
    # answered with its argument is still reported.
    with pytest.raises(AliasingError, match="aten::sin") as info:
        with aliasguard.audit(), _AnswersWithItsInput(torch.ops.aten.sin.default):
            torch.where(cond, nt, nt * 2)
            torch.randn(3).sin()
    assert info.value.kind == "fresh_is_argument"
