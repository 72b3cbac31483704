"""What the checkpoint fast path's write guard costs: the same regions with it on and off.

The guard (Note [Refusing a write where it happens] in
``torch/csrc/autograd/selective_checkpoint_write_guard.h``) is on while a
fast-path region's forward phase runs, unless ``allow_cache_entry_mutation=True``
(which also skips the version comparison when the region ends). So the two
configurations differ by exactly what refusing a write costs: the key turned on
and off per region, and the kernel of each op in the region that writes an
argument. The model is the dispatch-bound transformer block of
``bench_checkpoint.py`` (batch 1, seq 8, dim 32), four checkpointed blocks per
step, the list policy (mm, addmm, bmm), one intra-op thread.

    PYTHONPATH=. .venv/bin/python bench/bench_write_guard.py [--rounds 30]
    PYTHONPATH=. .venv/bin/python bench/bench_write_guard.py --instructions

The default alternates the two configurations in one process, blocks of 20
steps, and prints the median CPU time per step of each and their ratio.
``--instructions`` runs each configuration under callgrind twice (5 and 25
steps) and prints the instructions per step (the difference of the two runs
over 20 steps, so start-up cancels), which repeats to a fraction of a percent
on a shared machine.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

aten = torch.ops.aten
POLICY = [aten.mm.default, aten.addmm.default, aten.bmm.default]


def _inputs() -> list:
    g = torch.Generator().manual_seed(0)
    shapes = [(1, 8, 32), (96, 32), (96,), (32, 32), (64, 32), (32, 64)]
    return [torch.randn(*s, generator=g).requires_grad_() for s in shapes]


def _block(x, wqkv, bqkv, wo, wup, wdown):
    q, k, v = F.linear(x, wqkv, bqkv).split(32, dim=-1)
    attn = ((q @ k.transpose(-2, -1)) / math.sqrt(32)).softmax(-1) @ v
    x = x + F.linear(attn, wo)
    return x + F.linear(F.gelu(F.linear(x, wup)), wdown)


def _step(inputs: list, guard_on: bool) -> None:
    from aliasguard.checkpoint import checkpoint

    x = inputs[0]
    for _ in range(4):
        x = checkpoint(_block, x, *inputs[1:], policy=POLICY, allow_cache_entry_mutation=not guard_on)
    x.sum().backward()


def cpu_times(rounds: int) -> None:
    import aliasguard  # noqa: F401

    torch.set_num_threads(1)
    inputs = _inputs()
    times: dict = {True: [], False: []}
    for guard_on in (True, False):
        for _ in range(20):
            _step(inputs, guard_on)
    for r in range(rounds):
        for guard_on in (True, False) if r % 2 else (False, True):
            start = time.thread_time()
            for _ in range(20):
                _step(inputs, guard_on)
            times[guard_on].append((time.thread_time() - start) / 20 * 1e3)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"torch {torch.__version__}, {rounds} blocks of 20 steps each, alternating")
    print(f"guard on  (default)                         : {on:.3f} ms CPU per step")
    print(f"guard off (allow_cache_entry_mutation=True) : {off:.3f} ms CPU per step")
    print(f"on / off: {on / off:.3f}x")


def _collected(guard: str, steps: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={os.path.join(tmp, 'cg.out')}",
             sys.executable, os.path.abspath(__file__), "--worker", guard, str(steps)],
            capture_output=True, text=True, check=True,
        )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no count:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def instructions() -> None:
    per_step = {}
    for guard in ("on", "off"):
        per_step[guard] = (_collected(guard, 25) - _collected(guard, 5)) / 20
    print(f"torch {torch.__version__}, instructions per step (callgrind, 25 steps less 5 steps, over 20)")
    print(f"guard on : {per_step['on'] / 1e6:.2f} M")
    print(f"guard off: {per_step['off'] / 1e6:.2f} M")
    print(f"on / off: {per_step['on'] / per_step['off']:.4f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--worker", nargs=2, metavar=("GUARD", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import aliasguard  # noqa: F401

        torch.set_num_threads(1)
        inputs = _inputs()
        for _ in range(int(args.worker[1])):
            _step(inputs, args.worker[0] == "on")
    elif args.instructions:
        instructions()
    else:
        cpu_times(args.rounds)


if __name__ == "__main__":
    main()
