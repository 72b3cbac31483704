"""Families ``checkpoint``, ``rewrite`` and ``detach``: where features show that the op_db families do not reach.

``checkpoint/<variant>/<case>``: a selective activation checkpoint (policy: save ``mm`` and ``bmm``)
around a small function, run through ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``. The
``context_fn`` is ``aliasguard.checkpoint.create_selective_checkpoint_contexts`` on the aliasguard side
(``sac``: its fast path; ``sac_modes``: ``fast_path=False``, its dispatch modes) and torch's
``create_selective_checkpoint_contexts`` on the stock side; ``torch_sac`` uses torch's on both sides
(importing aliasguard must leave torch's SAC as it is). Cases: ``clean`` (nothing written), ``write_in_forward``
(the cached ``mm`` output written inside the region), ``write_in_forward_kept`` (the same, recording whether
the call raised and the written tensor after it: was the write made?), ``write_after_forward`` (written after the
forward pass, before backward), ``matmul_write`` (a batched matmul's result written inside the region:
its ``_unsafe_view`` hides the write from torch's check). Recorded: outputs, then backward's gradients
(or the exception of either step).

``rewrite/<op>``: a mode that answers an in-place op by running it, then writing the written argument
once more without changing it (``mul_(1)``): the argument's ``_version`` after the op counts that extra
write on the aliasguard side (Note [One bump per write through __torch_dispatch__] takes back only the
bump of the body's own call of the op).

``detach/<op>``: a mode that opts out of view tracking keeps ``out.detach()`` of each output; each output
is then written: the kept tensors' ``_version`` follows the output's on the aliasguard side (F1: detach
below autograd keeps the counter), stays 0 in stock. Where bodies are tracked, autograd's own detach
kernel shares the counter and F1 does not show. Nothing here imports aliasguard: the checkpoint variants use
``ctx.ag``, which only the aliasguard worker has.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from differential import observe as ob
from differential.scenarios import Context, Scenario, backward_record, call

aten = torch.ops.aten
SAC_POLICY = [aten.mm.default, aten.bmm.default]
SAC_VARIANTS = ("sac", "sac_modes", "torch_sac")


def _case_clean(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = torch.mm(x, w)
    return ((y * 2).sin(),)


def _case_write_in_forward(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = torch.mm(x, w)
    y.add_(1)
    return (y * 2,)


# What ``write_in_forward_kept`` wrote to, observed after the call: refused before the write (aliasguard), the
# value and version are the mm's; let through (torch's SAC), the write shows.
KEPT: list[torch.Tensor] = []


def _case_write_in_forward_kept(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = torch.mm(x, w)
    KEPT.append(y)
    y.add_(1)
    return (y * 2,)


def _case_write_after_forward(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = torch.mm(x, w)
    return (y.sin(), y)  # the caller writes y (out1) after the forward pass; sin's backward needs y again


def _case_matmul_write(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x.expand(2, 4, 4) @ w.expand(2, 4, 4)  # bmm, then _unsafe_view
    y.add_(1)
    return (y * 2,)


SAC_CASES: dict[str, Callable[..., tuple[torch.Tensor, ...]]] = {
    "clean": _case_clean,
    "write_in_forward": _case_write_in_forward,
    "write_in_forward_kept": _case_write_in_forward_kept,
    "write_after_forward": _case_write_after_forward,
    "matmul_write": _case_matmul_write,
}


def _context_fn(ctx: Context, variant: str) -> Callable[[], Any]:
    if variant == "torch_sac" or ctx.ag is None:
        return functools.partial(torch.utils.checkpoint.create_selective_checkpoint_contexts, SAC_POLICY)
    # looked up at each call: the checkpoint mutant (configs.apply_mutant) replaces it
    create = ctx.ag.checkpoint.create_selective_checkpoint_contexts
    return functools.partial(create, SAC_POLICY, **({"fast_path": False} if variant == "sac_modes" else {}))


def run_checkpoint(ctx: Context, variant: str, case: str) -> dict:
    torch.manual_seed(0)
    x = torch.randn(4, 4, requires_grad=True)
    w = torch.randn(4, 4, requires_grad=True)
    leaves = [("arg0", x), ("arg1", w)]
    pool = {id(x): "arg0", id(w): "arg1"}
    KEPT.clear()
    out, err = call(lambda: torch.utils.checkpoint.checkpoint(SAC_CASES[case], x, w, use_reentrant=False,
                                                              context_fn=_context_fn(ctx, variant)))
    if case == "write_in_forward_kept":
        # Whether the write was made, beside whether the call raised (a failed step would hide the rest).
        return {"refused": err["exc"] if err is not None else "<no exception>",
                "kept": ob.tensors([("kept0", KEPT[0])], pool), "args": ob.tensors(leaves, pool)}
    if err is not None:
        return {"call": err, "args": ob.tensors(leaves, pool)}
    outs = ob.named("out", out)
    ctx.perturb([t for _, t in outs])
    if case == "write_after_forward":
        with torch.no_grad():
            out[1].add_(1)
    pool.update({id(t): n for n, t in outs})
    return {"outs": ob.tensors(outs, pool), "args": ob.tensors(leaves, pool),
            "backward": backward_record([out[0]], leaves)}


class RewriteMode(TorchDispatchMode):
    """Answers an in-place op by running it, then writing its first argument once more, unchanged."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func._schema.is_mutable and args and isinstance(args[0], torch.Tensor):
            args[0].mul_(1)
        return out


REWRITE_OPS: dict[str, Callable[[torch.Tensor], Any]] = {
    "add_": lambda t: t.add_(1),
    "mul_": lambda t: t.mul_(2),
    "clamp_": lambda t: t.clamp_(-0.5, 0.5),
    "fill_": lambda t: t.fill_(3),
    "sin_": lambda t: t.sin_(),
    "view_add_": lambda t: t.view(-1)[:2].add_(1),
}


def run_rewrite(ctx: Context, opname: str) -> dict:
    torch.manual_seed(0)
    t = torch.randn(2, 3)
    pool = {id(t): "arg0"}
    with RewriteMode():
        out, err = call(lambda: REWRITE_OPS[opname](t))
    if err is not None:
        return {"call": err}
    outs = ob.named("out", out)
    ctx.perturb([o for _, o in outs])
    pool.update({id(o): n for n, o in outs if id(o) not in pool})
    return {"outs": ob.tensors(outs, pool), "args": ob.tensors([("arg0", t)], pool)}


class KeepDetachedMode(TorchDispatchMode):
    """Keeps ``out.detach()`` of every output, and opts out of view tracking (the attribute means nothing to
    stock), so that its body runs below autograd untracked: what detach gives there is F1's alone."""

    __aliasguard_track_views__ = False

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.kept += [o.detach() for o in ob.flat_tensors(out)][:4]
        return out


DETACH_OPS: dict[str, Callable[[torch.Tensor], Any]] = {
    "sin": torch.sin,
    "mul": lambda t: t * 2,
    "clone": torch.clone,
    "exp": torch.exp,
}


def run_detach(ctx: Context, opname: str) -> dict:
    """``detach/<op>``: the op under KeepDetachedMode, then each output written (no grad): the kept
    detached tensors' versions (stock: a fresh counter that never moves; aliasguard: the output's)."""
    torch.manual_seed(0)
    t = torch.randn(2, 3, requires_grad=True)
    m = KeepDetachedMode()
    with m:
        out, err = call(lambda: DETACH_OPS[opname](t))
    if err is not None:
        return {"call": err}
    outs = ob.named("out", out)
    ctx.perturb([o for _, o in outs])
    pool = {id(t): "arg0", **{id(o): n for n, o in outs}}
    kept = [(f"kept{i}", k) for i, k in enumerate(m.kept)]
    rec = {"outs": ob.tensors(outs, pool), "kept": ob.tensors(kept, pool)}
    with torch.no_grad():
        for _, o in outs:
            o.add_(1)
    rec["kept_versions_after_write"] = {n: k._version for n, k in kept}
    rec["out_versions_after_write"] = {n: o._version for n, o in outs}
    return rec


def feature_scenarios() -> list[Scenario]:
    out = [Scenario(f"checkpoint/{v}/{c}", "checkpoint", lambda ctx, v=v, c=c: run_checkpoint(ctx, v, c))
           for v in SAC_VARIANTS for c in SAC_CASES]
    out += [Scenario(f"rewrite/{op}", "rewrite", lambda ctx, op=op: run_rewrite(ctx, op)) for op in REWRITE_OPS]
    out += [Scenario(f"detach/{op}", "detach", lambda ctx, op=op: run_detach(ctx, op)) for op in DETACH_OPS]
    return out
