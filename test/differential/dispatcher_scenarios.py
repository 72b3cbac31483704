"""Family ``dispatcher``: every aten op whose schema writes or aliases an argument, from the dispatcher.

The ``opdb`` family reaches the ops OpInfo knows, with the samples it has. This family takes its ops from
the dispatcher instead (``torch._C._dispatch_get_all_op_names``): every ``aten`` overload with a
``Tensor(a)`` or ``Tensor(a!)`` argument (in-place and ``out=`` variants, views, ``_foreach_*``,
``_fused_*`` optimizers, ``_amp_*``, batch norm's running statistics, ``set_``, ``resize_``...), with
inputs built from the schema alone (``build``): each tensor ``float32`` 3x3 (indices ``int64``, masks
``bool``, running statistics one per channel), ``out=`` tensors empty, sizes that of the tensor,
dimensions 0, scalars 1; an argument with a default keeps it unless the op writes it. An argument of a type
the builder does not know (``str``, ``Dimname``, a ``Generator``...) skips the scenario, and so do the few
ops that crash stock torch with such inputs (``CRASH_STOCK``); both count as skipped. Many calls raise
(wrong dtype, shape or value for the op): identically on both sides, and compared as such. A list of tensors
is built four ways (``variant``): ``distinct``, ``repeated`` (one tensor twice), ``halves`` (the two
slices of one base) and ``overlap`` (two overlapping slices of one base); an op without a tensor list has
``plain`` only.

``dispatcher/<mode>/<op>/<variant>``: the op under ``pass`` and ``saving`` (the ``opdb`` family's modes),
recorded as ``opdb`` records a call (arguments, outputs, what the saving mode saw and kept, the kept
tensors' versions after each output is written; ``saved_is``: which kept tensors are the op's outputs),
plus ``top``: the same call at top level (no mode), on inputs of its own: each argument's and output's
version, ``_is_view`` and ``_base``, and the outputs' versions after they are written, which is what a
mode's call must give (Note [What a tracked body's call runs as]); ``settled_writes``: the op writes
arguments, returns nothing and has no ADInplaceOrView kernel (Note [One bump per write through
__torch_dispatch__]).

``dispatcher/<mode>/custom_<when>_<op>/<variant>``: custom ops defined with ``torch.library.custom_op``
and ``Library.define``, registered ``before`` (when this module is imported, before any scenario runs a
tracked body) or ``after`` (by the first such scenario, after a tracked body ran): a mutating op, a
list-mutating op, a view op and a view-list op (Note [Ops registered after the tracked views' kernels]).
``dispatcher/keep/custom_<when>_<op>/0``: a body keeps the custom view op's view of ``sin``'s output,
then the output is written: the kept view, and what the same view op gives at top level.
``dispatcher/<mode>/custom_cpp_<when>_<op>/<variant>`` and ``dispatcher/keep/custom_cpp_<when>_<op>/0``: the
same four kinds (``mutate``, ``mutate_list``, ``view``, ``view_list``) registered from C++ with
``TORCH_LIBRARY`` (test/cpp/differential_test_ops.cpp), one library per registration time, loaded with
``torch.ops.load_library`` at the same two times (``differential.cpp_ops``); where the build did not make
them, each such scenario raises ``TestOpsNotBuilt`` on both sides and is reported unexpected.

Nothing here imports aliasguard.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import torch

from differential import cpp_ops
from differential import observe as ob
from differential.scenarios import Context, PassMode, SavingMode, Scenario, call

aten = torch.ops.aten
MODES = ("pass", "saving")
LIST_VARIANTS = ("distinct", "repeated", "halves", "overlap")
SHAPE = (3, 3)


# Ops that crash stock torch (segfault, abort) with the generic inputs (empty out= tensors for batch norm's
# and embedding_bag's several outputs): counted as skipped.
CRASH_STOCK = frozenset({
    "_batch_norm_no_update.out", "_embedding_bag_forward_only.out", "_native_batch_norm_legit.no_stats_out",
    "native_batch_norm.out", "native_batch_norm_backward.out",
})


# Outputs with uninitialised elements (an empty out= tensor resized and partly written): no values.
NO_VALUES = re.compile(r"empty|resize|_weight_norm_interface|linalg_lstsq|linalg_matrix_rank")


class Unbuildable(Exception):
    """An argument of a type the generic builder does not know."""


# --- the ops ------------------------------------------------------------------------------


def _aliases_an_argument(schema: Any) -> bool:
    return any(a.alias_info is not None for a in schema.arguments)


@functools.lru_cache(maxsize=None)
def aten_ops() -> tuple[str, ...]:
    """``name.overload`` of every aten op whose schema writes or aliases an argument, sorted."""
    out = []
    for qualified in torch._C._dispatch_get_all_op_names():
        ns, _, rest = qualified.partition("::")
        if ns != "aten":
            continue
        name, _, overload = rest.partition(".")
        packet = getattr(aten, name, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is None:
            continue
        if _aliases_an_argument(op._schema):
            out.append(f"{name}.{overload or 'default'}")
    return tuple(sorted(out))


def aten_op(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(aten, packet), overload)


# --- custom ops, registered before and after the first tracked body -------------------------

CUSTOM_OPS = ("mutate", "define_mutate", "define_mutate_list", "define_view", "define_view_list")
_LIBS: dict[str, Any] = {}


def _register_custom(when: str) -> None:
    if when in _LIBS:
        return
    ns = f"agdiff_{when}"

    @torch.library.custom_op(f"{ns}::mutate", mutates_args=("x",))
    def mutate(x: torch.Tensor) -> None:
        x.add_(1)

    lib = torch.library.Library(ns, "FRAGMENT")
    lib.define("define_mutate(Tensor(a!) x) -> Tensor(a!)")
    lib.impl("define_mutate", lambda x: x.add_(1), "CPU")
    lib.define("define_mutate_list(Tensor(a!)[] xs) -> ()")
    lib.impl("define_mutate_list", lambda xs: [x.mul_(2) for x in xs] and None, "CPU")
    lib.define("define_view(Tensor(a) x) -> Tensor(a)")
    lib.impl("define_view", lambda x: x.view(x.shape), "CompositeExplicitAutograd")
    lib.define("define_view_list(Tensor(a) x) -> Tensor(a)[]")
    lib.impl("define_view_list", lambda x: list(x.unbind(0)), "CPU")
    _LIBS[when] = (lib, mutate)


def custom_op(when: str, name: str) -> Any:
    if when == "after" and when not in _LIBS:
        with PassMode():  # a tracked body on the aliasguard side, before the op exists
            torch.zeros(2).view(2).add_(1)
    _register_custom(when)
    return getattr(getattr(torch.ops, f"agdiff_{when}"), name).default


# --- custom ops registered from C++ (TORCH_LIBRARY), loaded before and after the first tracked body -----

CPP_OPS = ("mutate", "mutate_list", "view", "view_list")
CPP_VARIANTS = {"mutate_list": LIST_VARIANTS}  # the rest take no tensor list


def custom_cpp_op(when: str, name: str) -> Any:
    """The op from the ``agdiff_cpp_<when>`` library (differential/cpp_ops.py), loaded as ``custom_op`` registers:
    ``before`` when this module lists its scenarios, ``after`` by the first scenario that needs it, after a
    tracked body ran. Raises ``TestOpsNotBuilt`` when the build did not make the library."""
    ns = f"agdiff_cpp_{when}"
    if when == "after" and not cpp_ops.is_loaded(ns):
        cpp_ops.library_path(ns)  # missing: raise before the body, as when listing
        with PassMode():  # a tracked body on the aliasguard side, before the op exists
            torch.zeros(2).view(2).add_(1)
    return getattr(cpp_ops.load(ns), name).default


# --- inputs from the schema -----------------------------------------------------------------


def _tensor(name: str) -> torch.Tensor:
    if name.startswith("running_"):  # batch norm's statistics: one per channel (dimension 1)
        return torch.ones(SHAPE[1]) if "var" in name else torch.zeros(SHAPE[1])
    if re.search(r"ind(ex|ices)|offsets|target|lengths", name):
        return torch.zeros(SHAPE, dtype=torch.int64)
    if "mask" in name:
        return torch.ones(SHAPE, dtype=torch.bool)
    return torch.randn(SHAPE)


def _tensor_list(variant: str, n: int = 2) -> list[torch.Tensor]:
    if variant == "repeated":
        t = torch.randn(SHAPE)
        return [t] * n
    if variant == "halves":
        return list(torch.randn((n,) + SHAPE).unbind(0))
    if variant == "overlap":
        base = torch.randn(SHAPE[0] + n - 1, SHAPE[1])
        return [base[i:i + SHAPE[0]] for i in range(n)]
    return [torch.randn(SHAPE) for _ in range(n)]


def _value(arg: Any, variant: str) -> Any:
    """A value for one argument, or Unbuildable."""
    kind = str(arg.real_type)  # TorchScript spelling: List[int], Optional[Tensor], number, ScalarType
    name = arg.name
    written = arg.alias_info is not None and arg.alias_info.is_write
    optional = kind.startswith("Optional[")
    base = kind[len("Optional["):-1] if optional else kind
    if base == "Tensor":
        if optional and not written:
            return None
        if arg.kwarg_only and written:
            return torch.empty(0)  # out=: resized by the op
        return _tensor(name)
    if base == "List[Tensor]":
        return _tensor_list(variant)
    if base == "List[Optional[Tensor]]":
        return [torch.zeros(SHAPE[0], dtype=torch.int64)]
    if optional:
        return None
    if base in ("int", "SymInt"):
        return 0 if "dim" in name else 1
    if base in ("List[int]", "List[SymInt]"):
        if re.search(r"size|shape", name):
            return list(SHAPE)
        if "stride" in name:
            return [SHAPE[1], 1]
        return [0] if "dim" in name else [1]
    if base == "float":
        return 1.0
    if base == "List[float]":
        return [1.0]
    if base == "bool":
        return False
    if base == "List[bool]":
        return [False] * 3
    if base == "number":
        return 1.0
    if base == "List[number]":
        return [1.0, 1.0]
    if base == "ScalarType":
        return torch.float32
    if base == "Device":
        return torch.device("cpu")
    if base == "Layout":
        return torch.strided
    if base == "MemoryFormat":
        return torch.contiguous_format
    if base == "Storage":
        return torch.randn(SHAPE).untyped_storage()
    raise Unbuildable(f"{name}: {kind}")


def build(op: Any, variant: str) -> tuple[list, dict]:
    """Positional and keyword arguments for ``op`` from its schema alone."""
    args: list = []
    kwargs: dict = {}
    for arg in op._schema.arguments:
        written = arg.alias_info is not None and arg.alias_info.is_write
        if arg.has_default_value() and not written:
            if arg.kwarg_only:
                continue
            # a positional default: pass it only when a later positional argument needs passing
            args.append(("default", arg))
            continue
        value = _value(arg, variant)
        if arg.kwarg_only:
            kwargs[arg.name] = value
        else:
            args.append(("value", value))
    # Trailing defaults are left out; earlier ones take their default value.
    while args and args[-1][0] == "default":
        args.pop()
    return [v.default_value if k == "default" else v for k, v in args], kwargs


def has_tensor_list(op: Any) -> bool:
    return any(str(a.real_type) in ("List[Tensor]", "Optional[List[Tensor]]") for a in op._schema.arguments)


# --- running one --------------------------------------------------------------------------


def _versions(items: list[tuple[str, torch.Tensor]]) -> dict:
    return {n: ob.safe(lambda t=t: t._version) for n, t in items}


TOP_KEYS = ("version", "is_view", "base")


def _aliasing(items: list[tuple[str, torch.Tensor]], pool: dict[int, str]) -> dict:
    return {n: {k: ob.tensor(t, pool, with_value=False)[k] for k in TOP_KEYS} for n, t in items}


def _write_each(outs: list[tuple[str, torch.Tensor]]) -> None:
    for _, t in outs:
        with torch.no_grad():
            call(lambda t=t: t.add_(1) if t.is_floating_point() else None)


def _top_level(op: Any, variant: str) -> dict:
    """The op at top level (no mode), on inputs of its own from the same seed: ``tensors``, for each argument
    and output, its version, whether it is a view and of what; ``after_write``, each output's version after
    every output is written. What a mode's call must reproduce."""
    torch.manual_seed(0)
    args, kwargs = build(op, variant)
    torch.manual_seed(1)
    out, err = call(lambda: op(*args, **kwargs))
    if err is not None:
        return err
    leaves = ob.named("arg", (args, kwargs))
    outs = ob.named("out", out)
    rec = {"tensors": _aliasing(leaves + outs, {id(t): n for n, t in leaves + outs})}
    _write_each(outs)
    rec["after_write"] = _versions(outs)
    return rec


def run_op(ctx: Context, op: Any, mode: str, variant: str) -> dict:
    if f"{op._schema.name.partition('::')[2]}.{op._overloadname}" in CRASH_STOCK:
        return {"skipped": "crashes stock torch with generic inputs"}
    try:
        torch.manual_seed(0)
        args, kwargs = build(op, variant)
    except Unbuildable as e:
        return {"skipped": f"cannot build {e}"}
    rec: dict[str, Any] = {}
    rec["top"] = _top_level(op, variant)
    leaves = ob.named("arg", (args, kwargs))
    pool = {id(t): n for n, t in leaves}
    m = SavingMode() if mode == "saving" else PassMode()
    torch.manual_seed(1)
    with m:
        out, err = call(lambda: op(*args, **kwargs))
    if err is not None:
        rec["call"] = err
        rec["args"] = ob.tensors(leaves, pool, with_value=False)
        return rec
    outs = ob.named("out", out)
    ctx.perturb([t for _, t in outs])
    pool.update({id(t): n for n, t in outs})
    rec["out_nontensor"] = ob.non_tensor(out)
    with_values = not NO_VALUES.search(str(op))
    # An op that writes arguments, returns nothing and has no ADInplaceOrView kernel: the settled count of
    # Note [One bump per write through __torch_dispatch__].
    rec["settled_writes"] = not op._schema.returns and not torch._C._dispatch_has_kernel_for_dispatch_key(
        op.name(), "ADInplaceOrView")
    rec["outs"] = ob.tensors(outs, pool, with_values)
    rec["args"] = ob.tensors(leaves, pool, with_values)
    if isinstance(m, SavingMode):
        rec["inside"] = m.calls
        saved = [(f"saved{i}", t) for i, t in enumerate(m.saved) if isinstance(t, torch.Tensor)]
        # which kept tensors are the op's outputs themselves (the rest are view_as of them)
        outputs = {id(t): n for n, t in outs}
        rec["saved_is"] = {n: outputs[id(t)] for n, t in saved if id(t) in outputs}
        if m.calls and m.calls[0]["op"] == str(op):
            # the body saw the op first: saved 2k is its output k, whether the kernel above hands it back or
            # another tensor in its memory (a view op's output rewrapped above)
            first = len(m.calls[0]["outs"])
            for k, (n, _) in enumerate(outs[:first]):
                rec["saved_is"].setdefault(f"saved{2 * k}", n)
        pool.update({id(t): n for n, t in saved})
        rec["saved"] = ob.tensors(saved, pool, with_value=False)
        rec["saved_ops"] = m.saved_ops
        _write_each(outs)
        rec["saved_versions_after_write"] = _versions(saved)
    return rec


class KeepCustomView(PassMode):  # a PassMode, so the class-* configurations opt it out too
    """Keeps ``view(out)`` of ``sin``'s output, a custom view op called inside the body."""

    def __init__(self, view: Any) -> None:
        super().__init__()
        self.view = view
        self.kept: Any = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is aten.sin.default:
            self.kept = _kept_view(self.view, self.view(out))
        return out


def _kept_view(view: Any, kept: Any) -> Any:
    return kept[1] if isinstance(kept, (list, tuple)) else kept


def run_keep(ctx: Context, view: Any) -> dict:
    """Recorded as a saving scenario: ``saved0`` is the kept view; ``top`` what the same view op gives at top
    level (a view of ``sin``'s output, which sees its write)."""
    torch.manual_seed(0)
    y = torch.randn(SHAPE).sin()
    kept = _kept_view(view, view(y))
    rec: dict[str, Any] = {"top": {"tensors": {"kept": _aliasing([("kept", kept)], {id(y): "out0"})["kept"]}}}
    with torch.no_grad():
        y.mul_(2)
    rec["top"]["after_write"] = {"kept": kept._version}
    torch.manual_seed(0)
    m = KeepCustomView(view)
    with m:
        y, err = call(lambda: torch.randn(SHAPE).sin())
    if err is not None:
        rec["call"] = err
        return rec
    rec["saved"] = ob.tensors([("saved0", m.kept)], {id(y): "out0"}, with_value=False)
    rec["saved_is"] = {"saved0": "kept"}
    with torch.no_grad():
        y.mul_(2)
    rec["saved_versions_after_write"] = {"saved0": m.kept._version}
    return rec


def _variants(op: Any) -> tuple[str, ...]:
    return LIST_VARIANTS if has_tensor_list(op) else ("plain",)


def dispatcher_scenarios() -> list[Scenario]:
    _register_custom("before")  # at import, before any scenario runs a tracked body
    try:
        cpp_ops.load("agdiff_cpp_before")  # the same, for the ops registered from C++
    except cpp_ops.TestOpsNotBuilt:
        pass  # listed all the same: each of their scenarios fails with this error (compare.UNRUNNABLE)
    out = []
    for name in aten_ops():
        op = aten_op(name)
        for mode in MODES:
            for variant in _variants(op):
                out.append(Scenario(f"dispatcher/{mode}/{name}/{variant}", "dispatcher",
                                    lambda ctx, name=name, mode=mode, variant=variant:
                                    run_op(ctx, aten_op(name), mode, variant)))
    for when in ("before", "after"):
        out += _custom_scenarios(f"custom_{when}", CUSTOM_OPS, lambda name: _variants(custom_op("before", name)),
                                 functools.partial(custom_op, when), ("define_view", "define_view_list"))
    for when in ("before", "after"):
        out += _custom_scenarios(f"custom_cpp_{when}", CPP_OPS, lambda name: CPP_VARIANTS.get(name, ("plain",)),
                                 functools.partial(custom_cpp_op, when), ("view", "view_list"))
    return out


def _custom_scenarios(prefix: str, names: tuple[str, ...], variants: Any, op_of: Any,
                      kept_views: tuple[str, ...]) -> list[Scenario]:
    """``dispatcher/<mode>/<prefix>_<op>/<variant>`` for each custom op, and ``dispatcher/keep/...`` for its view
    ops; ``variants(name)`` reads the schema only (the same for either registration time)."""
    out = [Scenario(f"dispatcher/{mode}/{prefix}_{name}/{variant}", "dispatcher",
                    lambda ctx, name=name, mode=mode, variant=variant: run_op(ctx, op_of(name), mode, variant))
           for name in names for mode in MODES for variant in variants(name)]
    out += [Scenario(f"dispatcher/keep/{prefix}_{name}/0", "dispatcher",
                     lambda ctx, name=name: run_keep(ctx, op_of(name)))
            for name in kept_views]
    return out
