"""F5 benchmark: selective checkpointing, aliasguard's against torch's, fairly.

A 4-layer pre-norm transformer (CPU, float32), forward + backward, under:
no checkpoint, plain checkpoint (per layer), torch's selective checkpoint (SAC)
and aliasguard's, both with the same policy (save the matmuls, recompute the
rest). Two sizes: one where the kernels dominate, and a tiny one where the
time is mostly dispatch, so the modes' per-op overhead shows.

Fairness: the three baselines run in worker processes that never import
aliasguard (importing it wraps every ``__torch_dispatch__``, torch's SAC mode
included); aliasguard's SAC (the list-policy fast path below autograd, and the
dispatch-mode path with ``fast_path=False``) runs in its own worker processes,
beside in-process copies of the plain checkpoint and torch's SAC (with
aliasguard imported), so each ratio can also be read within one process. Workers of the
two kinds alternate, several rounds each, on one intra-op thread; each
reports the wall and CPU (thread) time of every step, and the table gives
medians over all rounds and the ratio of medians. Saved bytes are the
storages made in the forward pass and still alive after it (what the
backward pass holds: autograd's saved tensors and SAC's cache). All variants
must produce the same gradients, checked across processes.

The floor for SAC is plain checkpointing minus the recompute of the saved
ops; with this policy (the matmuls) that is between "no checkpoint" and
"plain checkpoint". "pass-through modes" is plain checkpointing with two
TorchDispatchModes that only forward each op (``func._op(*args, **kwargs)``):
the cost of routing every op through torch's Python dispatch key, which any
SAC built on a TorchDispatchMode pays, whatever its own per-op work.

A third model, ``--sizes decoder``: the llama-style decoder of
``decoder_model.py`` (RMSNorm, causal SDPA attention, SwiGLU feed-forward of
bias-free linears; batch 4, seq 128, dim 256, 4 blocks) under torchtitan's
op-level SAC policy (its save list, every second mm recomputed): torch's SAC,
aliasguard's fast path (``ops=`` the list's dispatcher ops) and mode path
(``fast_path=False``), torch_remat saving the same projections (when
installed: an optional package, imported only by its variant; skipped with a
note otherwise), plain checkpoint and no checkpoint; with ``--compiled`` also
each under ``torch.compile`` (inductor). Its ratios are to torch's SAC with the
same policy.

    PYTHONPATH=. .venv/bin/python bench/bench_checkpoint.py [--repeats N] [--rounds R] [--compiled]
    PYTHONPATH=. .venv/bin/python bench/bench_checkpoint.py --sizes decoder [--compiled]
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as torch_checkpoint
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import decoder_model  # bench/, beside this file: never imports aliasguard

aten = torch.ops.aten
LAYERS = 4
# (batch, seq, dim, heads, ffn)
SIZES = {"kernel-bound": (8, 128, 256, 4, 1024), "dispatch-bound": (1, 8, 32, 2, 64), "decoder": (4, 128, 256, 4, 768)}
# The sizes --compiled also measures under torch.compile.
COMPILED_SIZES = ("dispatch-bound", "decoder")
SAVE_MATMULS = [aten.mm.default, aten.addmm.default, aten.bmm.default]
STOCK = ("no checkpoint", "plain checkpoint", "pass-through modes", "torch SAC", "torch SAC, policy fn")
OURS = (
    "aliasguard SAC",
    "aliasguard SAC, policy fn + ops",
    "aliasguard SAC (modes)",
    "plain checkpoint (in-process)",
    "torch SAC (in-process)",
    "torch SAC, policy fn (in-process)",
)
# torch.compile: torch's SAC and aliasguard's (which hands torch's own contexts
# to AOTAutograd) under each backend, beside a compiled plain checkpoint.
COMPILED_BACKENDS = ("aot_eager", "inductor")
COMPILED_STOCK = tuple(f"torch SAC, compiled ({b})" for b in COMPILED_BACKENDS) + (
    "plain checkpoint, compiled (aot_eager)",
)
COMPILED_OURS = tuple(f"aliasguard SAC, compiled ({b})" for b in COMPILED_BACKENDS) + (
    "plain checkpoint, compiled (aot_eager) (in-process)",
)


# The decoder (decoder_model.Block) under torchtitan's own policy and save list.
TITAN = "torchtitan policy"
REMAT = "torch_remat"
DECODER_STOCK = ("no checkpoint", "plain checkpoint", f"torch SAC, {TITAN}", REMAT)
DECODER_OURS = (
    f"aliasguard SAC, {TITAN} + ops",
    f"aliasguard SAC, {TITAN} (modes)",
    "plain checkpoint (in-process)",
    f"torch SAC, {TITAN} (in-process)",
)
DECODER_COMPILED_STOCK = tuple(
    f"{name}, compiled (inductor)" for name in ("no checkpoint", "plain checkpoint", f"torch SAC, {TITAN}", REMAT)
)
DECODER_COMPILED_OURS = (
    f"aliasguard SAC, {TITAN} + ops, compiled (inductor)",
    "plain checkpoint, compiled (inductor) (in-process)",
)


def has_torch_remat() -> bool:
    return importlib.util.find_spec("torch_remat") is not None


def variant_names(label: str, kind: str) -> Tuple[str, ...]:
    """The variants a worker of ``kind`` ("stock" or "ours") measures for ``label``.

    torch_remat's only where it is installed (its variant is the one place
    that imports it).
    """
    stock = kind == "stock"
    if label == "compiled decoder":
        names = DECODER_COMPILED_STOCK if stock else DECODER_COMPILED_OURS
    elif label.startswith("compiled "):
        names = COMPILED_STOCK if stock else COMPILED_OURS
    elif label == "decoder":
        names = DECODER_STOCK if stock else DECODER_OURS
    else:
        names = STOCK if stock else OURS
    return tuple(n for n in names if has_torch_remat() or not n.startswith(REMAT))


def reference_variant(label: str) -> str:
    """The variant every other's gradients are compared with."""
    if label == "compiled decoder":
        return "no checkpoint, compiled (inductor)"
    if label.startswith("compiled "):
        return "plain checkpoint, compiled (aot_eager)"
    return "no checkpoint"


def remat_saving_projections(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with torchtitan's saved projections as torch_remat save regions.

    A save region keeps what its call saves for backward and is skipped in the
    recompute; ``recompute_needs_tensor`` keeps its output for the recompute,
    as SAC's cache does.
    """
    import torch_remat as remat

    def save(linear: Callable[..., Any], name: str) -> Callable[..., Any]:
        region = remat.region(linear, name, recompute=False)

        def call(x: torch.Tensor) -> torch.Tensor:
            out = region(x)
            remat.recompute_needs_tensor(out)
            return out

        return call

    return remat.checkpoint()(decoder_model.saved_projections(save, function))


def titan_policy() -> Callable[..., Any]:
    """A torchtitan-style policy function: save the matmuls, but only every second addmm.

    torchtitan counts mm (its linears have no bias); these have, so addmm.

    Made fresh per checkpoint call (its counters are per region, as torchtitan's).
    """
    counts = {False: 0, True: 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        if func is aten.addmm.default:
            counts[ctx.is_recompute] += 1
            if counts[ctx.is_recompute] % 2 == 0:
                return torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE
        if func in SAVE_MATMULS:
            return torch_checkpoint.CheckpointPolicy.MUST_SAVE
        return torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE

    return policy
# Suffix of the baselines that also run in the aliasguard worker.
IN_PROCESS = " (in-process)"


class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, ffn)
        self.down = torch.nn.Linear(ffn, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(dim, dim=-1)
        head_dim = dim // self.heads
        q, k, v = (t.reshape(batch, seq, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
        attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, dim)
        x = x + self.proj(attn)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


Forward = Callable[[torch.Tensor], torch.Tensor]


def make_variants(blocks: torch.nn.ModuleList, names: Tuple[str, ...]) -> Dict[str, Forward]:
    def run(layer_fn: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]) -> Forward:
        def forward(x: torch.Tensor) -> torch.Tensor:
            for block in blocks:
                x = layer_fn(block, x)
            return x

        return forward

    variants: Dict[str, Forward] = {}
    for full_name in names:
        name = full_name.removesuffix(IN_PROCESS)
        if name == "no checkpoint":
            variants[name] = run(lambda block, x: block(x))
        elif name == "plain checkpoint":
            variants[name] = run(lambda block, x: torch_checkpoint.checkpoint(block, x, use_reentrant=False))
        elif name == "pass-through modes":

            class PassThrough(TorchDispatchMode):
                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    return func._op(*args, **(kwargs or {}))

            def pass_through_context() -> Any:
                return PassThrough(), PassThrough()

            variants[name] = run(
                lambda block, x: torch_checkpoint.checkpoint(
                    block, x, use_reentrant=False, context_fn=pass_through_context
                )
            )
        elif name == "torch SAC":

            def torch_sac_context() -> Any:
                return torch_checkpoint.create_selective_checkpoint_contexts(SAVE_MATMULS)

            variants[name] = run(
                lambda block, x: torch_checkpoint.checkpoint(
                    block, x, use_reentrant=False, context_fn=torch_sac_context
                )
            )
        elif name == "torch SAC, policy fn":

            def torch_titan_context() -> Any:
                return torch_checkpoint.create_selective_checkpoint_contexts(titan_policy())

            variants[name] = run(
                lambda block, x: torch_checkpoint.checkpoint(
                    block, x, use_reentrant=False, context_fn=torch_titan_context
                )
            )
        elif name == "aliasguard SAC":
            from aliasguard.checkpoint import checkpoint as aliasguard_checkpoint

            variants[name] = run(lambda block, x: aliasguard_checkpoint(block, x, policy=SAVE_MATMULS))
        elif name == "aliasguard SAC, policy fn + ops":
            from aliasguard.checkpoint import checkpoint as aliasguard_checkpoint

            variants[name] = run(
                lambda block, x: aliasguard_checkpoint(block, x, policy=titan_policy(), ops=SAVE_MATMULS)
            )
        elif name.endswith(", compiled (aot_eager)") or name.endswith(", compiled (inductor)"):
            variants[name] = compiled_variant(blocks, name)
        elif name == f"torch SAC, {TITAN}":

            def torch_titan_sac_context() -> Any:
                return torch_checkpoint.create_selective_checkpoint_contexts(decoder_model.torchtitan_policy())

            variants[name] = run(
                lambda block, x: torch_checkpoint.checkpoint(
                    block, x, use_reentrant=False, context_fn=torch_titan_sac_context
                )
            )
        elif name in (f"aliasguard SAC, {TITAN} + ops", f"aliasguard SAC, {TITAN} (modes)"):
            from aliasguard.checkpoint import checkpoint as aliasguard_checkpoint

            def aliasguard_titan_sac(block: torch.nn.Module, x: torch.Tensor, fast_path: bool) -> torch.Tensor:
                return aliasguard_checkpoint(
                    block, x, policy=decoder_model.torchtitan_policy(),
                    ops=decoder_model.DISPATCHER_SAVE_LIST, fast_path=fast_path,
                )

            variants[name] = run(functools.partial(aliasguard_titan_sac, fast_path=not name.endswith("(modes)")))
        elif name == REMAT:
            variants[name] = run(lambda block, x: remat_saving_projections(block)(x))
        elif name == "aliasguard SAC (modes)":
            from aliasguard.checkpoint import checkpoint as aliasguard_checkpoint

            variants[name] = run(
                lambda block, x: aliasguard_checkpoint(block, x, policy=SAVE_MATMULS, fast_path=False)
            )
        else:
            raise ValueError(name)
        variants[full_name] = variants.pop(name)
    return variants


def compiled_variant(blocks: torch.nn.ModuleList, name: str) -> Forward:
    """One layer-wise checkpointed forward under torch.compile (one graph per step)."""
    backend = name[name.index("compiled (") + len("compiled ("):-1]
    kwargs: Dict[str, Any] = {}
    if name.startswith(("no checkpoint", REMAT)):
        layer: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] = (
            (lambda block, x: block(x)) if name.startswith("no checkpoint")
            else (lambda block, x: remat_saving_projections(block)(x))
        )

        def forward_without_torch_checkpoint(x: torch.Tensor) -> torch.Tensor:
            for block in blocks:
                x = layer(block, x)
            return x

        return torch.compile(forward_without_torch_checkpoint, backend=backend, fullgraph=True)
    if name.startswith(f"torch SAC, {TITAN}"):

        def torch_titan_sac_context() -> Any:
            return torch_checkpoint.create_selective_checkpoint_contexts(decoder_model.torchtitan_policy())

        kwargs["context_fn"] = torch_titan_sac_context
    elif name.startswith(f"aliasguard SAC, {TITAN}"):
        from aliasguard.checkpoint import create_selective_checkpoint_contexts as aliasguard_contexts

        def aliasguard_titan_sac_context() -> Any:
            return aliasguard_contexts(decoder_model.torchtitan_policy(), ops=decoder_model.DISPATCHER_SAVE_LIST)

        kwargs["context_fn"] = aliasguard_titan_sac_context
    elif name.startswith("torch SAC"):
        kwargs["context_fn"] = functools.partial(torch_checkpoint.create_selective_checkpoint_contexts, SAVE_MATMULS)
    elif name.startswith("aliasguard SAC"):
        from aliasguard.checkpoint import create_selective_checkpoint_contexts

        kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts, SAVE_MATMULS)

    def forward(x: torch.Tensor) -> torch.Tensor:
        for block in blocks:
            x = torch_checkpoint.checkpoint(block, x, use_reentrant=False, **kwargs)
        return x

    return torch.compile(forward, backend=backend, fullgraph=True)


def saved_tensor_bytes(forward: Forward, x: torch.Tensor, params: List[torch.Tensor]) -> int:
    """Bytes of the distinct storages autograd saves for the backward (what a compiled graph keeps).

    For the compiled variants: a dispatch mode around a compiled call would
    change what is compiled, while saved-tensors hooks see what AOTAutograd's
    backward saves, for torch's SAC and aliasguard's alike.
    """
    storages: Dict[int, int] = {}
    excluded = {t.untyped_storage()._cdata for t in (x, *params)}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in excluded:
            storages[storage._cdata] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = forward(x).sum()
    loss.backward()
    return sum(storages.values())


class StorageTracker(TorchDispatchMode):
    """Remembers every storage an op returns; reports the bytes still alive.

    Not aliasguard.testing's: the stock workers must not import aliasguard.
    """

    __aliasguard_fixup__ = False  # read only when aliasguard is imported

    def __init__(self) -> None:
        super().__init__()
        self.storages: Dict[int, Tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                known = self.storages.get(storage._cdata)
                if known is None or known[0].expired():
                    self.storages[storage._cdata] = (StorageWeakRef(storage), storage.nbytes())
        return out


def saved_activation_bytes(forward: Forward, x: torch.Tensor, params: List[torch.Tensor]) -> int:
    """Bytes of the storages made in the forward pass that are alive after it."""
    tracker = StorageTracker()
    with tracker:
        loss = forward(x).sum()
    # Views of parameters and of the input (a transposed weight) show their
    # storages; those are not activations.
    excluded = {t.untyped_storage()._cdata for t in (loss, x, *params)}
    live = sum(n for key, (ref, n) in tracker.storages.items() if not ref.expired() and key not in excluded)
    loss.backward()
    return live


def time_step(forward: Forward, x: torch.Tensor, blocks: torch.nn.Module) -> Tuple[float, float]:
    """(wall, CPU) seconds of one forward + backward."""
    blocks.zero_grad(set_to_none=True)
    x.grad = None
    start_wall, start_cpu = time.perf_counter(), time.thread_time()
    forward(x).sum().backward()  # CPU autograd runs on this thread
    return time.perf_counter() - start_wall, time.thread_time() - start_cpu


def worker(kind: str, label: str, repeats: int, warmup: int, grads_file: str) -> Dict[str, Any]:
    """Measures the variants of one kind in this process; returns samples and bytes."""
    torch.set_num_threads(1)
    compiled = label.startswith("compiled ")
    names = variant_names(label, kind)
    size = label.removeprefix("compiled ")
    batch, seq, dim, heads, ffn = SIZES[size]
    torch.manual_seed(0)
    block_type = decoder_model.Block if size == "decoder" else Block
    blocks = torch.nn.ModuleList(block_type(dim, heads, ffn) for _ in range(LAYERS))
    x = torch.randn(batch, seq, dim, requires_grad=True)
    params = list(blocks.parameters())
    variants = make_variants(blocks, names)

    grads: Dict[str, List[torch.Tensor]] = {}
    for name, forward in variants.items():
        blocks.zero_grad(set_to_none=True)
        x.grad = None
        forward(x).sum().backward()
        grads[name] = [x.grad.clone()] + [p.grad.clone() for p in params]
    torch.save(grads, grads_file)

    measure_saved = saved_tensor_bytes if compiled else saved_activation_bytes
    saved = {name: measure_saved(forward, x, params) for name, forward in variants.items()}
    for _ in range(warmup):
        for forward in variants.values():
            time_step(forward, x, blocks)
    wall: Dict[str, List[float]] = {name: [] for name in variants}
    cpu: Dict[str, List[float]] = {name: [] for name in variants}
    order = list(variants)
    for repeat in range(repeats):
        # Interleaved, and rotated so no variant always follows the same one.
        shift = repeat % len(order)
        for name in order[shift:] + order[:shift]:
            step_wall, step_cpu = time_step(variants[name], x, blocks)
            wall[name].append(step_wall)
            cpu[name].append(step_cpu)
    return {
        "torch": torch.__version__,
        "aliasguard_imported": "aliasguard" in sys.modules,
        "wall": wall,
        "cpu": cpu,
        "saved": saved,
    }


def run_worker(kind: str, label: str, repeats: int, warmup: int, grads_file: str) -> Dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--size", label,
               "--repeats", str(repeats), "--warmup", str(warmup), "--grads-file", grads_file]
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["aliasguard_imported"] != (kind == "ours"):
        raise AssertionError(f"{kind} worker: aliasguard imported = {result['aliasguard_imported']}")
    return result


Samples = Dict[str, List[float]]


def measure(label: str, repeats: int, warmup: int, rounds: int) -> Tuple[Samples, Samples, Dict[str, int], str]:
    names = variant_names(label, "stock") + variant_names(label, "ours")
    wall: Dict[str, List[float]] = {name: [] for name in names}
    cpu: Dict[str, List[float]] = {name: [] for name in names}
    saved: Dict[str, int] = {}
    version = ""
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(rounds):
            kinds = ("stock", "ours") if round_index % 2 == 0 else ("ours", "stock")
            for kind in kinds:
                grads_file = os.path.join(tmp, f"{kind}.pt")
                result = run_worker(kind, label, repeats, warmup, grads_file)
                version = result["torch"]
                for name in result["wall"]:
                    wall[name] += result["wall"][name]
                    cpu[name] += result["cpu"][name]
                    saved[name] = result["saved"][name]
            # Same gradients from every variant, or the timings mean nothing:
            # bitwise in eager mode (every variant runs the same kernels);
            # compiled graphs may fuse, so there within float32 tolerance of
            # a compiled reference.
            grads = {**torch.load(os.path.join(tmp, "stock.pt")), **torch.load(os.path.join(tmp, "ours.pt"))}
            compiled = label.startswith("compiled ")
            reference = grads[reference_variant(label)]
            for name, got in grads.items():
                same = (
                    all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, reference))
                    if compiled
                    else all(torch.equal(a, b) for a, b in zip(got, reference))
                )
                if not same:
                    raise AssertionError(f"{name}: gradients differ from the reference run")
    return wall, cpu, saved, version


def table_bases(label: str, name: str) -> Tuple[str, str, Optional[str], Optional[str]]:
    """For one row: (its torch SAC, the plain checkpoint, their in-process copies or None) to divide by.

    Each SAC row's base is torch's SAC with the same policy (and backend).
    """
    if label == "compiled decoder":
        return f"torch SAC, {TITAN}, compiled (inductor)", "plain checkpoint, compiled (inductor)", None, (
            "plain checkpoint, compiled (inductor)" + IN_PROCESS
        )
    if label.startswith("compiled "):
        base = "torch SAC, compiled (aot_eager)"
        if name.startswith(("aliasguard SAC, compiled", "torch SAC, compiled")):
            base = "torch SAC, compiled " + name[name.index("("):]
        return base, "plain checkpoint, compiled (aot_eager)", None, (
            "plain checkpoint, compiled (aot_eager)" + IN_PROCESS
        )
    if label == "decoder":
        base = f"torch SAC, {TITAN}"
    else:
        base = "torch SAC, policy fn" if "policy fn" in name else "torch SAC"
    return base, "plain checkpoint", base + IN_PROCESS, "plain checkpoint" + IN_PROCESS


def print_table(label: str, wall: Samples, cpu: Samples, saved: Dict[str, int]) -> None:
    names = [name for name in variant_names(label, "stock") + variant_names(label, "ours") if wall.get(name)]
    ours = variant_names(label, "ours")
    print(
        "| variant | wall (ms) | IQR / median | wall / torch SAC | wall / plain ckpt "
        "| wall / in-process torch SAC | wall / in-process plain ckpt | CPU (ms) | CPU / torch SAC "
        "| saved (KiB) | bytes / torch SAC |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    med_wall = {name: statistics.median(s) for name, s in wall.items() if s}
    med_cpu = {name: statistics.median(s) for name, s in cpu.items() if s}
    for name in names:
        quartiles = statistics.quantiles(wall[name], n=4) if len(wall[name]) > 1 else [med_wall[name]] * 3
        spread = (quartiles[2] - quartiles[0]) / med_wall[name]
        own_base, plain, in_process_base, in_process_plain = table_bases(label, name)
        in_process = "| | "
        if name in ours:
            in_process = (
                (f"| {med_wall[name] / med_wall[in_process_base]:.3f}x " if in_process_base else "| ")
                + f"| {med_wall[name] / med_wall[in_process_plain]:.3f}x "
            )
        print(
            f"| {name} | {med_wall[name] * 1e3:.2f} | {spread:.1%} | {med_wall[name] / med_wall[own_base]:.3f}x "
            f"| {med_wall[name] / med_wall[plain]:.3f}x {in_process}"
            f"| {med_cpu[name] * 1e3:.2f} | {med_cpu[name] / med_cpu[own_base]:.3f}x "
            f"| {saved[name] / 2**10:.1f} | {saved[name] / saved[own_base]:.3f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="steps per variant per worker (x5 dispatch-bound)")
    parser.add_argument("--rounds", type=int, default=4, help="worker processes of each kind per size")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--sizes", nargs="+", choices=tuple(SIZES), default=["kernel-bound", "dispatch-bound"],
        help="which models: the two transformer sizes (the default), and/or decoder (torchtitan's policy)",
    )
    parser.add_argument(
        "--compiled", action="store_true",
        help="also under torch.compile: the dispatch-bound transformer (aot_eager, inductor) and the decoder "
        "(inductor), for those chosen (the dispatch-bound one if neither is)",
    )
    parser.add_argument("--worker", choices=("stock", "ours"), help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    parser.add_argument("--grads-file", help=argparse.SUPPRESS)
    options = parser.parse_args()

    if options.worker:
        print(json.dumps(worker(options.worker, options.size, options.repeats, options.warmup, options.grads_file)))
        return

    labels = list(options.sizes)
    if options.compiled:
        compiled_sizes = [size for size in COMPILED_SIZES if size in options.sizes] or ["dispatch-bound"]
        labels += [f"compiled {size}" for size in compiled_sizes]
    if "decoder" in options.sizes and not has_torch_remat():
        print(f"note: {REMAT} is not installed; its variants are skipped (pip install torch-remat to add them)\n")
    headers_done = set()
    for label in labels:
        size = label.removeprefix("compiled ")
        batch, seq, dim, heads, ffn = SIZES[size]
        repeats = options.repeats * (5 if label.endswith("dispatch-bound") else 1)
        wall, cpu, saved, version = measure(label, repeats, options.warmup, options.rounds)
        if size == "decoder" and "decoder" not in headers_done:
            headers_done.add("decoder")
            print(
                f"\n{LAYERS}-block llama-style decoder (RMSNorm, causal SDPA, SwiGLU, bias-free linears), "
                f"CPU float32, 1 thread, torch {version}; median of fwd+bwd steps over alternating worker "
                "processes (baselines without aliasguard imported); SAC policy: torchtitan's (its save list, "
                f"every second mm recomputed), aliasguard's given ops= its {len(decoder_model.DISPATCHER_SAVE_LIST)} "
                "dispatcher ops; torch_remat saves the same projections (wq, wv, w1, w2) as regions; ratios "
                "are to torch's SAC with that policy"
            )
        elif size != "decoder" and "transformer" not in headers_done:
            headers_done.add("transformer")
            print(
                f"{LAYERS}-layer pre-norm transformer, CPU float32, 1 thread, torch {version}; "
                "median of fwd+bwd steps over alternating worker processes (baselines "
                "without aliasguard imported); SAC policy: save mm/addmm/bmm, recompute the rest "
                "(policy fn: the same, but every second addmm recomputed, torchtitan-style); each SAC "
                "row's ratios are to torch's SAC with the same policy"
            )
        samples = len(wall[table_bases(label, "")[0]])
        saved_kind = (
            "saved = distinct storages autograd saved (saved_tensors_hooks)"
            if label.startswith("compiled ")
            else "saved = forward storages alive after the forward"
        )
        print(
            f"\n{label}: batch {batch}, seq {seq}, dim {dim}, heads {heads}, ffn {ffn}; "
            f"{samples} steps per variant in {options.rounds} processes of each kind; {saved_kind}\n"
        )
        print_table(label, wall, cpu, saved)


if __name__ == "__main__":
    main()
