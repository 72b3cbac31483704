"""torchtitan's save list given verbatim as ``ops=``, with its stateful policy.

torchtitan's op-level SAC list (llama3) holds aten ops, a c10d collective and
two higher-order operators, ``flex_attention`` and ``inductor_compiled_code``.
Passed as it is to ``ops=``:

* aliasguard warns once, at the caller's line, naming each higher-order op
  and what falling back to the dispatch-mode path costs, and takes that path;
* on a decoder block that runs none of them, the result is torch's own SAC
  with the same policy: losses and gradients bitwise equal, the same bytes
  saved for the backward, the policy asked the same questions with the same
  answers, and the same ops run in the forward, recompute and backward;
* when a higher-order op of the list does run inside the region (eager
  ``flex_attention``; a compiled function whose code inductor wraps in
  ``inductor_compiled_code``), torch's SAC treats it as one op: asks the
  policy about it, caches its output and hands that back to the recompute.
  aliasguard's mode path must do the same.
"""

from __future__ import annotations

import shutil
import warnings
from collections import Counter, defaultdict
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as torch_checkpoint
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy

import aliasguard.checkpoint as ours
from aliasguard.testing import StorageTracker

aten = torch.ops.aten
HIGHER_ORDER_NAMES = ("flex_attention", "inductor_compiled_code")


def higher_order_op(name: str) -> Optional[Any]:
    """``torch._higher_order_ops.<name>`` if this torch has it (a HigherOrderOperator), else None."""
    import torch._higher_order_ops as higher_order_ops

    op = getattr(higher_order_ops, name, None)
    return op if isinstance(op, torch._ops.HigherOrderOperator) else None


HIGHER_ORDER_OPS = {name: higher_order_op(name) for name in HIGHER_ORDER_NAMES}
PRESENT_HIGHER_ORDER = [op for op in HIGHER_ORDER_OPS.values() if op is not None]
# torchtitan's list as its llama3 parallelize.py spells it, less what this torch lacks and its
# torch.ops.torch_attn._varlen_attn (registered only once torch.nn.attention.varlen is imported).
TORCHTITAN_SAVE_LIST = {
    aten.mm.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_attention_math.default,
    aten._scaled_dot_product_fused_attention_overrideable.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    aten.max.default,
    *PRESENT_HIGHER_ORDER,
}

needs_higher_order_ops = pytest.mark.skipif(
    not PRESENT_HIGHER_ORDER,
    reason=f"torch {torch.__version__} has neither of torch._higher_order_ops.{{{','.join(HIGHER_ORDER_NAMES)}}}",
)


def torchtitan_policy(
    save_list: Any = frozenset(TORCHTITAN_SAVE_LIST), asked: Optional[List[Tuple[str, bool, str]]] = None
) -> Callable[..., CheckpointPolicy]:
    """torchtitan's per-region policy: save the list's ops, but every second mm.

    Records ``(op, is_recompute, answer)`` per question into ``asked`` when given.
    """
    meta: Dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        key = "recompute_mm_count" if ctx.is_recompute else "forward_mm_count"
        if func == aten.mm.default:
            meta[key] += 1
        to_save = func in save_list and not (func == aten.mm.default and meta[key] % 2 == 0)
        answer = CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE
        if asked is not None:
            asked.append((str(func), ctx.is_recompute, answer.name))
        return answer

    return policy


def torch_contexts(**policy_options: Any) -> Any:
    return torch_checkpoint.create_selective_checkpoint_contexts(torchtitan_policy(**policy_options))


def our_contexts(**policy_options: Any) -> Any:
    """aliasguard's contexts for the verbatim list; the fallback warning is another test's."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="aliasguard.checkpoint: the ops the policy may save include")
        return ours.create_selective_checkpoint_contexts(
            torchtitan_policy(**policy_options), ops=list(TORCHTITAN_SAVE_LIST)
        )


# --- a llama-style decoder block (no write: both SACs must be right) ---------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2, hidden: int = 48) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm, self.ffn_norm = RMSNorm(dim), RMSNorm(dim)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        h = self.attention_norm(x)
        q, k, v = (w(h).view(batch, seq, self.heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(attention.transpose(1, 2).reshape(batch, seq, dim))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def blocks_and_input(seed: int = 0) -> Tuple[nn.ModuleList, torch.Tensor]:
    torch.manual_seed(seed)
    return nn.ModuleList(Block() for _ in range(2)), torch.randn(2, 8, 16, requires_grad=True)


def loss_and_gradients(
    blocks: nn.ModuleList, x: torch.Tensor, context_fn: Optional[Callable[[], Any]]
) -> Tuple[torch.Tensor, List[torch.Tensor]]:
    inputs = [x, *blocks.parameters()]
    y = x
    for block in blocks:
        y = (
            block(y)
            if context_fn is None
            else torch_checkpoint.checkpoint(block, y, use_reentrant=False, context_fn=context_fn)
        )
    loss = y.pow(2).mean()
    return loss.detach(), list(torch.autograd.grad(loss, inputs))


def assert_bitwise_equal(actual: Tuple[torch.Tensor, List[torch.Tensor]], expected: Any) -> None:
    (loss, grads), (expected_loss, expected_grads) = actual, expected
    assert torch.equal(loss, expected_loss)
    assert len(grads) == len(expected_grads)
    assert all(torch.equal(a, e) for a, e in zip(grads, expected_grads))


# --- the warning and the path -----------------------------------------------------------------


@needs_higher_order_ops
def test_the_verbatim_list_warns_once_naming_each_higher_order_op_and_the_fallback_cost():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forward, recompute = ours.create_selective_checkpoint_contexts(
            torchtitan_policy(), ops=list(TORCHTITAN_SAVE_LIST)
        )
    ours_warnings = [w for w in caught if str(w.message).startswith("aliasguard.checkpoint")]
    assert len(ours_warnings) == 1, [str(w.message) for w in caught]
    warning = ours_warnings[0]
    message = str(warning.message)
    for op in PRESENT_HIGHER_ORDER:
        assert op.name() in message
    # What the fallback costs: every op of the region through a dispatch mode.
    assert "dispatch-mode path" in message
    assert "every op in it goes through a TorchDispatchMode" in message
    assert warning.filename == __file__  # the caller's line, not aliasguard's
    # And the region does take the modes.
    assert isinstance(forward, TorchDispatchMode) and isinstance(recompute, TorchDispatchMode)


def test_the_list_without_its_higher_order_ops_takes_the_fast_path_silently():
    dispatcher_ops = [op for op in TORCHTITAN_SAVE_LIST if isinstance(op, torch._ops.OpOverload)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        forward, recompute = ours.create_selective_checkpoint_contexts(torchtitan_policy(), ops=dispatcher_ops)
    assert not isinstance(forward, TorchDispatchMode) and not isinstance(recompute, TorchDispatchMode)


# --- the same as torch's SAC where none of them runs ------------------------------------------


def test_losses_and_gradients_are_bitwise_torch_sacs():
    blocks, x = blocks_and_input()
    theirs = loss_and_gradients(blocks, x, torch_contexts)
    assert_bitwise_equal(loss_and_gradients(blocks, x, our_contexts), theirs)
    # Torch's SAC is right here (no write), so the reference is not an artefact.
    assert_bitwise_equal(loss_and_gradients(blocks, x, None), theirs)


def test_the_policy_is_asked_what_torch_asks_about_the_listed_ops_with_the_same_answers():
    blocks, x = blocks_and_input(1)
    asked: Dict[str, List[Tuple[str, bool, str]]] = {"torch": [], "aliasguard": []}
    loss_and_gradients(blocks, x, lambda: torch_contexts(asked=asked["torch"]))
    loss_and_gradients(blocks, x, lambda: our_contexts(asked=asked["aliasguard"]))
    listed = {str(op) for op in TORCHTITAN_SAVE_LIST}
    assert asked["aliasguard"] == [q for q in asked["torch"] if q[0] in listed]
    answers = Counter(q[2] for q in asked["aliasguard"])
    assert answers["MUST_SAVE"] > 0 and answers["PREFER_RECOMPUTE"] > 0  # every second mm


def saved_bytes(context_fn: Optional[Callable[[], Any]]) -> int:
    """Bytes the forward pass leaves alive for the backward (autograd's saved tensors and SAC's cache)."""
    blocks, x = blocks_and_input(2)
    tracker = StorageTracker()
    with tracker:
        y = x
        for block in blocks:
            y = torch_checkpoint.checkpoint(block, y, use_reentrant=False, context_fn=context_fn)
        loss = y.pow(2).mean()
    live = sum(tracker.live((loss, x, *blocks.parameters())).values())
    loss.backward()
    return live


def test_the_same_bytes_are_saved_as_by_torch_sac():
    theirs = saved_bytes(torch_contexts)
    mine = saved_bytes(our_contexts)
    plain = saved_bytes(torch_checkpoint.noop_context_fn)
    assert mine == theirs
    assert mine > plain  # the policy did save something


class OpCounter(TorchDispatchMode):
    """How often each op ran below it (an op answered from SAC's cache does not run)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


def test_the_same_ops_run_forward_recompute_and_backward_as_with_torch_sac():
    def ops_run(context_fn: Callable[[], Any]) -> Counter:
        blocks, x = blocks_and_input(3)
        with OpCounter() as counter:
            loss_and_gradients(blocks, x, context_fn)
        return counter.counts

    theirs, mine = ops_run(torch_contexts), ops_run(our_contexts)
    assert mine == theirs
    # The saved mm calls were not run again: fewer mm than with plain checkpointing.
    assert mine["aten.mm.default"] < ops_run(torch_checkpoint.noop_context_fn)["aten.mm.default"]


# --- the higher-order ops running inside the region -------------------------------------------


def cache_state(forward_context: Any, op: Any) -> List[str]:
    """What the forward context's cache holds for ``op``: "consumed" per entry the recompute used.

    torch's caching mode keeps ``storage[op][i]``; aliasguard's lists
    ``(op, value or None once used, line)`` in ``cached_entries()``.
    """
    if hasattr(forward_context, "cached_entries"):
        return [
            "consumed" if value is None else "cached" for o, value, _ in forward_context.cached_entries() if o is op
        ]
    consumed = torch_checkpoint._CONSUMED
    entries = [
        v
        for key, slots in forward_context.storage.items()
        for v in slots.values()
        if key is op or (isinstance(key, tuple) and key[0] is op)
    ]
    return ["consumed" if v is consumed else "cached" for v in entries]


def run_region_with(
    fn: Callable[..., torch.Tensor], inputs: Tuple[torch.Tensor, ...], make_contexts: Callable[[], Any], wrt: List
) -> Tuple[List[torch.Tensor], List[Tuple[str, bool, str]], Any]:
    """Gradients of ``fn`` checkpointed with ``make_contexts``, the policy's questions, its forward context."""
    asked: List[Tuple[str, bool, str]] = []
    forward_contexts: List[Any] = []

    def context_fn() -> Any:
        contexts = make_contexts(asked=asked)
        forward_contexts.append(contexts[0])
        return contexts

    out = torch_checkpoint.checkpoint(fn, *inputs, use_reentrant=False, context_fn=context_fn)
    grads = list(torch.autograd.grad(out.sum(), wrt))
    return grads, asked, forward_contexts[0]


def assert_handled_as_torch_sac_handles_it(fn, inputs, wrt, op) -> None:
    expected = list(torch.autograd.grad(fn(*inputs).sum(), wrt))
    theirs, torch_asked, torch_forward = run_region_with(fn, inputs, torch_contexts, wrt)
    assert all(torch.equal(a, e) for a, e in zip(theirs, expected))
    # torch's SAC asks about the higher-order op once and serves the recompute from its cache.
    assert (str(op), False, "MUST_SAVE") in torch_asked
    assert cache_state(torch_forward, op) == ["consumed"]

    mine, our_asked, our_forward = run_region_with(fn, inputs, our_contexts, wrt)
    assert all(torch.equal(a, e) for a, e in zip(mine, expected))
    listed = {str(o) for o in TORCHTITAN_SAVE_LIST}
    assert our_asked == [q for q in torch_asked if q[0] in listed]
    assert cache_state(our_forward, op) == ["consumed"]


@pytest.mark.skipif(HIGHER_ORDER_OPS["flex_attention"] is None, reason="this torch has no flex_attention")
def test_eager_flex_attention_in_the_region_is_cached_as_torch_sac_caches_it():
    from torch.nn.attention.flex_attention import flex_attention

    # flex_attention has no CPU backward: its inputs need no gradient, the
    # projection of its output does (the recompute must still produce it).
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    w = torch.randn(8, 8, requires_grad=True)

    def region(q, k, v, w):
        return (flex_attention(q, k, v).flatten(0, 2) @ w).sin()

    assert_handled_as_torch_sac_handles_it(region, (q, k, v, w), [w], HIGHER_ORDER_OPS["flex_attention"])


@pytest.mark.skipif(HIGHER_ORDER_OPS["inductor_compiled_code"] is None, reason="no inductor_compiled_code")
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor needs a C++ compiler")
def test_a_compiled_function_in_the_region_is_cached_as_torch_sac_caches_it():
    import torch._inductor.config as inductor_config

    if not hasattr(inductor_config, "wrap_inductor_compiled_regions"):
        pytest.skip("this torch's inductor cannot wrap its code in inductor_compiled_code")

    with inductor_config.patch(wrap_inductor_compiled_regions=True):
        torch._dynamo.reset()
        inner = torch.compile(lambda t: (t.sin() * 2).cos(), backend="inductor", fullgraph=True)
        torch.manual_seed(5)
        x, w = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)

        def region(x, w):
            return (inner(x @ w) @ w).tanh()

        region(x, w)  # compile outside any region
        assert_handled_as_torch_sac_handles_it(region, (x, w), [x, w], HIGHER_ORDER_OPS["inductor_compiled_code"])
