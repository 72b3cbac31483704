"""F5 benchmark: selective checkpointing, aliasguard's vs torch's, in one process.

A 4-layer pre-norm transformer (CPU, float32), forward + backward, under:
no checkpoint, plain checkpoint (per layer), torch's selective checkpoint and
aliasguard's, both with the same policy (save the matmuls, recompute the
rest). Reports the median time over interleaved repeats and the bytes the
forward pass leaves alive for the backward pass, with ratios to torch's SAC.
Two sizes: one where the kernels dominate, and a tiny one where the time is
mostly dispatch, so the two modes' per-op overhead shows. One intra-op thread,
and both wall and CPU time of that thread: on a shared machine other
processes' load then swings the comparison far less.

    PYTHONPATH=. .venv/bin/python bench/bench_checkpoint.py [--repeats N]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as torch_checkpoint

import aliasguard
from aliasguard.testing import StorageTracker
from aliasguard.checkpoint import checkpoint as aliasguard_checkpoint

aten = torch.ops.aten
LAYERS = 4
# (batch, seq, dim, heads, ffn)
SIZES = {"kernel-bound": (8, 128, 256, 4, 1024), "dispatch-bound": (1, 8, 32, 2, 64)}
SAVE_MATMULS = [aten.mm.default, aten.addmm.default, aten.bmm.default]


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


def torch_sac_context() -> Any:
    return torch_checkpoint.create_selective_checkpoint_contexts(SAVE_MATMULS)


def make_variants(blocks: torch.nn.ModuleList) -> Dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    Forward = Callable[[torch.Tensor], torch.Tensor]

    def run(layer_fn: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]) -> Forward:
        def forward(x: torch.Tensor) -> torch.Tensor:
            for block in blocks:
                x = layer_fn(block, x)
            return x

        return forward

    return {
        "no checkpoint": run(lambda block, x: block(x)),
        "plain checkpoint": run(lambda block, x: torch_checkpoint.checkpoint(block, x, use_reentrant=False)),
        "torch 2.13 SAC": run(
            lambda block, x: torch_checkpoint.checkpoint(
                block, x, use_reentrant=False, context_fn=torch_sac_context
            )
        ),
        "aliasguard SAC": run(lambda block, x: aliasguard_checkpoint(block, x, policy=SAVE_MATMULS)),
    }


def saved_activation_bytes(
    forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, params: List[torch.Tensor]
) -> int:
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


def time_step(
    forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, blocks: torch.nn.Module
) -> Tuple[float, float]:
    """(wall, CPU) seconds of one forward + backward."""
    blocks.zero_grad(set_to_none=True)
    x.grad = None
    start_wall, start_cpu = time.perf_counter(), time.thread_time()
    forward(x).sum().backward()  # CPU autograd runs on this thread
    return time.perf_counter() - start_wall, time.thread_time() - start_cpu


def measure(
    sizes: Tuple[int, int, int, int, int], repeats: int, warmup: int
) -> Tuple[Dict[str, float], Dict[str, float], Dict[str, int]]:
    """Median wall and CPU seconds and saved-activation bytes of each variant."""
    batch, seq, dim, heads, ffn = sizes
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(Block(dim, heads, ffn) for _ in range(LAYERS))
    x = torch.randn(batch, seq, dim, requires_grad=True)
    params = list(blocks.parameters())
    variants = make_variants(blocks)

    # Same gradients from every variant, or the timings mean nothing.
    reference = None
    for name, forward in variants.items():
        blocks.zero_grad(set_to_none=True)
        x.grad = None
        forward(x).sum().backward()
        got = [x.grad.clone()] + [p.grad.clone() for p in params]
        if reference is None:
            reference = got
        elif not all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, reference)):
            raise AssertionError(f"{name}: gradients differ from the un-checkpointed run")

    saved = {name: saved_activation_bytes(forward, x, params) for name, forward in variants.items()}

    for _ in range(warmup):
        for forward in variants.values():
            time_step(forward, x, blocks)
    wall: Dict[str, List[float]] = {name: [] for name in variants}
    cpu: Dict[str, List[float]] = {name: [] for name in variants}
    names = list(variants)
    for repeat in range(repeats):
        # Interleaved, so drift hits all alike, and rotated, so no variant
        # always runs right after the same other one.
        shift = repeat % len(names)
        for name in names[shift:] + names[:shift]:
            step_wall, step_cpu = time_step(variants[name], x, blocks)
            wall[name].append(step_wall)
            cpu[name].append(step_cpu)
    return (
        {name: statistics.median(samples) for name, samples in wall.items()},
        {name: statistics.median(samples) for name, samples in cpu.items()},
        saved,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    options = parser.parse_args()

    torch.set_num_threads(1)
    print(
        f"{LAYERS}-layer pre-norm transformer, CPU float32, 1 thread, "
        f"torch {torch.__version__}, aliasguard {aliasguard.__version__}; median of "
        "interleaved fwd+bwd; SAC policy: save mm/addmm/bmm, recompute the rest"
    )
    base = "torch 2.13 SAC"
    for label, sizes in SIZES.items():
        repeats = options.repeats * (5 if label == "dispatch-bound" else 1)
        wall, cpu, saved = measure(sizes, repeats, options.warmup)
        batch, seq, dim, heads, ffn = sizes
        print(
            f"\n{label}: batch {batch}, seq {seq}, dim {dim}, heads {heads}, ffn {ffn}, "
            f"{repeats} repeats\n"
        )
        print(
            "| variant | wall (ms) | wall / torch SAC | CPU (ms) | CPU / torch SAC "
            "| saved activations (KiB) | bytes / torch SAC |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name in wall:
            print(
                f"| {name} | {wall[name] * 1e3:.2f} | {wall[name] / wall[base]:.3f}x "
                f"| {cpu[name] * 1e3:.2f} | {cpu[name] / cpu[base]:.3f}x "
                f"| {saved[name] / 2**10:.1f} | {saved[name] / saved[base]:.3f}x |"
            )


if __name__ == "__main__":
    main()
