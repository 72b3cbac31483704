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

``--simulate`` (with ``--instructions``) also has callgrind simulate the caches
and the branch predictor (``--cache-sim=yes --branch-sim=yes``) and counts the
calls of the allocators: per step, first-level data misses (D1, reads and
writes), last-level data and instruction misses (LLd, LLi), mispredicted
branches (conditional and indirect), ``malloc`` calls (``operator new``
included) and CPython object allocations (``PyObject_Malloc``). Simulated, for a cache the
size of this machine's: counts that repeat, not times. ``--keep DIR`` keeps
the callgrind files (``DIR/<workload>.<side>.callgrind``) for
``callgrind_annotate``.

    PYTHONPATH=. .venv/bin/python bench/bench_clients.py --instructions --simulate --steps 20

In the timing mode each worker also reads the hardware's cycle and
instruction counters around each block (``perf_event_open``, its own thread,
user space only) and the table adds cycles per step and instructions per
cycle on each side. Where the machine has no such counters (most VMs) or
``kernel.perf_event_paranoid`` refuses them, it says so and prints CPU time
alone.

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

# --- hardware counters (perf_event_open through ctypes) -------------------------------------

_PERF_TYPE_HARDWARE = 0
_PERF_COUNT_HW_CPU_CYCLES = 0
_PERF_COUNT_HW_INSTRUCTIONS = 1
_PERF_TYPE_SOFTWARE = 1
_PERF_COUNT_SW_TASK_CLOCK = 1
_PERF_EVENT_IOC_ENABLE = 0x2400
_PERF_EVENT_IOC_DISABLE = 0x2401
_PERF_EVENT_IOC_RESET = 0x2403
_PERF_FLAG_FD_CLOEXEC = 8
_SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}


class PerfCounters:
    """Counters of the calling thread, user space only, read around a block.

    ``PerfCounters([("cycles", 0, 0), ...])``: (name, perf type, config). Raises
    OSError (with the reason) when the kernel refuses one, which is what a
    machine without a PMU (most VMs) does for the hardware events."""

    def __init__(self, events: List[tuple]) -> None:
        import ctypes
        import fcntl
        import platform
        import struct

        number = _SYS_PERF_EVENT_OPEN.get(platform.machine())
        if number is None or not sys.platform.startswith("linux"):
            raise OSError(0, f"perf_event_open is not wired up for {sys.platform}/{platform.machine()}")
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fcntl = fcntl
        self._fds: Dict[str, int] = {}
        # struct perf_event_attr, PERF_ATTR_SIZE_VER0 (64 bytes): type, size, config,
        # sample_period, sample_type, read_format, flags (disabled | exclude_kernel |
        # exclude_hv), wakeup_events, bp_type, config1.
        flags = (1 << 0) | (1 << 5) | (1 << 6)
        try:
            for name, kind, config in events:
                attr = struct.pack("IIQQQQQIIQ", kind, 64, config, 0, 0, 0, flags, 0, 0, 0)
                buffer = ctypes.create_string_buffer(attr, len(attr))
                fd = self._libc.syscall(number, buffer, 0, -1, -1, _PERF_FLAG_FD_CLOEXEC)
                if fd < 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"perf_event_open({name}): {os.strerror(errno)}")
                self._fds[name] = fd
        except OSError:
            self.close()
            raise

    def start(self) -> None:
        for fd in self._fds.values():
            self._fcntl.ioctl(fd, _PERF_EVENT_IOC_RESET, 0)
            self._fcntl.ioctl(fd, _PERF_EVENT_IOC_ENABLE, 0)

    def stop(self) -> Dict[str, int]:
        for fd in self._fds.values():
            self._fcntl.ioctl(fd, _PERF_EVENT_IOC_DISABLE, 0)
        return {name: int.from_bytes(os.read(fd, 8), sys.byteorder) for name, fd in self._fds.items()}

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}


HARDWARE_EVENTS = [
    ("cycles", _PERF_TYPE_HARDWARE, _PERF_COUNT_HW_CPU_CYCLES),
    ("instructions", _PERF_TYPE_HARDWARE, _PERF_COUNT_HW_INSTRUCTIONS),
]


def open_hardware_counters() -> tuple:
    """(PerfCounters or None, why not): cycles and instructions of this thread."""
    try:
        return PerfCounters(HARDWARE_EVENTS), ""
    except OSError as error:
        return None, error.strerror or str(error)


def worker(side: str, steps: int) -> None:
    """Serve `run NAME` lines on stdin with one JSON line: CPU seconds per step, and
    cycles and instructions per step where the hardware counters can be read."""
    import torch

    if side == "aliasguard":
        import aliasguard  # noqa: F401
    torch.set_num_threads(1)
    counters, why_not = open_hardware_counters()
    ready: Dict[str, Callable[[], None]] = {}
    for line in sys.stdin:
        name = line.strip()
        if name not in ready:
            ready[name] = WORKLOADS[name]()
            for _ in range(steps):  # warm-up: caches, lazy registrations
                ready[name]()
        step = ready[name]
        if counters is not None:
            counters.start()
        start = time.process_time()
        for _ in range(steps):
            step()
        elapsed = (time.process_time() - start) / steps
        reply: Dict[str, object] = {"name": name, "seconds": elapsed}
        if counters is not None:
            reply.update({event: count / steps for event, count in counters.stop().items()})
        else:
            reply["counters_unavailable"] = why_not
        assert side == "aliasguard" or "aliasguard" not in sys.modules
        print(json.dumps(reply), flush=True)


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


# The allocators whose calls --simulate counts (callgrind's call counts, so
# only calls made while instrumentation is on). C++'s operator new is libstdc++'s
# call of malloc, so it is counted there, once.
MALLOC_FUNCTIONS = ("malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign")
PYMALLOC_FUNCTIONS = ("PyObject_Malloc", "PyObject_Calloc", "PyObject_Realloc")


def read_callgrind(path: str) -> Dict[str, float]:
    """Totals of a callgrind file by event name, plus the call counts of the
    allocators (`malloc calls`, `PyObject_Malloc calls`)."""
    names: Dict[str, str] = {}  # compressed function ids
    events: List[str] = []
    totals: List[int] = []
    malloc_calls = pymalloc_calls = 0
    callee = ""
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("cfn=") or line.startswith("fn="):
                match = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                if match is None:
                    name = line.split("=", 1)[1].strip()
                else:
                    if match.group(2) is not None:
                        names[match.group(1)] = match.group(2)
                    name = names.get(match.group(1), "")
                if line.startswith("cfn="):
                    callee = name
            elif line.startswith("calls="):
                count = int(line[6:].split()[0])
                if callee in MALLOC_FUNCTIONS:
                    malloc_calls += count
                elif callee in PYMALLOC_FUNCTIONS:
                    pymalloc_calls += count
            elif line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("totals:") or (line.startswith("summary:") and not totals):
                totals = [int(value) for value in line.split()[1:]]
    if not events or not totals:
        raise SystemExit(f"no event totals in {path}")
    counts: Dict[str, float] = dict(zip(events, map(float, totals)))
    counts["malloc calls"] = malloc_calls
    counts["PyObject_Malloc calls"] = pymalloc_calls
    return counts


# What --simulate reports per step: (column, callgrind events summed).
SIMULATED_COLUMNS = [
    ("D1 miss", ("D1mr", "D1mw")),
    ("LLd miss", ("DLmr", "DLmw")),
    ("LLi miss", ("ILmr",)),
    ("I1 miss", ("I1mr",)),
    ("br mispred", ("Bcm", "Bim")),
    ("malloc", ("malloc calls",)),
    ("pymalloc", ("PyObject_Malloc calls",)),
]


def count_instructions(
    name: str, steps: int, env: Dict[str, str], simulate: bool = False, keep: str = ""
) -> Dict[str, Dict[str, float]]:
    """Events per step of `name` on each side ({side: {event: count}}, `Ir` the
    instructions), both sides under callgrind at once; with `simulate` also the
    simulated cache misses, branch mispredictions and allocator calls."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"--instructions needs {tool} on PATH (Debian: apt-get install valgrind)")
    simulation = ["--cache-sim=yes", "--branch-sim=yes"] if simulate else []
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
                        *simulation,
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
            counts[side] = {event: total / steps for event, total in read_callgrind(out_file).items()}
            if keep:
                os.makedirs(keep, exist_ok=True)
                label = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")
                shutil.copy(out_file, os.path.join(keep, f"{label}.{side}.callgrind"))
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
        "--simulate",
        action="store_true",
        help="with --instructions: also simulated cache misses, branch mispredictions and allocator calls per step",
    )
    parser.add_argument(
        "--keep", metavar="DIR", default="", help="with --instructions: keep the callgrind files in DIR"
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
        simulated: Dict[str, Dict[str, Dict[str, float]]] = {}
        for name in [name for name in WORKLOADS if args.filter in name]:
            counts = count_instructions(name, args.steps, env, simulate=args.simulate, keep=args.keep)
            simulated[name] = counts
            print(
                f"{name:<36} {counts['stock']['Ir'] / 1e6:>13.3f} {counts['aliasguard']['Ir'] / 1e6:>18.3f} "
                f"{counts['aliasguard']['Ir'] / counts['stock']['Ir']:>6.3f}x",
                flush=True,
            )
        if args.simulate:
            print()
            print("Simulated per step (callgrind --cache-sim=yes --branch-sim=yes; allocator calls counted):")
            print("stock / aliasguard, then aliasguard's extra per step")
            header = "".join(f" {column:>22}" for column, _ in SIMULATED_COLUMNS)
            print(f"{'workload':<36}{header}")
            for name, counts in simulated.items():
                cells = []
                for _, events in SIMULATED_COLUMNS:
                    stock = sum(counts["stock"].get(event, 0.0) for event in events)
                    ours = sum(counts["aliasguard"].get(event, 0.0) for event in events)
                    cells.append(f" {f'{stock:.0f}/{ours:.0f} ({ours - stock:+.0f})':>22}")
                print(f"{name:<36}{''.join(cells)}")
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
    # Per block, where the workers could read the hardware counters.
    cycles: Dict[str, Dict[str, List[float]]] = {name: {"stock": [], "aliasguard": []} for name in names}
    instructions: Dict[str, Dict[str, List[float]]] = {name: {"stock": [], "aliasguard": []} for name in names}
    counters_unavailable = ""
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
                block = json.loads(reply)
                samples[name][side].append(block["seconds"])
                if "cycles" in block:
                    cycles[name][side].append(block["cycles"])
                    instructions[name][side].append(block["instructions"])
                else:
                    counters_unavailable = block.get("counters_unavailable", "")
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
    print()
    if counters_unavailable or not all(cycles[name][side] for name in names for side in cycles[name]):
        print(
            "Cycles and IPC: not supported on this machine (hardware counters unavailable: "
            f"{counters_unavailable or 'not read by every worker'}); CPU time only"
        )
        return
    print(f"Hardware counters per step (user space, the worker's thread), medians of {args.rounds} blocks")
    print(
        f"{'workload':<36} {'stock Mcyc':>11} {'aliasguard Mcyc':>16} {'ratio':>7} "
        f"{'stock Minstr':>13} {'aliasguard Minstr':>18} {'ratio':>7} {'stock IPC':>10} {'aliasguard IPC':>15}"
    )

    def ratio_of(ours: float, stock: float) -> str:
        return f"{ours / stock:>6.3f}x" if stock else f"{'-':>7}"

    for name in names:
        cyc = {side: statistics.median(values) for side, values in cycles[name].items()}
        ins = {side: statistics.median(values) for side, values in instructions[name].items()}
        ipc = {
            side: statistics.median([i / c for i, c in zip(instructions[name][side], cycles[name][side]) if c] or [0.0])
            for side in cycles[name]
        }
        print(
            f"{name:<36} {cyc['stock'] / 1e6:>11.3f} {cyc['aliasguard'] / 1e6:>16.3f} "
            f"{ratio_of(cyc['aliasguard'], cyc['stock'])} {ins['stock'] / 1e6:>13.3f} {ins['aliasguard'] / 1e6:>18.3f} "
            f"{ratio_of(ins['aliasguard'], ins['stock'])} {ipc['stock']:>10.3f} {ipc['aliasguard']:>15.3f}"
        )


if __name__ == "__main__":
    main()
