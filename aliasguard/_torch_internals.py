"""The one place where aliasguard's Python code reaches torch's private APIs.

Every private torch name the package uses is bound here, each with a Note on
why it is needed and what upstream would offer instead, and :func:`self_test`
runs when the module is first imported: if a torch release renamed, removed or
changed one of them, ``import aliasguard`` fails with an :class:`ImportError`
naming the internal, instead of misbehaving later. The C++ counterpart is
``torch/csrc/utils/torch_internals.h`` (and ``python_torch_internals.h`` for
the CPython side); its self-test runs from here too.

Other modules import the names below from this module, never from torch's
private modules directly.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

import torch

__all__ = [
    "INFRASTRUCTURE_CLASSES",
    "INFRASTRUCTURE_MODULE_PREFIXES",
    "HigherOrderOperator",
    "OpOverload",
    "OpOverloadPacket",
    "TorchDispatchMode",
    "audit_key_set",
    "current_dispatch_modes",
    "disable_current_modes",
    "disable_functorch",
    "sac_respects_saved_tensors_hooks",
    "tree_flatten",
    "tree_leaves",
    "tree_map",
    "tree_unflatten",
    "higher_order_ops",
    "mode_rule",
    "num_higher_order_ops",
    "register_mode_rule",
    "unregister_mode_rule",
    "write_guard_key_set",
    "checkpoint_error_type",
    "current_user_saved_tensors_hooks",
    "disabled_torch_dispatch_impl",
    "has_kernel_for_dispatch_key",
    "effect_candidate_ops",
    "effect_registry_key",
    "has_ordered_effects",
    "sac_caches_effectful_op",
    "is_aot_tracing",
    "is_alias_of",
    "is_audit_quiet_infrastructure",
    "is_tracing_infrastructure",
    "sac_cached_mode_type",
    "sac_caching_mode_type",
    "sac_ignored_ops",
    "sac_probe_saves",
    "self_test",
    "top_saved_tensors_hooks",
]

# Note [TorchDispatchMode]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# torch.utils._python_dispatch is private by name but is the documented home
# of TorchDispatchMode, the base class of every dispatch mode; alias
# correction hooks its __init_subclass__. Upstream: a public re-export
# (torch.utils.python_dispatch) would do.
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

# Note [Operator classes]
# ~~~~~~~~~~~~~~~~~~~~~~~
# torch._ops defines the classes of the `func` a __torch_dispatch__ receives
# (OpOverload), of `torch.ops.aten.add` (OpOverloadPacket) and of higher-order
# operators (HigherOrderOperator, e.g. torch.ops.higher_order.cond).
# aliasguard.checkpoint tells them apart to validate a policy's op list, and
# the audit hooks HigherOrderOperator.__init__ while it is open (see Note
# [Higher-order operators under an audit] in _install.py), which relies on
# every higher-order operator's class running HigherOrderOperator.__init__
# and that __init__ setting `non_fallthrough_keys`. Upstream: the classes are
# documented (torch.library) but not exported from a public module.
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket  # noqa: E402

# Note [Pytree]
# ~~~~~~~~~~~~~
# torch.utils._pytree flattens and rebuilds the nested outputs of an op
# (selective checkpointing detaches and packs each tensor of them) the way
# torch's own dispatch code does; its tree_* functions are torch's stable
# pytree API in all but name. Upstream: torch.utils.pytree is the public
# spelling on newer releases.
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten  # noqa: E402

# Note [Disabled __torch_dispatch__ sentinel]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A class that sets `__torch_dispatch__ = torch._C._disabled_torch_dispatch_impl`
# opts out of Python dispatch (torch.Tensor itself does); there is nothing to
# correct and wrapping it would turn the sentinel into a real dispatch.
# Upstream: a public predicate "does this class define __torch_dispatch__".
disabled_torch_dispatch_impl: Any = getattr(torch._C, "_disabled_torch_dispatch_impl", None)

# Note [Tracing infrastructure is not corrected]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Tracing infrastructure implements aliasing on its own terms (fake tensors
# keep meta storage behind a fake device, functionalization removes aliasing,
# proxy tracing records ops), and torch.compile depends on its exact outputs:
# FakeTensorMode answers aten::lift_fresh of a real tensor with a fake one,
# which must not be given the real tensor's storage. torch has no flag that
# marks such modes, so they are recognised by the module that defines them.
# Selective checkpointing's recompute mode answers ops, views included, with
# tensors cached in the forward pass: by design they alias the forward's
# inputs, not the recomputed ones. Its caching mode is left alone with it: the
# pair answers a recomputed in-place op with the cached tensor, which
# autograd's ADInplaceOrView kernel ignores (it returns the argument), and only
# the cache's version check, tuned to stock's counts inside the caching body,
# turns that into an error; tracked counts (automatic view tracking)
# would turn it into silently wrong gradients. aliasguard.checkpoint
# recomputes in-place ops instead. Upstream: a class attribute (say
# `_is_infra_mode`, which some modes already carry) on every such mode.
INFRASTRUCTURE_MODULE_PREFIXES: Tuple[str, ...] = (
    "torch._subclasses.",
    "torch._functorch.",
    "torch._dynamo.",
    "torch._inductor.",
    "torch._export.",
    "torch.export.",
    "torch._higher_order_ops.",
    "torch._prims",
    "torch.fx.",
)
INFRASTRUCTURE_CLASSES = frozenset(
    {
        "torch.utils.checkpoint._CachedTorchDispatchMode",
        "torch.utils.checkpoint._CachingTorchDispatchMode",
    }
)

# Classes the prefixes above must keep matching: if torch moves one, the
# self-test says so rather than letting correction rewrite its results.
_INFRASTRUCTURE_SAMPLES = (
    "torch._subclasses.fake_tensor.FakeTensorMode",
    "torch._subclasses.functional_tensor.FunctionalTensorMode",
    "torch.fx.experimental.proxy_tensor.ProxyTorchDispatchMode",
)


def is_tracing_infrastructure(cls: type) -> bool:
    """Whether ``cls`` is one of torch's tracing modes/subclasses (see the Note above)."""
    module = getattr(cls, "__module__", "") or ""
    return module.startswith(INFRASTRUCTURE_MODULE_PREFIXES) or (
        f"{module}.{cls.__qualname__}" in INFRASTRUCTURE_CLASSES
    )


def is_audit_quiet_infrastructure(cls: type) -> bool:
    """Whether the audit leaves ops run under ``cls`` (a mode) alone.

    Tracing infrastructure only, by module (see the Note above): selective
    checkpointing's recompute mode, which correction leaves alone, is audited,
    since its cached views are no views of the recomputed inputs.
    """
    module = getattr(cls, "__module__", "") or ""
    return module.startswith(INFRASTRUCTURE_MODULE_PREFIXES)


# Note [Audit context]
# ~~~~~~~~~~~~~~~~~~~~
# The audit's reporter decides, on a violation, who is responsible and
# whether tracing runs: the stack of active dispatch modes
# (torch.utils._python_dispatch._get_current_dispatch_mode_stack); whether a
# functorch transform runs is read in C++ from the dispatch key set (see Note
# [Tracing infrastructure is left alone]). Higher-order operators
# (torch.cond, ...) dispatch in Python on the highest key of the thread's
# include set, so they must be told to fall through the key the audit
# includes: torch._ops._higher_order_ops lists them, and their
# non_fallthrough_keys is the set they consult. Upstream: a public mode-stack
# accessor, and a dedicated audit key that higher-order operators know.
_AUDIT_DISPATCH_KEY = "DeferredInit"  # torch_internals.h: kAuditDispatchKey


def current_dispatch_modes() -> List[Any]:
    """The active dispatch modes, outermost first."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return list(_get_current_dispatch_mode_stack())


def higher_order_ops() -> List[Any]:
    """Every higher-order operator created so far."""
    return list(torch._ops._higher_order_ops.values())


# Note [Eager dispatch inside a trace]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Probing what torch's SAC does runs one op eagerly, possibly while
# torch.compile traces around it: every dispatch mode, infrastructure and
# pre-dispatch modes included, is stashed for the block
# (torch.utils._python_dispatch._disable_current_modes), and functorch's
# layers are switched off (torch._C._DisableFuncTorch). Upstream: a public
# "run this eagerly" guard, or the "what would SAC do" query of Note
# [Probing torch's SAC decision].
def disable_current_modes() -> ContextManager[Any]:
    """Stash every active dispatch mode for the block (see Note [Eager dispatch inside a trace])."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


def disable_functorch() -> ContextManager[Any]:
    """Switch functorch's transforms off for the block (see Note [Eager dispatch inside a trace])."""
    return torch._C._DisableFuncTorch()


def audit_key_set() -> Any:
    """The DispatchKeySet of the key the audit borrows."""
    return torch._C.DispatchKeySet(_AUDIT_DISPATCH_KEY)  # type: ignore[arg-type]  # accepts key names


# The checkpoint fast path's write guard borrows this key and includes it in
# the thread's set while a forward region runs (torch_internals.h: Note [The
# checkpoint write guard's dispatch key]); higher-order operators must fall
# through it as they do through the audit's (see Note [Higher-order operators
# in a fast-path region] in _install.py).
_WRITE_GUARD_DISPATCH_KEY = "AutocastXLA"  # torch_internals.h: kCheckpointWriteGuardDispatchKey


def write_guard_key_set() -> Any:
    """The DispatchKeySet of the key the checkpoint's write guard borrows."""
    return torch._C.DispatchKeySet(_WRITE_GUARD_DISPATCH_KEY)  # type: ignore[arg-type]  # accepts key names


def num_higher_order_ops() -> int:
    """How many higher-order operators were created so far (cheap: no list is made)."""
    return len(torch._ops._higher_order_ops)


# Note [Higher-order operators' mode rules]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A higher-order operator reaches a TorchDispatchMode in eager mode only
# through a rule registered for the mode's exact type, kept in its
# python_key_table (registered with py_impl). aliasguard's checkpoint modes
# take the rules torch registered for its own SAC modes (see Note
# [Higher-order operators in the modes] in checkpoint.py). Upstream: rules
# looked up along the mode's MRO.
def mode_rule(op: Any, mode_type: type) -> Optional[Callable[..., Any]]:
    """The rule ``op`` runs for a dispatch mode of exactly ``mode_type``, or None."""
    rule = op.python_key_table.get(mode_type)
    return rule if callable(rule) else None


def register_mode_rule(op: Any, mode_type: type, rule: Callable[..., Any]) -> None:
    """Make ``rule`` what ``op`` runs for a dispatch mode of exactly ``mode_type``."""
    op.py_impl(mode_type)(rule)


def unregister_mode_rule(op: Any, mode_type: type) -> None:
    """Take back what :func:`register_mode_rule` registered for ``mode_type`` (HOPs cache their lookups)."""
    op.python_key_table.pop(mode_type, None)
    op._dispatch_cache.clear()


# Note [Selective checkpointing internals]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# aliasguard.checkpoint mirrors torch's selective checkpointing and must agree
# with it on which ops neither mode counts (SAC_IGNORED_OPS: the forward and
# the recompute run different numbers of them) and raise the error type
# torch's own recompute raises (CheckpointError), so that callers catching
# torch's error catch ours. Upstream: both are public in spirit (documented in
# torch.utils.checkpoint's docstrings) but not in __all__.
def sac_ignored_ops() -> frozenset[Any]:
    """Ops torch's selective checkpointing neither caches nor counts."""
    import torch.utils.checkpoint as checkpoint

    return frozenset(checkpoint.SAC_IGNORED_OPS)


def checkpoint_error_type() -> type:
    """``torch.utils.checkpoint.CheckpointError``."""
    import torch.utils.checkpoint as checkpoint

    return checkpoint.CheckpointError


# Note [Selective checkpointing modes, hooks and effects]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# aliasguard.checkpoint follows the running torch's SAC (see
# aliasguard/_torch_sac_semantics.py), which needs:
# * torch's two SAC mode classes: ours derive from them, because torch's
#   checkpoint() hands options (respect_saved_tensors_hooks, 2.14 on) only to
#   an instance of its caching mode;
# * the saved-tensors hooks in force: the innermost pair
#   (torch._C._autograd._top_saved_tensors_default_hooks, read per cached op
#   to skip the rest when there are none), and the user's pair behind
#   checkpoint's own (torch.utils.checkpoint._current_user_saved_tensors_hooks,
#   2.14 on; None before, when SAC never routes its cache through hooks);
# * whether AOTAutograd is tracing (torch.utils.checkpoint._is_compiling):
#   then the contexts must be torch's own;
# * whether an op has an ordered side effect
#   (torch._higher_order_ops.effects.has_effects), and which of those SAC
#   caches rather than replays (torch.utils.checkpoint._is_cacheable_effect,
#   2.15 on: not the raw c10d collectives, whose output is no cache boundary;
#   absent before, when every effectful op was treated alike).
# Upstream: the SAC modes would take the options as constructor arguments,
# and the hooks/effects queries are public in spirit (torch.autograd.graph,
# torch.library) but not exported.
def sac_caching_mode_type() -> type:
    """``torch.utils.checkpoint._CachingTorchDispatchMode``."""
    import torch.utils.checkpoint as checkpoint

    return checkpoint._CachingTorchDispatchMode


def sac_cached_mode_type() -> type:
    """``torch.utils.checkpoint._CachedTorchDispatchMode``."""
    import torch.utils.checkpoint as checkpoint

    return checkpoint._CachedTorchDispatchMode


def top_saved_tensors_hooks() -> Optional[Tuple[Callable[..., Any], Callable[..., Any]]]:
    """The innermost saved-tensors hooks (checkpoint's own included), or None."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False)


@functools.lru_cache(maxsize=None)
def sac_respects_saved_tensors_hooks() -> bool:
    """Whether the running torch's ``checkpoint`` takes ``respect_saved_tensors_hooks`` (2.14 on).

    On such a torch ``torch.utils.checkpoint._current_user_saved_tensors_hooks``
    must exist: the self-test requires it, so that a rename fails the import
    instead of silently turning the option off.
    """
    import torch.utils.checkpoint as checkpoint

    return "respect_saved_tensors_hooks" in inspect.signature(checkpoint.checkpoint).parameters


def current_user_saved_tensors_hooks() -> Optional[Tuple[Callable[..., Any], Callable[..., Any]]]:
    """The user's hooks behind checkpoint's own; None when none, or torch predates the notion."""
    if not sac_respects_saved_tensors_hooks():
        return None
    import torch.utils.checkpoint as checkpoint

    return checkpoint._current_user_saved_tensors_hooks()  # type: ignore[attr-defined, unused-ignore]  # 2.14 on


def is_aot_tracing() -> bool:
    """Whether AOTAutograd (torch.compile) or export is tracing right now."""
    import torch.utils.checkpoint as checkpoint

    return bool(checkpoint._is_compiling(None, (), {}))


def has_ordered_effects(op: Any) -> bool:
    """Whether ``op`` has an ordered side effect registered (``aten._print``, ...)."""
    from torch._higher_order_ops.effects import has_effects

    try:
        return bool(has_effects(op))
    except Exception:  # an op torch's effect registry cannot name
        return False


def sac_caches_effectful_op(op: Any) -> bool:
    """Whether the running torch's SAC treats ``op`` as an effectful op whose output it keeps.

    torch 2.15 narrows "effectful" to what its SAC can cache (not the raw
    ``c10d`` collectives); a torch without that predicate treats every op with
    an ordered effect alike. Which policies the keeping overrides is probed
    separately (``_torch_sac_semantics.policies_overridden_for_effects``).
    """
    import torch.utils.checkpoint as checkpoint

    cacheable = getattr(checkpoint, "_is_cacheable_effect", None)
    if cacheable is None:
        return has_ordered_effects(op)
    try:
        return bool(cacheable(op))
    except Exception:  # an op torch's effect registry cannot name
        return False


def effect_registry_key() -> Tuple[int, int]:
    """Changes when an operator is (de)registered or torch's per-op registry gains an entry.

    What ``effect_candidate_ops`` is cached under: operator registrations
    counted by aliasguard's own listener, and the size of
    ``torch._library.simple_registry.singleton._data`` (where effects live).
    """
    from torch._library import simple_registry

    from aliasguard import _C

    return _C._operator_registrations(), len(simple_registry.singleton._data)


def effect_candidate_ops() -> List[Any]:
    """Every registered ``OpOverload`` torch might take as effectful (a superset; torch decides).

    An effect is registered per operator name in torch's per-op registry
    (``torch._library.simple_registry``), or inferred from an argument of a
    TorchBind class type (``torch.ClassType`` in the schema). About 60 ms:
    callers cache it (``_torch_sac_semantics.ops_kept_for_effect``).
    """
    from torch._library import simple_registry

    names = set()
    for schema in torch._C._jit_get_all_schemas():
        if any(isinstance(argument.type, torch.ClassType) for argument in schema.arguments):
            names.add((schema.name, schema.overload_name))
    for qualname in list(simple_registry.singleton._data):
        namespace, _, name = qualname.partition("::")
        if namespace == "higher_order" or not name:
            continue
        name, _, overload = name.partition(".")
        packet = _op_packet(namespace, name)
        overloads = [overload] if overload else (packet.overloads() if packet is not None else [])
        names.update((f"{namespace}::{name}", "" if o == "default" else o) for o in overloads)
    # JIT-only operators (cuda::set_stream) have schemas but no dispatcher entry.
    registered = set(torch._C._dispatch_get_all_op_names())
    ops = []
    for qualified, overload in sorted(names):
        if (f"{qualified}.{overload}" if overload else qualified) not in registered:
            continue
        namespace, _, name = qualified.partition("::")
        packet = _op_packet(namespace, name)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if isinstance(op, OpOverload):
            ops.append(op)
    return ops


def _op_packet(namespace: str, name: str) -> Any:
    """``torch.ops.<namespace>.<name>``, or None where no such operator is registered."""
    try:
        return getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return None


# Note [Probing torch's SAC decision]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Whether torch's SAC keeps an op's output is decided by its caching mode and
# recorded in the storage it shares with the recompute mode:
# `storage[func][index]` is the sentinel `torch.utils.checkpoint._RECOMPUTE`
# when the op will run again, a wrapped output when it is kept. Running one
# op under that mode alone, with every other mode stashed
# (torch.utils._python_dispatch._disable_current_modes) and no autograd
# involved, reads torch's decision without a checkpoint (whose first call
# would import torch._dynamo) and without disturbing an enclosing one.
# Upstream: a public "what would SAC do with this op and policy" query.
def sac_probe_saves(policy_fn: Callable[..., Any], op: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    """Whether torch's own SAC forward mode keeps ``op``'s output under ``policy_fn``."""
    import torch.utils.checkpoint as checkpoint

    forward, _ = checkpoint.create_selective_checkpoint_contexts(policy_fn)
    with disable_current_modes(), forward:
        op(*args, **kwargs)
    slots = forward.storage[op]
    return slots[0] is not checkpoint._RECOMPUTE


# Note [Storage alias test]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# torch._C._is_alias_of(a, b) answers "do a and b share a storage" without
# touching a wrapper subclass's storage() (which raises). Upstream: a public
# Tensor.is_alias_of (it exists in C++ as at::Tensor::is_alias_of).
def is_alias_of(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share a storage."""
    return bool(torch._C._is_alias_of(a, b))  # type: ignore[attr-defined]


# Note [Dispatcher introspection]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The demo shows that detach's CPU kernel is ours; torch exposes the
# dispatcher's tables only through torch._C. Upstream: torch.library
# introspection (torch.library has no "has kernel for key" query).
def has_kernel_for_dispatch_key(op_name: str, key: str) -> bool:
    """Whether the dispatcher has a kernel for ``op_name`` registered at ``key``."""
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op_name, key))


def _resolve(dotted: str) -> Any:
    """The object named ``pkg.module.Attr``; raises if any part is missing."""
    module_name, _, attribute = dotted.rpartition(".")
    return getattr(importlib.import_module(module_name), attribute)


def _key_set_arithmetic_holds() -> bool:
    key = audit_key_set()
    full = torch._C._dispatch_keyset_full()
    without = full - key
    return without != full and (without | key) == full and (without - key) == without


def _higher_order_operator_init_holds() -> bool:
    init = HigherOrderOperator.__dict__.get("__init__")
    if not callable(init) or "non_fallthrough_keys" not in init.__code__.co_names:
        return False
    ops = higher_order_ops()
    return bool(ops) and all(isinstance(op, HigherOrderOperator) for op in ops)


def _pytree_holds() -> bool:
    a, b = torch.zeros(1), torch.ones(1)
    leaves, spec = tree_flatten((a, [b, None]))
    rebuilt = tree_unflatten(leaves, spec)
    mapped = tree_map(lambda t: t + 1 if isinstance(t, torch.Tensor) else t, (a, [b, None]))
    return (
        len(leaves) == 3
        and leaves[0] is a
        and leaves[1] is b
        and rebuilt[0] is a
        and rebuilt[1][0] is b
        and rebuilt[1][1] is None
        and bool(mapped[1][0].eq(2).all())
        and tree_leaves({"x": a})[0] is a
    )


def _disable_current_modes_holds() -> bool:
    # The base class itself: no subclass is made (install() would wrap it).
    with TorchDispatchMode():
        inside = current_dispatch_modes()
        with disable_current_modes():
            stashed = current_dispatch_modes()
    return len(inside) == 1 and stashed == []


def _disable_functorch_holds() -> bool:
    front = torch._C.DispatchKey.FuncTorchDynamicLayerFrontMode
    excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
    before = excluded(front)
    with disable_functorch():
        inside = excluded(front)
    return inside and not before and not excluded(front)


def _check_python_internals() -> List[str]:
    problems: List[str] = []

    def expect(name: str, ok: Callable[[], bool], why: str) -> None:
        try:
            passed = ok()
        except Exception as error:  # a missing module or attribute
            problems.append(f"{name}: {type(error).__name__}: {error}")
            return
        if not passed:
            problems.append(f"{name}: {why}")

    expect(
        "torch._C._disabled_torch_dispatch_impl",
        lambda: callable(torch._C._disabled_torch_dispatch_impl)
        and torch.Tensor.__torch_dispatch__ is torch._C._disabled_torch_dispatch_impl,
        "is no longer torch.Tensor's __torch_dispatch__ sentinel",
    )
    expect(
        "torch.utils._python_dispatch.TorchDispatchMode",
        lambda: isinstance(_resolve("torch.utils._python_dispatch.TorchDispatchMode"), type),
        "is not a class",
    )
    def recognised(dotted: str) -> Callable[[], bool]:
        return lambda: isinstance(_resolve(dotted), type) and is_tracing_infrastructure(_resolve(dotted))

    for dotted in sorted(INFRASTRUCTURE_CLASSES) + list(_INFRASTRUCTURE_SAMPLES):
        expect(dotted, recognised(dotted), "is not recognised as tracing infrastructure any more")
    expect(
        "torch.utils._python_dispatch._get_current_dispatch_mode_stack",
        lambda: current_dispatch_modes() == [],
        "does not return an empty list outside every mode",
    )
    expect(
        "torch._ops._higher_order_ops",
        lambda: isinstance(torch._ops._higher_order_ops, dict)
        and all(hasattr(op, "non_fallthrough_keys") for op in higher_order_ops()),
        "is no longer a dict of higher-order operators with non_fallthrough_keys",
    )
    expect(
        "torch._C.DispatchKeySet('AutocastXLA')",
        lambda: repr(write_guard_key_set()) == "DispatchKeySet(AutocastXLA)",
        "does not name the write guard's key",
    )
    expect(
        "HigherOrderOperator.python_key_table / py_impl",
        lambda: all(
            isinstance(op.python_key_table, dict) and callable(op.py_impl) and isinstance(op._dispatch_cache, dict)
            for op in higher_order_ops()
        ),
        "no longer hold a higher-order operator's rules per mode type, or its cache of lookups",
    )
    expect(
        "torch._C.DispatchKeySet('DeferredInit')",
        lambda: repr(audit_key_set()) == "DispatchKeySet(DeferredInit)"
        and _key_set_arithmetic_holds(),
        "does not name the key the audit borrows, or its - / | / == do not remove, add and compare keys",
    )
    expect(
        "torch._ops.HigherOrderOperator.__init__",
        _higher_order_operator_init_holds,
        "is not a function of HigherOrderOperator itself that sets non_fallthrough_keys, "
        "or a higher-order operator is not a HigherOrderOperator",
    )
    expect(
        "torch._ops.OpOverload / OpOverloadPacket",
        lambda: isinstance(torch.ops.aten.add.Tensor, OpOverload)
        and isinstance(torch.ops.aten.add, OpOverloadPacket)
        and not isinstance(torch.ops.aten.add, OpOverload),
        "no longer the classes of torch.ops.aten.add.Tensor / torch.ops.aten.add",
    )
    expect(
        "torch.utils._pytree.tree_flatten / tree_unflatten / tree_map / tree_leaves",
        _pytree_holds,
        "does not flatten, rebuild and map a (tensor, [tensor, None]) output",
    )
    expect(
        "torch.utils._python_dispatch._disable_current_modes",
        _disable_current_modes_holds,
        "does not stash an active mode for its block",
    )
    expect(
        "torch._C._DisableFuncTorch",
        _disable_functorch_holds,
        "does not exclude functorch's dynamic-layer key in its block",
    )
    expect(
        "torch.utils.checkpoint._current_user_saved_tensors_hooks",
        lambda: not sac_respects_saved_tensors_hooks() or current_user_saved_tensors_hooks() is None,
        "is not callable, or reports hooks where none are set, although torch's checkpoint "
        "takes respect_saved_tensors_hooks",
    )
    expect(
        "threading.Thread._bootstrap_inner",
        lambda: callable(getattr(threading.Thread, "_bootstrap_inner", None)),
        "is gone: threads started inside an audited test can no longer be audited",
    )
    expect(
        "torch.utils.checkpoint.SAC_IGNORED_OPS",
        lambda: torch.ops.aten.detach.default in sac_ignored_ops(),
        "no longer lists aten.detach.default",
    )
    expect(
        "torch.utils.checkpoint.CheckpointError",
        lambda: issubclass(checkpoint_error_type(), RuntimeError),
        "is not a RuntimeError",
    )
    expect(
        "torch.utils.checkpoint._CachingTorchDispatchMode",
        lambda: issubclass(sac_caching_mode_type(), TorchDispatchMode),
        "is not a TorchDispatchMode",
    )
    expect(
        "torch.utils.checkpoint._CachedTorchDispatchMode",
        lambda: issubclass(sac_cached_mode_type(), TorchDispatchMode),
        "is not a TorchDispatchMode",
    )
    expect(
        "torch._C._autograd._top_saved_tensors_default_hooks",
        lambda: top_saved_tensors_hooks() is None,
        "reports hooks where none are set",
    )
    expect(
        "torch.utils.checkpoint._is_compiling",
        lambda: is_aot_tracing() is False,
        "says eager code is being traced",
    )
    expect(
        "torch._higher_order_ops.effects.has_effects",
        lambda: has_ordered_effects(torch.ops.aten._linalg_check_errors.default)
        and not has_ordered_effects(torch.ops.aten.mm.default),
        "no longer knows aten._linalg_check_errors as effectful",
    )
    expect(
        "torch.utils.checkpoint._is_cacheable_effect",
        lambda: sac_caches_effectful_op(torch.ops.aten._linalg_check_errors.default)
        and not sac_caches_effectful_op(torch.ops.aten.mm.default),
        "does not take aten._linalg_check_errors as an effectful op SAC caches",
    )
    expect(
        "torch._library.simple_registry.singleton._data / torch._C._jit_get_all_schemas",
        _effect_registry_holds,
        "no longer holds aten::_linalg_check_errors's effect by name, or schemas no longer list "
        "their arguments' types",
    )
    # Structure only: running an op under torch's SAC mode imports
    # torch._dynamo (seconds), which import must not pay; the probe itself
    # runs on first use of aliasguard.checkpoint, after torch's checkpoint
    # has imported it anyway.
    expect(
        "torch.utils.checkpoint._RECOMPUTE",
        lambda: hasattr(sac_caching_mode_type()(None, {}), "storage")
        and hasattr(importlib.import_module("torch.utils.checkpoint"), "_RECOMPUTE"),
        "is gone, or torch's SAC forward mode keeps no storage",
    )
    expect(
        "torch._C._is_alias_of",
        lambda: (lambda t: is_alias_of(t, t[:1]) and not is_alias_of(t, t.clone()))(torch.ones(2)),
        "does not tell a view from a copy",
    )
    expect(
        "torch._C._dispatch_has_kernel_for_dispatch_key",
        lambda: has_kernel_for_dispatch_key("aten::add.Tensor", "CPU")
        and not has_kernel_for_dispatch_key("aten::add.Tensor", _AUDIT_DISPATCH_KEY),
        "gives wrong answers for aten::add.Tensor",
    )
    return problems


def _effect_registry_holds() -> bool:
    # Structure only (the full scan of effect_candidate_ops takes ~60 ms).
    import torch._higher_order_ops.effects  # noqa: F401  (registers aten's effects)
    from torch._library import simple_registry

    entry = simple_registry.singleton._data.get("aten::_linalg_check_errors")
    schema = torch.ops.aten._linalg_check_errors.default._schema
    return (
        isinstance(simple_registry.singleton._data, dict)
        and entry is not None
        and entry.effect.effect is not None
        and callable(torch._C._jit_get_all_schemas)
        and all(hasattr(argument, "type") for argument in schema.arguments)
    )


def _check_cpp_internals() -> List[str]:
    from aliasguard import _C

    return list(_C._torch_internals_self_test())


def self_test(extra: Optional[List[str]] = None) -> None:
    """Check every torch internal aliasguard relies on; ImportError naming each that changed."""
    problems = _check_python_internals() + _check_cpp_internals() + list(extra or [])
    if problems:
        raise ImportError(
            f"aliasguard cannot run on torch {torch.__version__}: torch internals it "
            "relies on have changed:\n  " + "\n  ".join(problems)
        )


self_test()
