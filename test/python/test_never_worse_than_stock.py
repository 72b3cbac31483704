"""Cases where aliasguard was worse than stock, one test each.

Stock PyTorch runs each of these; with aliasguard imported (or inside
``audit()``) they once failed. A case still open is
``xfail(strict=True)`` with the case in its reason, so its fix turns it into a
failure and removes the marker. The upstream tests that found them are named
where there is one (``tools/run_upstream_suites.py``).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from test_audit_report import CopyingViews

import aliasguard

# --- audit() registration and state --------------------------------------


@pytest.mark.parametrize("key", ["TESTING_ONLY_GenericMode", "TESTING_ONLY_GenericWrapper"])
@pytest.mark.parametrize("auditing", [False, True], ids=["no_audit", "inside_audit"])
def test_testing_only_keys_stay_free(key, auditing):
    # What test_python_dispatch's test_fallback* do: register a fallback on the
    # TESTING_ONLY keys, include the key, and see it called. The audit borrows
    # another key, so this works inside audit() too, and the audit still sees
    # the ops.
    seen = []
    key_set = torch._C.DispatchKeySet(key)

    def fallback(op, *args, **kwargs):
        seen.append(op)
        with torch._C._ForceDispatchKeyGuard(
            torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set() | key_set
        ):
            return op(*args, **kwargs)

    lib = torch.library.Library("_", "IMPL")
    try:
        lib.fallback(fallback, key)
        with aliasguard.audit() if auditing else contextlib.nullcontext():
            include = torch._C._dispatch_tls_local_include_set() | key_set
            with torch._C._ForceDispatchKeyGuard(include, torch._C._dispatch_tls_local_exclude_set()):
                out = torch.ones(2) + 1
            if auditing:
                with pytest.raises(aliasguard.AliasingError, match="aten::view"):
                    with CopyingViews():
                        torch.ones(2).view(2)
    finally:
        lib._destroy()
    assert torch.equal(out, torch.full((2,), 2.0))
    assert torch.ops.aten.add.Tensor in seen



# Out-of-order exits: test_audit_report.py::test_scopes_ending_out_of_order_restore_the_thread.


# --- audit() false alarms on correct code ----------------------------------


def test_audit_quiet_under_vmap():
    x = torch.randn(4, 1, 3)
    expected = torch.vmap(lambda t: t.expand(2, 3))(x)
    with aliasguard.audit():
        got = torch.vmap(lambda t: t.expand(2, 3))(x)
    torch.testing.assert_close(got, expected)


def test_audit_quiet_under_compile_aot_eager():
    torch._dynamo.reset()
    f = torch.compile(lambda t: t.sin() + 1, backend="aot_eager")
    x = torch.randn(3)
    with aliasguard.audit():
        got = f(x)
    torch.testing.assert_close(got, x.sin() + 1)


def test_audit_quiet_on_cond():
    x = torch.randn(2)
    with aliasguard.audit():
        got = torch.cond(torch.tensor(True), lambda t: t.sin(), lambda t: t.cos(), (x,))
    torch.testing.assert_close(got, x.sin())


@pytest.mark.parametrize("kernels", [False, True], ids=["default", "kernels"])
def test_audit_quiet_on_batched_gradients(kernels):
    # autograd.grad(is_grads_batched=True), which gradcheck's batched-gradient
    # check uses, runs the backward under the legacy vmap: its batched tensors
    # have no storage or counter of their own (test_autograd.py's
    # test_grad_batched_grad and the gradchecks of test_view_ops.py).
    x = torch.randn(2, 2, dtype=torch.double, requires_grad=True)
    expected = torch.autograd.grad(x.sum(), x, torch.arange(3.0), is_grads_batched=True)
    with aliasguard.audit(kernels=kernels):
        got = torch.autograd.grad(x.sum(), x, torch.arange(3.0), is_grads_batched=True)
        assert torch.autograd.gradcheck(
            lambda t: t.as_strided((2,), (2,)).expand(3, 2), (x,), check_batched_grad=True
        )
    torch.testing.assert_close(got, expected)


def test_audit_under_dynamic_shapes():
    # A second shape makes dynamo trace with a symbolic size, so fake tensors'
    # storage sizes are symbols: the audit must not ask for them as integers
    # (that raised "Expected !size_bytes_is_heap_allocated_").
    torch._dynamo.reset()
    for n in (3, 4, 5):
        x, pred = torch.randn(n), torch.tensor(True)
        with aliasguard.audit():
            got = torch.cond(pred, lambda t: t.sin(), lambda t: t.cos(), (x,))
        torch.testing.assert_close(got, x.sin())
    f = torch.compile(lambda t: t.view(-1, 2).sin(), backend="aot_eager", dynamic=True)
    for n in (2, 3):
        x = torch.randn(2 * n)
        with aliasguard.audit(kernels=True):
            got = f(x)
        torch.testing.assert_close(got, x.view(-1, 2).sin())


def test_audit_quiet_under_functionalize():
    # Once a false alarm: functionalize's tensors alias one level down.
    f = torch.func.functionalize(lambda t: t.view(-1).add_(1))
    with aliasguard.audit():
        got = f(torch.zeros(2, 2))
    assert got.tolist() == [1.0] * 4


@pytest.mark.parametrize("how", ["kernels", "pass_through"])
def test_audit_quiet_on_c10d_collectives(how):
    # The collectives reach the audit (kernels=True, or a pass-through mode):
    # the control in assert_quiet_and_controlled shows that they did.
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from real_client_workloads import gloo_world_of_one
    from test_audit_controls import assert_quiet_and_controlled

    with gloo_world_of_one():
        t = torch.arange(4.0)

        def workload():
            dist.broadcast(t, 0)
            dist.all_reduce(t)
            funcol.all_reduce(t, "sum", dist.group.WORLD).wait()

        assert_quiet_and_controlled(workload, how)
        assert t.tolist() == [0.0, 1.0, 2.0, 3.0]


# --- errors torch reports itself stay torch's -------------------------------


def test_invalid_return_type_keeps_torchs_error():
    class ReturnsStr(torch.Tensor):
        @staticmethod
        def __new__(cls, elem):
            return torch.Tensor._make_subclass(cls, elem, elem.requires_grad)

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return "arf"

    with pytest.raises(RuntimeError, match="Unable to cast"):
        ReturnsStr(torch.zeros(1)).neg()
    with pytest.raises(RuntimeError, match="Unable to cast"):
        ReturnsStr(torch.zeros(1)).detach()
