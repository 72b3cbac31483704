"""aliasguard.checkpoint across processes.

Each test starts two processes (torch.distributed, gloo, 127.0.0.1, a free
port) that train a small transformer-like model with aliasguard.checkpoint on
every block, sharded with FSDP2 (``fully_shard``) or split with tensor
parallelism on DTensor, and compare the gradients with the same run without
checkpointing. A write to a cached tensor must raise CheckpointMutationError
on every rank without leaving the other one waiting in a collective. Every
wait is bounded: a hang fails the test instead of the suite.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Any, Callable, Dict, List

import pytest
import torch

TIMEOUT_S = 240
WORLD_SIZE = 2
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

distributed = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with gloo is not available",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(scenarios: str) -> List[Dict[str, Any]]:
    """Runs the comma-separated `scenarios` on WORLD_SIZE processes; returns each rank's report."""
    port = free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(WORLD_SIZE),
               OMP_NUM_THREADS="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    processes = [
        subprocess.Popen([sys.executable, os.path.abspath(__file__), scenarios], env=dict(env, RANK=str(rank)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in range(WORLD_SIZE)
    ]
    reports = []
    try:
        for rank, process in enumerate(processes):
            out, err = process.communicate(timeout=TIMEOUT_S)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            assert process.returncode == 0 and lines, f"rank {rank} failed (rc {process.returncode}):\n{err[-4000:]}"
            reports.append(json.loads(lines[-1]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return reports


SCENARIOS = ("fsdp2", "fsdp2_wrapper", "tensor_parallel", "mutation")


@pytest.fixture(scope="module")
def reports() -> Dict[str, List[Dict[str, Any]]]:
    """Every scenario, run once by one pair of processes (start-up is the cost)."""
    per_rank = run_ranks(",".join(SCENARIOS))
    return {scenario: [rank_report[scenario] for rank_report in per_rank] for scenario in SCENARIOS}


@distributed
def test_fsdp2_gradients_equal_uncheckpointed_run(reports):
    for report in reports["fsdp2"]:
        assert report["max_grad_diff"] < 1e-5 and report["num_grads"] > 0


@distributed
def test_fsdp2_with_checkpoint_wrapper_context_fn(reports):
    for report in reports["fsdp2_wrapper"]:
        assert report["max_grad_diff"] < 1e-5 and report["num_grads"] > 0


@distributed
def test_tensor_parallel_gradients_equal_uncheckpointed_run(reports):
    for report in reports["tensor_parallel"]:
        assert report["max_grad_diff"] < 1e-5 and report["num_grads"] > 0
        assert report["dtensor_grads"] > 0  # the parameters really were DTensors


@distributed
def test_mutation_of_cached_tensor_raises_on_every_rank_without_hanging(reports):
    for report in reports["mutation"]:
        assert report["error"] == "CheckpointMutationError"
        assert "of aten.addmm.default" in report["message"]
        assert report["barrier_after_error"] == "ok"


# ---------------------------------------------------------------------------
# The worker side: runs in each spawned process.


def _worker(scenarios: str) -> Dict[str, Any]:
    import datetime
    import functools

    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh

    from aliasguard.checkpoint import CheckpointMutationError, checkpoint, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    policy = [aten.mm.default, aten.addmm.default]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (WORLD_SIZE,))

    class Block(torch.nn.Module):
        def __init__(self, dim: int, mutate: bool = False) -> None:
            super().__init__()
            self.up = torch.nn.Linear(dim, 2 * dim)
            self.down = torch.nn.Linear(2 * dim, dim)
            self.mutate = mutate

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.up(x)
            if self.mutate:
                h.add_(1)  # writes the cached addmm output
            return x + self.down(F.gelu(h))

    class Checkpointed(torch.nn.Module):
        def __init__(self, block: torch.nn.Module) -> None:
            super().__init__()
            self.block = block

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.block, x, policy=policy)

    def model(wrap: Callable[[torch.nn.Module], torch.nn.Module], mutate: bool = False) -> torch.nn.Module:
        torch.manual_seed(0)  # same parameters on every rank and in every run
        return torch.nn.Sequential(*(wrap(Block(8, mutate)) for _ in range(3)))

    def data() -> torch.Tensor:
        torch.manual_seed(1 + rank)  # each rank its own batch
        return torch.randn(4, 8)

    def fsdp(module: torch.nn.Sequential) -> torch.nn.Module:
        from torch.distributed.fsdp import fully_shard

        for block in module:
            fully_shard(block, mesh=mesh)
        return fully_shard(module, mesh=mesh)

    def local_grads(module: torch.nn.Module) -> List[torch.Tensor]:
        grads = []
        for p in module.parameters():
            g = p.grad
            grads.append(g.to_local() if hasattr(g, "to_local") else g)
        return grads

    def compare(wrap: Callable[[torch.nn.Module], torch.nn.Module], shard: Callable[[Any], Any]) -> Dict[str, Any]:
        expected_model = shard(model(lambda b: b))
        expected_model(data()).sum().backward()
        actual_model = shard(model(wrap))
        actual_model(data()).sum().backward()
        expected, actual = local_grads(expected_model), local_grads(actual_model)
        diff = max(float((a - e).abs().max()) for a, e in zip(actual, expected))
        dtensors = sum(type(p.grad).__name__ == "DTensor" for p in actual_model.parameters())
        return {"max_grad_diff": diff, "num_grads": len(actual), "dtensor_grads": dtensors}

    def run(scenario: str) -> Dict[str, Any]:
        if scenario == "fsdp2":
            return compare(Checkpointed, fsdp)
        if scenario == "fsdp2_wrapper":
            context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
            return compare(lambda b: checkpoint_wrapper(b, context_fn=context_fn), fsdp)
        if scenario == "tensor_parallel":
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            def tp(module: torch.nn.Sequential) -> torch.nn.Module:
                for i in range(len(module)):
                    prefix = "block." if isinstance(module[i], Checkpointed) else ""
                    plan = {f"{prefix}up": ColwiseParallel(), f"{prefix}down": RowwiseParallel()}
                    parallelize_module(module[i], mesh, plan)
                return module

            return compare(Checkpointed, tp)
        if scenario == "mutation":
            sharded = fsdp(model(Checkpointed, mutate=True))
            report: Dict[str, Any] = {"error": None}
            try:
                sharded(data()).sum().backward()
            except CheckpointMutationError as error:
                report.update(error=type(error).__name__, message=str(error))
            # Both ranks must get here: the error came before any collective
            # could be left half done.
            work = dist.barrier(async_op=True)
            work.wait(timeout=datetime.timedelta(seconds=30))
            report["barrier_after_error"] = "ok"
            return report
        raise ValueError(scenario)

    try:
        return {scenario: run(scenario) for scenario in scenarios.split(",")}
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    print(json.dumps(_worker(sys.argv[1])), flush=True)
