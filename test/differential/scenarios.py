"""The scenario registry: every scenario the harness can run, by family.

A scenario is a function ``fn(ctx) -> dict`` that builds its inputs from a fixed
seed, runs, and returns a JSON-able record of what it observed. Both workers
build the same registry; only the aliasguard worker has ``ctx.aliasguard``.
Nothing in this module imports aliasguard.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import socket
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from differential import observe as ob

FAMILIES = ("opdb", "opdb_tx", "njt", "dtensor", "dtensor_compile", "trace", "compile", "torchao",
            "checkpoint", "rewrite", "detach", "dispatcher", "nested")


@dataclass
class Scenario:
    id: str
    family: str
    fn: Callable[["Context"], dict]
    full_only: bool = False  # left out of samples (slow: inductor)
    timeout: float = 60.0


class Context:
    """What a scenario may know about its side."""

    def __init__(self, side: str, aliasguard_module: Any, scenario_id: str):
        self.side = side
        self.ag = aliasguard_module
        self.scenario_id = scenario_id
        self.inject = _injection(side, scenario_id)

    def audit(self) -> Any:
        """aliasguard.audit() on the aliasguard side; nothing on the stock side (it has no audit)."""
        return self.ag.audit() if self.ag is not None else contextlib.nullcontext()

    def perturb(self, outs: list[torch.Tensor]) -> None:
        """Self-test hook: make the aliasguard side differ on purpose (ALIASGUARD_DIFF_INJECT)."""
        if self.inject is None:
            return
        if self.inject == "raise":
            raise RuntimeError("injected difference")
        plain = [t for t in outs if type(t) is torch.Tensor and t.is_floating_point() and t.numel() > 0]
        if not plain:
            return
        with torch.no_grad():
            if self.inject == "value":
                plain[0].data.add_(1)  # through .data: the value changes, the version does not
            elif self.inject == "version":
                plain[0].add_(0)  # the version changes, the value does not


def _injection(side: str, scenario_id: str) -> str | None:
    # ALIASGUARD_DIFF_INJECT="<regex>=<value|version|raise|guard>[;...]", applied on the aliasguard side only
    # (guard: compiled() marks a dimension of the first input static, so dynamo guards on the mark).
    spec = os.environ.get("ALIASGUARD_DIFF_INJECT")
    if not spec or side != "aliasguard":
        return None
    for item in spec.split(";"):
        pattern, _, kind = item.rpartition("=")
        if pattern and re.search(pattern, scenario_id):
            return kind
    return None


# --- helpers shared by the families ----------------------------------------------------


def backward_record(outs: list[torch.Tensor], leaves: list[tuple[str, torch.Tensor]]) -> Any:
    """Gradients of the sum of every floating output that requires grad, w.r.t. the leaves that do."""
    diff_outs = [o for o in outs if ob.safe(lambda o=o: o.requires_grad and o.is_floating_point()) is True]
    wrt = [(n, t) for n, t in leaves if t.requires_grad and t.is_leaf]
    if not diff_outs or not wrt:
        return {"skipped": "nothing differentiable"}
    try:
        loss = sum(o.sum() for o in diff_outs)
        grads = torch.autograd.grad(loss, [t for _, t in wrt], allow_unused=True)
    except Exception as e:
        return ob.exc_record(e)
    return {n: (None if g is None else {"type": type(g).__name__, "value": ob.safe(lambda g=g: ob.value(g))})
            for (n, _), g in zip(wrt, grads)}


def call(fn: Callable[[], Any]) -> tuple[Any, Any]:
    try:
        return fn(), None
    except Exception as e:
        return None, ob.exc_record(e)


# --- family 1: op_db through modes and wrapper subclasses -----------------------------


class PassMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _alias_of_self(func: Any) -> bool:
    rets = func._schema.returns
    info = rets[0].alias_info if rets else None
    return info is not None and not info.is_write


class DataMode(TorchDispatchMode):
    """Answers view ops on ``args[0].data`` (a pattern found in real modes)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _alias_of_self(func) and args and isinstance(args[0], torch.Tensor):
            return func(args[0].data, *args[1:], **kwargs)
        return func(*args, **kwargs)


class SavingMode(TorchDispatchMode):
    """Keeps every output and a ``view_as`` of it, as selective checkpointing keeps activations.

    Records, inside ``__torch_dispatch__``, what each output looks like there."""

    MAX_CALLS = 12

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict] = []
        self.saved: list[torch.Tensor] = []
        self.saved_ops: list[str] = []  # the op whose output each saved entry is (or "view_as" of it)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        ins = ob.named("in", (args, kwargs))
        outs = ob.flat_tensors(out)
        pool = {id(t): n for n, t in ins}
        if len(self.calls) < self.MAX_CALLS:
            self.calls.append({
                "op": str(func),
                "view_op": any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns),
                "outs": [{k: ob.tensor(o, pool, with_value=False)[k] for k in ("is_view", "base", "version")}
                         for o in outs],
                "in_versions": [ob.safe(lambda t=t: t._version) for _, t in ins],
            })
        for o in outs:
            if len(self.saved) < 16:
                self.saved.append(o)
                self.saved.append(ob.safe(lambda o=o: o.view_as(o)))
                self.saved_ops += [str(func), "view_as"]
        return out


class CompilePassMode(PassMode):
    """PassMode for torch.compile: off while dynamo compiles, on while the compiled code runs.

    (A mode that does not ignore compile internals makes dynamo skip every frame.)"""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


class CompileSavingMode(SavingMode):
    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


class CompileDataMode(DataMode):
    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


class Wrapper(torch.Tensor):
    """A minimal wrapper subclass, written the way many are: rewrap every output, ignore aliasing."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor, requires_grad: bool = False):
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, device=elem.device, requires_grad=requires_grad)

    def __init__(self, elem: torch.Tensor, requires_grad: bool = False):
        self.elem = elem

    def __repr__(self) -> str:
        return f"Wrapper({self.elem!r})"

    def __tensor_flatten__(self):
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return Wrapper(inner["elem"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(x):
            return x.elem if isinstance(x, Wrapper) else x

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda x: Wrapper(x) if type(x) is torch.Tensor else x, out)


def _wrap_args(obj: Any, how: str) -> Any:
    from torch.testing._internal.two_tensor import TwoTensor

    def conv(x):
        if type(x) is not torch.Tensor or not x.is_floating_point() or x.layout != torch.strided:
            return x
        a = x.detach()
        if how == "twotensor":
            w = TwoTensor(a, a.clone())
        else:
            w = Wrapper(a)
        return w.requires_grad_(x.requires_grad) if x.is_leaf else w

    return tree_map(conv, obj)


_OPDB: dict[str, Any] | None = None


def opdb() -> dict[str, Any]:
    global _OPDB
    if _OPDB is None:
        import torch.testing._internal.common_utils as common_utils
        import torch.testing._internal.opinfo.core as opinfo_core
        from torch.testing._internal.common_methods_invocations import op_db

        # sample_inputs() looks for the running unittest.TestCase with inspect.stack(), which resolves every
        # frame's module; a worker started with -m has frozen runpy frames that never resolve, so each call
        # scanned sys.modules again (most of a make_fx scenario's time). No TestCase runs here: the answer
        # is None either way.
        common_utils.extract_test_fn = opinfo_core.extract_test_fn = lambda: None
        _OPDB = {}
        for op in op_db:
            if torch.float32 not in op.dtypes:
                continue
            name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
            _OPDB[name] = op
    return _OPDB


# Ops whose outputs hold uninitialised memory or are otherwise not reproducible: compare metadata only.
NO_VALUES = re.compile(r"empty|new_empty|^nn\.functional\.dropout|^bernoulli|^multinomial|^normal|^uniform|"
                       r"^rand|^cauchy|^exponential|^geometric|^log_normal|^nn\.functional\.rrelu|"
                       r"^nn\.functional\.feature_alpha_dropout|^nn\.functional\.alpha_dropout")
OPDB_MODES = ("pass", "saving", "datamode", "twotensor", "wrapper")


def _sample(op: Any, index: int) -> Any:
    torch.manual_seed(0)
    samples = op.sample_inputs("cpu", torch.float32, requires_grad=op.supports_autograd)
    return next(itertools.islice(samples, index, None), None)


def _plain_shapes(op: Any, index: int) -> Any:
    """Output shapes of the op on plain tensors: what a wrapper's outputs should look like."""
    sample = _sample(op, index)
    torch.manual_seed(1)
    with torch.no_grad():
        out, err = call(lambda: op(sample.input, *sample.args, **sample.kwargs))
    return err or [list(t.shape) for t in ob.flat_tensors(out)]


def run_opdb(ctx: Context, opname: str, mode: str, index: int) -> dict:
    op = opdb()[opname]
    sample = _sample(op, index)
    if sample is None:
        return {"skipped": "no such sample"}
    inp, args, kwargs = sample.input, sample.args, sample.kwargs
    if mode in ("twotensor", "wrapper"):
        inp, args, kwargs = _wrap_args((inp, args, kwargs), mode)
    with_values = not NO_VALUES.search(opname)
    leaves = ob.named("arg", (inp, args, kwargs))
    pool = {id(t): n for n, t in leaves}
    rec: dict[str, Any] = {}
    m: Any = {"pass": PassMode, "saving": SavingMode, "datamode": DataMode}.get(mode, contextlib.nullcontext)()
    torch.manual_seed(1)
    with m:
        out, err = call(lambda: op(inp, *args, **kwargs))
    if err is not None:
        rec["call"] = err
        rec["args"] = ob.tensors(leaves, pool, with_values)
        return rec
    outs = ob.named("out", out)
    ctx.perturb([t for _, t in outs])
    pool.update({id(t): n for n, t in outs})
    rec["out_nontensor"] = ob.non_tensor(out)
    rec["outs"] = ob.tensors(outs, pool, with_values)
    rec["args"] = ob.tensors(leaves, pool, with_values)
    if isinstance(m, SavingMode):
        rec["inside"] = m.calls
        saved = [(f"saved{i}", t) for i, t in enumerate(m.saved) if isinstance(t, torch.Tensor)]
        pool.update({id(t): n for n, t in saved})
        rec["saved"] = ob.tensors(saved, pool, with_value=False)
        rec["saved_ops"] = m.saved_ops
        # The view kept of the first output: what does backward through it do?
        if len(saved) > 1:
            v = saved[1][1]
            wrt = [t for _, t in leaves if t.requires_grad and t.is_leaf]
            if wrt and v.is_floating_point():
                g, e = call(lambda: torch.autograd.grad(v.sum(), wrt, allow_unused=True, retain_graph=True))
                rec["saved_view_backward"] = e or [None if x is None else ob.safe(lambda x=x: ob.value(x)) for x in g]
    rec["backward"] = backward_record([t for _, t in outs], leaves)
    if mode in ("twotensor", "wrapper"):
        rec["plain_shapes"] = _plain_shapes(op, index)
    if isinstance(m, SavingMode):
        # Write each output (no autograd), then look at the saved tensors' versions again.
        for _, t in outs:
            with torch.no_grad():
                call(lambda t=t: t.add_(1) if t.is_floating_point() else None)
        rec["saved_versions_after_write"] = {n: ob.safe(lambda t=t: t._version) for n, t in saved}
    return rec


def opdb_scenarios() -> list[Scenario]:
    out = []
    for name in opdb():
        for mode in OPDB_MODES:
            indices = (0, 1) if mode == "pass" else (0,)
            for i in indices:
                out.append(Scenario(f"opdb/{mode}/{name}/{i}", "opdb",
                                    lambda ctx, name=name, mode=mode, i=i: run_opdb(ctx, name, mode, i)))
    return out


# --- compile helper --------------------------------------------------------------------


class _GuardRecorder:
    """The guards dynamo installs, one sorted list per compiled frame, from torch's ``guards`` log artifact.

    Each compiled frame logs ``GUARDS:``, then its guard tree, one guard per line (``| +- TENSOR_MATCH:
    check_tensor(...)``). The source comments are dropped and what differs between processes by
    construction (object and type ids, addresses, dict version tags) is replaced by a placeholder, so that
    two processes compiling the same code record the same lines. Nothing is printed while recording."""

    NAME = "torch._dynamo.guards.__guards"
    _COMMENT = re.compile(r"\s+#\s.*$")
    _IDS = re.compile(r"0x[0-9a-fA-F]+|(?<![0-9])[0-9]{6,}(?![0-9])")
    _DICT_VERSION = re.compile(r"(___dict_version\([^)]*\)\s*==\s*)\d+")

    def __init__(self) -> None:
        self.frames: list[list[str]] = []

    def __enter__(self) -> "_GuardRecorder":
        import logging

        torch._logging.set_logs(guards=True)
        self._logger = logging.getLogger(self.NAME)
        self._saved = (self._logger.handlers[:], self._logger.propagate)
        recorder = self

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                recorder.add(record.getMessage())

        self._logger.handlers = [Handler(logging.DEBUG)]
        self._logger.propagate = False
        return self

    def __exit__(self, *exc: Any) -> None:
        self._logger.handlers, self._logger.propagate = self._saved
        torch._logging.set_logs()

    def add(self, message: str) -> None:
        if message == "GUARDS:":
            self.frames.append([])
        elif self.frames and "TREE_GUARD_MANAGER:" in message:
            for line in message.splitlines():
                if "+- " in line:
                    part = self._COMMENT.sub("", line)
                    self.frames[-1].append(self._DICT_VERSION.sub(r"\1<n>", self._IDS.sub("<id>", part)))

    def record(self) -> list[list[str]]:
        return [sorted(set(frame)) for frame in self.frames]


def compiled(ctx: Context, fn: Callable, inputs: list[tuple], backend: str, grads: bool = True,
             dynamic: bool | None = None, around: Callable[[], Any] = contextlib.nullcontext,
             with_values: bool = True, extra: Callable[[Any], dict] | None = None) -> dict:
    """Run ``torch.compile(fn)`` on each input tuple; results, gradients, dynamo's counts and guards.

    ``around()`` is entered for each call (not for the backward), ``extra(out)`` adds to a call's record."""
    import torch._dynamo
    from torch._dynamo.backends.registry import lookup_backend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    graphs = [0]

    def counting(gm, example_inputs):
        graphs[0] += 1
        return lookup_backend(backend)(gm, example_inputs)

    cf = torch.compile(fn, backend=counting, dynamic=dynamic)
    rec: dict[str, Any] = {"calls": []}
    guards = _GuardRecorder()
    for args in inputs:
        leaves = ob.named("arg", args)
        pool = {id(t): n for n, t in leaves}
        if ctx.inject == "guard":  # one guard more (a dimension marked static), nothing else changed
            torch._dynamo.mark_static(next(t for _, t in leaves if t.dim() > 0), 0)

        def one(args: tuple = args) -> Any:
            with around(), guards:
                return cf(*args)

        out, err = call(one)
        c: dict[str, Any] = {}
        if err is not None:
            c["call"] = err
        else:
            outs = ob.named("out", out)
            ctx.perturb([t for _, t in outs])
            pool.update({id(t): n for n, t in outs})
            c["outs"] = ob.tensors(outs, pool, with_values)
            c["args"] = ob.tensors(leaves, pool, with_values)
            if extra is not None:
                c.update(extra(out))
            if grads:
                c["backward"] = backward_record([t for _, t in outs], leaves)
        c["graphs"] = graphs[0]
        rec["calls"].append(c)
    rec["graph_breaks"] = sum(counters["graph_break"].values())
    rec["unique_graphs"] = counters["stats"]["unique_graphs"]
    rec["frames_ok"] = counters["frames"]["ok"]
    rec["guards"] = guards.record()
    torch._dynamo.reset()
    return rec


# --- make_fx and torch.func helpers (a subclass's ops, NJT and DTensor) ---------------------


def traced(ctx: Context, fn: Callable, make_input: Callable[[], torch.Tensor], tracing_mode: str,
           functionalize: bool = False, extra: Callable[[Any], dict] | None = None) -> dict:
    """``make_fx(fn)`` (of ``torch.func.functionalize(fn)`` if asked) on ``make_input()``: the graph's code and the
    outputs seen while tracing (no values), then the graph run on a fresh input: outputs and the argument.

    ``extra(out)`` adds to the record of the graph's run (DTensor placements)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = make_input()
    seen: dict[str, Any] = {}

    def f(t: torch.Tensor) -> Any:
        out = fn(t)
        seen["out"] = out
        return out

    g = torch.func.functionalize(f) if functionalize else f
    gm, err = call(lambda: make_fx(g, tracing_mode=tracing_mode)(x))
    if err is not None:
        return {"trace": err}
    rec: dict[str, Any] = {"code": _graph_code(gm)}
    traced_outs = ob.named("out", seen.get("out"))
    pool = {id(x): "arg0"}
    pool.update({id(t): n for n, t in traced_outs})
    rec["traced_outs"] = ob.tensors(traced_outs, pool, with_value=False)
    fresh = make_input()
    out, err = call(lambda: gm(fresh))
    if err is not None:
        rec["run"] = err
        return rec
    outs = ob.named("out", out)
    ctx.perturb([t for _, t in outs])
    pool = {id(fresh): "arg0"}
    pool.update({id(t): n for n, t in outs})
    rec["outs"] = ob.tensors(outs, pool)
    rec["args"] = ob.tensors([("arg0", fresh)], pool)
    if extra is not None:
        rec.update(extra(out))
    return rec


def func_transform(ctx: Context, fn: Callable, x: torch.Tensor, transform: str,
                   extra: Callable[[Any], dict] | None = None) -> dict:
    """``torch.func.grad`` (of the sum of every floating output, outputs as aux) or ``torch.func.vjp`` (cotangents
    of ones) of ``fn`` at ``x``: gradients and outputs. An exception is recorded as the step's."""

    def floating(out: Any) -> list[torch.Tensor]:
        return [o for o in ob.flat_tensors(out) if o.is_floating_point()]

    if transform == "grad":
        def loss(t: torch.Tensor) -> tuple[Any, Any]:
            out = fn(t)
            return sum(o.sum() for o in floating(out)), out

        res, err = call(lambda: torch.func.grad(loss, has_aux=True)(x))
        if err is not None:
            return {"call": err}
        grads, out = res
        gr = ob.named("grad", grads)
        ctx.perturb([t for _, t in gr])
        rec = {"grads": ob.tensors(gr, {}), "outs": ob.tensors(ob.named("out", out), {})}
    elif transform == "vjp":
        res, err = call(lambda: torch.func.vjp(lambda t: tuple(floating(fn(t))), x))
        if err is not None:
            return {"call": err}
        out, vjp_fn = res
        rec = vjp_record(ctx, out, vjp_fn)
        if "vjp" in rec:
            return rec
    else:
        raise ValueError(transform)
    if extra is not None:
        rec.update(extra(out))
    return rec


def vjp_record(ctx: Context, out: tuple, vjp_fn: Callable, with_values: bool = True) -> dict:
    """The outputs of a torch.func.vjp and the gradients of all-ones cotangents (or the error they raise)."""
    rec: dict[str, Any] = {"outs": ob.tensors(ob.named("out", out), {}, with_values)}
    grads, err = call(lambda: vjp_fn(tuple(torch.ones_like(t) for t in out)))
    if err is not None:
        rec["vjp"] = err
        return rec
    gr = ob.named("grad", grads)
    ctx.perturb([t for _, t in gr])
    rec["grads"] = ob.tensors(gr, {}, with_values)
    return rec


# --- family 2: nested jagged tensors -----------------------------------------------------


def _njt(requires_grad: bool = True) -> torch.Tensor:
    torch.manual_seed(0)
    parts = [torch.randn(2, 3), torch.randn(4, 3)]
    return torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=requires_grad)


def _njt_inplace(t):
    y = t.clone()
    y.mul_(2)
    return y


NJT_OPS: dict[str, Callable] = {
    "sin": lambda t: t.sin(),
    "sin_mul2": lambda t: t.sin() * 2,
    "clone": lambda t: t.clone(),
    "narrow": lambda t: t.narrow(-1, 0, 2),
    "select": lambda t: t.select(0, 1),
    "unbind": lambda t: t.unbind(),
    "chunk": lambda t: t.chunk(2, dim=-1),
    "transpose": lambda t: t.transpose(1, 2),
    "matmul": lambda t: t @ torch.ones(3, 5),
    "sum": lambda t: t.sum(dim=-1),
    "detach": lambda t: t.detach(),
    "values": lambda t: t.values(),
    "inplace_mul": _njt_inplace,
}
NJT_VARIANTS = ("eager", "audit", "fake", "compile_eager", "compile_aot_eager",
                "make_fx", "make_fx_fake", "make_fx_symbolic", "functionalize", "functionalize_eager", "grad", "vjp",
                "compile_inductor")
# make_fx traces an NJT in symbolic mode only (real and fake raise on its nested int); make_fx of
# torch.func.functionalize raises in every mode, so functionalize_eager runs the functionalized function without
# make_fx. torch.func.grad / vjp over an NJT raise for most ops in stock: the exception type is what is compared.
NJT_TRACING = {"make_fx": ("real", False), "make_fx_fake": ("fake", False), "make_fx_symbolic": ("symbolic", False),
               "functionalize": ("symbolic", True)}
NJT_INDUCTOR_OPS = ("sin_mul2", "transpose", "inplace_mul")  # a fusion, a view, an in-place op; full run only
# The input is itself a view (a transposed NJT, as OpInfo's *_noncontig_transposed samples): meta conversion replays
# its view function on a fake base, through NJT's __torch_dispatch__.
# The same under torch.compile with inputs made by the views whose NJT body views its values along the batch's
# ragged dimension's neighbours (narrow, unsqueeze): guards are compared (njt-values-base-guard).
NJT_VIEW_INPUT_VARIANTS = ("fake_view_input", "compile_eager_view_input", "compile_aot_eager_view_input",
                           "compile_eager_narrow_input", "compile_aot_eager_narrow_input",
                           "compile_eager_unsqueeze_input", "compile_aot_eager_unsqueeze_input")
NJT_VIEW_INPUT_OPS = ("sin", "clone", "sin_mul2", "transpose", "sum")
NJT_INPUT_VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "_view_input": lambda t: t.transpose(1, 2),
    "_narrow_input": lambda t: t.narrow(2, 0, 2),
    "_unsqueeze_input": lambda t: t.unsqueeze(-1),
}


def run_njt(ctx: Context, opname: str, variant: str) -> dict:
    fn = NJT_OPS[opname]
    make = _njt
    for suffix, view in NJT_INPUT_VIEWS.items():
        if variant.endswith(suffix):
            make = lambda view=view: view(_njt())  # noqa: E731
            variant = variant[: -len(suffix)]
    if variant.startswith("compile_"):
        backend = variant[len("compile_"):]
        return compiled(ctx, fn, [(make(),), (make(),)], backend)
    if variant in NJT_TRACING:
        mode, functionalize = NJT_TRACING[variant]
        return traced(ctx, fn, lambda: _njt(requires_grad=False), mode, functionalize)
    if variant in ("grad", "vjp"):
        return func_transform(ctx, fn, _njt(requires_grad=False), variant)
    if variant == "functionalize_eager":
        nt = _njt(requires_grad=False)
        out, err = call(lambda: torch.func.functionalize(fn)(nt))
        if err is not None:
            return {"call": err}
        outs = ob.named("out", out)
        ctx.perturb([t for _, t in outs])
        pool = {id(nt): "arg0"}
        pool.update({id(t): n for n, t in outs})
        return {"outs": ob.tensors(outs, pool), "args": ob.tensors([("arg0", nt)], pool)}
    if variant == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        nt = make()
        with FakeTensorMode(shape_env=ShapeEnv()) as mode:
            fake, err = call(lambda: mode.from_tensor(nt))
            if err is not None:
                return {"from_tensor": err}
            out, err = call(lambda: fn(fake))
            if err is not None:
                return {"call": err}
            outs = ob.named("out", out)
            return {"outs": ob.tensors(outs, {id(fake): "arg0"}, with_value=False)}
    nt = _njt()
    leaves = [("arg0", nt)]
    pool = {id(nt): "arg0"}
    with ctx.audit() if variant == "audit" else contextlib.nullcontext():
        out, err = call(lambda: fn(nt))
        if err is not None:
            return {"call": err}
        outs = ob.named("out", out)
        ctx.perturb([t for _, t in outs])
        pool.update({id(t): n for n, t in outs})
        rec = {"outs": ob.tensors(outs, pool), "args": ob.tensors(leaves, pool)}
        rec["backward"] = backward_record([t for _, t in outs], leaves)
    return rec


def njt_scenarios() -> list[Scenario]:
    return [Scenario(f"njt/{v}/{op}", "njt", lambda ctx, op=op, v=v: run_njt(ctx, op, v),
                     full_only=(v == "compile_inductor"), timeout=600 if v == "compile_inductor" else 120)
            for op in NJT_OPS for v in NJT_VARIANTS if v != "compile_inductor" or op in NJT_INDUCTOR_OPS] + [
        Scenario(f"njt/{v}/{op}", "njt", lambda ctx, op=op, v=v: run_njt(ctx, op, v), timeout=120)
        for op in NJT_VIEW_INPUT_OPS for v in NJT_VIEW_INPUT_VARIANTS]


# --- family 3: DTensor on gloo, world size 1 ---------------------------------------------

_MESH: Any = None


def _mesh() -> Any:
    global _MESH
    if _MESH is None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
        _MESH = init_device_mesh("cpu", (1,))
    return _MESH


DTENSOR_OPS: dict[str, Callable] = {
    "chunk": lambda t: t.chunk(2),
    "split": lambda t: t.split(2),
    "unbind": lambda t: t.unbind(0),
    "sin": lambda t: t.sin(),
    "view": lambda t: t.view(-1),
    "transpose": lambda t: t.transpose(0, 1),
    "narrow": lambda t: t.narrow(1, 1, 3),
    "detach": lambda t: t.detach(),
    "matmul": lambda t: t @ t.t(),
    "sum": lambda t: t.sum(),
    "inplace_add": lambda t: t.clone().add_(1),
    "view_then_inplace": lambda t: _view_then_inplace(t),
}


def _view_then_inplace(t):
    y = t.clone()
    v = y[0]
    v.mul_(3)
    return y, v


DTENSOR_VARIANTS = ("eager", "audit", "pass", "fake", "fake_local", "make_fx", "make_fx_fake", "functionalize",
                    "grad", "vjp")
PLACEMENTS = ("shard0", "replicate")
# fake: FakeTensorMode.from_tensor of a DTensor (how dynamo fakeifies one); fake_local: DTensor.from_local of a
# fake local tensor inside FakeTensorMode. make_fx traces at the DTensor level (the graph's inputs are DTensors).
DTENSOR_TRACING = {"make_fx": ("real", False), "make_fx_fake": ("fake", False), "functionalize": ("real", True)}


def _placements(out: Any) -> dict:
    return {"placements": [ob.safe(lambda t=t: str(t.placements)) for t in ob.flat_tensors(out)]}


def _dtensor(placement: str, requires_grad: bool = True) -> torch.Tensor:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = _mesh()
    torch.manual_seed(0)
    base = torch.randn(4, 6)
    dt = distribute_tensor(base, mesh, [Shard(0) if placement == "shard0" else Replicate()])
    return dt.requires_grad_(requires_grad)


def run_dtensor_fake(ctx: Context, opname: str, variant: str, placement: str) -> dict:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import DTensor, Replicate, Shard

    fn = DTENSOR_OPS[opname]
    dt = _dtensor(placement)
    with FakeTensorMode() as fm:
        if variant == "fake":
            made, err = call(lambda: fm.from_tensor(dt))
            leaves = [("arg0", made)]
        else:
            torch.manual_seed(0)
            local = fm.from_tensor(torch.randn(4, 6)).requires_grad_()
            pl = [Shard(0) if placement == "shard0" else Replicate()]
            made, err = call(lambda: DTensor.from_local(local, _mesh(), pl))
            leaves = [("arg0", made), ("local", local)]
        if err is not None:
            return {"from_tensor": err}
        pool = {id(t): n for n, t in leaves}
        out, err = call(lambda: fn(made))
        if err is not None:
            return {"call": err}
        outs = ob.named("out", out)
        ctx.perturb([t for _, t in outs])
        pool.update({id(t): n for n, t in outs})
        rec = {"outs": ob.tensors(outs, pool, with_value=False), "args": ob.tensors(leaves, pool, with_value=False)}
        rec.update(_placements(out))
        rec["backward"] = backward_record([t for _, t in outs], leaves)
    return rec


def run_dtensor(ctx: Context, opname: str, variant: str, placement: str) -> dict:
    if variant in ("fake", "fake_local"):
        return run_dtensor_fake(ctx, opname, variant, placement)
    if variant in DTENSOR_TRACING:
        mode, functionalize = DTENSOR_TRACING[variant]
        return traced(ctx, DTENSOR_OPS[opname], lambda: _dtensor(placement, False), mode, functionalize,
                      extra=_placements)
    if variant in ("grad", "vjp"):
        return func_transform(ctx, DTENSOR_OPS[opname], _dtensor(placement, False), variant, extra=_placements)
    dt = _dtensor(placement)
    leaves = [("arg0", dt)]
    pool = {id(dt): "arg0"}
    cm = {"audit": ctx.audit, "pass": PassMode}.get(variant, contextlib.nullcontext)()
    with cm:
        out, err = call(lambda: DTENSOR_OPS[opname](dt))
        if err is not None:
            return {"call": err}
        outs = ob.named("out", out)
        ctx.perturb([t for _, t in outs])
        pool.update({id(t): n for n, t in outs})
        rec = {"outs": ob.tensors(outs, pool), "args": ob.tensors(leaves, pool)}
        rec.update(_placements(out))
        rec["backward"] = backward_record([t for _, t in outs], leaves)
    return rec


def dtensor_scenarios() -> list[Scenario]:
    return [Scenario(f"dtensor/{v}/{op}/{p}", "dtensor", lambda ctx, op=op, v=v, p=p: run_dtensor(ctx, op, v, p))
            for op in DTENSOR_OPS for v in DTENSOR_VARIANTS for p in PLACEMENTS]


# family 3b: the same DTensor ops under torch.compile (Shard(0), one call, dynamic=False)
DTENSOR_INDUCTOR_OPS = ("sin", "matmul", "inplace_add")


def run_dtensor_compile(ctx: Context, opname: str, backend: str) -> dict:
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = _mesh()
    torch.manual_seed(0)
    dt = distribute_tensor(torch.randn(4, 6), mesh, [Shard(0)]).requires_grad_()
    return compiled(ctx, DTENSOR_OPS[opname], [(dt,)], backend, dynamic=False, extra=_placements)


def dtensor_compile_scenarios() -> list[Scenario]:
    return [Scenario(f"dtensor_compile/{b}/{op}", "dtensor_compile",
                     lambda ctx, op=op, b=b: run_dtensor_compile(ctx, op, b),
                     full_only=(b == "inductor"), timeout=600 if b == "inductor" else 180)
            for op in DTENSOR_OPS for b in COMPILE_VARIANTS if b != "inductor" or op in DTENSOR_INDUCTOR_OPS]


# --- family 4: tracing and transforms (FakeTensorMode, make_fx, torch.func, compile) ------


def _f_inplace_view(x):
    y = x.clone()
    y[0].mul_(2)
    return y


def _f_unbind_inplace(x):
    y = x.clone()
    for r in y.unbind():
        r.add_(1)
    return y


def _f_zero_view(x):
    y = x.clone()
    y.view(-1).zero_()
    return y + x


def _f_detach_inplace(x):
    y = x.clone()
    d = y.detach()
    d.add_(1)
    return y * x


TRACE_FNS: dict[str, Callable] = {
    "view_chain": lambda x: x.view(-1).narrow(0, 0, 4).mul(2),
    "inplace_view": _f_inplace_view,
    "detach": lambda x: x.detach().sin() + x,
    "detach_inplace": _f_detach_inplace,
    "transpose_matmul": lambda x: x.t() @ x,
    "split_sum": lambda x: torch.stack([s.sum() for s in x.split(2)]),
    "unbind_inplace": _f_unbind_inplace,
    "as_strided": lambda x: x.as_strided((2, 2), (1, 2)).exp(),
    "expand_contig": lambda x: x[:, :1].expand(-1, 4).contiguous() * x,
    "data": lambda x: x.data.mul(2) + x,
    "softmax": lambda x: torch.softmax(x, -1),
    "zero_view": _f_zero_view,
}
TRACE_VARIANTS = ("eager", "audit", "fake", "make_fx", "make_fx_fake", "functionalize", "grad", "vmap")
COMPILE_VARIANTS = ("eager", "aot_eager", "inductor")


def _x(shape=(4, 4), requires_grad=False) -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(*shape).requires_grad_(requires_grad)


def _graph_code(gm) -> str:
    return "\n".join(line.rstrip() for line in gm.code.strip().splitlines())


def run_trace(ctx: Context, fname: str, variant: str) -> dict:
    from torch.fx.experimental.proxy_tensor import make_fx

    f = TRACE_FNS[fname]
    if variant in ("eager", "audit"):
        x = _x(requires_grad=True)
        with ctx.audit() if variant == "audit" else contextlib.nullcontext():
            out, err = call(lambda: f(x))
            if err is not None:
                return {"call": err}
            ctx.perturb([out])
            pool = {id(x): "arg0", id(out): "out0"}
            return {"outs": ob.tensors([("out0", out)], pool), "args": ob.tensors([("arg0", x)], pool),
                    "backward": backward_record([out], [("arg0", x)])}
    if variant == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode

        x = _x()
        with FakeTensorMode() as mode:
            fx = mode.from_tensor(x)
            out, err = call(lambda: f(fx))
            if err is not None:
                return {"call": err}
            pool = {id(fx): "arg0", id(out): "out0"}
            return {"outs": ob.tensors([("out0", out)], pool, with_value=False),
                    "args": ob.tensors([("arg0", fx)], pool, with_value=False)}
    if variant in ("make_fx", "make_fx_fake", "functionalize"):
        x = _x()
        g = torch.func.functionalize(f) if variant == "functionalize" else f
        mode = "fake" if variant == "make_fx_fake" else "real"
        gm, err = call(lambda: make_fx(g, tracing_mode=mode)(x))
        if err is not None:
            return {"trace": err}
        out, err = call(lambda: gm(_x()))
        ctx.perturb([out] if isinstance(out, torch.Tensor) else [])
        return {"code": _graph_code(gm), "result": err or ob.value(out)}
    if variant == "grad":
        x = _x()
        out, err = call(lambda: torch.func.grad(lambda x: f(x).sum())(x))
        if err is None:
            ctx.perturb([out])
        return {"result": err or ob.tensor(out)}
    if variant == "vmap":
        x = _x((3, 4, 4))
        out, err = call(lambda: torch.func.vmap(f)(x))
        if err is None:
            ctx.perturb([out])
        return {"result": err or ob.tensor(out)}
    raise ValueError(variant)


def run_compile(ctx: Context, fname: str, backend: str) -> dict:
    f = TRACE_FNS[fname]
    inputs = [(_x(requires_grad=True),), (_x(requires_grad=True),), (_x((8, 4), requires_grad=True),)]
    return compiled(ctx, f, inputs, backend)


def trace_scenarios() -> list[Scenario]:
    out = [Scenario(f"trace/{v}/{f}", "trace", lambda ctx, f=f, v=v: run_trace(ctx, f, v))
           for f in TRACE_FNS for v in TRACE_VARIANTS]
    out += [Scenario(f"compile/{b}/{f}", "compile", lambda ctx, f=f, b=b: run_compile(ctx, f, b),
                     full_only=(b == "inductor"), timeout=600 if b == "inductor" else 120)
            for f in TRACE_FNS for b in COMPILE_VARIANTS
            if b != "inductor" or f in INDUCTOR_FNS]
    return out


INDUCTOR_FNS = ("view_chain", "inplace_view", "detach_inplace", "split_sum", "unbind_inplace")


# --- family 5: torchao ------------------------------------------------------------------


def _torchao_missing() -> str | None:
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        return "torchao is not installed (requirements-test.txt pins it)"
    return None


TORCHAO_VARIANTS = ("eager", "audit", "pass", "compile_eager", "compile_aot_eager")


def _ao_float8_linear() -> tuple[torch.nn.Module, torch.Tensor]:
    """A small MLP whose Linears become torchao Float8Linear (dynamic tensorwise scaling, float8 matmuls)."""
    from torchao.float8 import convert_to_float8_training

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    convert_to_float8_training(m)
    return m, torch.randn(16, 32, requires_grad=True)


def _ao_int8_weight_only() -> tuple[torch.nn.Module, torch.Tensor]:
    """A Linear whose weight quantize_ turns into an affine-quantized int8 tensor subclass (Int8Tensor)."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(32, 32))
    quantize_(m, Int8WeightOnlyConfig())
    return m, torch.randn(4, 32)


TORCHAO_MODELS: dict[str, Callable[[], tuple[torch.nn.Module, torch.Tensor]]] = {
    "float8_linear": _ao_float8_linear,
    "int8_weight_only": _ao_int8_weight_only,
}


def _ao_context(ctx: Context, variant: str, compiles: bool = False) -> Any:
    return {"audit": ctx.audit, "pass": CompilePassMode if compiles else PassMode}.get(variant,
                                                                                      contextlib.nullcontext)()


def run_torchao_model(ctx: Context, name: str, variant: str) -> dict:
    """Forward (and backward, for what is differentiable) through a torchao-converted module."""
    import torch._dynamo
    from torch._dynamo.backends.registry import lookup_backend
    from torch._dynamo.utils import counters

    m, x = TORCHAO_MODELS[name]()
    leaves = [("arg0", x)] + [(f"param.{n}", p) for n, p in m.named_parameters()]
    pool = {id(t): n for n, t in leaves}
    rec: dict[str, Any] = {"modules": [type(mod).__name__ for mod in m.modules()],
                           "params": {n: type(t).__name__ for n, t in leaves}}
    fn: Callable = m
    graphs = [0]
    if variant.startswith("compile_"):
        backend = variant[len("compile_"):]
        torch._dynamo.reset()
        counters.clear()

        def counting(gm, example_inputs):
            graphs[0] += 1
            return lookup_backend(backend)(gm, example_inputs)

        fn = torch.compile(m, backend=counting, dynamic=False)
    torch.manual_seed(1)
    with _ao_context(ctx, variant):
        out, err = call(lambda: fn(x))
        if err is not None:
            rec["call"] = err
        else:
            outs = ob.named("out", out)
            ctx.perturb([t for _, t in outs])
            pool.update({id(t): n for n, t in outs})
            rec["outs"] = ob.tensors(outs, pool)
            rec["backward"] = backward_record([t for _, t in outs], leaves)
    rec["args"] = ob.tensors(leaves, pool)
    if variant.startswith("compile_"):
        rec["graphs"] = graphs[0]
        rec["graph_breaks"] = sum(counters["graph_break"].values())
        rec["unique_graphs"] = counters["stats"]["unique_graphs"]
        torch._dynamo.reset()
    return rec


def run_torchao_adamw8bit(ctx: Context, variant: str) -> dict:
    """Three AdamW8bit steps on a Linear: the weight's optimizer state is torchao's OptimState8bit subclass
    (block-wise 8-bit codes and scales; the bias is too small and keeps plain tensors). The step itself is
    torch.compile'd by torchao (inductor, fullgraph): the pass-through mode is one that lets torch.compile
    compile (ignore_compile_internals) and sees the compiled step run."""
    from torchao.optim import AdamW8bit

    torch.manual_seed(0)
    m = torch.nn.Linear(64, 256)
    opt = AdamW8bit(m.parameters(), lr=1e-2)
    xs = [torch.randn(4, 64) for _ in range(3)]
    losses: list[Any] = []
    with _ao_context(ctx, variant, compiles=True):
        for x in xs:
            def step(x: torch.Tensor = x) -> float:
                loss = m(x).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                return loss.item()

            v, err = call(step)
            losses.append(err or ob._scalar(v))
            if err is not None:
                break
    params = [(f"param.{n}", p) for n, p in m.named_parameters()]
    ctx.perturb([p for _, p in params])
    pool = {id(p): n for n, p in params}
    state = {n: {k: ob.tensor(t, pool) if isinstance(t, torch.Tensor) else ob.non_tensor(t)
                 for k, t in opt.state[p].items()} for n, p in params}
    return {"losses": losses, "params": ob.tensors(params, pool), "state": state}


def torchao_scenarios() -> list[Scenario]:
    reason = _torchao_missing()
    if reason is not None:
        return [Scenario("torchao/all", "torchao", lambda ctx: {"skipped": reason})]
    out = [Scenario(f"torchao/{v}/{name}", "torchao", lambda ctx, n=name, v=v: run_torchao_model(ctx, n, v),
                    full_only=v.startswith("compile_"), timeout=300)
           for name in TORCHAO_MODELS for v in TORCHAO_VARIANTS]
    out += [Scenario(f"torchao/{v}/adamw8bit", "torchao", lambda ctx, v=v: run_torchao_adamw8bit(ctx, v),
                     full_only=True, timeout=600)
            for v in ("eager", "audit", "pass")]
    return out


def registry() -> dict[str, Scenario]:
    from differential.transforms import opdb_tx_scenarios

    all_ = (opdb_scenarios() + opdb_tx_scenarios() + njt_scenarios() + dtensor_scenarios()
            + dtensor_compile_scenarios() + trace_scenarios() + torchao_scenarios())
    from differential.feature_scenarios import feature_scenarios  # checkpoint, rewrite, detach

    all_ += feature_scenarios()
    from differential.dispatcher_scenarios import dispatcher_scenarios  # dispatcher

    all_ += dispatcher_scenarios()
    from differential.nested_scenarios import nested_scenarios  # nested

    all_ += nested_scenarios()
    reg = {s.id: s for s in all_}
    assert len(reg) == len(all_), "duplicate scenario ids"
    return reg
