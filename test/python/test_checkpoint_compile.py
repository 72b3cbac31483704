"""aliasguard.checkpoint under torch.compile.

Under AOTAutograd tracing the policy becomes a tag on each traced node that
the partitioner honours (see Note [SAC under torch.compile] in
aliasguard/checkpoint.py). These tests compile with ``fullgraph=True`` and
count what the partitioned forward graph saves for the backward graph: it
must be what torch's own SAC saves for the same policy, and different from
plain checkpointing, with gradients equal to eager.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint
from torch.utils.checkpoint import CheckpointPolicy

from aliasguard.checkpoint import checkpoint, create_selective_checkpoint_contexts

aten = torch.ops.aten
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def block(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    h = torch.mm(x, w1).relu()
    h = torch.mm(h, w2).sin()
    return torch.mm(h, w1.t()).cos()


def save_mm(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op is aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE


def inputs() -> Tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(8, 8, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))


VARIANTS: Dict[str, Callable[..., torch.Tensor]] = {
    "torch SAC": lambda *a: torch_checkpoint.checkpoint(
        block, *a, use_reentrant=False,
        context_fn=functools.partial(torch_checkpoint.create_selective_checkpoint_contexts, [aten.mm.default]),
    ),
    "plain checkpoint": lambda *a: torch_checkpoint.checkpoint(block, *a, use_reentrant=False),
    "aliasguard list": lambda *a: checkpoint(block, *a, policy=[aten.mm.default]),
    "aliasguard function": lambda *a: checkpoint(block, *a, policy=save_mm),
    "aliasguard context_fn": lambda *a: torch_checkpoint.checkpoint(
        block, *a, use_reentrant=False,
        context_fn=functools.partial(create_selective_checkpoint_contexts, [aten.mm.default]),
    ),
}


def partitioned(run: Callable[..., torch.Tensor]) -> Tuple[Dict[str, int], Tuple[torch.Tensor, ...]]:
    """Compiles ``run`` with aot_eager's partitioner; counts what the forward graph saves."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    counts: Dict[str, int] = {}

    def forward_compiler(gm: torch.fx.GraphModule, example_inputs: List[Any]) -> Any:
        (output_node,) = [n for n in gm.graph.nodes if n.op == "output"]
        # The forward graph returns the user's output, then what it saves.
        counts["saved"] = len(output_node.args[0]) - 1
        counts["forward mm"] = sum(n.target is aten.mm.default for n in gm.graph.nodes)
        return make_boxed_func(gm.forward)

    def backward_compiler(gm: torch.fx.GraphModule, example_inputs: List[Any]) -> Any:
        counts["backward mm"] = sum(n.target is aten.mm.default for n in gm.graph.nodes)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(
        fw_compiler=forward_compiler,
        bw_compiler=backward_compiler,
        partition_fn=min_cut_rematerialization_partition,
    )
    torch._dynamo.reset()
    args = inputs()
    compiled = torch.compile(run, backend=backend, fullgraph=True)
    got = torch.autograd.grad(compiled(*args).sum(), args)
    return counts, got


def eager_grads() -> Tuple[torch.Tensor, ...]:
    args = inputs()
    return torch.autograd.grad(block(*args).sum(), args)


def test_compiled_graph_saves_what_torch_sac_saves():
    results = {name: partitioned(run) for name, run in VARIANTS.items()}
    expected = eager_grads()
    for name, (_, got) in results.items():
        for a, e in zip(got, expected):
            torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12, msg=name)
    theirs = results["torch SAC"][0]
    for name in ("aliasguard list", "aliasguard function", "aliasguard context_fn"):
        assert results[name][0] == theirs, name
    # The policy is honoured: the mm outputs are saved, so the backward graph
    # recomputes no forward mm, unlike plain checkpointing.
    plain = results["plain checkpoint"][0]
    assert theirs["backward mm"] < plain["backward mm"]
    assert theirs != plain


def test_inductor_fullgraph_gives_eager_gradients():
    torch._dynamo.reset()
    args = inputs()
    compiled = torch.compile(VARIANTS["aliasguard list"], backend="inductor", fullgraph=True)
    got = torch.autograd.grad(compiled(*args).sum(), args)
    for a, e in zip(got, eager_grads()):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


# --- the first selective checkpoint of a process is a compiled one ----------------
#
# aliasguard probes what the running torch's SAC does on its first selective
# checkpoint (aliasguard/_torch_sac_semantics.py). When that first call is
# inside torch.compile, AOTAutograd is tracing around the probe; it must still
# see eager torch. Only a fresh process can check this: any earlier checkpoint
# in the test process has cached the probe's answer.

FIRST_CALL_COMPILED = """
import sys

import torch
from torch.utils.checkpoint import CheckpointPolicy

import aliasguard
from aliasguard import _torch_sac_semantics as semantics
from aliasguard.checkpoint import checkpoint

aten = torch.ops.aten
backend = sys.argv[1]
assert semantics.policies_overridden_for_effects.cache_info().currsize == 0, "probed before the test"


def block(x, w1, w2):
    h = torch.mm(x, w1).relu()
    h = torch.mm(h, w2).sin()
    return torch.mm(h, w1.t()).cos()


def save_mm(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op is aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE


def inputs():
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(8, 8, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))


eager_args = inputs()
eager_out = block(*eager_args)
eager_grads = torch.autograd.grad(eager_out.sum(), eager_args)

for policy in ([aten.mm.default], save_mm):
    torch._dynamo.reset()
    args = inputs()
    compiled = torch.compile(lambda *a: checkpoint(block, *a, policy=policy), backend=backend, fullgraph=True)
    out = compiled(*args)
    grads = torch.autograd.grad(out.sum(), args)
    torch.testing.assert_close(out, eager_out, rtol=1e-10, atol=1e-12)
    for got, expected in zip(grads, eager_grads):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)

# The answer probed under tracing is the one an eager probe gives.
probed = semantics.policies_overridden_for_effects()
assert probed == semantics.policies_overridden_for_effects.__wrapped__(), probed
print("compiled first call OK", sorted(p.name for p in probed))
"""


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_first_checkpoint_of_the_process_under_compile(backend: str, tmp_path: Any) -> None:
    script = tmp_path / "first_call_compiled.py"
    script.write_text(FIRST_CALL_COMPILED)
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    result = subprocess.run(
        [sys.executable, str(script), backend], capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path)
    )
    assert result.returncode == 0, result.stderr[-6000:]
    assert "compiled first call OK" in result.stdout


@pytest.mark.parametrize("mode", ["fake", "functional"])
def test_effects_probe_sees_eager_torch_under_tracing_modes(mode: str) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    from aliasguard import _torch_sac_semantics as semantics

    eager = semantics.policies_overridden_for_effects.__wrapped__()
    with FakeTensorMode() if mode == "fake" else FunctionalTensorMode():
        traced = semantics.policies_overridden_for_effects.__wrapped__()
    assert traced == eager


# --- a policy's result is checked under compile as in eager mode -------------------


def test_numpy_bool_policy_under_compile_saves_what_the_enum_policy_saves():
    np = pytest.importorskip("numpy")

    def numpy_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        return np.bool_(op is aten.mm.default)

    counts, got = partitioned(lambda *a: checkpoint(block, *a, policy=numpy_policy))
    expected_counts, _ = partitioned(lambda *a: checkpoint(block, *a, policy=save_mm))
    assert counts == expected_counts
    for a, e in zip(got, eager_grads()):
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


def test_bad_policy_under_compile_names_the_op_and_the_value():
    def bad_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        return None

    with pytest.raises(Exception) as info:
        partitioned(lambda *a: checkpoint(block, *a, policy=bad_policy))
    # torch.compile wraps what the backend raised; the message is kept.
    assert (
        "CheckpointPolicyError: aliasguard.checkpoint: the policy function returned None (of type NoneType) "
        "for aten.mm.default" in str(info.value)
    )
