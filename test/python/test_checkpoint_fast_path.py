"""The fast path of aliasguard.checkpoint (kernels below autograd): list policies and policy functions given ops=.

Each guarantee is checked against a reference that could differ: outputs and
gradients bitwise equal to the un-checkpointed run, the same saved bytes as
torch's SAC with the same list, writes to cached tensors raising (never a
silent wrong gradient), nested regions, two threads, tensor subclasses, and
that the mode path is what a policy function without ``ops`` gets; a policy
function with ``ops`` is asked what a dispatch mode's policy would be asked,
only for those ops, once per forward call.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as torch_checkpoint
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils.checkpoint import CheckpointPolicy

import aliasguard.checkpoint as ours
from aliasguard.testing import StorageTracker
from aliasguard import _C
from aliasguard.checkpoint import CheckpointMutationError, checkpoint

aten = torch.ops.aten
MATMULS = [aten.mm.default, aten.addmm.default, aten.bmm.default]


def block_inputs(seed: int = 0) -> Tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(2, 4, 8), (24, 8), (24,), (8, 8), (16, 8), (8, 16)]
    return tuple(torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_() for s in shapes)


def block(x, wqkv, bqkv, wo, wup, wdown):
    q, k, v = F.linear(x, wqkv, bqkv).split(8, dim=-1)
    attn = ((q @ k.transpose(-2, -1)) / math.sqrt(8)).softmax(-1) @ v  # bmm
    x = x + F.linear(attn, wo)
    return x + F.linear(F.gelu(F.linear(x, wup)), wdown)


def grads_of(fn: Callable[..., torch.Tensor], inputs: Tuple[torch.Tensor, ...]) -> Tuple[torch.Tensor, ...]:
    for t in inputs:
        t.grad = None
    out = fn(*inputs)
    out.sum().backward()
    return (out.detach(), *(t.grad.clone() for t in inputs))


def fast_contexts(policy: Any) -> Any:
    return ours.create_selective_checkpoint_contexts(policy)


def test_list_policy_uses_the_fast_path_and_no_dispatch_mode():
    forward, recompute = fast_contexts(MATMULS)
    assert not isinstance(forward, TorchDispatchMode)
    assert not isinstance(recompute, TorchDispatchMode)
    seen: List[int] = []

    def fn(x, w):
        seen.append(len(_get_current_dispatch_mode_stack()))
        return torch.mm(x, w).sin()

    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    checkpoint(fn, x, w, policy=[aten.mm.default]).sum().backward()
    assert seen == [0, 0]  # forward and recompute ran with no mode on the stack


def test_function_policy_keeps_the_mode_path():
    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE

    forward, recompute = ours.create_selective_checkpoint_contexts(policy)
    assert isinstance(forward, TorchDispatchMode) and isinstance(recompute, TorchDispatchMode)
    forward, _ = ours.create_selective_checkpoint_contexts(MATMULS, fast_path=False)
    assert isinstance(forward, TorchDispatchMode)


def test_outputs_and_gradients_are_bitwise_equal_to_no_checkpoint():
    inputs = block_inputs()
    expected = grads_of(block, inputs)
    got = grads_of(lambda *a: checkpoint(block, *a, policy=MATMULS), inputs)
    for e, g in zip(expected, got):
        assert torch.equal(e, g)


def test_cached_ops_are_not_run_again_in_the_recompute():
    calls = {"mm": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is aten.mm.default:
                calls["mm"] += 1
            return func(*args, **(kwargs or {}))

    x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    with Count():
        out = checkpoint(lambda x, w: torch.mm(x.cos(), w).sin(), x, w, policy=[aten.mm.default])
        assert calls["mm"] == 1
        out.sum().backward()
    # backward: the 2 gradient mm; the forward mm came from the cache.
    assert calls["mm"] == 3


def saved_bytes(context_fn: Callable[[], Any], inputs: Tuple[torch.Tensor, ...]) -> int:
    """Bytes the forward pass of a checkpointed ``block`` leaves alive for the backward."""
    tracker = StorageTracker()
    with tracker:
        out = torch_checkpoint.checkpoint(block, *inputs, use_reentrant=False, context_fn=context_fn).sum()
    live = sum(tracker.live((out, *inputs)).values())
    out.backward()
    return live


def test_saved_bytes_equal_torch_sac_with_the_same_list():
    inputs = block_inputs(1)

    def saved(make_contexts: Callable[..., Any]) -> int:
        return saved_bytes(functools.partial(make_contexts, MATMULS), inputs)

    theirs = saved(torch_checkpoint.create_selective_checkpoint_contexts)
    mine = saved(ours.create_selective_checkpoint_contexts)
    plain = saved(lambda _: (torch_checkpoint.noop_context_fn()))
    assert mine == theirs
    assert mine > plain  # something was cached


SAVE_MM = {
    "list": {"policy": [aten.mm.default]},
    "function with ops": {"policy": lambda ctx, op, *args, **kwargs: True, "ops": [aten.mm.default]},
}


@pytest.mark.parametrize("how", list(SAVE_MM))
def test_write_after_forward_raises_at_recompute_naming_the_cached_op(how: str):
    kept: List[torch.Tensor] = []

    def fn(x, w):
        y = torch.mm(x, w)
        kept.append(y)
        return y.sin()

    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    out = checkpoint(fn, x, w, **SAVE_MM[how]).sum()
    with torch.no_grad():
        kept[0].mul_(2)
    with pytest.raises(CheckpointMutationError, match=r"aten\.mm\.default .*after the forward pass") as info:
        out.backward()
    assert info.value.cached_op == "aten.mm.default"
    assert info.value.cached_at.endswith(f"{__file__}:{fn.__code__.co_firstlineno + 1}".split("/")[-1])
    assert (info.value.expected_version, info.value.found_version) == (0, 1)


# Each writes to ``y``, the cached mm output, in its own way; the line of the
# write is the lambda's.
WRITES: Dict[str, Callable[[torch.Tensor], Any]] = {
    "in place": lambda y: y.add_(1),
    "through a view": lambda y: y[0].mul_(2),
    "out=": lambda y: torch.mul(torch.ones(3, 3), 2, out=y),
    "copy_": lambda y: y.copy_(torch.zeros(3, 3)),
    "foreach": lambda y: torch._foreach_add_([torch.zeros(1), y], 1),
    "under no_grad": lambda y: _under_no_grad(y),
}
WRITING_OPS = {
    "in place": "aten.add_.Tensor",
    "through a view": "aten.mul_.Tensor",
    "out=": "aten.mul.out",
    "copy_": "aten.copy_.default",
    "foreach": "aten._foreach_add_.Scalar",
    "under no_grad": "aten.sub_.Tensor",
}


def _under_no_grad(y: torch.Tensor) -> None:
    with torch.no_grad():
        y.sub_(1)


def _line_of(fn: Callable[..., Any], offset: int = 0) -> str:
    return f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno + offset}"


@pytest.mark.parametrize("how", list(SAVE_MM))
@pytest.mark.parametrize("write", list(WRITES))
def test_write_inside_the_region_is_refused_before_it_happens(how: str, write: str):
    seen: Dict[str, Any] = {}

    def fn(x, w):
        y = torch.mm(x, w)
        seen["y"], seen["value"], seen["version"] = y, y.detach().clone(), y._version
        WRITES[write](y)
        return y.sin()

    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    refused = r"would write to the memory of output 0 of aten\.mm\.default"
    with pytest.raises(CheckpointMutationError, match=refused) as info:
        checkpoint(fn, x, w, **SAVE_MM[how])
    error = info.value
    assert error.mutating_op == WRITING_OPS[write]
    assert error.cached_op == "aten.mm.default"
    assert error.cached_at == _line_of(fn, 1)
    write_line = _line_of(_under_no_grad, 2) if write == "under no_grad" else _line_of(WRITES[write])
    assert error.mutated_at == write_line
    assert f"{error.mutating_op} at {write_line}" in str(error)
    # Nothing was written, and the guard is off again.
    assert torch.equal(seen["y"].detach(), seen["value"]) and seen["y"]._version == seen["version"]
    assert not _C._sac_write_guard_is_on()
    assert _C._sac_fast_num_open_regions() == 0


@pytest.mark.parametrize("how", list(SAVE_MM))
def test_write_inside_the_region_goes_through_when_mutation_is_allowed(how: str):
    def fn(x, w):
        y = torch.mm(x, w)
        y.add_(1)  # would be applied twice by the recompute: the user said it is harmless
        return y

    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    out = checkpoint(fn, x, w, allow_cache_entry_mutation=True, **SAVE_MM[how])
    assert torch.equal(out.detach(), torch.mm(x, w).detach() + 1)


def test_the_write_guard_is_on_only_in_this_threads_forward_region():
    calls: List[Tuple[bool, bool]] = []  # per run of fn: (this thread, another thread)

    def fn(x):
        in_other: List[bool] = []
        other = threading.Thread(target=lambda: in_other.append(_C._sac_write_guard_is_on()))
        other.start()
        other.join()
        calls.append((_C._sac_write_guard_is_on(), in_other[0]))
        return torch.mm(x, x).sin()

    x = torch.randn(3, 3, requires_grad=True)
    assert not _C._sac_write_guard_is_on()
    out = checkpoint(fn, x, policy=[aten.mm.default])
    assert not _C._sac_write_guard_is_on()
    out.sum().backward()  # runs fn again: the recompute
    assert calls == [(True, False), (False, False)]
    # allow_cache_entry_mutation=True: nothing to refuse, the guard stays off.
    checkpoint(fn, x, policy=[aten.mm.default], allow_cache_entry_mutation=True)
    assert calls[-1] == (False, False)


def test_a_write_from_another_thread_is_found_when_the_forward_ends():
    def fn(x):
        y = torch.mm(x, x)
        writer = threading.Thread(target=lambda: y.detach().add_(1))  # the guard is this thread's
        writer.start()
        writer.join()
        return y.sin()

    with pytest.raises(CheckpointMutationError, match="could not refuse") as info:
        checkpoint(fn, torch.randn(3, 3, requires_grad=True), policy=[aten.mm.default])
    assert (info.value.expected_version, info.value.found_version) == (0, 1)
    assert not _C._sac_write_guard_is_on()


def test_nested_regions_refuse_a_write_to_the_outer_regions_cache():
    def inner(y):
        y.mul_(2)
        return y.sin()

    def outer(x):
        y = torch.mm(x, x)
        return checkpoint(inner, y, policy=[aten.addmm.default])

    with pytest.raises(CheckpointMutationError) as info:
        checkpoint(outer, torch.randn(3, 3, requires_grad=True), policy=[aten.mm.default])
    assert (info.value.mutating_op, info.value.cached_op) == ("aten.mul_.Tensor", "aten.mm.default")
    assert info.value.mutated_at == _line_of(inner, 1)
    assert not _C._sac_write_guard_is_on()


def test_an_op_registered_after_the_first_region_is_guarded():
    checkpoint(lambda x: torch.mm(x, x), torch.randn(2, 2, requires_grad=True), policy=[aten.mm.default])
    before = _C._sac_write_guard_num_kernels()
    assert before > 0
    lib = torch.library.Library("aliasguard_write_guard_test", "DEF")  # noqa: TOR901
    try:
        lib.define("halve_(Tensor(a!) x) -> ()")
        lib.impl("halve_", lambda x: x.mul_(0.5), "CompositeExplicitAutograd")
        halve_ = torch.ops.aliasguard_write_guard_test.halve_.default

        def fn(x):
            y = torch.mm(x, x)
            halve_(y)
            return y.sin()

        with pytest.raises(CheckpointMutationError) as info:
            checkpoint(fn, torch.randn(2, 2, requires_grad=True), policy=[aten.mm.default])
        assert info.value.mutating_op == "aliasguard_write_guard_test.halve_.default"
        assert _C._sac_write_guard_num_kernels() > before
    finally:
        lib._destroy()


def test_write_through_a_batched_matmul_result_is_seen():
    # x @ w on 3-d inputs ends with aten._unsafe_view, which has a counter of
    # its own: the fast path gives it the cached bmm output's.
    kept: List[torch.Tensor] = []

    def fn(a, b):
        y = a @ b
        kept.append(y)
        return y.sin()

    a, b = torch.randn(2, 3, 4, requires_grad=True), torch.randn(2, 4, 5, requires_grad=True)
    out = checkpoint(fn, a, b, policy=[aten.bmm.default]).sum()
    with torch.no_grad():
        kept[0].add_(1)
    with pytest.raises(CheckpointMutationError, match=r"aten\.bmm\.default"):
        out.backward()


def test_nested_regions_give_the_same_gradients():
    inputs = block_inputs(2)

    def inner(x, wup, wdown):
        return F.linear(F.gelu(F.linear(x, wup)), wdown)

    def outer(x, wqkv, bqkv, wo, wup, wdown):
        q, k, v = F.linear(x, wqkv, bqkv).split(8, dim=-1)
        attn = ((q @ k.transpose(-2, -1)) / math.sqrt(8)).softmax(-1) @ v
        x = x + F.linear(attn, wo)
        return x + checkpoint(inner, x, wup, wdown, policy=[aten.mm.default])

    expected = grads_of(block, inputs)
    got = grads_of(lambda *a: checkpoint(outer, *a, policy=MATMULS), inputs)
    for e, g in zip(expected, got):
        assert torch.equal(e, g)
    assert _C._sac_fast_num_open_regions() == 0


def test_two_threads_each_get_their_own_regions():
    inputs = [block_inputs(seed) for seed in (3, 4)]
    expected = [grads_of(block, i) for i in inputs]
    results: Dict[int, Any] = {}
    barrier = threading.Barrier(2)

    def work(index: int) -> None:
        try:
            barrier.wait()
            for _ in range(5):
                results[index] = grads_of(lambda *a: checkpoint(block, *a, policy=MATMULS), inputs[index])
        except BaseException as error:  # reported by the main thread
            results[index] = error

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for index in range(2):
        assert not isinstance(results[index], BaseException), results[index]
        for e, g in zip(expected[index], results[index]):
            assert torch.equal(e, g)


def test_tensor_subclass_outputs_are_recomputed_with_the_same_gradients():
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g)
    w = torch.randn(4, 4, generator=g, requires_grad=True)

    def fn(x, w):
        return torch.mm(x, w).sin()

    def run(checkpointed: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        x = TwoTensor(a.clone(), b.clone()).requires_grad_()
        w.grad = None
        out = checkpoint(fn, x, w, policy=[aten.mm.default]) if checkpointed else fn(x, w)
        out.sum().backward()
        return out.detach(), x.grad

    (out_ref, gx_ref), gw_ref = run(False), w.grad.clone()
    (out, gx), gw = run(True), w.grad.clone()
    assert torch.equal(out.a, out_ref.a) and torch.equal(out.b, out_ref.b)
    assert torch.equal(gx.a, gx_ref.a) and torch.equal(gx.b, gx_ref.b)
    assert torch.equal(gw, gw_ref)


def test_view_and_in_place_ops_in_the_list_are_recomputed():
    forward, _ = fast_contexts([aten.mm.default, aten.t.default, aten.add_.Tensor])
    assert not isinstance(forward, TorchDispatchMode)
    assert _C._sac_fast_skip_reason("aten::t", "").startswith("it has an ADInplaceOrView kernel")
    assert _C._sac_fast_skip_reason("aten::add_", "Tensor").startswith("it has an ADInplaceOrView kernel")
    assert _C._sac_fast_skip_reason("aten::linear", "").startswith("it is CompositeImplicitAutograd")

    def fn(x, w):
        y = torch.mm(x, w.t()).sin()  # sin's output is not cached: add_ may write it
        return y.add_(1).cos()

    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    expected = grads_of(fn, (x, w))
    got = grads_of(lambda *a: checkpoint(fn, *a, policy=[aten.mm.default, aten.t.default]), (x, w))
    for e, g in zip(expected, got):
        assert torch.equal(e, g)


def test_cached_entries_name_the_op_and_the_line():
    forward, recompute = fast_contexts([aten.mm.default])
    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3)
    line = test_cached_entries_name_the_op_and_the_line.__code__.co_firstlineno + 5
    out = torch_checkpoint.checkpoint(
        lambda x, w: torch.mm(x, w).sin(), x, w, use_reentrant=False, context_fn=lambda: (forward, recompute)
    )
    ((op, value, where),) = forward.cached_entries()
    assert op is aten.mm.default
    assert isinstance(value, torch.Tensor) and value.shape == (3, 3)
    assert where.endswith(f":{line}")
    out.sum().backward()
    ((_, value, _),) = forward.cached_entries()
    assert value is None  # handed back and released


def test_kernels_outside_a_region_change_nothing():
    checkpoint(lambda x: torch.mm(x, x), torch.randn(2, 2, requires_grad=True), policy=[aten.mm.default])
    assert _C._sac_fast_num_kernels() >= 2  # mm and _unsafe_view stay registered
    x = torch.randn(3, 3, requires_grad=True)
    y = torch.mm(x, x)
    y.sum().backward()
    assert torch.equal(x.grad, (torch.ones(3, 3) @ x.detach().t() + x.detach().t() @ torch.ones(3, 3)))


# --- function policies with their op set (ops=) ---------------------------------------


def torchtitan_style_policy() -> Tuple[Callable[..., Any], List[Any]]:
    """Save every matmul but every second mm, counting per pass (as torchtitan does)."""
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, func, *args, **kwargs):
        if func is aten.mm.default:
            counts["recompute" if ctx.is_recompute else "forward"] += 1
            if counts["recompute" if ctx.is_recompute else "forward"] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in MATMULS else CheckpointPolicy.PREFER_RECOMPUTE

    return policy, MATMULS


def test_function_policy_with_ops_takes_the_fast_path():
    policy, ops = torchtitan_style_policy()
    forward, recompute = ours.create_selective_checkpoint_contexts(policy, ops=ops)
    assert not isinstance(forward, TorchDispatchMode) and not isinstance(recompute, TorchDispatchMode)
    forward, _ = ours.create_selective_checkpoint_contexts(policy, ops=ops, fast_path=False)
    assert isinstance(forward, TorchDispatchMode)


def test_function_policy_is_asked_only_for_its_ops_with_what_a_mode_would_pass():
    seen: Dict[str, List[Any]] = {"ours": [], "torch": []}

    def recording(into: List[Any]) -> Callable[..., Any]:
        def policy(ctx, func, *args, **kwargs):
            if not ctx.is_recompute:
                plain = (int, float, bool, list, torch.dtype, type(None))
                shown = [a if isinstance(a, plain) else type(a) for a in args]
                into.append((func, shown, kwargs, type(ctx.op_output)))
            return CheckpointPolicy.MUST_SAVE if func is aten.addmm.default else CheckpointPolicy.PREFER_RECOMPUTE

        return policy

    def fn(x, w):
        y = torch.addmm(x, x, w, beta=0.5)  # a non-default keyword-only argument
        z = F.layer_norm(y, (4,))  # trailing defaults, None arguments
        return torch.mm(z, w).to(torch.float64).sin()

    x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    ops = [aten.addmm.default, aten.native_layer_norm.default, aten.mm.default, aten._to_copy.default]
    checkpoint(fn, x, w, policy=recording(seen["ours"]), ops=ops).sum().backward()
    torch_checkpoint.checkpoint(
        fn, x, w, use_reentrant=False,
        context_fn=functools.partial(torch_checkpoint.create_selective_checkpoint_contexts, recording(seen["torch"])),
    ).sum().backward()
    assert seen["ours"] == [s for s in seen["torch"] if s[0] in ops]
    assert [s[0] for s in seen["ours"]] == ops  # sin, t, ... were never asked
    assert seen["ours"][0][2] == {"beta": 0.5}
    assert seen["ours"][3][2] == {"dtype": torch.float64}


def test_function_policy_with_ops_gives_bitwise_gradients_and_torch_saved_bytes():
    inputs = block_inputs(6)
    expected = grads_of(block, inputs)
    policy, ops = torchtitan_style_policy()
    got = grads_of(lambda *a: checkpoint(block, *a, policy=policy, ops=ops), inputs)
    for e, g in zip(expected, got):
        assert torch.equal(e, g)

    torch_policy, _ = torchtitan_style_policy()
    theirs = saved_bytes(functools.partial(torch_checkpoint.create_selective_checkpoint_contexts, torch_policy), inputs)
    policy, ops = torchtitan_style_policy()
    mine = saved_bytes(functools.partial(ours.create_selective_checkpoint_contexts, policy, ops=ops), inputs)
    everything = saved_bytes(functools.partial(ours.create_selective_checkpoint_contexts, MATMULS), inputs)
    assert mine == theirs
    assert 0 < mine < everything  # the policy dropped some of the listed calls


def test_function_policy_decisions_are_replayed_not_asked_again_at_recompute():
    asked: List[bool] = []

    def policy(ctx, func, *args, **kwargs):
        asked.append(ctx.is_recompute)
        return CheckpointPolicy.MUST_SAVE

    calls = {"mm": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls["mm"] += func is aten.mm.default
            return func(*args, **(kwargs or {}))

    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    with Count():
        out = checkpoint(lambda x, w: torch.mm(x, w).sin(), x, w, policy=policy, ops=[aten.mm.default])
        out.sum().backward()
    assert asked == [False]
    assert calls["mm"] == 3  # one forward, two in the backward; none in the recompute


def test_function_policy_with_ops_watches_only_the_calls_it_saves():
    # The write to a saved call is refused: test_write_after_forward_... above.
    kept: List[torch.Tensor] = []

    def fn(x, w):
        kept.append(torch.mm(x, w))
        return kept[-1].sin()

    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    expected = torch.autograd.grad(fn(x, w).sum(), (x, w))
    out = checkpoint(fn, x, w, policy=lambda ctx, op, *a, **k: False, ops=[aten.mm.default]).sum()
    with torch.no_grad():
        kept[-1].mul_(2)  # recomputed, so the write cannot reach the backward
    got = torch.autograd.grad(out, (x, w))
    assert all(torch.equal(e, g) for e, g in zip(expected, got))


def test_function_policy_errors_propagate_from_the_op_and_leave_no_region_open():
    def raising(ctx, func, *args, **kwargs):
        raise KeyError("policy failed")

    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    with pytest.raises(KeyError, match="policy failed"):
        checkpoint(lambda x, w: torch.mm(x, w).sin(), x, w, policy=raising, ops=[aten.mm.default])
    assert _C._sac_fast_num_open_regions() == 0
    with pytest.raises(ours.CheckpointPolicyError, match=r"aten\.mm\.default"):
        checkpoint(lambda x, w: (x @ w).sin(), x, w, policy=lambda *a, **k: None, ops=[aten.mm.default])
    assert _C._sac_fast_num_open_regions() == 0
    # Still usable afterwards.
    out = checkpoint(lambda x, w: torch.mm(x, w).sin(), x, w, policy=lambda *a, **k: True, ops=[aten.mm.default])
    out.sum().backward()


@pytest.mark.parametrize("fast_path", [True, False])
def test_ops_means_the_same_on_every_path(fast_path: bool):
    asked: List[Any] = []

    def policy(ctx, func, *args, **kwargs):
        asked.append(func)
        return CheckpointPolicy.MUST_SAVE

    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    checkpoint(lambda x, w: torch.mm(x, w).sin().cos(), x, w, policy=policy, ops=[aten.mm.default],
               fast_path=fast_path).sum().backward()
    assert asked == [aten.mm.default]


def test_ops_argument_errors_name_what_was_wrong():
    policy = lambda ctx, func, *a, **k: True  # noqa: E731
    with pytest.raises(ValueError, match="a list policy already names them"):
        ours.create_selective_checkpoint_contexts(MATMULS, ops=MATMULS)
    with pytest.raises(TypeError, match="ops must be a list .* got OpOverload"):
        ours.create_selective_checkpoint_contexts(policy, ops=aten.mm.default)
    with pytest.raises(ValueError, match=r"overload packet; name one overload, e\.g\. aten\.mm\.default"):
        ours.create_selective_checkpoint_contexts(policy, ops=[aten.mm])
    x = torch.randn(2, 2, requires_grad=True)
    with pytest.raises(ValueError, match="a list policy already names them"):
        checkpoint(lambda x: x.sin(), x, policy=MATMULS, ops=MATMULS)
    assert x.grad is None and x._version == 0


# --- ops with an ordered effect (Note [Effectful ops on the fast path]) ------------------


def effectful_block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # aten._linalg_check_errors has an ordered effect registered by every
    # supported torch; from 2.15 on torch's SAC keeps it whatever a
    # recomputing policy says, so its effect happens once.
    torch.ops.aten._linalg_check_errors.default(torch.zeros((), dtype=torch.int32), "test", is_matrix=False)
    return torch.mm(x, w).sin()


def effect_calls(make_contexts: Callable[[], Any]) -> int:
    op = aten._linalg_check_errors.default
    calls = 0

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            nonlocal calls
            calls += func is op
            return func(*args, **(kwargs or {}))

    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    with Count():
        out = torch_checkpoint.checkpoint(effectful_block, x, w, use_reentrant=False, context_fn=make_contexts)
        out.sum().backward()
    return calls


def function_policy_saving(saved: CheckpointPolicy) -> Callable[..., Any]:
    return lambda ctx, func, *args, **kwargs: saved if func is aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE


@pytest.mark.parametrize("policy_kind", ["list", "function", "function asked for it"])
def test_an_effectful_op_keeps_the_fast_path_and_runs_as_often_as_with_torch_sac(policy_kind):
    if policy_kind == "list":
        ours_make = functools.partial(ours.create_selective_checkpoint_contexts, [aten.mm.default])
        theirs_make = functools.partial(torch_checkpoint.create_selective_checkpoint_contexts, [aten.mm.default])
    else:
        ops = [aten.mm.default]
        if policy_kind == "function asked for it":
            ops.append(aten._linalg_check_errors.default)
        policy = function_policy_saving(CheckpointPolicy.MUST_SAVE)
        ours_make = functools.partial(ours.create_selective_checkpoint_contexts, policy, ops=ops)
        theirs_make = functools.partial(torch_checkpoint.create_selective_checkpoint_contexts, policy)
    forward, recompute = ours_make()
    assert not isinstance(forward, TorchDispatchMode) and not isinstance(recompute, TorchDispatchMode)
    theirs = effect_calls(theirs_make)
    assert effect_calls(ours_make) == theirs
    from aliasguard import _torch_sac_semantics as semantics

    kept = aten._linalg_check_errors.default in semantics.ops_kept_for_effect()
    assert kept == bool(semantics.policies_overridden_for_effects())
    assert theirs == (1 if kept else 2)


def test_a_policy_that_must_recompute_an_effectful_op_replays_it_as_with_torch_sac():
    # MUST_RECOMPUTE is the one answer torch's override leaves alone.
    def policy(ctx, func, *args, **kwargs):
        if func is aten._linalg_check_errors.default:
            return CheckpointPolicy.MUST_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func is aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE

    ops = [aten.mm.default, aten._linalg_check_errors.default]
    ours_make = functools.partial(ours.create_selective_checkpoint_contexts, policy, ops=ops)
    assert not isinstance(ours_make()[0], TorchDispatchMode)
    theirs = effect_calls(functools.partial(torch_checkpoint.create_selective_checkpoint_contexts, policy))
    assert theirs == 2
    assert effect_calls(ours_make) == theirs


def test_the_effectful_ops_are_recomputed_when_an_op_is_registered():
    from aliasguard import _torch_sac_semantics as semantics

    if not semantics.policies_overridden_for_effects():
        assert semantics.ops_kept_for_effect() == frozenset()
        return
    from torch._higher_order_ops.effects import _EffectType

    before = semantics.ops_kept_for_effect()
    lib = torch.library.Library("aliasguard_fast_effects", "FRAGMENT")
    try:
        lib.define("probe(Tensor x) -> Tensor")
        lib.impl("probe", lambda x: x.clone(), "CompositeExplicitAutograd")
        lib._register_effectful_op("aliasguard_fast_effects::probe", _EffectType.ORDERED)
        op = torch.ops.aliasguard_fast_effects.probe.default
        assert op not in before
        assert op in semantics.ops_kept_for_effect()
    finally:
        lib._destroy()
    assert op not in semantics.ops_kept_for_effect()


def test_where_another_library_holds_the_guards_key_the_modes_refuse_the_write():
    from subprocess_snippets import run_snippet

    # A library that registered a fallback on the key before aliasguard's first
    # region: the fast path cannot guard writes there, so the region takes the
    # modes (with a warning), which refuse the write before it happens.
    result = run_snippet(
        """
        import warnings
        import torch
        lib = torch.library.Library("_", "IMPL")  # noqa: TOR901
        lib.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastXLA")
        import aliasguard
        from aliasguard import _C
        from aliasguard.checkpoint import CheckpointMutationError, checkpoint
        assert "another library registered a fallback" in _C._sac_write_guard_unavailable_reason()

        def fn(x):
            y = torch.mm(x, x)
            y.add_(1)
            return y.sin()

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                checkpoint(fn, torch.randn(2, 2, requires_grad=True), policy=[torch.ops.aten.mm.default])
            except CheckpointMutationError as error:
                assert error.mutating_op == "aten.add_.Tensor", error
            else:
                raise AssertionError("the write went through")
        assert any("cannot refuse a write" in str(w.message) for w in caught), [str(w.message) for w in caught]
        print("ok")
        """
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.describe()


def test_a_higher_order_op_runs_in_a_fast_path_region_with_the_same_gradients():
    # The write guard's key is on while the region runs; torch.cond computes its key in Python.
    def fn(x):
        y = torch.mm(x, x)
        return torch.cond(y.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (y,))

    x = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    expected = grads_of(fn, (x,))
    got = grads_of(lambda t: checkpoint(fn, t, policy=[aten.mm.default]), (x,))
    for e, g in zip(expected, got):
        assert torch.equal(e, g)


def test_uninstall_gives_higher_order_ops_the_write_guards_key_back():
    from subprocess_snippets import run_snippet

    result = run_snippet(
        """
        import torch
        import aliasguard
        from aliasguard._torch_internals import write_guard_key_set
        from aliasguard.checkpoint import checkpoint
        cond = torch.ops.higher_order.cond
        key = repr(write_guard_key_set())
        def has_key():
            return repr(cond.non_fallthrough_keys & write_guard_key_set()) == key
        assert has_key()
        x = torch.randn(3, 3, requires_grad=True)
        fn = lambda t: torch.cond(t.sum() > 0, torch.sin, torch.cos, (torch.mm(t, t),))
        checkpoint(fn, x, policy=[torch.ops.aten.mm.default]).sum().backward()
        assert not has_key()
        aliasguard.uninstall()
        assert has_key()
        print("ok")
        """
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.describe()


def test_the_first_fast_path_region_registers_its_kernels_without_a_warning():
    from subprocess_snippets import run_snippet

    # In a fresh process the first region registers the cache kernels and the write guard's: no
    # "Overriding a previously registered kernel" or any other warning, from Python or from C++.
    result = run_snippet(
        """
        import warnings
        import torch
        import aliasguard
        from aliasguard import _C
        from aliasguard.checkpoint import checkpoint
        assert _C._sac_write_guard_num_kernels() == 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x = torch.randn(3, 3, requires_grad=True)
            checkpoint(lambda t: torch.mm(t, t).sin(), x, policy=[torch.ops.aten.mm.default]).sum().backward()
        assert _C._sac_write_guard_num_kernels() > 100
        assert not caught, [str(w.message) for w in caught]
        print("ok")
        """
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.describe()
    assert "Overriding" not in result.stderr and "Warning" not in result.stderr, result.stderr[-2000:]


def test_a_function_compiled_inside_a_fast_path_region_compiles_once_more():
    # design.md lists it: dynamo's tensor guards read the thread's include set, which holds the write
    # guard's key in the forward region only, so the recompute compiles the function again.
    from torch._dynamo.testing import CompileCounter

    frames = {}
    for guard in (True, False):
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(lambda t: t.sin() * 2, backend=counter)
        x = torch.randn(3, 3, requires_grad=True)
        out = checkpoint(lambda t, f=compiled: f(torch.mm(t, t)), x, policy=[aten.mm.default],
                         allow_cache_entry_mutation=not guard)
        out.sum().backward()
        frames[guard] = counter.frame_count
    torch._dynamo.reset()
    assert frames[True] == frames[False] + 1, frames


# See Note [The fast path's plan is kept per op set].
def test_the_checked_op_list_follows_a_list_changed_between_calls():
    policy = [aten.mm.default]
    first = ours._checked_ops(policy)
    assert ours._checked_ops(policy) is first  # kept
    policy.append(aten.bmm.default)
    assert ours._checked_ops(policy) == frozenset({aten.mm.default, aten.bmm.default})
    policy[0] = "aten.mm"
    with pytest.raises(ValueError, match="must hold OpOverloads"):
        ours._checked_ops(policy)


def test_the_fast_path_plan_is_made_again_when_an_operator_is_registered(monkeypatch):
    ops = frozenset({aten.mm.default, aten.addmm.default})
    made: List[Any] = []
    real = ours._qualified
    monkeypatch.setattr(ours, "_qualified", lambda op: made.append(op) or real(op))
    ours._fast_path_plan(ops)
    ours._fast_path_plan(ops)
    assert len(made) <= 2  # made at most once (it may have been kept from an earlier test)
    before = len(made)
    lib = torch.library.Library("aliasguard_plan_test", "FRAGMENT")
    lib.define("noop(Tensor x) -> Tensor")
    plan = ours._fast_path_plan(ops)
    assert len(made) == before + 2  # made again
    assert plan is not None and {op for _, _, op in plan[0]} == set(ops)
    del lib
