"""Selective activation checkpointing that refuses mutated cached tensors (F5).

Selective activation checkpointing (SAC) runs the checkpointed function under
a :class:`~torch.utils._python_dispatch.TorchDispatchMode` that keeps the
outputs of chosen ops; the backward's recompute then takes those outputs from
the cache instead of running the ops again. A cached output is only right if
nothing wrote to its memory in between, so this module tracks every cached
tensor with the version counter it shares with the op's output (F1: ``detach``
below autograd keeps the counter) and raises :class:`CheckpointMutationError`:

* in the forward pass, *before* an in-place or ``out=`` op writes to a tensor
  that shares its counter with a cached one (the cached tensor itself, the
  op output it was taken from, or any view of either), naming the cached op,
  its output index, the mutating op and the source line of the mutation;
* in the recompute, when the version of a cached tensor moved since it was
  cached (a mutation after the forward pass), naming the cached op, its output
  index and both versions.

Usage mirrors :func:`torch.utils.checkpoint.create_selective_checkpoint_contexts`::

    import functools
    import torch
    from aliasguard.checkpoint import checkpoint, create_selective_checkpoint_contexts

    ops_to_save = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default]
    out = torch.utils.checkpoint.checkpoint(
        fn, x, use_reentrant=False,
        context_fn=functools.partial(create_selective_checkpoint_contexts, ops_to_save),
    )
    # or, in one call:
    out = checkpoint(fn, x, policy=ops_to_save)

Differences from torch's version, each for correctness:

* Outputs of view ops and of in-place / ``out=`` ops are never cached, whatever
  the policy says; they are recomputed. A view costs nothing to recompute, and
  a cached one would alias the forward pass's buffers instead of the recomputed
  base: autograd would treat it as a view of memory it does not view (torch's
  version fails :func:`aliasguard.audit` for that reason). An in-place op must
  run again so that the recomputed buffers see its write; its version bump
  also happens after the dispatch mode returns, so a cached copy would always
  look mutated.
* ``aten._unsafe_view`` returns a tensor sharing its input's memory but, by its
  schema, not its version counter (``torch.matmul`` on batched inputs ends
  with one). When its input can be cached that memory is no longer private, so
  the forward mode gives the output its input's counter; otherwise a write to
  the result of ``x @ w`` would slip past the check.

``Tensor.data`` stays the escape hatch: it returns an alias with a fresh
version counter, so writes through it are neither refused nor detected, and
the recompute uses the written values. Use it only when that is what you want.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import warnings
from typing import (
    Any,
    Callable,
    Collection,
    Dict,
    List,
    NoReturn,
    Optional,
    Tuple,
    Union,
)

import torch
import torch.utils.checkpoint as _torch_checkpoint
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten, TreeSpec
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

from aliasguard import _torch_sac_semantics as _semantics

from aliasguard._views import mark_as_view, shares_version_counter

__all__ = [
    "CheckpointMutationError",
    "CheckpointPolicy",
    "PolicyFn",
    "SelectiveCheckpointContext",
    "checkpoint",
    "create_selective_checkpoint_contexts",
]

# policy_fn(ctx, op, *args, **kwargs) -> CheckpointPolicy (a bool is accepted
# too, as torch does: True means MUST_SAVE, False PREFER_RECOMPUTE).
PolicyFn = Callable[..., Union[CheckpointPolicy, bool]]
Op = Union[OpOverload, HigherOrderOperator]


class CheckpointMutationError(RuntimeError):
    """A tensor cached by selective checkpointing was (or was about to be) mutated.

    Raised by the forward pass before the mutating op runs (nothing is
    written), or by the recompute in the backward pass when the cached
    tensor's version moved after the forward pass. The attributes say what
    was found; the fields that do not apply are ``None``.

    Attributes:
        cached_op: the op whose output was cached, e.g. ``"aten.mm.default"``.
        output_index: which output of ``cached_op`` (flattened, in order).
        cached_at: ``"file:line"`` of the user code that ran ``cached_op``.
        mutating_op: the in-place or ``out=`` op (forward pass only).
        mutated_at: ``"file:line"`` of the user code that ran ``mutating_op``.
        expected_version: the version when the output was cached (recompute only).
        found_version: the version found at recompute (recompute only).
    """

    def __init__(
        self,
        message: str,
        *,
        cached_op: str,
        output_index: int,
        cached_at: str,
        mutating_op: Optional[str] = None,
        mutated_at: Optional[str] = None,
        expected_version: Optional[int] = None,
        found_version: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.cached_op = cached_op
        self.output_index = output_index
        self.cached_at = cached_at
        self.mutating_op = mutating_op
        self.mutated_at = mutated_at
        self.expected_version = expected_version
        self.found_version = found_version


# ---------------------------------------------------------------------------
# Where in the user's code an op ran.

_LIBRARY_DIRS: Tuple[str, ...] = (
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
)


def _user_location() -> str:
    """``file:line`` of the innermost frame that is not torch's or aliasguard's.

    Walking frames is cheap (no traceback objects, no source lines read), and
    holding only a string keeps no frame, and so none of its locals, alive.
    """
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_LIBRARY_DIRS):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


# ---------------------------------------------------------------------------
# What an op's schema says about aliasing, computed once per overload.


class _OpAliasInfo:
    __slots__ = ("written_args", "is_view", "is_mutating", "has_effects")

    def __init__(self, op: OpOverload) -> None:
        schema = op._schema
        written: List[Tuple[int, str]] = []
        for position, argument in enumerate(schema.arguments):
            alias = argument.alias_info
            if alias is not None and alias.is_write:
                written.append((position, argument.name))
        # (position, name) of every argument the op writes to; kwarg-only
        # arguments (out=) are found by name.
        self.written_args: Tuple[Tuple[int, str], ...] = tuple(written)
        self.is_mutating = bool(written)
        # An output annotated Tensor(a) (not a!) is a view of an input.
        self.is_view = any(
            ret.alias_info is not None and not ret.alias_info.is_write
            for ret in schema.returns
        )
        # An ordered side effect (aten._print, ...): some torch releases save
        # such ops whatever the policy; see _semantics.
        self.has_effects = _semantics.has_ordered_effects(op)


_alias_info_cache: Dict[Any, Optional[_OpAliasInfo]] = {}


def _alias_info(op: Any) -> Optional[_OpAliasInfo]:
    try:
        return _alias_info_cache[op]
    except KeyError:
        # Higher-order operators have no schema to read: treated as pure.
        info = _OpAliasInfo(op) if isinstance(op, OpOverload) else None
        _alias_info_cache[op] = info
        return info


def _written_tensors(
    info: _OpAliasInfo, args: Tuple[Any, ...], kwargs: Dict[str, Any]
) -> List[torch.Tensor]:
    written: List[torch.Tensor] = []
    for position, name in info.written_args:
        value = args[position] if position < len(args) else kwargs.get(name)
        if isinstance(value, torch.Tensor):
            written.append(value)
        elif isinstance(value, (list, tuple)):  # Tensor(a!)[], e.g. _foreach_*_
            written.extend(t for t in value if isinstance(t, torch.Tensor))
    return written


# Ops that neither mode caches nor counts. The forward and the recompute run a
# different number of detaches (checkpoint's own), and the determinism check
# runs metadata ops in the forward only; counting them would shift the index
# of every later op of the same kind.
_IGNORED_OPS = frozenset(_torch_checkpoint.SAC_IGNORED_OPS)
_SAVE_POLICIES = frozenset({CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE})
_UNSAFE_VIEW = torch.ops.aten._unsafe_view.default


# ---------------------------------------------------------------------------
# The cache shared by the two modes.


class _CacheEntry:
    """The outputs of one op call kept for the recompute."""

    __slots__ = ("op", "tensors", "versions", "spec", "cached_at", "packed", "unpack")

    def __init__(
        self,
        op: Op,
        leaves: List[Any],
        spec: Optional[TreeSpec],
        cached_at: str,
    ) -> None:
        self.op = op
        # Non-tensor leaves (e.g. a scalar output) are kept as they are.
        self.tensors = leaves
        self.versions: List[Optional[int]] = [
            t._version if isinstance(t, torch.Tensor) else None for t in leaves
        ]
        # None when the op returned a single tensor.
        self.spec = spec
        self.cached_at = cached_at
        # With respect_saved_tensors_hooks: what the user's pack hook made of
        # each tensor leaf, handed to their unpack hook at recompute.
        self.packed: Optional[List[Any]] = None
        self.unpack: Optional[Callable[[Any], torch.Tensor]] = None

    def values(self) -> List[Any]:
        if self.packed is None:
            return self.tensors
        unpack = self.unpack
        assert unpack is not None
        return [
            unpack(packed) if isinstance(t, torch.Tensor) else t
            for t, packed in zip(self.tensors, self.packed)
        ]


_RECOMPUTE = object()  # the op runs again in the recompute
_CONSUMED = object()  # the recompute already took this entry

# op -> one slot per call of that op in the forward pass, in order:
# a _CacheEntry, _RECOMPUTE or _CONSUMED.
_Storage = Dict[Any, List[Any]]


def _op_name(op: Any) -> str:
    # str(torch.ops.aten.mm.default) is "aten.mm.default"
    return str(op)


class _CachingMode(_semantics.TorchCachingMode):
    """Forward pass: asks the policy about each op and caches what it says to save."""

    def __init__(
        self,
        policy_fn: PolicyFn,
        storage: _Storage,
        allow_cache_entry_mutation: bool,
    ) -> None:
        # torch's __init__ sets up its own storage; only the mode's is wanted.
        TorchDispatchMode.__init__(self)
        self.policy_fn = policy_fn
        self.storage = storage
        self.allow_cache_entry_mutation = allow_cache_entry_mutation
        # Set by torch's checkpoint() (2.14 on) on instances of its caching
        # mode, which this is; None: torch's default (legacy, warn on hooks).
        self.respect_saved_tensors_hooks: Optional[bool] = None
        # Non-saving policies the running torch overrides for ops with
        # ordered side effects (read once, outside any dispatch).
        self.effect_overrides = _semantics.policies_overridden_for_effects()
        # Every cached tensor with its entry and output index, for the
        # fail-fast check. Only the forward pass needs it, so __exit__ drops it
        # rather than let it pin cached tensors the recompute already consumed.
        self.cached_tensors: List[Tuple[torch.Tensor, _CacheEntry, int]] = []

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.cached_tensors = []
        return TorchDispatchMode.__exit__(self, exc_type, exc_value, traceback)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: Tuple[Any, ...] = (),
        kwargs: Optional[Dict[str, Any]] = None,
    ) -> Any:
        if kwargs is None:
            kwargs = {}
        if func in _IGNORED_OPS:
            return func(*args, **kwargs)

        info = _alias_info(func)
        if (
            info is not None
            and info.is_mutating
            and self.cached_tensors
            and not self.allow_cache_entry_mutation
        ):
            self._refuse_write_to_cached(func, info, args, kwargs)

        out = func(*args, **kwargs)

        if func is _UNSAFE_VIEW:
            self._share_counter_with_input(out, args[0])

        slots = self.storage.get(func)
        if slots is None:
            slots = self.storage[func] = []

        policy = self.policy_fn(
            SelectiveCheckpointContext(is_recompute=False, op_output=out),
            func,
            *args,
            **kwargs,
        )
        if type(policy) is not CheckpointPolicy:
            policy = _coerce_policy(policy, func)
        if (
            info is not None
            and info.has_effects
            and policy in self.effect_overrides
        ):
            # The running torch keeps an effectful op so that its effect
            # happens once, whatever the policy; so do we.
            policy = CheckpointPolicy.MUST_SAVE

        # See the module docstring: views and writes always run again.
        if policy in _SAVE_POLICIES and not (
            info is not None and (info.is_view or info.is_mutating)
        ):
            slots.append(self._cache(func, out))
        else:
            slots.append(_RECOMPUTE)
        return out

    def _cache(self, func: Op, out: Any) -> _CacheEntry:
        # Below autograd, detach keeps the counter (F1): the cached alias sees
        # every later write to the output's memory made through a tracked
        # alias. It is also free of autograd metadata, so the recompute can
        # hand it back as a fresh op output.
        if isinstance(out, torch.Tensor):
            leaves: List[Any] = [out.detach()]
            spec = None
        else:
            raw, spec = tree_flatten(out)
            leaves = [t.detach() if isinstance(t, torch.Tensor) else t for t in raw]
        entry = _CacheEntry(func, leaves, spec, _user_location())
        for index, tensor in enumerate(leaves):
            if isinstance(tensor, torch.Tensor):
                self.cached_tensors.append((tensor, entry, index))
        hooks = self._user_hooks()
        if hooks is not None:
            pack, entry.unpack = hooks
            entry.packed = [pack(t) if isinstance(t, torch.Tensor) else None for t in leaves]
        return entry

    def _user_hooks(self) -> Optional[_semantics.Hooks]:
        """The saved-tensors hooks the cache must go through, as the running torch's SAC decides."""
        hooks = _semantics.current_user_saved_tensors_hooks()
        if hooks is None:
            return None
        respects = self.respect_saved_tensors_hooks
        if respects is None:
            warnings.warn(
                "aliasguard.checkpoint: a saved_tensors_hooks context (e.g. "
                "save_on_cpu) is active around a selective checkpoint. Like "
                f"torch {torch.__version__}'s own, the tensors it caches bypass "
                "those hooks for now; torch will route them through the hooks "
                "in a future release. Pass respect_saved_tensors_hooks=True or "
                "False to checkpoint() to choose and silence this warning.",
                FutureWarning,
                stacklevel=2,
            )
        return hooks if respects else None

    @staticmethod
    def _share_counter_with_input(out: Any, source: Any) -> None:
        if (
            isinstance(out, torch.Tensor)
            and isinstance(source, torch.Tensor)
            and not out.is_inference()
            and torch._C._is_alias_of(out, source)
            and not shares_version_counter(out, source)
        ):
            # A non-differentiable view only shares the counter; the autograd
            # kernel above still records the op as usual.
            mark_as_view(out, source, is_bw_differentiable=False, is_fw_differentiable=False)

    def _refuse_write_to_cached(
        self,
        func: OpOverload,
        info: _OpAliasInfo,
        args: Tuple[Any, ...],
        kwargs: Dict[str, Any],
    ) -> None:
        for written in _written_tensors(info, args, kwargs):
            for cached, entry, index in self.cached_tensors:
                if shares_version_counter(written, cached):
                    _raise_forward_mutation(func, entry, index)


def _coerce_policy(policy: Any, func: Any) -> CheckpointPolicy:
    if isinstance(policy, bool):
        # Accepted for compatibility with torch's policies.
        return CheckpointPolicy.MUST_SAVE if policy else CheckpointPolicy.PREFER_RECOMPUTE
    raise TypeError(
        f"aliasguard.checkpoint: the policy function returned {policy!r} "
        f"(of type {type(policy).__name__}) for {_op_name(func)}; it must return "
        "a torch.utils.checkpoint.CheckpointPolicy (MUST_SAVE, PREFER_SAVE, "
        "MUST_RECOMPUTE or PREFER_RECOMPUTE)"
    )


def _raise_forward_mutation(func: Any, entry: _CacheEntry, index: int) -> NoReturn:
    cached_op = _op_name(entry.op)
    mutating_op = _op_name(func)
    where = _user_location()
    raise CheckpointMutationError(
        f"aliasguard.checkpoint: {mutating_op} at {where} would write to the "
        f"memory of output {index} of {cached_op} (run at {entry.cached_at}), "
        "which selective checkpointing cached for the backward pass. The "
        "recompute would read the written values and compute wrong gradients. "
        f"Clone the tensor before writing to it, have the policy recompute "
        f"{cached_op}, or pass allow_cache_entry_mutation=True if the write is "
        "known to be harmless. Nothing was written.",
        cached_op=cached_op,
        output_index=index,
        cached_at=entry.cached_at,
        mutating_op=mutating_op,
        mutated_at=where,
    )


class _CachedMode(_semantics.TorchCachedMode):
    """Recompute: hands back cached outputs, runs every other op again."""

    def __init__(self, storage: _Storage, allow_cache_entry_mutation: bool) -> None:
        TorchDispatchMode.__init__(self)
        self.storage = storage
        self.allow_cache_entry_mutation = allow_cache_entry_mutation
        self.call_counts: Dict[Any, int] = {}

    def __enter__(self) -> "_CachedMode":
        # A second backward (retain_graph=True) recomputes from the start; it
        # must then find the consumed entries, not "op not found".
        self.call_counts.clear()
        return TorchDispatchMode.__enter__(self)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: Tuple[Any, ...] = (),
        kwargs: Optional[Dict[str, Any]] = None,
    ) -> Any:
        if kwargs is None:
            kwargs = {}
        if func in _IGNORED_OPS:
            return func(*args, **kwargs)

        index = self.call_counts.get(func, 0)
        self.call_counts[func] = index + 1
        slots = self.storage.get(func)
        if slots is None or index >= len(slots):
            raise _torch_checkpoint.CheckpointError(
                f"aliasguard.checkpoint: the recompute ran {_op_name(func)} "
                f"{index + 1} time(s), the forward pass "
                f"{0 if slots is None else len(slots)}. The checkpointed function "
                "must run the same ops in the recompute; it may depend on global "
                "state that changed, or be nondeterministic."
            )
        slot = slots[index]
        if slot is _RECOMPUTE:
            return func(*args, **kwargs)
        if slot is _CONSUMED:
            raise RuntimeError(
                f"aliasguard.checkpoint: the cached output of {_op_name(func)} was "
                "already used by an earlier backward. A region computed under "
                "selective checkpointing can be backpropagated through only once."
            )
        entry: _CacheEntry = slot
        if not self.allow_cache_entry_mutation:
            _check_versions(entry)
        # Let the memory go once the recomputed graph holds the output.
        slots[index] = _CONSUMED
        # The cached tensors carry no autograd metadata (they were detached
        # below autograd), so the autograd kernel above can make them the
        # recomputed op's outputs, history and all.
        values = entry.values()
        if entry.spec is None:
            return values[0]
        return tree_unflatten(values, entry.spec)


def _check_versions(entry: _CacheEntry) -> None:
    for index, (tensor, expected) in enumerate(zip(entry.tensors, entry.versions)):
        if expected is None:
            continue
        found = tensor._version
        if found != expected:
            cached_op = _op_name(entry.op)
            raise CheckpointMutationError(
                f"aliasguard.checkpoint: output {index} of {cached_op} (run at "
                f"{entry.cached_at}), cached by selective checkpointing for the "
                f"backward pass, was modified in place after the forward pass: "
                f"its version was {expected} when cached and is {found} now. "
                "Using it would compute wrong gradients. Do not write to the "
                f"checkpointed region's tensors before backward (clone them), "
                f"have the policy recompute {cached_op}, or pass "
                "allow_cache_entry_mutation=True if the write is known to be "
                "harmless.",
                cached_op=cached_op,
                output_index=index,
                cached_at=entry.cached_at,
                expected_version=expected,
                found_version=found,
            )


# ---------------------------------------------------------------------------
# Public API.


def _policy_from_ops(ops: Collection[Any]) -> PolicyFn:
    for op in ops:
        if not isinstance(op, (OpOverload, HigherOrderOperator)):
            hint = ""
            if isinstance(op, OpOverloadPacket):
                hint = (
                    f" {op} is an overload packet; name one overload, "
                    f"e.g. {op}.default."
                )
            raise ValueError(
                "aliasguard.checkpoint: the list of ops to save must hold "
                f"OpOverloads (e.g. torch.ops.aten.mm.default), got {op!r} of "
                f"type {type(op).__name__}.{hint}"
            )
    ops_to_save = frozenset(ops)

    def save_listed_ops(ctx: SelectiveCheckpointContext, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in ops_to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return save_listed_ops


def _as_policy_fn(policy_fn_or_list: Union[PolicyFn, Collection[Op]]) -> PolicyFn:
    if callable(policy_fn_or_list):
        return policy_fn_or_list
    if isinstance(policy_fn_or_list, (list, tuple, set, frozenset)):
        return _policy_from_ops(policy_fn_or_list)
    raise TypeError(
        "aliasguard.checkpoint: the policy must be a policy function or a list "
        f"of ops to save, got {type(policy_fn_or_list).__name__}"
    )


def create_selective_checkpoint_contexts(
    policy_fn_or_list: Union[PolicyFn, Collection[Op]],
    allow_cache_entry_mutation: bool = False,
) -> Tuple[TorchDispatchMode, TorchDispatchMode]:
    """Build the two contexts of a selective checkpoint; use as ``context_fn``.

    Pass ``functools.partial(create_selective_checkpoint_contexts, policy)``
    as the ``context_fn`` of ``torch.utils.checkpoint.checkpoint(...,
    use_reentrant=False)``. The first context runs the forward pass and caches
    the outputs of the ops the policy saves; the second runs the recompute,
    handing those outputs back instead of running the ops again.

    Args:
        policy_fn_or_list: either
            ``policy_fn(ctx, op, *args, **kwargs) -> CheckpointPolicy``, called
            once per op in the forward pass (``ctx`` is a
            :class:`~torch.utils.checkpoint.SelectiveCheckpointContext`;
            ``ctx.is_recompute`` is False and ``ctx.op_output`` is the op's
            output; a ``bool`` result means ``MUST_SAVE`` / ``PREFER_RECOMPUTE``
            as in torch); or a list (any collection) of
            :class:`~torch._ops.OpOverload` whose outputs to save, everything
            else being recomputed. ``*_SAVE`` caches the output;
            ``*_RECOMPUTE`` and ``*_CPU_OFFLOAD`` (which eager mode does not
            perform, as in torch) recompute it. Outputs of view ops and of
            in-place / ``out=`` ops are always recomputed (see the module
            docstring).
        allow_cache_entry_mutation: turn off both mutation checks (the one in
            the forward pass and the one in the recompute).

    Returns:
        ``(forward_context, recompute_context)``, two ``TorchDispatchMode``.

    Raises:
        TypeError: ``policy_fn_or_list`` is neither callable nor a collection
            of ``OpOverload`` (an ``OpOverloadPacket`` such as
            ``torch.ops.aten.mm`` is refused, naming it).

    The forward context raises :class:`CheckpointMutationError` before an
    in-place or ``out=`` op writes to a cached tensor (or to anything sharing
    its version counter), and ``TypeError`` when the policy returns something
    that is not a ``CheckpointPolicy``. The recompute context raises
    :class:`CheckpointMutationError` when a cached tensor was modified after
    the forward pass.
    """
    policy_fn = _as_policy_fn(policy_fn_or_list)
    storage: _Storage = {}
    return (
        _CachingMode(policy_fn, storage, allow_cache_entry_mutation),
        _CachedMode(storage, allow_cache_entry_mutation),
    )


def checkpoint(
    function: Callable[..., Any],
    *args: Any,
    policy: Union[PolicyFn, Collection[Op]],
    allow_cache_entry_mutation: bool = False,
    respect_saved_tensors_hooks: Optional[bool] = None,
    **kwargs: Any,
) -> Any:
    """Run ``function(*args, **kwargs)`` under a selective activation checkpoint.

    Shorthand for::

        torch.utils.checkpoint.checkpoint(
            function, *args, use_reentrant=False,
            context_fn=functools.partial(
                create_selective_checkpoint_contexts, policy,
                allow_cache_entry_mutation=allow_cache_entry_mutation),
            **kwargs)

    Args:
        function: the checkpointed region.
        *args: its positional arguments.
        policy: a policy function or a list of ops to save, as for
            :func:`create_selective_checkpoint_contexts`.
        allow_cache_entry_mutation: turn off the mutation checks.
        respect_saved_tensors_hooks: as in torch's ``checkpoint`` (torch 2.14
            on): ``True`` routes the cached tensors through the user's
            ``saved_tensors_hooks`` (e.g. ``save_on_cpu``) active at the call,
            ``False`` bypasses them, ``None`` bypasses them with a
            ``FutureWarning`` when such hooks are active. The mutation checks
            still look at the tensors the ops returned.
        **kwargs: ``preserve_rng_state``, ``determinism_check``, ``debug``,
            ``early_stop`` go to ``torch.utils.checkpoint.checkpoint``; the
            rest are keyword arguments of ``function``.

    Returns:
        What ``function`` returns.

    Raises:
        ValueError: ``use_reentrant=True`` (the reentrant checkpoint has no
            dispatch modes, so nothing could be cached), or ``context_fn`` was
            passed (``policy`` builds it), or ``respect_saved_tensors_hooks``
            was given to a torch whose checkpoint has no such option.
        TypeError: see :func:`create_selective_checkpoint_contexts`;
            ``respect_saved_tensors_hooks`` is not a bool or None.
    """
    if kwargs.pop("use_reentrant", False):
        raise ValueError(
            "aliasguard.checkpoint.checkpoint: use_reentrant=True is not "
            "supported; selective checkpointing needs the non-reentrant "
            "checkpoint, whose forward and recompute run under dispatch modes "
            "(the reentrant one runs the forward under no_grad and takes no "
            "context_fn). Drop use_reentrant or pass use_reentrant=False."
        )
    if "context_fn" in kwargs:
        raise ValueError(
            "aliasguard.checkpoint.checkpoint: context_fn cannot be passed, it "
            "is built from policy; call torch.utils.checkpoint.checkpoint with "
            "context_fn=functools.partial(create_selective_checkpoint_contexts, "
            "policy) to combine it with other contexts."
        )
    if respect_saved_tensors_hooks is not None:
        if not isinstance(respect_saved_tensors_hooks, bool):
            raise TypeError(
                "aliasguard.checkpoint.checkpoint: respect_saved_tensors_hooks "
                "must be True, False or None, got "
                f"{type(respect_saved_tensors_hooks).__name__}"
            )
        if not _semantics.supports_respect_saved_tensors_hooks():
            raise ValueError(
                "aliasguard.checkpoint.checkpoint: respect_saved_tensors_hooks "
                f"is not supported with torch {torch.__version__}: its "
                "selective checkpointing always bypasses saved_tensors_hooks "
                "(the option arrived in torch 2.14). Drop the argument."
            )
        kwargs["respect_saved_tensors_hooks"] = respect_saved_tensors_hooks
    # Check the policy here, where the caller's line is in the traceback,
    # rather than inside the forward pass; a list is turned into a function once.
    policy_fn = _as_policy_fn(policy)
    return _torch_checkpoint.checkpoint(
        function,
        *args,
        use_reentrant=False,
        context_fn=functools.partial(
            create_selective_checkpoint_contexts,
            policy_fn,
            allow_cache_entry_mutation=allow_cache_entry_mutation,
        ),
        **kwargs,
    )
