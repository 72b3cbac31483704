"""What ``import aliasguard`` costs real tensor-subclass clients, per training step.

Two worker processes run the same workloads, one that never imports
aliasguard (stock) and one that does; the parent alternates them, one block
of steps at a time, so both see the same machine. Each block's CPU time
(``time.process_time``, one intra-op thread) is one sample; the table gives
the median per step on each side and the ratio of medians, with the spread
of the per-block ratios.

    PYTHONPATH=. .venv/bin/python bench/bench_clients.py --rounds 7

On a machine whose CPU time drifts (a shared VM), ``--instructions`` counts
instead: each side runs its steps under valgrind's callgrind, instrumented only
from the end of the warm-up to the end of the steps, and the table gives
instructions per step and their ratio. The counts repeat to a fraction of a
percent from run to run; they weigh a Python round trip and a cache miss
alike, so they complement the CPU times and do not replace them.

    PYTHONPATH=. .venv/bin/python bench/bench_clients.py --instructions --steps 20

``--control`` runs the same comparison with both workers stock: the ratios it
prints are the machine's own spread, the floor below which a CPU-time ratio
means nothing.

Workloads: plain MLP training (no subclass: the price of the wrapper hooks
is zero there), TwoTensor MLP training, FlopCounterMode over an MLP step,
a gated projection block on a nested jagged tensor, tensor-parallel attention on DTensor
(gloo, world size 1, loopback).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List

# --- workloads (run in the workers) -------------------------------------------------------


def _mlp_step_factory(wrap: Callable, context: Callable) -> Callable[[], None]:
    import torch

    torch.manual_seed(0)
    w1 = wrap(torch.randn(32, 64)).requires_grad_()
    w2 = wrap(torch.randn(64, 16)).requires_grad_()
    x = wrap(torch.randn(8, 32))

    def step() -> None:
        with context():
            out = ((x @ w1).relu() @ w2).sum()
            out.backward()
        w1.grad = None
        w2.grad = None

    return step


def plain_mlp() -> Callable[[], None]:
    import contextlib

    return _mlp_step_factory(lambda t: t, contextlib.nullcontext)


def two_tensor_mlp() -> Callable[[], None]:
    import contextlib

    from torch.testing._internal.two_tensor import TwoTensor

    return _mlp_step_factory(lambda t: TwoTensor(t, t.clone()), contextlib.nullcontext)


def flop_counter_mlp() -> Callable[[], None]:
    from torch.utils.flop_counter import FlopCounterMode

    return _mlp_step_factory(lambda t: t, lambda: FlopCounterMode(display=False))


def nested_jagged_block() -> Callable[[], None]:
    import torch

    torch.manual_seed(0)
    proj = torch.nn.Linear(16, 48)
    out_proj = torch.nn.Linear(16, 16)
    values = torch.randn(10, 16)
    offsets = torch.tensor([0, 3, 7, 10])

    def step() -> None:
        # A gated projection block on a jagged batch: linear, chunk into
        # three views, pointwise gating, softmax, linear, backward.
        nt = torch.nested.nested_tensor_from_jagged(values, offsets)
        q, k, v = proj(nt).chunk(3, dim=-1)
        gated = (q.sigmoid() * k).softmax(-1) * v
        out_proj(gated).values().sum().backward()
        proj.zero_grad(set_to_none=True)
        out_proj.zero_grad(set_to_none=True)

    return step


def dtensor_tp_attention() -> Callable[[], None]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    mesh = init_device_mesh("cpu", (1,))
    torch.manual_seed(0)
    wqkv = distribute_tensor(torch.randn(48, 16), mesh, [Shard(0)]).requires_grad_()
    wo = distribute_tensor(torch.randn(16, 16), mesh, [Shard(1)]).requires_grad_()
    x = distribute_tensor(torch.randn(4, 6, 16), mesh, [Replicate()])

    def step() -> None:
        qkv = x @ wqkv.t()
        q, k, v = qkv.chunk(3, dim=-1)
        q, k, v = (t.unflatten(-1, (2, 8)).transpose(1, 2) for t in (q, k, v))
        attn = (q @ k.transpose(-2, -1)).softmax(-1) @ v
        out = attn.transpose(1, 2).flatten(-2) @ wo.t()
        out.sum().backward()
        wqkv.grad = None
        wo.grad = None

    return step


WORKLOADS: Dict[str, Callable[[], Callable[[], None]]] = {
    "plain MLP training (no subclass)": plain_mlp,
    "TwoTensor MLP training": two_tensor_mlp,
    "FlopCounterMode MLP training": flop_counter_mlp,
    "NJT gated projection block": nested_jagged_block,
    "DTensor tensor-parallel attention": dtensor_tp_attention,
}


def worker(side: str, steps: int) -> None:
    """Serve `run NAME` lines on stdin with one JSON line: CPU seconds per step."""
    import torch

    if side == "aliasguard":
        import aliasguard  # noqa: F401
    torch.set_num_threads(1)
    ready: Dict[str, Callable[[], None]] = {}
    for line in sys.stdin:
        name = line.strip()
        if name not in ready:
            ready[name] = WORKLOADS[name]()
            for _ in range(steps):  # warm-up: caches, lazy registrations
                ready[name]()
        step = ready[name]
        start = time.process_time()
        for _ in range(steps):
            step()
        elapsed = (time.process_time() - start) / steps
        assert side == "aliasguard" or "aliasguard" not in sys.modules
        print(json.dumps({"name": name, "seconds": elapsed}), flush=True)


def counting_worker(side: str, name: str, steps: int) -> None:
    """Warm `name` up, then run `steps` steps between two handshakes on stdin/stdout.

    The parent switches callgrind's instrumentation on after the first handshake and
    off after the second, so only the steps are counted."""
    import torch

    if side == "aliasguard":
        import aliasguard  # noqa: F401
    torch.set_num_threads(1)
    step = WORKLOADS[name]()
    for _ in range(steps):
        step()
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(steps):
        step()
    print("done", flush=True)
    sys.stdin.readline()
    assert side == "aliasguard" or "aliasguard" not in sys.modules


def count_instructions(name: str, steps: int, env: Dict[str, str]) -> Dict[str, float]:
    """Instructions per step of `name` on each side, both sides under callgrind at once."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"--instructions needs {tool} on PATH (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        procs = {}
        for side in ("stock", "aliasguard"):
            out_file = os.path.join(tmp, f"{side}.callgrind")
            procs[side] = (
                subprocess.Popen(
                    [
                        "valgrind",
                        "--tool=callgrind",
                        "--instr-atstart=no",
                        f"--callgrind-out-file={out_file}",
                        sys.executable,
                        os.path.abspath(__file__),
                        "--worker",
                        side,
                        "--count",
                        name,
                        "--steps",
                        str(steps),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=env,
                ),
                out_file,
            )
        for switch, reply in (("on", "ready"), ("off", "done")):
            for side, (proc, _) in procs.items():
                assert proc.stdin is not None and proc.stdout is not None
                line = proc.stdout.readline().strip()
                if line != reply:
                    raise SystemExit(f"the {side} worker under callgrind said {line!r} on {name!r}")
                if switch == "off":
                    subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True)
            for proc, _ in procs.values():
                assert proc.stdin is not None
                if switch == "on":
                    subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True)
                proc.stdin.write("\n")
                proc.stdin.flush()
        counts = {}
        for side, (proc, out_file) in procs.items():
            if proc.wait() != 0:
                raise SystemExit(f"the {side} worker under callgrind failed on {name!r}")
            with open(out_file) as f:
                totals = re.search(r"^totals: (\d+)", f.read(), re.MULTILINE)
            if totals is None:
                raise SystemExit(f"no instruction total in {out_file}")
            counts[side] = int(totals.group(1)) / steps
        return counts


# --- the parent ------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="blocks per workload and side")
    parser.add_argument("--steps", type=int, default=50, help="steps per block")
    parser.add_argument("--filter", default="", help="only workloads whose name contains this")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions per step under callgrind instead of timing"
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="the second worker is stock too: the ratios this machine gives with no difference at all",
    )
    parser.add_argument("--worker", choices=["stock", "aliasguard"], help=argparse.SUPPRESS)
    parser.add_argument("--count", metavar="WORKLOAD", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker and args.count:
        counting_worker(args.worker, args.count, args.steps)
        return
    if args.worker:
        worker(args.worker, args.steps)
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS="1")
    if args.instructions:
        print(f"Instructions per step under callgrind, {args.steps} steps after {args.steps} warm-up steps")
        print(f"{'workload':<36} {'stock Minstr':>13} {'aliasguard Minstr':>18} {'ratio':>7}")
        for name in [name for name in WORKLOADS if args.filter in name]:
            counts = count_instructions(name, args.steps, env)
            print(
                f"{name:<36} {counts['stock'] / 1e6:>13.3f} {counts['aliasguard'] / 1e6:>18.3f} "
                f"{counts['aliasguard'] / counts['stock']:>6.3f}x",
                flush=True,
            )
        return
    workers = {
        side: subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--worker",
                "stock" if args.control else side,
                "--steps",
                str(args.steps),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for side in ("stock", "aliasguard")
    }
    names = [name for name in WORKLOADS if args.filter in name]
    samples: Dict[str, Dict[str, List[float]]] = {name: {"stock": [], "aliasguard": []} for name in names}
    for round_index in range(args.rounds):
        for name in names:
            # Alternate which side goes first, so neither always runs warm.
            order = ("stock", "aliasguard") if round_index % 2 == 0 else ("aliasguard", "stock")
            for side in order:
                proc = workers[side]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(name + "\n")
                proc.stdin.flush()
                reply = proc.stdout.readline()
                if not reply:
                    raise SystemExit(f"the {side} worker died on {name!r}")
                samples[name][side].append(json.loads(reply)["seconds"])
    for proc in workers.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    print(f"CPU time per step, median of {args.rounds} blocks of {args.steps} steps (one thread)")
    if args.control:
        print("control run: the 'aliasguard' column is a second stock worker")
    print(f"{'workload':<36} {'stock ms':>9} {'aliasguard ms':>14} {'ratio':>7}  per-block ratios")
    for name in names:
        stock, ours = samples[name]["stock"], samples[name]["aliasguard"]
        ratios = sorted(o / s for o, s in zip(ours, stock))
        ratio = statistics.median(ours) / statistics.median(stock)
        print(
            f"{name:<36} {statistics.median(stock) * 1e3:>9.3f} {statistics.median(ours) * 1e3:>14.3f} "
            f"{ratio:>6.3f}x  {ratios[0]:.3f}-{ratios[-1]:.3f}"
        )


if __name__ == "__main__":
    main()
