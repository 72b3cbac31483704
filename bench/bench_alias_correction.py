"""F4 benchmark: alias correction and the alias audit, against upstream, in one process.

1. Per-op time on a wrapper subclass (two inner tensors, no alias bookkeeping
   of its own) of a view op (``x.view``) and a non-alias op (``x + y``), with
   the subclass's ``__torch_dispatch__``
     * unwrapped: no correction at all (the baseline),
     * wrapped by aliasguard (automatic correction),
     * unwrapped, ending in upstream's ``return_and_correct_aliasing``.
   "added" is the difference to the baseline. Because a whole wrapper-subclass
   op costs tens of microseconds and the machine may be shared, the per-op
   differences are noisy; the table also gives the correction alone, measured
   directly: the same dispatch body returning a prepared output, called through
   aliasguard's wrapper vs bare vs followed by upstream's helper.
2. A small MLP's forward + backward: plain vs ``aliasguard.audit()`` vs
   ``torch._subclasses.schema_check_mode.SchemaCheckMode``.

Medians over interleaved rounds, thread CPU time (other processes' load
barely moves it). Prints a markdown table.

    PYTHONPATH=. .venv/bin/python bench/bench_alias_correction.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable, Dict, Iterator, List

import torch
from torch._subclasses.schema_check_mode import SchemaCheckMode
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_map_only

import aliasguard
from aliasguard._aliasing import _wrap_bound

aten = torch.ops.aten


def unwrap_pair(cls, args, kwargs, which):
    return tree_map_only(cls, lambda t: getattr(t, which), args), tree_map_only(cls, lambda t: getattr(t, which), kwargs)


class Pair(torch.Tensor):
    """Wrapper subclass with two inner tensors, like an fp8 (data, scale) pair."""

    @staticmethod
    def __new__(cls, a, b):
        return torch.Tensor._make_wrapper_subclass(
            cls, a.shape, strides=a.stride(), storage_offset=a.storage_offset(), dtype=a.dtype, device=a.device
        )

    def __init__(self, a, b):
        self.a = a
        self.b = b

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return pair_dispatch(cls, func, args, kwargs or {})


def pair_dispatch(cls, func, args, kwargs):
    args_a, kwargs_a = unwrap_pair(cls, args, kwargs, "a")
    args_b, kwargs_b = unwrap_pair(cls, args, kwargs, "b")
    out_a = func(*args_a, **kwargs_a)
    out_b = func(*args_b, **kwargs_b)
    if isinstance(out_a, torch.Tensor):
        return cls(out_a, out_b)
    return type(out_a)(cls(x, y) for x, y in zip(out_a, out_b))


class AutoPair(Pair):
    """Same dispatch; aliasguard wraps it on class creation."""


class BarePair(Pair):
    """Same dispatch, with aliasguard's wrapper taken off: no correction."""


class UpstreamPair(Pair):
    """Same dispatch, ending in upstream's return_and_correct_aliasing."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        return return_and_correct_aliasing(func, args, kwargs, pair_dispatch(cls, func, args, kwargs))


def take_off_aliasguard(cls: type) -> None:
    # Assigned after class creation, so not wrapped again.
    descriptor = cls.__dict__["__torch_dispatch__"]
    type.__setattr__(cls, "__torch_dispatch__", classmethod(descriptor.__func__.__aliasguard_wrapped__))


BarePair.__torch_dispatch__ = Pair.__dict__["__torch_dispatch__"]  # inherited body, class's own slot
take_off_aliasguard(BarePair)
take_off_aliasguard(UpstreamPair)
assert hasattr(Pair.__dict__["__torch_dispatch__"].__func__, "__aliasguard_wrapped__")


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    start = time.thread_time_ns()
    for _ in range(calls):
        fn()
    return (time.thread_time_ns() - start) / calls / 1e3


def interleaved(variants: Dict[str, Callable[[], Any]], rounds: int, calls: int) -> Dict[str, float]:
    samples: Dict[str, List[float]] = {name: [] for name in variants}
    for fn in variants.values():  # warm-up: caches, allocator
        per_call_us(fn, calls)
    for _ in range(rounds):
        for name, fn in variants.items():
            samples[name].append(per_call_us(fn, calls))
    return {name: statistics.median(values) for name, values in samples.items()}


def make(cls, *shape):
    a = torch.randn(*shape)
    return cls(a, a.clone())


def end_to_end(rounds: int) -> Dict[str, Dict[str, float]]:
    results = {}
    for op_name, run in (("view", lambda x, y: x.view(16, 4)), ("add", lambda x, y: x + y)):
        variants = {}
        for label, cls in (("none", BarePair), ("aliasguard", AutoPair), ("upstream", UpstreamPair)):
            x, y = make(cls, 8, 8), make(cls, 8, 8)
            variants[label] = (lambda run=run, x=x, y=y: run(x, y))
        results[op_name] = interleaved(variants, rounds, calls=300)
    return results


def correction_alone(rounds: int) -> Dict[str, Dict[str, float]]:
    """The correction by itself: a dispatch body that returns a prepared output."""
    results = {}
    x, y = make(Pair, 8, 8), make(Pair, 8, 8)
    calls = 2000
    for op_name, func, args, make_out in (
        ("view", aten.view.default, (x, [16, 4]), lambda: Pair(x.a.view(16, 4), x.b.view(16, 4))),
        ("add", aten.add.Tensor, (x, y), lambda: Pair(x.a + y.a, x.b + y.b)),
    ):
        # Fresh, uncorrected outputs for every call (a view's storage is
        # swapped on first correction); the same pool order for each variant.
        pool_size = calls * (rounds + 1) + 10
        pools = {label: iter([make_out() for _ in range(pool_size)]) for label in ("none", "aliasguard", "upstream")}

        def body(cls, func, types, args, kwargs, pool: Iterator = None):
            return next(pool)

        def bare(pool=pools["none"]):
            return body(Pair, func, (), args, {}, pool)

        wrapped_body = _wrap_bound(lambda cls, func, types, args, kwargs, pool=pools["aliasguard"]: next(pool))

        def auto():
            return wrapped_body(Pair, func, (), args, {})

        def upstream(pool=pools["upstream"]):
            return return_and_correct_aliasing(func, args, {}, body(Pair, func, (), args, {}, pool))

        results[op_name] = interleaved({"none": bare, "aliasguard": auto, "upstream": upstream}, rounds, calls)
    return results


def model_step(rounds: int) -> Dict[str, float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    )
    x = torch.randn(16, 64)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    def audited():
        with aliasguard.audit():
            step()

    def schema_checked():
        with SchemaCheckMode():
            step()

    return interleaved({"none": step, "audit": audited, "SchemaCheckMode": schema_checked}, rounds, calls=5)


def ratio(numerator: float, denominator: float) -> str:
    if denominator <= 0:
        return "n/a (added time below noise)"
    return f"{numerator / denominator:.1f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    rounds = parser.parse_args().rounds
    torch.set_num_threads(1)

    e2e = end_to_end(rounds)
    alone = correction_alone(rounds)
    model = model_step(max(5, rounds // 3))

    print(f"torch {torch.__version__}, {rounds} interleaved rounds, medians, thread CPU time\n")
    print("| measurement | no correction | aliasguard (added) | upstream helper (added) | upstream added / aliasguard added |")
    print("|---|---|---|---|---|")
    for label, table in (("per op, wrapper subclass", e2e), ("correction alone", alone)):
        for op_name in ("view", "add"):
            r = table[op_name]
            added_ag = r["aliasguard"] - r["none"]
            added_up = r["upstream"] - r["none"]
            print(
                f"| {label}: `{op_name}` | {r['none']:.2f} µs | {r['aliasguard']:.2f} µs ({added_ag:+.2f}) "
                f"| {r['upstream']:.2f} µs ({added_up:+.2f}) | {ratio(added_up, added_ag)} |"
            )
    print()
    print("| MLP forward+backward | time | added | added vs audit |")
    print("|---|---|---|---|")
    base = model["none"]
    audit_added = model["audit"] - base
    for name in ("none", "audit", "SchemaCheckMode"):
        added = model[name] - base
        vs = "" if name == "none" else ratio(added, audit_added)
        print(f"| {name} | {model[name] / 1e3:.3f} ms | {added / 1e3:+.3f} ms | {vs} |")


if __name__ == "__main__":
    main()
