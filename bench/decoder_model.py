"""The llama-style decoder of ``bench_checkpoint.py --sizes decoder``, and torchtitan's op-level SAC policy.

A decoder as torchtitan's llama3 builds it (pre-norm blocks of RMSNorm,
attention through ``F.scaled_dot_product_attention`` and a SwiGLU feed-forward,
every projection a bias-free ``nn.Linear``), and the selective activation
checkpointing policy of torchtitan 0.3.0's op-level SAC
(``torchtitan/distributed/activation_checkpoint.py``, ``_get_custom_policy``):
save the outputs of the ops in its save list, except every second ``aten.mm``,
counting per checkpointed region. Its CUDA-to-CPU ``_to_copy`` rule and its
per-module shape exceptions do not apply here and are left out.

Imports torch only, never aliasguard: the stock workers load it too.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Dict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy

aten = torch.ops.aten


def _higher_order_op(name: str) -> Any:
    """``torch._higher_order_ops.<name>``, or None on a torch without it."""
    import torch._higher_order_ops as higher_order_ops

    return getattr(higher_order_ops, name, None)


# torchtitan's llama3 save list, by the ops this torch has, less
# torch.ops.torch_attn._varlen_attn (registered only once
# torch.nn.attention.varlen is imported; this model does not use it).
TORCHTITAN_SAVE_LIST = {
    op
    for op in (
        aten.mm.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
        aten._scaled_dot_product_attention_math.default,
        aten._scaled_dot_product_fused_attention_overrideable.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        aten.max.default,
        _higher_order_op("flex_attention"),
        _higher_order_op("inductor_compiled_code"),
    )
    if op is not None
}
# The dispatcher ops of the list: what aliasguard's fast path takes as ops=.
# The higher-order ops would send it to the dispatch-mode path (with a warning).
DISPATCHER_SAVE_LIST = sorted((op for op in TORCHTITAN_SAVE_LIST if isinstance(op, torch._ops.OpOverload)), key=str)


def torchtitan_policy() -> Callable[..., CheckpointPolicy]:
    """A fresh torchtitan-style policy function; its mm counters are per region.

    torchtitan makes one per ``context_fn`` call (``meta = defaultdict(int)``).
    """
    meta: Dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        key = "recompute_mm_count" if ctx.is_recompute else "forward_mm_count"
        if func == aten.mm.default:
            meta[key] += 1
        # Save every op of the list, but only every second mm.
        to_save = func in TORCHTITAN_SAVE_LIST and not (func == aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


# The projections torchtitan's policy saves in each block, in call order:
# mm 1 (wq), 3 (wv), 5 (w1), 7 (w2). torch_remat saves regions of code, not
# ops: its variant wraps these calls (see saved_projections).
SAVED_PROJECTIONS = ("wq", "wv", "w1", "w2")


def _plain_call(function: Callable[..., Any], name: str) -> Callable[..., Any]:
    return function


# How a saved projection is called: as is, or (inside saved_projections) wrapped.
_saved_call: Callable[[Callable[..., Any], str], Callable[..., Any]] = _plain_call


def saved_projections(wrap: Callable[[Callable[..., Any], str], Callable[..., Any]], function: Callable[..., Any]):
    """``function`` with the saved projections called through ``wrap(projection, name)`` while it runs.

    Set at call time, not on the modules, so the recompute of a checkpoint
    that replays ``function`` sees the same wrapping, and other variants
    sharing the modules see none.
    """

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        global _saved_call
        previous, _saved_call = _saved_call, wrap
        try:
            return function(*args, **kwargs)
        finally:
            _saved_call = previous

    return wrapped


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    """Pre-norm decoder block: causal SDPA attention, then a SwiGLU feed-forward (torchtitan's llama3 layout)."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm = RMSNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = RMSNorm(dim)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def _project(self, name: str, x: torch.Tensor) -> torch.Tensor:
        linear = getattr(self, name)
        if name in SAVED_PROJECTIONS:
            return _saved_call(linear, name)(x)
        return linear(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        h = self.attention_norm(x)
        q, k, v = (
            self._project(name, h).view(batch, seq, self.heads, dim // self.heads).transpose(1, 2)
            for name in ("wq", "wk", "wv")
        )
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self._project("wo", attention.transpose(1, 2).reshape(batch, seq, dim))
        h = self.ffn_norm(x)
        gate = self._project("w1", h)
        return x + self._project("w2", F.silu(gate) * self._project("w3", h))
