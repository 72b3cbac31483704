"""Family ``opdb_tx``: op_db ops through a mode or a wrapper subclass, under a tracing or transform layer.

``opdb_tx/<transform>/<mode>/<op>``: the op's first sample (float32 CPU) with the
``pass`` mode (a pass-through ``TorchDispatchMode``), the ``saving`` mode (keeps
every output and a ``view_as`` of it, records what it sees inside
``__torch_dispatch__``), the ``datamode`` mode (answers view ops with
``func(args[0].data, ...)``), ``twotensor`` arguments or ``wrapper`` arguments
(the harness's ``_make_wrapper_subclass`` wrapper, which rewraps every output), under one of:

``fake``            ``FakeTensorMode``, inputs through ``from_tensor``; metadata, no values
``make_fx``         real tracing; the graph's code, then the graph run on fresh inputs
``functionalize``   ``make_fx`` of ``torch.func.functionalize``; the same
``grad`` / ``vjp``  ``torch.func`` over the floating arguments (ops that support autograd)
``vmap``            ``torch.func.vmap`` over a batch of two of the op's input
``compile_*``       ``torch.compile(backend=..., dynamic=False)``, one call (a subset of ops; inductor full
                    run only); the mode is active while the compiled function runs and is switched off
                    while it compiles (``ignore_compile_internals``), as torch.compile composes with modes

The modes are entered inside the traced or transformed function, so the graph
and the transform see what the mode does. Nothing in this module imports aliasguard.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from differential import observe as ob
from differential.scenarios import (NO_VALUES, CompileDataMode, CompilePassMode, CompileSavingMode, Context, DataMode,
                                    PassMode, SavingMode, Scenario, _graph_code, _plain_shapes, _wrap_args,
                                    backward_record, call, compiled, opdb, vjp_record)

TX_MODES = ("pass", "twotensor", "saving", "datamode", "wrapper")
WRAPPED = ("twotensor", "wrapper")  # modes that are argument subclasses, not dispatch modes
TX_TRANSFORMS = ("fake", "make_fx", "functionalize", "grad", "vjp", "vmap",
                 "compile_eager", "compile_aot_eager", "compile_inductor")

# torch.compile runs on a subset: views, multi-output ops, in-place ops and common compute ops,
# plus every op whose name hashes into one bucket of 8.
COMPILE_OPS = (
    "view", "reshape", "view_as", "transpose", "t", "permute", "movedim", "narrow", "select", "expand", "squeeze",
    "unsqueeze", "flatten", "diagonal", "as_strided", "unfold", "real", "__getitem__", "chunk", "split",
    "split_with_sizes", "tensor_split", "unbind", "unsafe_chunk", "unsafe_split", "topk", "sort",
    "max.reduction_with_dim", "min.reduction_with_dim", "aminmax", "var_mean", "std_mean", "linalg.eigh",
    "linalg.qr", "resize_", "resize_as_", "zero_", "index_put", "index_add", "scatter", "masked_fill",
    "sin", "add", "mul", "matmul", "addmm", "bmm", "sum", "mean", "softmax", "cumsum", "clone", "contiguous",
    "cat", "stack", "where", "gather", "index_select", "nn.functional.relu", "nn.functional.linear",
)
COMPILE_BUCKETS = 8
INDUCTOR_OPS = ("sin", "add", "matmul", "sum", "softmax", "view", "transpose", "narrow", "chunk", "unbind",
                "cat", "where", "index_select", "nn.functional.relu", "zero_")
INDUCTOR_MODES_ALL = ("sin", "view", "chunk", "zero_", "matmul")  # the other modes too; the rest: pass only


def _in_compile_subset(name: str) -> bool:
    return name in COMPILE_OPS or int(hashlib.sha1(name.encode()).hexdigest(), 16) % COMPILE_BUCKETS == 0


def _mode(mode: str, compiling: bool = False) -> Any:
    if mode == "pass":
        return CompilePassMode() if compiling else PassMode()
    if mode == "saving":
        return CompileSavingMode() if compiling else SavingMode()
    if mode == "datamode":
        return CompileDataMode() if compiling else DataMode()
    return contextlib.nullcontext()


def _inputs(op: Any, mode: str, requires_grad: bool) -> tuple[Any, Any, Any] | None:
    """The op's first sample as (input, args, kwargs), its floating tensors wrapped for twotensor and wrapper."""
    torch.manual_seed(0)
    sample = next(iter(op.sample_inputs("cpu", torch.float32, requires_grad=requires_grad)), None)
    if sample is None:
        return None
    obj = (sample.input, sample.args, sample.kwargs)
    return _wrap_args(obj, mode) if mode in WRAPPED else obj


def _saving_record(m: Any, pool: dict[int, str]) -> dict:
    """What a SavingMode saw inside __torch_dispatch__ and what it kept (the opdb family's keys)."""
    saved = [(f"saved{i}", t) for i, t in enumerate(m.saved) if isinstance(t, torch.Tensor)]
    pool.update({id(t): n for n, t in saved})
    return {"inside": m.calls, "saved": ob.tensors(saved, pool, with_value=False), "saved_ops": m.saved_ops}


def _float_leaves(obj: Any) -> list[int]:
    """Positions, in tree_flatten(obj), of the floating-point tensors: what torch.func differentiates."""
    leaves, _ = tree_flatten(obj)
    return [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.is_floating_point()]


def _replace(obj: Any, positions: list[int], values: Any) -> Any:
    leaves, spec = tree_flatten(obj)
    leaves = list(leaves)
    for i, v in zip(positions, values):
        leaves[i] = v
    return tree_unflatten(leaves, spec)


def _floating(outs: Any) -> list[torch.Tensor]:
    return [t for t in ob.flat_tensors(outs) if t.is_floating_point()]


def run_fake(ctx: Context, op: Any, mode: str) -> dict:
    from torch._subclasses.fake_tensor import FakeTensorMode

    obj = _inputs(op, mode, op.supports_autograd)
    if obj is None:
        return {"skipped": "no sample"}
    with FakeTensorMode() as fm:
        fake, err = call(lambda: tree_map(lambda x: fm.from_tensor(x) if isinstance(x, torch.Tensor) else x, obj))
        if err is not None:
            return {"from_tensor": err}
        inp, args, kwargs = fake
        leaves = ob.named("arg", fake)
        pool = {id(t): n for n, t in leaves}
        m = _mode(mode)
        with m:
            out, err = call(lambda: op(inp, *args, **kwargs))
        if err is not None:
            return {"call": err, "args": ob.tensors(leaves, pool, with_value=False)}
        outs = ob.named("out", out)
        ctx.perturb([t for _, t in outs])
        pool.update({id(t): n for n, t in outs})
        rec: dict[str, Any] = {"out_nontensor": ob.non_tensor(out), "outs": ob.tensors(outs, pool, with_value=False),
                               "args": ob.tensors(leaves, pool, with_value=False)}
        if isinstance(m, SavingMode):
            rec.update(_saving_record(m, pool))
        rec["backward"] = backward_record([t for _, t in outs], leaves)
    return rec


def run_make_fx(ctx: Context, op: Any, mode: str, functionalize: bool) -> dict:
    from torch.fx.experimental.proxy_tensor import make_fx

    obj = _inputs(op, mode, False)
    if obj is None:
        return {"skipped": "no sample"}
    flat, spec = tree_flatten(obj)
    pos = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
    seen: dict[str, Any] = {}

    def f(*ts: torch.Tensor) -> Any:
        inp, args, kwargs = _replace(obj, pos, ts)
        m = _mode(mode)
        with m:
            out = op(inp, *args, **kwargs)
        seen["out"], seen["mode"] = out, m
        return out

    g = torch.func.functionalize(f) if functionalize else f
    tensors = [flat[i] for i in pos]
    torch.manual_seed(1)
    gm, err = call(lambda: make_fx(g, tracing_mode="real")(*tensors))
    if err is not None:
        return {"trace": err}
    with_values = not NO_VALUES.search(op.name)
    rec: dict[str, Any] = {"code": _graph_code(gm)}
    pool = {id(t): f"arg{i}" for i, t in enumerate(tensors)}
    traced = ob.named("out", seen.get("out"))
    pool.update({id(t): n for n, t in traced})
    rec["traced_outs"] = ob.tensors(traced, pool, with_value=False)
    if isinstance(seen.get("mode"), SavingMode):
        rec.update(_saving_record(seen["mode"], pool))
    # the graph on fresh inputs (tracing ran the op on the first ones: in-place ops wrote them)
    fresh = _inputs(op, mode, False)
    assert fresh is not None
    fresh_t = [x for x in tree_flatten(fresh)[0] if isinstance(x, torch.Tensor)]
    torch.manual_seed(1)
    out, err = call(lambda: gm(*fresh_t))
    if err is not None:
        rec["run"] = err
        return rec
    outs = ob.named("out", out)
    ctx.perturb([t for _, t in outs])
    leaves = [(f"arg{i}", t) for i, t in enumerate(fresh_t)]
    pool = {id(t): n for n, t in leaves + outs}
    rec["outs"] = ob.tensors(outs, pool, with_values)
    rec["args"] = ob.tensors(leaves, pool, with_values)
    if mode == "wrapper":
        rec["plain_shapes"] = _plain_shapes(op, 0)  # what the outputs look like on plain tensors
    return rec


def _plain_reference(op: Any, transform: str) -> dict:
    """The same torch.func transform on plain tensors, reduced to what a wrapper's record is checked against:
    output shapes, gradient shapes and strides, the exception of a step."""
    rec = run_func(Context("stock", None, ""), op, "plain", transform)
    ref: dict[str, Any] = {k: v["exc"] for k, v in rec.items() if isinstance(v, dict) and "exc" in v}
    for key in ("outs", "grads"):
        if isinstance(rec.get(key), dict):
            ref[key] = {n: {"shape": t["shape"], "stride": t.get("stride")} for n, t in rec[key].items()}
    return ref


def run_func(ctx: Context, op: Any, mode: str, transform: str) -> dict:
    """torch.func.grad / vjp over every floating argument, or vmap over a batch of two inputs.

    With ``wrapper`` arguments the record also holds the transform's result on plain tensors (``plain``)."""
    rec = _run_func(ctx, op, mode, transform)
    if mode == "wrapper" and "skipped" not in rec:
        rec["plain"] = _plain_reference(op, transform)
    return rec


def _run_func(ctx: Context, op: Any, mode: str, transform: str) -> dict:
    obj = _inputs(op, mode, False)
    if obj is None:
        return {"skipped": "no sample"}
    with_values = not NO_VALUES.search(op.name)

    def apply(o: Any) -> Any:
        inp, args, kwargs = o
        with _mode(mode):
            return op(inp, *args, **kwargs)

    torch.manual_seed(1)
    if transform == "vmap":
        x = obj[0]
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return {"skipped": "the input is not a floating-point tensor"}
        batch, err = call(lambda: torch.stack([x, x]))
        if err is not None:
            return {"batch": err}
        out, err = call(lambda: torch.func.vmap(lambda xi: apply((xi, obj[1], obj[2])))(batch))
        if err is not None:
            return {"call": err}
        outs = ob.named("out", out)
        ctx.perturb([t for _, t in outs])
        return {"out_nontensor": ob.non_tensor(out), "outs": ob.tensors(outs, {}, with_values)}
    pos = _float_leaves(obj)
    if not pos:
        return {"skipped": "no floating-point argument"}
    primals = [tree_flatten(obj)[0][i] for i in pos]
    if transform == "grad":
        def loss(ps: list[torch.Tensor]) -> tuple[torch.Tensor, Any]:
            out = apply(_replace(obj, pos, ps))
            fl = _floating(out)
            total = sum((t.sum() for t in fl), torch.zeros(()))
            return total, out

        res, err = call(lambda: torch.func.grad(loss, has_aux=True)(primals))
        if err is not None:
            return {"call": err}
        grads, out = res
        outs = ob.named("out", out)
        gr = ob.named("grad", grads)
        ctx.perturb([t for _, t in gr])
        return {"grads": ob.tensors(gr, {}, with_values), "outs": ob.tensors(outs, {}, with_values)}
    assert transform == "vjp"

    def fwd(ps: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return tuple(_floating(apply(_replace(obj, pos, ps))))

    res, err = call(lambda: torch.func.vjp(fwd, primals))
    if err is not None:
        return {"call": err}
    out, vjp_fn = res
    if not out:
        return {"skipped": "no floating-point output"}
    return vjp_record(ctx, out, vjp_fn, with_values)


def run_compile(ctx: Context, op: Any, mode: str, backend: str) -> dict:
    obj = _inputs(op, mode, op.supports_autograd)
    if obj is None:
        return {"skipped": "no sample"}
    m = _mode(mode, compiling=True)

    def fn(inp: Any, args: Any, kwargs: Any) -> Any:
        return op(inp, *args, **kwargs)

    torch.manual_seed(1)
    rec = compiled(ctx, fn, [obj], backend, dynamic=False, around=lambda: m,
                   with_values=not NO_VALUES.search(op.name))
    if isinstance(m, SavingMode):
        rec.update(_saving_record(m, {}))
    if mode == "wrapper":
        rec["plain_shapes"] = _plain_shapes(op, 0)
    return rec


def run_opdb_tx(ctx: Context, opname: str, transform: str, mode: str) -> dict:
    op = opdb()[opname]
    if transform == "fake":
        return run_fake(ctx, op, mode)
    if transform in ("make_fx", "functionalize"):
        return run_make_fx(ctx, op, mode, functionalize=transform == "functionalize")
    if transform in ("grad", "vjp", "vmap"):
        return run_func(ctx, op, mode, transform)
    if transform.startswith("compile_"):
        return run_compile(ctx, op, mode, transform[len("compile_"):])
    raise ValueError(transform)


def _applies(transform: str, mode: str, name: str, op: Any) -> bool:
    if transform in ("grad", "vjp"):
        return bool(op.supports_autograd)
    if transform in ("compile_eager", "compile_aot_eager"):
        return _in_compile_subset(name)
    if transform == "compile_inductor":
        return name in INDUCTOR_OPS and (mode == "pass" or name in INDUCTOR_MODES_ALL)
    return True


def opdb_tx_scenarios() -> list[Scenario]:
    out = []
    timeouts: dict[str, float] = {"compile_eager": 120, "compile_aot_eager": 120, "compile_inductor": 600}
    run: Callable[..., dict] = run_opdb_tx
    for name, op in opdb().items():
        for transform in TX_TRANSFORMS:
            for mode in TX_MODES:
                if not _applies(transform, mode, name, op):
                    continue
                out.append(Scenario(f"opdb_tx/{transform}/{mode}/{name}", "opdb_tx",
                                    lambda ctx, n=name, t=transform, m=mode: run(ctx, n, t, m),
                                    full_only=transform == "compile_inductor",
                                    timeout=timeouts.get(transform, 60.0)))
    return out
