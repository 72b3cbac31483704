"""Audit scopes: what the audit changes in torch only while one is open, and scopes ended in any order.

* Higher-order operators skip the audit's dispatch key while at least one
  audit is open on any thread, and get their own key sets back when the last
  one ends (see Note [Higher-order operators under an audit] in
  aliasguard/_install.py).
* Each scope is removed by its identity, so a violation goes to the innermost
  scope still open, whatever order the others ended in.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import uuid
from typing import Dict, List, Optional

import pytest
import torch
from torch._ops import HigherOrderOperator
from torch.utils._python_dispatch import TorchDispatchMode

import aliasguard
from aliasguard import AliasingError, AuditReport, _C
from aliasguard._aliasing import _audit_new_threads
from aliasguard._install import higher_order_op_scopes

aten = torch.ops.aten
AUDIT_KEY = torch._C.DispatchKeySet("DeferredInit")  # type: ignore[arg-type]


def hop_key_sets() -> Dict[str, int]:
    return {name: op.non_fallthrough_keys.raw_repr() for name, op in torch._ops._higher_order_ops.items()}


def assert_key_sets_restored(before: Dict[str, int]) -> None:
    """Each HOP that existed has its set back; HOPs made meanwhile (torch.cond's first
    call imports dynamo, which makes some) have the audit key, as any new HOP has."""
    after = hop_key_sets()
    assert {name: after[name] for name in before} == before
    assert all(has_audit_key(torch._ops._higher_order_ops[name]) for name in after.keys() - before.keys())


def has_audit_key(op: HigherOrderOperator) -> bool:
    return (op.non_fallthrough_keys - AUDIT_KEY) != op.non_fallthrough_keys


def make_doubling_hop() -> HigherOrderOperator:
    """A new higher-order operator (registered for good, so under a fresh name)."""

    class Double(HigherOrderOperator):
        def __init__(self) -> None:
            super().__init__(f"aliasguard_test_double_{uuid.uuid4().hex}")

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            return super().__call__(x)

    double = Double()

    @double.py_impl(torch._C.DispatchKey.CompositeExplicitAutograd)
    def _dense(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @double.py_impl(torch._C.DispatchKey.Autograd)
    def _autograd(x: torch.Tensor) -> torch.Tensor:
        with torch._C._AutoDispatchBelowAutograd():
            return double(x)

    return double


# --- higher-order operators ---------------------------------------------------------


def test_cond_under_audit_and_every_key_set_restored_after():
    before = hop_key_sets()
    init_before = HigherOrderOperator.__dict__["__init__"]
    assert all(has_audit_key(op) for op in torch._ops._higher_order_ops.values())
    x, pred = torch.randn(3), torch.tensor(True)
    with aliasguard.audit():
        assert higher_order_op_scopes() == 1
        assert not any(has_audit_key(op) for op in torch._ops._higher_order_ops.values())
        assert HigherOrderOperator.__dict__["__init__"] is not init_before
        out = torch.cond(pred, lambda t: t.sin(), lambda t: t.cos(), (x,))
    torch.testing.assert_close(out, x.sin())
    assert_key_sets_restored(before)
    assert HigherOrderOperator.__dict__["__init__"] is init_before
    assert higher_order_op_scopes() == 0


def test_a_hop_created_inside_an_open_audit_works_inside_it_and_gets_its_keys_back():
    with aliasguard.audit():
        double = make_doubling_hop()
        assert not has_audit_key(double)
        assert torch.equal(double(torch.ones(2)), torch.full((2,), 2.0))
    assert has_audit_key(double)  # as a HOP made outside any audit has it
    assert double.non_fallthrough_keys.raw_repr() == make_doubling_hop().non_fallthrough_keys.raw_repr()
    assert torch.equal(double(torch.ones(2)), torch.full((2,), 2.0))


def test_a_hop_made_outside_fails_on_the_audit_key_unless_the_audit_removes_it():
    # The control: without the audit's change the audit key reaches the HOP,
    # which has no rule for it, so the change above is what makes it work.
    double = make_doubling_hop()
    with aliasguard.audit():
        double.non_fallthrough_keys = double.non_fallthrough_keys | AUDIT_KEY
        try:
            with pytest.raises(NotImplementedError, match="could not find kernel"):
                double(torch.ones(2))
        finally:
            double.non_fallthrough_keys = double.non_fallthrough_keys - AUDIT_KEY


def test_other_changes_to_a_hop_key_set_during_an_audit_are_kept():
    double = make_doubling_hop()
    before = double.non_fallthrough_keys
    with aliasguard.audit():
        double.fallthrough(torch._C.DispatchKey.AutocastCPU)
    assert double.non_fallthrough_keys == before - torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def test_key_sets_stay_changed_while_an_audit_is_open_on_another_thread():
    before = hop_key_sets()
    opened, release = threading.Event(), threading.Event()
    errors: List[BaseException] = []

    def audited() -> None:
        try:
            with aliasguard.audit():
                opened.set()
                release.wait(60)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    worker = threading.Thread(target=audited)
    worker.start()
    try:
        assert opened.wait(60)
        with aliasguard.audit():
            assert higher_order_op_scopes() == 2
        assert higher_order_op_scopes() == 1
        cond = torch.ops.higher_order.cond
        assert not has_audit_key(cond)  # the other thread's audit is still open
    finally:
        release.set()
        worker.join(60)
    assert not errors
    assert_key_sets_restored(before)


def test_a_failed_audit_entry_leaves_the_key_sets_alone():
    before = hop_key_sets()
    lib = torch.library.Library("_", "IMPL")
    try:
        lib.fallback(lambda op, *args, **kwargs: op(*args, **kwargs), "DeferredInit")
        with pytest.raises(RuntimeError, match="already has a fallback registered"):
            with aliasguard.audit():
                pass
    finally:
        lib._destroy()
    assert_key_sets_restored(before)
    assert higher_order_op_scopes() == 0


# --- scopes ended out of order -------------------------------------------------------


class CopyingViews(TorchDispatchMode):
    """Answers aten.view with a copy; opted out of correction, so only the audit sees it."""

    __aliasguard_fixup__ = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out.clone() if func is aten.view.default else out


def violate() -> None:
    with CopyingViews():
        torch.randn(4).view(2, 2)


def test_the_violation_is_silent_without_an_audit():
    violate()  # the control for "no scope left" below


def occurrences(reports: List[Optional[AuditReport]]) -> List[int]:
    return [report.occurrences if report is not None else 0 for report in reports]


KINDS = list(itertools.product(("raise", "report"), repeat=3))
ORDERS = list(itertools.permutations(range(3)))


@pytest.mark.parametrize("kinds", KINDS, ids=["-".join(k) for k in KINDS])
@pytest.mark.parametrize("order", ORDERS, ids=["".join(map(str, o)) for o in ORDERS])
def test_violations_go_to_the_innermost_open_scope_after_each_exit(kinds, order):
    reports: List[Optional[AuditReport]] = [AuditReport() if kind == "report" else None for kind in kinds]
    scopes = [aliasguard.audit(report=report) for report in reports]
    for scope in scopes:
        scope.__enter__()
    open_scopes = [0, 1, 2]
    try:
        for ending in order:
            scopes[ending].__exit__(None, None, None)
            open_scopes.remove(ending)
            counts = occurrences(reports)
            if not open_scopes:
                violate()
                assert occurrences(reports) == counts
                continue
            target = open_scopes[-1]
            if reports[target] is None:
                with pytest.raises(AliasingError):
                    violate()
                assert occurrences(reports) == counts
            else:
                violate()
                counts[target] += 1
                assert occurrences(reports) == counts
    finally:
        for index in open_scopes:
            scopes[index].__exit__(None, None, None)
    assert _C._alias_audit_depth() == 0 and higher_order_op_scopes() == 0


def test_scopes_ended_out_of_order_with_an_exit_stack():
    first, second = AuditReport(), AuditReport()
    with contextlib.ExitStack() as stack:
        stack.enter_context(aliasguard.audit(report=first))
        inner = aliasguard.audit(report=second)
        inner.__enter__()
        stack.close()  # the outer scope ends first
        violate()
        assert (first.occurrences, second.occurrences) == (0, 1)
        inner.__exit__(None, None, None)
    violate()
    assert (first.occurrences, second.occurrences) == (0, 1)


def test_thread_audit_blocks_ended_out_of_order_send_threads_to_the_remaining_one():
    outer, inner = AuditReport(), AuditReport()

    def run_violation() -> None:
        worker = threading.Thread(target=violate)
        worker.start()
        worker.join(60)

    outer_block, inner_block = _audit_new_threads(outer), _audit_new_threads(inner)
    outer_block.__enter__()
    inner_block.__enter__()
    try:
        run_violation()
        assert (outer.occurrences, inner.occurrences) == (0, 1)
        outer_block.__exit__(None, None, None)
        run_violation()
        assert (outer.occurrences, inner.occurrences) == (0, 2)
    finally:
        inner_block.__exit__(None, None, None)
    run_violation()
    assert (outer.occurrences, inner.occurrences) == (0, 2)
