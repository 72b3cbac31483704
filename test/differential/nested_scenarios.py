"""Family ``nested``: two dispatch modes in every opt-out combination, wrappers inside modes, a mode in a wrapper.

``nested/<outer>-<inner>/<op>``: a mode entered first (``outer``) and one entered inside it (``inner``), each
one of ``tracked`` (aliasguard's default), ``notrack`` (``__aliasguard_track_views__ = False``) or
``nofix`` (``__aliasguard_fixup__ = False``): nine combinations. The inner mode is the top of the mode stack,
so its body runs first and its calls (the op, and everything its body does) reach the outer mode's body.
Every body (``NestMode``) answers an op by calling it, records the versions of the arguments the schema
marks written (``written_after_call``), keeps a ``view`` of each floating output (what it sees of the
output and of the kept view: ``_is_view``, ``_base``, ``_version``), then writes each written floating
argument once more (``add_(1)``, a write that changes the value) and records the versions again
(``written_after_rewrite``). The version recorded between the two writes must never equal the version the
tensor has once the op returned (``stale``: one boolean per recorded point, "recorded == final";
the value has changed since). Then, as the other families: arguments and outputs after the op (type,
metadata, ``_version``, ``_is_view``, ``_base``, values), backward's gradients, what each body kept
(``kept_<mode>``), and the kept views' versions after the op's outputs are written
(``kept_versions_after_write``).

Ops (``NEST_OPS``): an in-place op (``add_``), a view op (``view``), an ``out=`` op, ``_foreach_add_`` with
a repeated tensor and with two overlapping slices of one base, ``split`` and ``unbind`` (several view
outputs), a mutating custom op defined with ``Library.define`` (``custom_define_mutate``) and one defined
with ``torch.library.custom_op`` (``custom_op_mutate``), both registered by ``dispatcher_scenarios``
before any tracked body runs.

``nested/wrapper_in_<mode>/<wrapper>/<op>``: the op on wrapper-subclass arguments (the harness's
``_make_wrapper_subclass`` ``Wrapper``, or ``TwoTensor``) inside one mode of each kind.

``nested/mode_in_wrapper/<mode>/<op>``: the op on ``ModeWrapper`` arguments, a wrapper whose
``__torch_dispatch__`` enters a mode of that kind around its call of the op on the inner tensors.

Nothing here imports aliasguard; the opt-out attributes mean nothing to stock.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from differential import observe as ob
from differential.scenarios import Context, Scenario, Wrapper, backward_record, call

aten = torch.ops.aten
KINDS = ("tracked", "notrack", "nofix")
MAX_CALLS = 12  # body records per mode
MAX_POINTS = 24  # stale-version points per scenario


def _written(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors the schema marks written (Tensor(a!), Tensor(a!)[]), in argument order, floating only."""
    out: list[torch.Tensor] = []
    schema = func._schema
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = args[i] if i < len(args) else kwargs.get(a.name)
        for t in ob.flat_tensors(v):
            if t.is_floating_point():
                out.append(t)
    return out


class NestBody:
    """A body that calls the op, keeps a view of each output and writes each written argument once more.

    ``points`` (shared by the bodies of a scenario): (tensor, version recorded between the op's write and the
    body's second write). ``call(func, *args, **kwargs)`` is how the body's own ops go on: as a mode, the op
    itself (the mode stack routes it); in the top-level emulation, the next body down."""

    def _init_body(self, label: str, points: list) -> None:
        self.label = label
        self.points = points
        self.calls: list[dict] = []
        self.kept: list[torch.Tensor] = []

    def body(self, func: Any, args: tuple, kwargs: dict, call: Callable[..., Any]) -> Any:
        out = call(func, *args, **kwargs)
        if len(self.calls) >= MAX_CALLS or not REWRITING[0]:
            return out
        ins = ob.named("in", (args, kwargs))
        pool = {id(t): n for n, t in ins}
        written = _written(func, args, kwargs)
        rec: dict[str, Any] = {"op": str(func),
                               "written_after_call": [ob.safe(lambda t=t: t._version) for t in written]}
        self.calls.append(rec)
        outs = ob.flat_tensors(out)[:4]
        pool.update({id(o): f"out{j}" for j, o in enumerate(outs) if id(o) not in pool})
        rec["outs"] = [{k: ob.tensor(o, pool, with_value=False)[k] for k in ("is_view", "base", "version")}
                       for o in outs]
        kept = []
        for o in outs[:2]:
            if isinstance(o, torch.Tensor) and o.is_floating_point() and len(self.kept) < 8:
                v = ob.safe(lambda o=o: call(aten.view.default, o, list(o.shape)))
                if isinstance(v, torch.Tensor):
                    self.kept.append(v)
                    kept.append({k: ob.tensor(v, pool, with_value=False)[k] for k in ("is_view", "base", "version")})
        rec["kept"] = kept
        for t in written:
            if len(self.points) < MAX_POINTS:
                self.points.append((t, t._version))
        for t in written:
            call(aten.add_.Tensor, t, 1)  # the body's second write: it changes the value
        rec["written_after_rewrite"] = [ob.safe(lambda t=t: t._version) for t in written]
        return out


# The bodies write (and record) only while the op runs, not in backward (whose in-place accumulation a body's
# extra write would change).
REWRITING = [False]


def _plain_call(func: Any, *args: Any, **kwargs: Any) -> Any:
    return func(*args, **kwargs)


class NestMode(NestBody, TorchDispatchMode):
    kind = "tracked"

    def __init__(self, label: str, points: list) -> None:
        TorchDispatchMode.__init__(self)
        self._init_body(label, points)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.body(func, args, kwargs or {}, _plain_call)


class NoTrackNestMode(NestMode):
    kind = "notrack"
    __aliasguard_track_views__ = False


class NoFixNestMode(NestMode):
    kind = "nofix"
    __aliasguard_fixup__ = False


MODE_CLASSES: dict[str, type[NestMode]] = {"tracked": NestMode, "notrack": NoTrackNestMode, "nofix": NoFixNestMode}


class EmulatedBody(NestBody):
    """The same body as a plain function at top level: what its records would be if every op it runs, the op it
    answers included, ran at top level (views are views, every write counts once)."""

    def __init__(self, label: str, points: list) -> None:
        self._init_body(label, points)


def _emulated(bodies: list[EmulatedBody]) -> Callable[..., Any]:
    """``call`` for the emulation: the innermost body first, each body's ops through the bodies below it."""
    def go(depth: int, func: Any, *args: Any, **kwargs: Any) -> Any:
        if depth < 0:
            return func(*args, **kwargs)
        return bodies[depth].body(func, args, kwargs, lambda f, *a, **k: go(depth - 1, f, *a, **k))

    return lambda func, *args, **kwargs: go(len(bodies) - 1, func, *args, **kwargs)


class ModeWrapper(Wrapper):
    """A wrapper whose ``__torch_dispatch__`` enters a mode (``mode_kind``) around its call on the inner tensors."""

    mode_kind = "tracked"
    modes: list[NestMode] = []
    points: list = []

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return ModeWrapper(inner["elem"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def unwrap(x):
            return x.elem if isinstance(x, Wrapper) else x

        m = MODE_CLASSES[ModeWrapper.mode_kind](f"m{len(ModeWrapper.modes)}", ModeWrapper.points)
        if len(ModeWrapper.modes) < 4 and REWRITING[0]:
            ModeWrapper.modes.append(m)
        with m:
            out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda x: ModeWrapper(x) if type(x) is torch.Tensor else x, out)


# --- the ops ----------------------------------------------------------------------------------------------
# Each builds its inputs from a leaf (``a``, requiring grad where autograd allows it) and returns (leaves, the
# op as aten calls through ``call``). ``wrap`` turns a plain tensor into the scenario's wrapper (or leaves it).


def _leaf(shape: tuple = (3, 3), grad: bool = True, wrap: Callable = lambda t: t) -> torch.Tensor:
    return wrap(torch.randn(*shape)).requires_grad_(grad)


def _custom(name: str) -> Any:
    from differential.dispatcher_scenarios import custom_op

    return custom_op("before", name)


Op = Callable[[Callable], tuple[list, Callable[[Callable[..., Any]], Any]]]


def op_add_(wrap: Callable) -> tuple[list, Callable]:
    a = _leaf(wrap=wrap)
    x = a.clone()  # outside the modes: the op writes a non-leaf that requires grad
    return [("arg0", a), ("arg1", x)], lambda call: call(aten.add_.Tensor, x, 1)


def op_view(wrap: Callable) -> tuple[list, Callable]:
    a = _leaf(wrap=wrap)
    return [("arg0", a)], lambda call: call(aten.view.default, a, [9])


def op_out(wrap: Callable) -> tuple[list, Callable]:
    a, b = _leaf(grad=False, wrap=wrap), _leaf(grad=False, wrap=wrap)
    o = wrap(torch.zeros(3, 3))
    return [("arg0", a), ("arg1", b), ("arg2", o)], lambda call: call(aten.add.out, a, b, out=o)


def op_foreach_repeated(wrap: Callable) -> tuple[list, Callable]:
    a = _leaf(wrap=wrap)
    x = a.clone()
    return [("arg0", a), ("arg1", x)], lambda call: call(aten._foreach_add_.Scalar, [x, x], 1.0)


def op_foreach_overlap(wrap: Callable) -> tuple[list, Callable]:
    a = _leaf((4, 3), wrap=wrap)
    x = a.clone()

    def f(call: Callable[..., Any]) -> Any:
        views = [call(aten.slice.Tensor, x, 0, 0, 3), call(aten.slice.Tensor, x, 0, 1, 4)]
        call(aten._foreach_add_.Scalar, views, 1.0)
        return views

    return [("arg0", a), ("arg1", x)], f


def op_split(wrap: Callable) -> tuple[list, Callable]:
    a = _leaf(wrap=wrap)
    return [("arg0", a)], lambda call: call(aten.split.Tensor, a, 1)


def op_unbind(wrap: Callable) -> tuple[list, Callable]:
    a = _leaf(wrap=wrap)
    return [("arg0", a)], lambda call: call(aten.unbind.int, a, 0)


def op_custom_define_mutate(wrap: Callable) -> tuple[list, Callable]:
    x = _leaf(grad=False, wrap=wrap)
    return [("arg0", x)], lambda call: call(_custom("define_mutate"), x)


def op_custom_op_mutate(wrap: Callable) -> tuple[list, Callable]:
    x = _leaf(grad=False, wrap=wrap)
    return [("arg0", x)], lambda call: call(_custom("mutate"), x)


NEST_OPS: dict[str, Op] = {
    "add_": op_add_,
    "view": op_view,
    "out": op_out,
    "foreach_repeated": op_foreach_repeated,
    "foreach_overlap": op_foreach_overlap,
    "split": op_split,
    "unbind": op_unbind,
    "custom_define_mutate": op_custom_define_mutate,
    "custom_op_mutate": op_custom_op_mutate,
}
WRAPPERS = ("wrapper", "twotensor")


def _wrapper(kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if kind == "wrapper":
        return Wrapper
    if kind == "mode_wrapper":
        return ModeWrapper
    from torch.testing._internal.two_tensor import TwoTensor

    return lambda t: TwoTensor(t, t.clone())


# --- running one ------------------------------------------------------------------------------------------

TOP_KEYS = ("version", "is_view", "base")


def _observe(rec: dict, leaves: list, out: Any, bodies: list, points: list, full: bool) -> list:
    """Arguments, outputs, what each body kept and the stale-version points into ``rec``; returns the kept."""
    outs = ob.named("out", out)
    pool = {id(t): n for n, t in leaves}
    pool.update({id(t): n for n, t in outs if id(t) not in pool})

    def tensors(items: list) -> dict:
        recs = ob.tensors(items, pool, with_value=full)
        return recs if full else {n: {k: r[k] for k in TOP_KEYS} for n, r in recs.items()}

    if full:
        rec["out_nontensor"] = ob.non_tensor(out)
    rec["outs"] = tensors(outs)
    rec["args"] = tensors(leaves)
    # the version recorded between a body's two writes against the version once the op returned
    rec["stale"] = [ob.safe(lambda t=t, v=v: t._version == v) for t, v in points]
    kept = []
    for m in bodies:
        named = [(f"kept_{m.label}{i}", t) for i, t in enumerate(m.kept)]
        pool.update({id(t): n for n, t in named})
        kept += named
    for m in bodies:  # kept views: metadata, no values (the outputs' values are compared)
        mine = [(n, t) for n, t in kept if n.startswith(f"kept_{m.label}")]
        recs = ob.tensors(mine, pool, with_value=False)
        rec[f"kept_{m.label}"] = recs if full else {n: {k: r[k] for k in TOP_KEYS} for n, r in recs.items()}
    return kept


def _after_write(rec: dict, out: Any, kept: list) -> None:
    for _, t in ob.named("out", out):  # write each output (no autograd), then read what the bodies kept
        with torch.no_grad():
            call(lambda t=t: t.add_(1) if t.is_floating_point() else None)
    rec["kept_versions_after_write"] = {n: ob.safe(lambda t=t: t._version) for n, t in kept}


def _record(ctx: Context, leaves: list, fn: Callable, modes: list, points: list,
            around: Callable[[], Any]) -> dict:
    rec: dict[str, Any] = {}
    torch.manual_seed(1)
    REWRITING[0] = True
    try:
        with around():
            out, err = call(lambda: fn(_plain_call))
    finally:
        REWRITING[0] = False
    for m in modes:  # by index: a call one side has and the other not is one difference, the rest compared
        rec[f"inside_{m.label}"] = {str(i): c for i, c in enumerate(m.calls)}
    if err is not None:
        rec["call"] = err
        rec["args"] = ob.tensors(leaves, {id(t): n for n, t in leaves}, with_value=False)
        return rec
    ctx.perturb([t for _, t in ob.named("out", out)])
    kept = _observe(rec, leaves, out, modes, points, full=True)
    rec["backward"] = backward_record([t for _, t in ob.named("out", out)], leaves)
    _after_write(rec, out, kept)
    return rec


def _top(opname: str, labels: list[str]) -> dict:
    """The emulation: the bodies as plain functions at top level (no grad), on inputs of their own from the same
    seed; the records' version, _is_view and _base. What aliasguard gives where every body is tracked."""
    torch.manual_seed(0)
    leaves, fn = NEST_OPS[opname](lambda t: t)
    points: list = []
    bodies = [EmulatedBody(label, points) for label in labels]
    rec: dict[str, Any] = {}
    REWRITING[0] = True
    try:
        with torch.no_grad():
            out, err = call(lambda: fn(_emulated(bodies)))
    finally:
        REWRITING[0] = False
    if err is not None:
        return {"call": err}
    for b in bodies:
        rec[f"inside_{b.label}"] = {str(i): c for i, c in enumerate(b.calls)}
    kept = _observe(rec, leaves, out, bodies, points, full=False)
    _after_write(rec, out, kept)
    return rec


def run_nested(ctx: Context, outer: str, inner: str, opname: str) -> dict:
    top = _top(opname, ["outer", "inner"])
    torch.manual_seed(0)
    leaves, fn = NEST_OPS[opname](lambda t: t)
    points: list = []
    modes = [MODE_CLASSES[outer]("outer", points), MODE_CLASSES[inner]("inner", points)]

    @contextlib.contextmanager
    def around():
        with modes[0], modes[1]:
            yield

    rec = _record(ctx, leaves, fn, modes, points, around)
    rec["top"] = top
    return rec


def run_wrapper_in_mode(ctx: Context, kind: str, wrapper: str, opname: str) -> dict:
    torch.manual_seed(0)
    leaves, fn = NEST_OPS[opname](_wrapper(wrapper))
    points: list = []
    m = MODE_CLASSES[kind]("mode", points)
    return _record(ctx, leaves, fn, [m], points, lambda: m)


def run_mode_in_wrapper(ctx: Context, kind: str, opname: str) -> dict:
    ModeWrapper.mode_kind = kind
    ModeWrapper.modes = []
    ModeWrapper.points = []
    try:
        torch.manual_seed(0)
        leaves, fn = NEST_OPS[opname](_wrapper("mode_wrapper"))
        rec = _record(ctx, leaves, fn, ModeWrapper.modes, ModeWrapper.points, contextlib.nullcontext)
    finally:
        ModeWrapper.mode_kind = "tracked"
    return rec


def nested_scenarios() -> list[Scenario]:
    out = [Scenario(f"nested/{o}-{i}/{op}", "nested", lambda ctx, o=o, i=i, op=op: run_nested(ctx, o, i, op))
           for o in KINDS for i in KINDS for op in NEST_OPS]
    out += [Scenario(f"nested/wrapper_in_{k}/{w}/{op}", "nested",
                     lambda ctx, k=k, w=w, op=op: run_wrapper_in_mode(ctx, k, w, op))
            for k in KINDS for w in WRAPPERS for op in NEST_OPS]
    out += [Scenario(f"nested/mode_in_wrapper/{k}/{op}", "nested",
                     lambda ctx, k=k, op=op: run_mode_in_wrapper(ctx, k, op))
            for k in KINDS for op in NEST_OPS]
    return out
