"""aliasguard.checkpoint side by side with the running torch's own SAC.

The scenarios of torch's ``TestSelectiveActivationCheckpoint`` (test/test_autograd.py),
written anew, each run with both implementations: whatever torch's SAC does on
the running torch (how often the policy is called, which ops run again, which
error type), ours must do too. The one intended difference, the fail-fast
error when a cached tensor is written in the forward pass, has its own test.
Also torchtitan's stateful policy (save every second ``mm``) and per-layer
policies through ``checkpoint_wrapper(..., context_fn=...)``.
"""

from __future__ import annotations

import functools
import weakref
from collections import defaultdict
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as torch_checkpoint
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy
from torch.utils.flop_counter import FlopCounterMode

import aliasguard.checkpoint as ours
from aliasguard.checkpoint import CheckpointMutationError

aten = torch.ops.aten
IMPLEMENTATIONS = {
    "torch": torch_checkpoint.create_selective_checkpoint_contexts,
    "aliasguard": ours.create_selective_checkpoint_contexts,
}


def run_sac(make_contexts: Callable[..., Any], fn: Callable[..., Any], *args: Any, policy: Any, **options: Any) -> Any:
    context_fn = functools.partial(make_contexts, policy, **options)
    return torch_checkpoint.checkpoint(fn, *args, use_reentrant=False, context_fn=context_fn)


def both(scenario: Callable[[Callable[..., Any]], Any]) -> Tuple[Any, Any]:
    """The scenario's observations with torch's SAC and with ours."""
    return scenario(IMPLEMENTATIONS["torch"]), scenario(IMPLEMENTATIONS["aliasguard"])


def test_backward_flops_and_saved_bytes_match():
    # CPU version of torch's test_flops_and_mem: the recompute skips the mm.
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(64, 64, generator=g, requires_grad=True) for _ in range(2))

    def fn(x, y):
        return torch.mm(x.cos(), y).sin().sum()

    def scenario(make_contexts):
        out = run_sac(make_contexts, fn, x, y, policy=[aten.mm.default])
        with FlopCounterMode(display=False) as counter:
            out.backward()
        return counter.get_total_flops()

    theirs, mine = both(scenario)
    assert mine == theirs
    plain = torch_checkpoint.checkpoint(fn, x, y, use_reentrant=False)
    with FlopCounterMode(display=False) as counter:
        plain.backward()
    assert mine < counter.get_total_flops()  # plain checkpointing runs the mm again


def test_view_output_that_already_has_autograd_meta():
    def fn(x, y):
        return x.view(-1), y.sin().cos()

    def scenario(make_contexts):
        x = torch.tensor([1, 2, 3], dtype=torch.int64)
        y = torch.randn(3, requires_grad=True, generator=torch.Generator().manual_seed(0))
        out = run_sac(make_contexts, fn, x, y, policy=[aten.view.default])
        return torch.autograd.grad(out[1].sum(), y)

    theirs, mine = both(scenario)
    torch.testing.assert_close(mine, theirs)


class SizesWrapper(torch.Tensor):
    """A wrapper subclass that dispatches on sizes, so sym_size ops reach the modes."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), inner.stride(), None, None, inner.dtype, inner.layout,
            inner.device, False, inner.requires_grad, "sizes",
        )

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs):
        unwrapped = torch.utils._pytree.tree_map_only(cls, lambda t: t.inner, args)
        out = func(*unwrapped, **(kwargs or {}))
        return torch.utils._pytree.tree_map_only(torch.Tensor, cls, out)


def test_metadata_ops_of_a_subclass_are_ignored_like_torch():
    def policy(ctx, op, *args, **kwargs):
        # Saving sizes would hand back the forward's shapes in the recompute.
        return CheckpointPolicy.MUST_SAVE if op is aten.sym_size.default else CheckpointPolicy.PREFER_RECOMPUTE

    def fn(x):
        out = (x * x.sum()).view(-1).view(4, 3)
        assert list(out.grad_fn._saved_self_sym_sizes) == [12]
        return out.exp()

    def scenario(make_contexts):
        x = torch.randn(4, 3, requires_grad=True, generator=torch.Generator().manual_seed(0))
        out = run_sac(make_contexts, fn, SizesWrapper(x), policy=policy)
        out.sum().backward()
        return x.grad

    theirs, mine = both(scenario)
    torch.testing.assert_close(mine.inner if isinstance(mine, SizesWrapper) else mine,
                               theirs.inner if isinstance(theirs, SizesWrapper) else theirs)


@pytest.mark.parametrize(
    "bad, error",
    [([2], ValueError), ([aten.sin], ValueError), (2, TypeError)],
    ids=["int-in-list", "overload-packet", "not-a-list"],
)
def test_bad_inputs_raise_torchs_exception_types(bad, error):
    for make_contexts in IMPLEMENTATIONS.values():
        with pytest.raises(error):
            make_contexts(bad)


def test_stateful_policy_is_called_in_the_same_order():
    def scenario(make_contexts):
        seen: List[Tuple[bool, int]] = []

        class Policy:
            def __init__(self) -> None:
                self.counts = {False: 0, True: 0}

            def __call__(self, ctx, func, *args, **kwargs):
                self.counts[ctx.is_recompute] += 1
                seen.append((ctx.is_recompute, self.counts[ctx.is_recompute]))
                return CheckpointPolicy.PREFER_RECOMPUTE

        x = torch.randn(3, requires_grad=True)
        out = run_sac(make_contexts, lambda t: t.sin().sin().sin(), x, policy=Policy(),
                      allow_cache_entry_mutation=True)
        out.sum().backward()
        return seen

    theirs, mine = both(scenario)
    assert mine == theirs and mine


def test_cached_values_are_detached_and_die_with_the_graph():
    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE

    refs: List[Any] = []

    def fn(x):
        out = x.cos().exp()
        modes = [m for m in torch.utils._python_dispatch._get_current_dispatch_mode_stack()
                 if isinstance(m, ours._CachingMode)]
        if modes:
            (exp_entry,) = [value for op, value, _ in modes[0].cached_entries() if op is aten.exp.default]
            assert not exp_entry.requires_grad  # no graph -> hooks -> cache -> graph cycle
            refs.append(weakref.ref(exp_entry))
            del exp_entry
        return out.sin()

    import gc

    gc.disable()
    try:
        x = torch.randn(3, requires_grad=True)
        out = run_sac(ours.create_selective_checkpoint_contexts, fn, x, policy=policy)
        assert refs[-1]() is not None
        del out
        assert refs[-1]() is None  # no reference cycle keeps the cache alive

        out = run_sac(ours.create_selective_checkpoint_contexts, fn, x, policy=policy)
        assert refs[-1]() is not None
        out.sum().backward(retain_graph=True)
        assert refs[-1]() is None  # consumed entries are released
    finally:
        gc.enable()


def test_mutated_cached_output_fails_fast_where_torch_fails_at_backward():
    # The intended difference: torch reports the write at backward, ours
    # refuses it in the forward pass, before anything is written.
    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op is aten.sin.default else CheckpointPolicy.PREFER_RECOMPUTE

    def fn(x):
        return x.sin().mul_(2).cos().exp()

    x = torch.randn(3, requires_grad=True)
    out = run_sac(IMPLEMENTATIONS["torch"], fn, x, policy=policy)
    with pytest.raises(RuntimeError, match="has been mutated"):
        out.sum().backward()
    with pytest.raises(CheckpointMutationError, match=r"aten\.mul_\.Tensor"):
        run_sac(IMPLEMENTATIONS["aliasguard"], fn, x, policy=policy)
    # Both accept it when asked to.
    for make_contexts in IMPLEMENTATIONS.values():
        run_sac(make_contexts, fn, x, policy=policy, allow_cache_entry_mutation=True).sum().backward()


def test_op_with_several_outputs():
    def scenario(make_contexts):
        calls = [0]

        def policy(ctx, op, *args, **kwargs):
            if op is aten.var_mean.correction:
                calls[0] += 1
                return CheckpointPolicy.MUST_SAVE
            return CheckpointPolicy.PREFER_RECOMPUTE

        def fn(x):
            a, b = torch.var_mean(x)
            return a * b

        x = torch.randn(3, requires_grad=True, generator=torch.Generator().manual_seed(0))
        out = run_sac(make_contexts, fn, x, policy=policy)
        grad = torch.autograd.grad(out.sum(), x)
        torch.testing.assert_close(grad, torch.autograd.grad(fn(x).sum(), x))
        return calls[0], grad

    (their_calls, theirs), (my_calls, mine) = both(scenario)
    assert my_calls == their_calls
    torch.testing.assert_close(mine, theirs)


def test_op_with_non_tensor_output_runs_once():
    with torch.library._scoped_library("aliasguard_test_sac", "FRAGMENT"):
        calls = [0]

        @torch.library.custom_op("aliasguard_test_sac::sin_with_extra", mutates_args=())
        def sin_with_extra(x: torch.Tensor) -> Tuple[torch.Tensor, int]:
            calls[0] += 1
            return x.sin(), 2

        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0])

        def backward(ctx, grad, _unused):
            (x,) = ctx.saved_tensors
            return grad * x.cos()

        torch.library.register_autograd("aliasguard_test_sac::sin_with_extra", backward, setup_context=setup_context)
        op = torch.ops.aliasguard_test_sac.sin_with_extra

        def fn(x):
            return (op(x)[0] * x.sin().exp()).sin()

        def scenario(make_contexts):
            calls[0] = 0
            x = torch.randn(3, requires_grad=True, generator=torch.Generator().manual_seed(0))
            out = run_sac(make_contexts, fn, x, policy=[op.default])
            grad = torch.autograd.grad(out.sum(), x)
            torch.testing.assert_close(grad, torch.autograd.grad(fn(x).sum(), x))
            return calls[0] - 1  # the reference run above called it once more

        theirs, mine = both(scenario)
        assert mine == theirs == 1


def test_second_backward_raises_runtime_error_like_torch():
    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op is aten.sin.default else CheckpointPolicy.PREFER_RECOMPUTE

    for make_contexts in IMPLEMENTATIONS.values():
        x = torch.randn(3, requires_grad=True)
        out = run_sac(make_contexts, lambda t: t.sin().cos().exp(), x, policy=policy)
        out.sum().backward(retain_graph=True)
        with pytest.raises(RuntimeError):
            out.sum().backward(retain_graph=True)


# ---------------------------------------------------------------------------
# torchtitan-style policies through checkpoint_wrapper


SAVE_LIST = {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
             aten._scaled_dot_product_flash_attention.default, aten.max.default}


def torchtitan_context_fn(make_contexts: Callable[..., Any]) -> Callable[[], Any]:
    """torchtitan's op-level SAC: save the listed ops, except every second mm."""

    def context_fn():
        meta: Dict[str, int] = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            key = f"{mode}_mm_count"
            if func is aten.mm.default:
                meta[key] += 1
            to_save = func in SAVE_LIST and not (func is aten.mm.default and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

        return make_contexts(policy)

    return context_fn


class Layer(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.up = torch.nn.Linear(dim, 2 * dim, bias=False)
        self.down = torch.nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        attn = F.scaled_dot_product_attention(q, k, v)
        x = x + self.wo(attn)
        return x + self.down(F.silu(self.up(x)))


class SavedOps(TorchDispatchMode):
    """Counts the ops run in the backward pass (recomputed ones included)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Dict[Any, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func] += 1
        return func(*args, **(kwargs or {}))


def train_step(context_fns: List[Callable[[], Any]]) -> Tuple[List[torch.Tensor], Dict[Any, int]]:
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*(Layer(16) for _ in context_fns))
    wrapped = torch.nn.Sequential(*(
        checkpoint_wrapper(layer, context_fn=context_fn, preserve_rng_state=False)
        for layer, context_fn in zip(layers, context_fns)
    ))
    x = torch.randn(2, 5, 16, dtype=torch.float32)
    out = wrapped(x)
    counter = SavedOps()
    with counter:
        out.sum().backward()
    return [p.grad for p in layers.parameters()], dict(counter.counts)


def reference_grads(num_layers: int) -> List[torch.Tensor]:
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*(Layer(16) for _ in range(num_layers)))
    x = torch.randn(2, 5, 16, dtype=torch.float32)
    layers(x).sum().backward()
    return [p.grad for p in layers.parameters()]


def test_torchtitan_policy_saves_and_recomputes_as_with_torch():
    layers = 2
    theirs = train_step([torchtitan_context_fn(IMPLEMENTATIONS["torch"])] * layers)
    mine = train_step([torchtitan_context_fn(IMPLEMENTATIONS["aliasguard"])] * layers)
    # Same ops ran again in the backward pass: the same outputs were saved.
    assert mine[1] == theirs[1]
    for a, b, ref in zip(mine[0], theirs[0], reference_grads(layers)):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, ref, rtol=1e-5, atol=1e-6)
    # Every second mm is recomputed: more mm run in the backward pass than
    # when all are saved, fewer than with plain checkpointing.
    save_all = train_step([functools.partial(IMPLEMENTATIONS["aliasguard"], [aten.mm.default])] * layers)
    plain = train_step([torch_checkpoint.noop_context_fn] * layers)
    assert save_all[1][aten.mm.default] < mine[1][aten.mm.default] < plain[1][aten.mm.default]


def test_per_layer_policies():
    def save_nothing(make_contexts):
        return lambda: make_contexts(lambda ctx, op, *a, **k: CheckpointPolicy.PREFER_RECOMPUTE)

    def save_mm(make_contexts):
        return functools.partial(make_contexts, [aten.mm.default])

    results = {}
    for name, make_contexts in IMPLEMENTATIONS.items():
        results[name] = train_step([save_mm(make_contexts), save_nothing(make_contexts),
                                    torchtitan_context_fn(make_contexts)])
    # torch's SAC dispatches a detach per cached output it hands back; the
    # list-policy fast path aliases below the dispatcher. The other ops are
    # what was recomputed, and must match.
    def without_detach(counts: Dict[Any, int]) -> Dict[Any, int]:
        return {op: n for op, n in counts.items() if op is not aten.detach.default}

    assert without_detach(results["aliasguard"][1]) == without_detach(results["torch"][1])
    for a, ref in zip(results["aliasguard"][0], reference_grads(3)):
        torch.testing.assert_close(a, ref, rtol=1e-5, atol=1e-6)
