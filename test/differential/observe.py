"""Turn tensors and calls into JSON-able records that two processes can compare.

Nothing here may depend on aliasguard: the stock worker imports this module too.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

SMALL = 16  # tensors with at most this many elements are recorded element by element


def exc_record(e: BaseException) -> dict:
    msg = str(e).strip().splitlines()
    return {"exc": type(e).__name__, "msg": (msg[0][:200] if msg else "")}


def safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # an observable that raises is itself observed
        return {"exc": type(e).__name__}


def _scalar(v: Any) -> Any:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v == 0.0 and math.copysign(1.0, v) < 0:
            return "-0.0"
    if isinstance(v, complex):
        return [_scalar(v.real), _scalar(v.imag)]
    return v


def _plain_value(t: torch.Tensor) -> Any:
    if t.device.type == "meta" or isinstance(t, torch._subclasses.FakeTensor):
        return "no-data"
    if t.layout != torch.strided:
        if t.layout in (torch.sparse_coo,):
            t = t.coalesce()
            return {"indices": _plain_value(t.indices()), "values": _plain_value(t.values())}
        return f"layout:{t.layout}"
    with torch.no_grad():
        x = torch.Tensor._make_subclass(torch.Tensor, t) if type(t) is not torch.Tensor else t
        x = x.detach().resolve_conj().resolve_neg().contiguous()
        if x.numel() <= SMALL and x.dtype not in (torch.bfloat16, torch.float16) and not x.is_quantized:
            return [_scalar(v) for v in x.flatten().tolist()]
        if x.is_quantized:
            x = x.int_repr()
        raw = x.flatten().view(torch.uint8).numpy().tobytes()
        return "sha1:" + hashlib.sha1(raw).hexdigest()[:16]


def value(t: torch.Tensor, depth: int = 0) -> Any:
    """The data of ``t``: element list or digest; wrapper subclasses by their inner tensors."""
    if depth > 4:
        return "deep"
    if is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()
        return {a: safe(lambda a=a: value(getattr(t, a), depth + 1)) for a in attrs}
    return _plain_value(t)


def _symbol(s: torch.SymInt) -> str:
    # A nested int (an NJT's ragged size) prints as j<n>, n counting the NJTs the process made so far:
    # history, not behaviour (a worker restarted after a crash counts from 1 again).
    return re.sub(r"\bj\d+", "j", str(s))


def _grad_fn_name(t: torch.Tensor) -> Any:
    g = t.grad_fn
    return None if g is None else type(g).__name__


def tensor(t: torch.Tensor, pool: dict[int, str] | None = None, with_value: bool = True) -> dict:
    """Observables of one tensor. ``pool`` maps id() of named tensors to their names, for ``_base``."""
    rec: dict[str, Any] = {
        "type": type(t).__name__,
        "dtype": safe(lambda: str(t.dtype)),
        "shape": safe(lambda: [int(s) if not isinstance(s, torch.SymInt) else _symbol(s) for s in t.shape]),
        "requires_grad": safe(lambda: t.requires_grad),
        "is_leaf": safe(lambda: t.is_leaf),
        "grad_fn": safe(lambda: _grad_fn_name(t)),
        "version": safe(lambda: t._version),
        "is_view": safe(lambda: t._is_view()),
    }
    if t.layout == torch.strided and not t.is_nested:
        rec["stride"] = safe(lambda: list(t.stride()))
        rec["storage_offset"] = safe(lambda: t.storage_offset())

    def base() -> Any:
        b = t._base
        if b is None:
            return None
        if pool is not None and id(b) in pool:
            return pool[id(b)]
        return "other"

    rec["base"] = safe(base)
    if with_value:
        rec["value"] = safe(lambda: value(t))
    return rec


def flat_tensors(obj: Any) -> list[torch.Tensor]:
    leaves = torch.utils._pytree.tree_leaves(obj)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def named(prefix: str, obj: Any) -> list[tuple[str, torch.Tensor]]:
    return [(f"{prefix}{i}", t) for i, t in enumerate(flat_tensors(obj))]


def tensors(items: list[tuple[str, torch.Tensor]], pool: dict[int, str], with_value: bool = True) -> dict:
    return {name: tensor(t, pool, with_value) for name, t in items}


def non_tensor(obj: Any) -> Any:
    """Non-tensor outputs (ints, bools, shapes, ...), with tensors replaced by a marker."""
    def conv(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return "<tensor>"
        if isinstance(x, (int, float, bool, complex)) or x is None:
            return _scalar(x)
        if isinstance(x, (torch.Size, tuple, list)):
            return [conv(y) for y in x]
        if isinstance(x, str):
            return x
        return type(x).__name__

    return conv(obj)
