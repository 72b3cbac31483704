"""What automatic view tracking adds per op.

Per-op time of a view op (``x.view(-1)``), an in-place op (``x.mul_(1.0)``)
and a functional op (``x.neg()``), each through a pass-through
``TorchDispatchMode`` and through a wrapper subclass with one inner tensor,
with tracking on (the default) and off (``__aliasguard_track_views__ = False``
on the class: alias correction still runs, only the tracking differs). The
same ops also run in a second process that never imports aliasguard (stock).

"added" is the median over rounds of the paired difference tracking on minus
off. Medians over interleaved rounds of thread CPU time, garbage collection
off while timing. Prints a markdown table.

    PYTHONPATH=. .venv/bin/python bench/bench_view_tracking.py [--rounds N]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode

Samples = Dict[str, List[float]]
OPS = {
    "view": lambda x: x.view(-1),
    "in-place": lambda x: x.mul_(1.0),
    "functional": lambda x: x.neg(),
}


class PassMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class UntrackedPassMode(PassMode):
    __aliasguard_track_views__ = False


class One(torch.Tensor):
    """Wrapper subclass with one inner tensor; a lean dispatch (no pytree)."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype
        )

    def __init__(self, elem):
        self.elem = elem

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        out = func(*[t.elem if isinstance(t, One) else t for t in args], **(kwargs or {}))
        return cls(out) if isinstance(out, torch.Tensor) else out


class UntrackedOne(One):
    __aliasguard_track_views__ = False


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    start = time.thread_time_ns()
    for _ in range(calls):
        fn()
    return (time.thread_time_ns() - start) / calls / 1e3


def variants(tracked_classes: bool) -> Dict[str, Callable[[], Any]]:
    """name -> a function running `calls` ops, for each op and place."""
    result = {}
    for op_name, op in OPS.items():
        for tracked in (True, False) if tracked_classes else (True,):
            suffix = "on" if tracked else "off"
            mode = (PassMode if tracked else UntrackedPassMode)()
            x = torch.randn(16)
            w = (One if tracked else UntrackedOne)(torch.randn(16))

            def in_mode(mode=mode, x=x, op=op):
                with mode:
                    return op(x)

            result[f"mode/{op_name}/{suffix}"] = in_mode
            result[f"wrapper/{op_name}/{suffix}"] = lambda w=w, op=op: op(w)
    return result


def measure(fns: Dict[str, Callable[[], Any]], rounds: int, calls: int) -> Samples:
    samples: Samples = {name: [] for name in fns}
    for fn in fns.values():
        per_call_us(fn, calls)
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            names = list(fns)
            names = names[r % len(names) :] + names[: r % len(names)]
            for name in names:
                samples[name].append(per_call_us(fns[name], calls))
    finally:
        gc.enable()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--stock", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    torch.set_num_threads(1)
    if options.stock:  # the child process: no aliasguard
        samples = measure(variants(tracked_classes=False), options.rounds, options.calls)
        print(json.dumps({k.rsplit("/", 1)[0]: statistics.median(v) for k, v in samples.items()}))
        return
    child = subprocess.run(
        [sys.executable, __file__, "--stock", f"--rounds={options.rounds}", f"--calls={options.calls}"],
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    stock = json.loads(child.stdout)

    import aliasguard  # noqa: F401  (wraps the classes above)

    assert hasattr(PassMode.__dict__["__torch_dispatch__"], "__aliasguard_wrapped__")
    samples = measure(variants(tracked_classes=True), options.rounds, options.calls)
    print(
        f"torch {torch.__version__}, one intra-op thread, {options.rounds} interleaved rounds "
        f"of {options.calls} calls, medians of per-call thread CPU time\n"
    )
    print("| op | through | stock | tracking off | tracking on | added by tracking | target | on / stock |")
    print("|---|---|---:|---:|---:|---:|---|---:|")
    for place in ("mode", "wrapper"):
        for op_name in OPS:
            key = f"{place}/{op_name}"
            on, off = samples[f"{key}/on"], samples[f"{key}/off"]
            added = statistics.median([a - b for a, b in zip(on, off)])
            target = 0.5 if op_name == "view" else 0.2
            verdict = "met" if added <= target else "MISSED"
            print(
                f"| {op_name} | {place} | {stock[key]:.2f} µs | {statistics.median(off):.2f} µs | "
                f"{statistics.median(on):.2f} µs | {added:+.2f} µs | <= {target} µs ({verdict}) | "
                f"{statistics.median(on) / stock[key]:.2f}x |"
            )


if __name__ == "__main__":
    main()
