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
   directly: a dispatch body that only hands out prepared outputs, called
   bare, through aliasguard's wrapper, or followed by upstream's helper (or
   by ``aliasguard.correct_aliasing``, its drop-in replacement).
2. A small MLP's forward + backward: plain vs ``aliasguard.audit(kernels=True)`` vs
   ``torch._subclasses.schema_check_mode.SchemaCheckMode``.

Medians over interleaved rounds, thread CPU time (other processes' load
barely moves it), garbage collection off while timing (as timeit does).
Prints a markdown table.

    PYTHONPATH=. .venv/bin/python bench/bench_alias_correction.py [--rounds N]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any, Callable, Dict, Iterator, List

import torch
from torch._subclasses.schema_check_mode import SchemaCheckMode
from torch.utils._python_dispatch import return_and_correct_aliasing

import aliasguard
from aliasguard import _C
from aliasguard._aliasing import _wrap_bound

aten = torch.ops.aten


class Pair(torch.Tensor):
    """Wrapper subclass with two inner tensors, like an fp8 (data, scale) pair.

    Its dispatch is kept lean (no pytree) so that the per-op times, and their
    noise, are as small as a real subclass's can be.
    """

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
    out_a = func(*[t.a if isinstance(t, Pair) else t for t in args], **kwargs)
    out_b = func(*[t.b if isinstance(t, Pair) else t for t in args], **kwargs)
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


Samples = Dict[str, List[float]]


def interleaved(variants: Dict[str, Callable[[], Any]], rounds: int, calls: int) -> Samples:
    """Per-call times (µs), one sample per variant per round, variants
    measured back to back within a round so that each round's samples can be
    compared pairwise."""
    samples: Samples = {name: [] for name in variants}
    for fn in variants.values():  # warm-up: caches, allocator
        per_call_us(fn, calls)
    gc.collect()
    gc.disable()  # as timeit does: collections would land on whoever allocates
    try:
        for round_index in range(rounds):
            for name in rotated(list(variants), round_index):
                samples[name].append(per_call_us(variants[name], calls))
    finally:
        gc.enable()
    return samples


def rotated(names: List[str], round_index: int) -> List[str]:
    """Each round starts with the next variant: no variant always runs first
    (or right after the same neighbour), which would bias paired differences."""
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def median(values: List[float]) -> float:
    return statistics.median(values)


def added(samples: Samples, name: str, base: str = "none") -> float:
    """Median over rounds of the paired difference to the baseline: far less
    sensitive to load drifting between rounds than a difference of medians."""
    return median([a - b for a, b in zip(samples[name], samples[base])])


def make(cls, *shape):
    a = torch.randn(*shape)
    return cls(a, a.clone())


def end_to_end(rounds: int) -> Dict[str, Samples]:
    results = {}
    for op_name, run in (("view", lambda x, y: x.view(16, 4)), ("add", lambda x, y: x + y)):
        variants = {}
        for label, cls in (("none", BarePair), ("aliasguard", AutoPair), ("upstream", UpstreamPair)):
            x, y = make(cls, 8, 8), make(cls, 8, 8)
            variants[label] = (lambda run=run, x=x, y=y: run(x, y))
        results[op_name] = interleaved(variants, rounds, calls=500)
    return results


def correction_alone(rounds: int) -> Dict[str, Samples]:
    """The correction by itself. A dispatch body that hands out prepared
    output wrappers (fresh ones, built just before each small timed batch, so
    they are uncorrected and still in cache, as a real dispatch's output is) is
    called bare, through aliasguard's wrapper, or followed by upstream's
    helper; the difference to bare is what correcting costs."""
    results = {}
    x, y = make(Pair, 8, 8), make(Pair, 8, 8)
    batch, batches = 200, 5
    for op_name, func, args, inner in (
        ("view", aten.view.default, (x, [16, 4]), (x.a.view(16, 4), x.b.view(16, 4))),
        ("add", aten.add.Tensor, (x, y), (x.a + y.a, x.b + y.b)),
    ):
        outputs: List[Iterator[Pair]] = [iter(())]

        def body(cls, func, types, args, kwargs):
            return next(outputs[0])  # noqa: B023 (called within this iteration)

        wrapped = _wrap_bound(body)
        calls = {
            "none": lambda func=func, args=args: body(Pair, func, (), args, {}),
            "aliasguard": lambda func=func, args=args: wrapped(  # noqa: B023
                Pair, func, (), args, {}),
            "upstream": lambda func=func, args=args: return_and_correct_aliasing(
                func, args, {}, body(Pair, func, (), args, {})
            ),
            "explicit": lambda func=func, args=args: aliasguard.correct_aliasing(
                func, args, {}, body(Pair, func, (), args, {})
            ),
        }
        samples: Samples = {name: [] for name in calls}
        gc.collect()
        gc.disable()
        try:
            for round_index in range(rounds + 1):
                for name in rotated(list(calls), round_index):
                    call = calls[name]
                    elapsed = 0.0
                    for _ in range(batches):
                        outputs[0] = iter([Pair(*inner) for _ in range(batch)])
                        elapsed += per_call_us(call, batch) / batches
                    if round_index:  # the first round warms up
                        samples[name].append(elapsed)
        finally:
            gc.enable()
        results[op_name] = samples
    return results


def model_step(rounds: int) -> Samples:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    )
    x = torch.randn(16, 64)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    def audited():
        # Plain tensors reach no __torch_dispatch__: kernels=True makes the
        # audit check every op, as SchemaCheckMode does.
        with aliasguard.audit(kernels=True):
            step()

    def schema_checked():
        with SchemaCheckMode():
            step()

    # The first audit scope of a process registers the audit's dispatcher
    # fallback (the dispatcher updates every operator's table, ~17 ms) and the
    # last one removes it; a run audits under one scope, so the per-step cost
    # is measured with the registration kept (as the pytest plugin keeps it).
    _C._retain_alias_audit_fallback()
    try:
        return interleaved({"none": step, "audit": audited, "SchemaCheckMode": schema_checked}, rounds, calls=5)
    finally:
        _C._release_alias_audit_fallback()


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

    print(f"torch {torch.__version__}, {rounds} interleaved rounds; medians of per-call thread CPU time,")
    print("added = median over rounds of the paired difference to no correction\n")
    print(
        "| measurement | no correction | aliasguard (added) | upstream helper (added) "
        "| upstream added / aliasguard added |"
    )
    print("|---|---|---|---|---|")
    rows = [("per op, wrapper subclass", e2e, "aliasguard"), ("correction alone", alone, "aliasguard")]
    rows.append(("explicit `correct_aliasing` in place of upstream's", alone, "explicit"))
    for label, table, ours in rows:
        for op_name in ("view", "add"):
            r = table[op_name]
            added_ag, added_up = added(r, ours), added(r, "upstream")
            print(
                f"| {label}: `{op_name}` | {median(r['none']):.2f} µs | {median(r[ours]):.2f} µs "
                f"({added_ag:+.2f}) | {median(r['upstream']):.2f} µs ({added_up:+.2f}) | {ratio(added_up, added_ag)} |"
            )
    print()
    print("| MLP forward+backward | time | added | added vs audit |")
    print("|---|---|---|---|")
    audit_added = added(model, "audit")
    for name in ("none", "audit", "SchemaCheckMode"):
        extra = added(model, name) if name != "none" else 0.0
        vs = "" if name == "none" else ratio(extra, audit_added)
        label = {"audit": "`audit(kernels=True)`", "SchemaCheckMode": "`SchemaCheckMode`"}.get(name, name)
        print(f"| {label} | {median(model[name]) / 1e3:.3f} ms | {extra / 1e3:+.3f} ms | {vs} |")


if __name__ == "__main__":
    main()
