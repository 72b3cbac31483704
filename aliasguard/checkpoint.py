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

A policy function that returns anything but a ``CheckpointPolicy`` or a bool
raises :class:`CheckpointPolicyError` from the op it was asked about, naming
the op, the value and its type.

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

Everything else follows the running torch's SAC, found out at run time (see
:mod:`aliasguard._torch_sac_semantics`): when the policy is called (only in
the forward pass on torch 2.13 and 2.14), ``respect_saved_tensors_hooks``
(torch 2.14 on; refused with a clear error before), and whether ops with
ordered side effects are kept whatever the policy says.

Under ``torch.compile`` the contexts are torch's own (see Note [SAC under
torch.compile] below).

``Tensor.data`` stays the escape hatch: it returns an alias with a fresh
version counter, so writes through it are neither refused nor detected, and
the recompute uses the written values. Use it only when that is what you want.
"""

from __future__ import annotations

# Note [SAC under torch.compile]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# When AOTAutograd traces the checkpointed
# region (``torch.compile``, including ``fullgraph=True``, or export),
# :func:`create_selective_checkpoint_contexts` returns torch's own contexts for
# the same policy. There the policy is not a runtime cache but a tag on every
# traced node that the partitioner honours, so the compiled graph saves exactly
# what torch's SAC saves; the mutation checks do not apply (torch warns that
# the region must not mutate), as there is no cache to mutate. The policy
# function's results are checked as in eager mode (a numpy bool is a bool,
# anything else that is not a policy raises :class:`CheckpointPolicyError`).

import functools
import os
import warnings
from typing import (
    Any,
    Callable,
    Collection,
    Dict,
    FrozenSet,
    List,
    NoReturn,
    Optional,
    Tuple,
    Union,
)

import torch
import torch.utils.checkpoint as _torch_checkpoint
from torch.utils.checkpoint import CheckpointPolicy, SelectiveCheckpointContext

from aliasguard import _C
from aliasguard import _torch_sac_semantics as _semantics
from aliasguard import _install
from aliasguard._arguments import require_bool
from aliasguard._torch_internals import (
    HigherOrderOperator,
    OpOverload,
    OpOverloadPacket,
    TorchDispatchMode,
    checkpoint_error_type,
    tree_flatten,
    tree_map,
    tree_unflatten,
    sac_ignored_ops,
    top_saved_tensors_hooks,
)


__all__ = [
    "CheckpointMutationError",
    "CheckpointPolicyError",
    "CheckpointPolicy",
    "PolicyFn",
    "SelectiveCheckpointContext",
    "checkpoint",
    "create_selective_checkpoint_contexts",
]

# policy_fn(ctx, op, *args, **kwargs) -> CheckpointPolicy (a bool is accepted
# too, as torch does: True means MUST_SAVE, False PREFER_RECOMPUTE; so is a
# numpy bool, which torch would silently take for a recompute).
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


class CheckpointPolicyError(ValueError):
    """A selective checkpoint's policy function returned something that is not a policy.

    Raised in the forward pass, for the first op whose policy is unusable,
    with a message naming the op, the returned value and its type. It is a
    ``ValueError`` on purpose, not a ``TypeError``: torch turns a
    ``TypeError`` raised inside a ``Tensor`` operator (``@``, ``*``, ``+``,
    ...) into ``NotImplemented``, and Python then reports "unsupported operand
    type(s)" instead of this message.

    Attributes:
        op: the op the policy was asked about, e.g. ``"aten.mm.default"``.
        returned: what the policy function returned.
    """

    def __init__(self, message: str, *, op: str, returned: Any) -> None:
        super().__init__(message)
        self.op = op
        self.returned = returned


# ---------------------------------------------------------------------------
# Where in the user's code an op ran.

_LIBRARY_DIRS: Tuple[str, ...] = (
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
)


def _user_location() -> str:
    """``file:line`` of the innermost frame that is not torch's or aliasguard's.

    The walk the C++ modes make (see Note [Walking the Python stack for the
    user's line]); holding only a string keeps no frame, and so none of its
    locals, alive.
    """
    found = _C._innermost_user_frame(list(_LIBRARY_DIRS))
    return "<unknown>" if found is None else f"{found[0]}:{found[1]}"


# ---------------------------------------------------------------------------
# The two modes. Their per-op work is C++ (aliasguard._C; see Note [SAC
# dispatch without Python frames] in python_selective_checkpoint.cpp); the
# functions below are what it calls back for errors and rare cases.


def _op_name(op: Any) -> str:
    # str(torch.ops.aten.mm.default) is "aten.mm.default"
    return str(op)


def _type_name(value: Any) -> str:
    """``bool`` for builtins, ``numpy.bool`` for others: the name a user can look up."""
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _is_numpy_bool(value: Any) -> bool:
    # numpy.bool_ (numpy.bool in numpy 2), matched by name: numpy is not imported for this.
    cls = type(value)
    return cls.__module__ == "numpy" and cls.__name__ in ("bool_", "bool")


def _coerce_policy(policy: Any, func: Any) -> CheckpointPolicy:
    """The ``CheckpointPolicy`` a policy function's result stands for.

    Called from C++ for every result that is not a ``CheckpointPolicy``. A
    Python or numpy bool means ``MUST_SAVE`` / ``PREFER_RECOMPUTE``, as a bool
    does for torch; anything else raises :class:`CheckpointPolicyError`.
    """
    if isinstance(policy, CheckpointPolicy):
        return policy
    if isinstance(policy, bool) or _is_numpy_bool(policy):
        # Accepted for compatibility with torch's policies.
        return CheckpointPolicy.MUST_SAVE if bool(policy) else CheckpointPolicy.PREFER_RECOMPUTE
    op = _op_name(func)
    raise CheckpointPolicyError(
        f"aliasguard.checkpoint: the policy function returned {policy!r} "
        f"(of type {_type_name(policy)}) for {op}; it must return "
        "a torch.utils.checkpoint.CheckpointPolicy (MUST_SAVE, PREFER_SAVE, "
        "MUST_RECOMPUTE or PREFER_RECOMPUTE) or a bool",
        op=op,
        returned=policy,
    )


def _raise_write_refused(mutating_op: str, cached_op: str, index: int, cached_at: str) -> NoReturn:
    """The one message for a write refused before it happened, on either path."""
    where = _user_location()
    raise CheckpointMutationError(
        f"aliasguard.checkpoint: {mutating_op} at {where} would write to the "
        f"memory of output {index} of {cached_op} (run at {cached_at}), "
        "which selective checkpointing cached for the backward pass. The "
        "recompute would read the written values and compute wrong gradients. "
        f"Clone the tensor before writing to it, have the policy recompute "
        f"{cached_op}, or pass allow_cache_entry_mutation=True if the write is "
        "known to be harmless. Nothing was written.",
        cached_op=cached_op,
        output_index=index,
        cached_at=cached_at,
        mutating_op=mutating_op,
        mutated_at=where,
    )


def _raise_version_moved(
    cached_op: str, index: int, cached_at: str, expected: int, found: int, *, when: str
) -> NoReturn:
    """The one message for a cached output found written after the fact, on either path."""
    raise CheckpointMutationError(
        f"aliasguard.checkpoint: output {index} of {cached_op} (run at "
        f"{cached_at}), cached by selective checkpointing for the "
        f"backward pass, was modified in place {when}: "
        f"its version was {expected} when cached and is {found} now. "
        "Using it would compute wrong gradients. Do not write to the "
        f"checkpointed region's tensors before backward (clone them), "
        f"have the policy recompute {cached_op}, or pass "
        "allow_cache_entry_mutation=True if the write is known to be "
        "harmless.",
        cached_op=cached_op,
        output_index=index,
        cached_at=cached_at,
        expected_version=expected,
        found_version=found,
    )


_AFTER_FORWARD = "after the forward pass"


def _raise_forward_mutation(func: Any, cached_op_object: Any, index: int, cached_at: str) -> NoReturn:
    _raise_write_refused(_op_name(func), _op_name(cached_op_object), index, cached_at)


def _raise_recompute_mutation(
    cached_op_object: Any, index: int, cached_at: str, expected: int, found: int
) -> NoReturn:
    _raise_version_moved(_op_name(cached_op_object), index, cached_at, expected, found, when=_AFTER_FORWARD)


def _raise_missing(func: Any, calls: int, forward_calls: int) -> NoReturn:
    _raise_call_count_mismatch(_op_name(func), calls, forward_calls)


def _raise_call_count_mismatch(op_name: str, calls: int, forward_calls: int) -> NoReturn:
    raise checkpoint_error_type()(
        f"aliasguard.checkpoint: the recompute ran {op_name} "
        f"{calls} time(s), the forward pass {forward_calls}. The checkpointed "
        "function must run the same ops in the recompute; it may depend on "
        "global state that changed, or be nondeterministic."
    )


def _raise_consumed(func: Any) -> NoReturn:
    raise RuntimeError(
        f"aliasguard.checkpoint: the cached output of {_op_name(func)} was "
        "already used by an earlier backward. A region computed under "
        "selective checkpointing can be backpropagated through only once."
    )


def _fast_op_name(qualified: str) -> str:
    """``"aten.mm.default"`` for the dispatcher's ``"aten::mm"`` (the name torch prints)."""
    name, _, overload = qualified.partition(".")
    return f"{name.replace('::', '.')}.{overload or 'default'}"


def _raise_fast_path_write(qualified_writing_op: str, qualified_cached_op: str, index: int, cached_at: str) -> NoReturn:
    # See Note [Refusing a write where it happens] in selective_checkpoint_write_guard.h.
    _raise_write_refused(_fast_op_name(qualified_writing_op), _fast_op_name(qualified_cached_op), index, cached_at)


def _raise_fast_path_mutation(
    qualified_op: str, index: int, cached_at: str, expected: int, found: int, in_forward: bool
) -> NoReturn:
    # In the forward phase only a write the guard cannot see gets here; see
    # Note [Refusing a write where it happens].
    when = (
        "later in the checkpointed region, by a write its forward pass could not "
        "refuse (made from another thread, or by an op registered while the region ran; "
        "found when the forward pass ended)"
        if in_forward
        else _AFTER_FORWARD
    )
    _raise_version_moved(_fast_op_name(qualified_op), index, cached_at, expected, found, when=when)


def _raise_fast_path_missing(qualified_op: str, calls: int, forward_calls: int) -> NoReturn:
    _raise_call_count_mismatch(_fast_op_name(qualified_op), calls, forward_calls)


def _raise_fast_path_consumed(qualified_op: str) -> NoReturn:
    raise RuntimeError(
        f"aliasguard.checkpoint: the cached output of {_fast_op_name(qualified_op)} was "
        "already used by an earlier backward. A region computed under "
        "selective checkpointing can be backpropagated through only once."
    )


def _detach_tree(out: Any) -> Tuple[Any, List[Any]]:
    """Detached copy of an output pytree the C++ side does not walk, and its leaves."""
    leaves, spec = tree_flatten(out)
    detached = [t.detach() if isinstance(t, torch.Tensor) else t for t in leaves]
    return tree_unflatten(detached, spec), detached


class _Packed:
    """What a user's pack hook made of one cached tensor."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _pack_value(value: Any, pack: Callable[[torch.Tensor], Any]) -> Any:
    return tree_map(lambda t: _Packed(pack(t)) if isinstance(t, torch.Tensor) else t, value)


def _unpack_value(packed: Any, unpack: Callable[[Any], torch.Tensor]) -> Any:
    return tree_map(lambda p: unpack(p.value) if isinstance(p, _Packed) else p, packed)


def _user_hooks_of(mode: "_CachingMode") -> Optional[_semantics.Hooks]:
    return mode._user_hooks()


_C._sac_configure(
    {
        "ignored_ops": sac_ignored_ops(),
        "op_overload_type": OpOverload,
        "has_effects": _semantics.caches_effectful_op,
        "context_type": SelectiveCheckpointContext,
        "policy_type": CheckpointPolicy,
        "must_save": CheckpointPolicy.MUST_SAVE,
        "prefer_save": CheckpointPolicy.PREFER_SAVE,
        "prefer_recompute": CheckpointPolicy.PREFER_RECOMPUTE,
        "coerce_policy": _coerce_policy,
        "forward_error": _raise_forward_mutation,
        "recompute_error": _raise_recompute_mutation,
        "missing_error": _raise_missing,
        "consumed_error": _raise_consumed,
        "detach_tree": _detach_tree,
        "pack_value": _pack_value,
        "unpack_value": _unpack_value,
        "top_hooks": top_saved_tensors_hooks,
        "user_hooks": _user_hooks_of,
        "library_prefixes": list(_LIBRARY_DIRS),
    }
)


class _CachingMode(_semantics.TorchCachingMode):
    """Forward pass: asks the policy about each op and caches what it says to save.

    ``__torch_dispatch__`` is C++ (set below, after the class is made, so
    that alias correction leaves it alone: it corrects by itself).
    """

    # See Note [SAC modes correct as a wrapped __torch_dispatch__] in
    # python_selective_checkpoint.cpp.
    __aliasguard_track_views__ = False

    def __init__(self, state: Any) -> None:
        # torch's __init__ sets up its own storage; only the mode's is wanted.
        TorchDispatchMode.__init__(self)
        self._sac = state
        # Set by torch's checkpoint() (2.14 on) on instances of its caching
        # mode, which this is; None: torch's default (legacy, warn on hooks).
        self.respect_saved_tensors_hooks: Optional[bool] = None

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        # The fail-fast index is for the forward pass only.
        _C._sac_end_forward(self._sac)
        return TorchDispatchMode.__exit__(self, exc_type, exc_value, traceback)

    def cached_entries(self) -> List[Tuple[Any, Any, str]]:
        """``(op, cached value or None once used, "file:line")`` per cached op call."""
        return _C._sac_entries(self._sac)

    def _user_hooks(self) -> Optional[_semantics.Hooks]:
        """The saved-tensors hooks the cache must go through, as the running torch's SAC decides."""
        if not _semantics.supports_respect_saved_tensors_hooks():
            return None
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


class _CachedMode(_semantics.TorchCachedMode):
    """Recompute: hands back cached outputs, runs every other op again."""

    # See _CachingMode.
    __aliasguard_track_views__ = False

    def __init__(self, state: Any) -> None:
        TorchDispatchMode.__init__(self)
        self._sac = state

    def __enter__(self) -> "_CachedMode":
        # A second backward (retain_graph=True) recomputes from the start; it
        # must then find the consumed entries, not "op not found".
        _C._sac_begin_recompute(self._sac)
        return TorchDispatchMode.__enter__(self)

    def cached_entries(self) -> List[Tuple[Any, Any, str]]:
        """See :meth:`_CachingMode.cached_entries`."""
        return _C._sac_entries(self._sac)


# See the class docstring; instance methods bound like functions.
_CachingMode.__torch_dispatch__ = _C._sac_forward_dispatch
_CachedMode.__torch_dispatch__ = _C._sac_recompute_dispatch


# Note [Higher-order operators in the modes]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# In eager mode a higher-order operator (HOP) reaches a TorchDispatchMode only
# through its ``python_key_table``, which HigherOrderOperator.dispatch looks
# up by the mode's exact type, not by isinstance. torch registers its two SAC
# modes there for the HOPs its SAC treats as one op (in torch 2.13 to 2.15:
# flex_attention, inductor_compiled_code, invoke_subgraph, local_map_hop,
# triton_kernel_wrapper_mutation): the handler pops the mode and calls its
# ``__torch_dispatch__`` with the HOP, so the policy is asked about the HOP,
# its output is cached, and the recompute gets the cached output back. Our
# modes derive from torch's but are other types, so without registrations of
# their own each of those HOPs raised NotImplementedError ("There was no rule
# registered for HigherOrderOperator ...") inside our region, e.g. eager
# flex_attention. Before each region is made,
# _install.prepare_higher_order_ops_for_checkpoint gives our mode types
# torch's handler for every HOP that has one and was made since the last
# region (a module imported later, a user's HOP); uninstall() takes them
# out. A HOP torch's modes have no handler for fails on both alike. The C++
# dispatch then treats the HOP as a pure op, counted per HOP object; torch
# counts inductor_compiled_code per compiled callable
# (torch.utils.checkpoint._sac_storage_key), which differs only when the
# recompute skips a compiled region the forward pass ran.
_HOP_MODE_TYPES = ((_semantics.TorchCachingMode, _CachingMode), (_semantics.TorchCachedMode, _CachedMode))


class _FastForwardContext:
    """Forward pass of the list-policy fast path: opens the region below autograd.

    Not a dispatch mode: the caching is done by C++ kernels at the
    ADInplaceOrView key for the policy's ops (see Note [SAC below autograd] in
    ``selective_checkpoint_fast_path.h``), so the other ops of the region
    never go through Python.
    """

    __slots__ = ("_state", "_ops")

    def __init__(self, state: Any, ops: Dict[str, Op]) -> None:
        self._state = state
        self._ops = ops

    def __enter__(self) -> "_FastForwardContext":
        _C._sac_fast_enter_forward(self._state)
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        # Compares the cached versions: a write inside the region raises here.
        _C._sac_fast_exit_forward(self._state, exc_type is None)

    def cached_entries(self) -> List[Tuple[Any, Any, str]]:
        """``(op, cached outputs or None once used, "file:line")`` per cached op call."""
        entries: List[Tuple[Any, Any, str]] = []
        for name, outputs, site in _C._sac_fast_entries(self._state):
            value: Any = outputs[0] if outputs is not None and len(outputs) == 1 else outputs
            entries.append((self._ops[name], value, site))
        return entries


class _FastRecomputeContext:
    """Recompute of the list-policy fast path: hands cached outputs back below autograd."""

    __slots__ = ("_state", "_forward")

    def __init__(self, state: Any, forward: _FastForwardContext) -> None:
        self._state = state
        self._forward = forward

    def __enter__(self) -> "_FastRecomputeContext":
        _C._sac_fast_enter_recompute(self._state)
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        _C._sac_fast_exit_recompute(self._state)

    def cached_entries(self) -> List[Tuple[Any, Any, str]]:
        """See :meth:`_FastForwardContext.cached_entries`."""
        return self._forward.cached_entries()


def _qualified(op: OpOverload) -> Tuple[str, str]:
    schema = op._schema
    return schema.name, schema.overload_name


# Note [Effectful ops on the fast path]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# From torch 2.15 on, torch's SAC keeps the output of an op with an ordered
# effect (aten._linalg_check_errors, aten._print, ops taking a TorchBind
# object, custom ops registered with an effect; not the raw c10d
# collectives) whenever the policy would recompute it, so that the effect
# happens once. The fast path sees only the ops it has kernels for, so it
# gets kernels for those ops too (_torch_sac_semantics.ops_kept_for_effect
# lists them, by torch's own predicate): with a list policy they are simply
# cached; with a policy function they are cached without asking it when it
# was not given them in ``ops=`` (the modes recompute such ops without asking,
# and torch's override then keeps them), and when it was, its answer is
# overridden as torch overrides it. Higher-order operators with an effect are
# not dispatcher ops and never reach the fast path (in eager mode they reach
# the modes only as torch's own: Note [Higher-order operators in the modes]).
def _with_effects_kept(
    saved_ops: FrozenSet[Op], policy_fn: Optional[PolicyFn], kept_for_effect: FrozenSet[Op]
) -> Tuple[FrozenSet[Op], Optional[PolicyFn]]:
    """``saved_ops`` and ``policy_fn`` for the fast path where torch keeps ``kept_for_effect`` ops.

    See Note [Effectful ops on the fast path].
    """
    overridden = _semantics.policies_overridden_for_effects()
    if policy_fn is None:
        return saved_ops | kept_for_effect, None
    asked = saved_ops
    user_policy = policy_fn

    def keeping_effects(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        if func not in kept_for_effect:
            return user_policy(ctx, func, *args, **kwargs)
        if func not in asked:
            return CheckpointPolicy.MUST_SAVE
        decision = _coerce_policy(user_policy(ctx, func, *args, **kwargs), func)
        return CheckpointPolicy.MUST_SAVE if decision in overridden else decision

    return saved_ops | kept_for_effect, keeping_effects


# Note [The fast path's plan is kept per op set]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A checkpointed block builds its contexts on every call, and on a small
# block the Python that turns the policy's ops into the fast path's list
# (hashing each OpOverload, reading its schema, asking C++ which ops need no
# kernel) was a visible part of the fast path's cost. What it computes
# depends only on the op set and on the operators registered, so it is kept
# per op set and computed again when an operator is registered or removed
# (the registration count the write guard's sweep also follows). The checked
# op lists are kept the same way, by the identities of the ops given (each
# kept frozenset holds its ops, so those identities are not reused). Both
# are bounded: a program passes a handful of op lists. While dynamo traces
# the contexts' construction nothing is kept (a cache write there would be a
# side effect for dynamo to replay).
_PLAN_LIMIT = 64
_plans: Dict[FrozenSet[Op], Optional[Tuple[List[Tuple[str, str, Op]], Dict[str, Op]]]] = {}
_plans_registrations = [-1]


def _fast_path_plan(
    saved_ops: FrozenSet[Op],
) -> Optional[Tuple[List[Tuple[str, str, Op]], Dict[str, Op]]]:
    """The fast path's ``(name, overload, op)`` list and ops by name, or None where it cannot take ``saved_ops``.

    See Note [The fast path's plan is kept per op set].
    """
    registrations = _C._operator_registrations()
    if registrations != _plans_registrations[0]:
        _plans.clear()
        _plans_registrations[0] = registrations
    try:
        return _plans[saved_ops]
    except KeyError:
        pass
    ignored = sac_ignored_ops()
    ops: List[Tuple[str, str, Op]] = []
    by_name: Dict[str, Op] = {}
    plan: Optional[Tuple[List[Tuple[str, str, Op]], Dict[str, Op]]] = (ops, by_name)
    for op in saved_ops:
        if not isinstance(op, OpOverload) or op in ignored:
            plan = None
            break
        name, overload = _qualified(op)
        # Views, in-place and CompositeImplicitAutograd ops are recomputed by
        # the modes too (or never reach them): leaving them out is the same.
        if _C._sac_fast_skip_reason(name, overload):
            continue
        ops.append((name, overload, op))
        by_name[f"{name}.{overload}" if overload else name] = op
    if len(_plans) >= _PLAN_LIMIT:
        _plans.clear()
    _plans[saved_ops] = plan
    return plan


def _fast_path_contexts(
    saved_ops: FrozenSet[Op],
    allow_cache_entry_mutation: bool,
    policy_fn: Optional[PolicyFn] = None,
) -> Optional[Tuple[_FastForwardContext, _FastRecomputeContext]]:
    """The fast path's contexts, or None where only the modes are right.

    ``saved_ops``: the ops whose outputs may be cached; every call of them is
    cached when ``policy_fn`` is None (a list policy), else the calls the
    policy function saves (see Note [Function policies below autograd] in
    ``selective_checkpoint_fast_path.h``).

    On a torch whose SAC keeps effectful ops' outputs whatever a recomputing
    policy says (2.15 on), those ops join the fast path's own: see Note
    [Effectful ops on the fast path].

    The modes stay for: higher-order ops in the list, ops SAC ignores in the
    list, user saved-tensors hooks on a torch whose SAC may route its
    cache through them, and a process where the fast path's write guard
    cannot run (another library holds its dispatch key).
    """
    kept_for_effect = _semantics.ops_kept_for_effect()
    if kept_for_effect:
        saved_ops, policy_fn = _with_effects_kept(saved_ops, policy_fn, kept_for_effect)
    if _semantics.supports_respect_saved_tensors_hooks() and _semantics.current_user_saved_tensors_hooks() is not None:
        return None
    unavailable = _C._sac_write_guard_unavailable_reason()
    if unavailable:
        warnings.warn(
            "aliasguard.checkpoint: the fast path cannot refuse a write to a cached tensor where it "
            f"happens in this process ({unavailable}), so this region runs under the dispatch-mode "
            "path instead, which can: every op in it goes through a TorchDispatchMode, as with "
            "torch's own selective checkpointing. Pass fast_path=False to choose the mode path "
            "without this warning.",
            stacklevel=3,
        )
        return None
    higher_order = sorted(op.name() for op in saved_ops if isinstance(op, HigherOrderOperator))
    if higher_order:
        warnings.warn(
            "aliasguard.checkpoint: the ops the policy may save include higher-order "
            f"operator(s) {', '.join(higher_order)}, which the fast path cannot see (they are "
            "not one dispatcher op), so this region runs under the dispatch-mode path instead: "
            "every op in it goes through a TorchDispatchMode, as with torch's own selective "
            "checkpointing, rather than only the listed ops below autograd. Leave them out of "
            "the list where they do not run in eager mode, or pass fast_path=False to choose "
            "the mode path without this warning.",
            stacklevel=3,
        )
        return None
    plan = _fast_path_plan(saved_ops)
    if plan is None:
        return None
    ops, by_name = plan
    # See Note [Higher-order operators in a fast-path region] in _install.py.
    _install.prepare_higher_order_ops_for_checkpoint(_HOP_MODE_TYPES)
    state = _C._sac_fast_new_state(ops, bool(allow_cache_entry_mutation), policy_fn)
    forward = _FastForwardContext(state, by_name)
    return forward, _FastRecomputeContext(state, forward)


# ---------------------------------------------------------------------------
# Public API.


_checked: Dict[Tuple[int, ...], FrozenSet[Op]] = {}


def _checked_ops(ops: Collection[Any]) -> FrozenSet[Op]:
    """``ops`` as a frozenset, each checked to be an op; see Note [The fast path's plan is kept per op set]."""
    # Under dynamo the cache would be a side effect to replay in the graph's
    # bytecode (a frozenset stored into a module's dict): checked afresh.
    compiling = torch.compiler.is_compiling()
    identities = () if compiling else tuple(map(id, ops))
    found = None if compiling else _checked.get(identities)
    if found is not None:
        return found
    for op in ops:
        if not isinstance(op, (OpOverload, HigherOrderOperator)):
            hint = ""
            if isinstance(op, OpOverloadPacket):
                hint = (
                    f" {op} is an overload packet; name one overload, "
                    f"e.g. {op}.default."
                )
            # ValueError, as torch's create_selective_checkpoint_contexts.
            raise ValueError(
                "aliasguard.checkpoint: the list of ops to save must hold "
                f"OpOverloads (e.g. torch.ops.aten.mm.default), got {op!r} of "
                f"type {type(op).__name__}.{hint}"
            )
    checked = frozenset(ops)
    if not compiling:
        if len(_checked) >= _PLAN_LIMIT:
            _checked.clear()
        _checked[identities] = checked
    return checked


def _as_policy(
    policy_fn_or_list: Union[PolicyFn, Collection[Op]],
    ops: Optional[Collection[Op]] = None,
) -> Tuple[Optional[PolicyFn], FrozenSet[Op]]:
    """(None, the ops to save) for a list; (policy function, the ops it may save) for a function.

    A function without ``ops`` may save any op: its op set is empty and it is
    asked for every op (the mode path). With ``ops`` it is asked only for
    those; see :func:`_restricted`.
    """
    if callable(policy_fn_or_list):
        if ops is None:
            return policy_fn_or_list, frozenset()
        if not isinstance(ops, (list, tuple, set, frozenset)):
            raise TypeError(
                "aliasguard.checkpoint: ops must be a list (any collection) of "
                f"OpOverloads, got {type(ops).__name__}"
            )
        return policy_fn_or_list, _checked_ops(ops)
    if isinstance(policy_fn_or_list, (list, tuple, set, frozenset)):
        if ops is not None:
            raise ValueError(
                "aliasguard.checkpoint: ops= names the ops a policy function may "
                "save; a list policy already names them. Pass either a list of "
                "ops, or a policy function with ops=."
            )
        return None, _checked_ops(policy_fn_or_list)
    raise TypeError(
        "aliasguard.checkpoint: the policy must be a policy function or a list "
        f"of ops to save, got {type(policy_fn_or_list).__name__}"
    )


def _restricted(policy_fn: PolicyFn, ops: FrozenSet[Op]) -> PolicyFn:
    """``policy_fn`` asked only for ``ops``; every other op is recomputed.

    What a policy function given ``ops=`` means on every path: the fast path
    registers kernels for those ops alone (see Note [Function policies below
    autograd] in ``selective_checkpoint_fast_path.h``), so the modes and
    torch's own contexts must not ask it about others either.
    """

    @functools.wraps(policy_fn)
    def restricted(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        if func in ops:
            return policy_fn(ctx, func, *args, **kwargs)
        return CheckpointPolicy.PREFER_RECOMPUTE

    return restricted


def _coercing(policy_fn: PolicyFn) -> PolicyFn:
    """``policy_fn`` with its results checked as in eager mode, for torch's own contexts.

    Under tracing torch's caching mode tags each node with what the policy
    returned: a numpy bool would silently mean "recompute" there, and a
    ``None`` would surface from the partitioner, not from the policy.
    """

    @functools.wraps(policy_fn)
    def checked(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return _coerce_policy(policy_fn(ctx, func, *args, **kwargs), func)

    return checked


def _check_flags(function: str, allow_cache_entry_mutation: Any, fast_path: Any) -> None:
    """``TypeError`` for the first flag that is not a Python ``bool``, naming it and its type."""
    if allow_cache_entry_mutation.__class__ is bool and fast_path.__class__ is bool:
        return  # the usual case, on every call of a checkpointed block: no message built
    require_bool(f"aliasguard.checkpoint.{function}", "allow_cache_entry_mutation", allow_cache_entry_mutation)
    require_bool(f"aliasguard.checkpoint.{function}", "fast_path", fast_path)


def create_selective_checkpoint_contexts(
    policy_fn_or_list: Union[PolicyFn, Collection[Op]],
    allow_cache_entry_mutation: bool = False,
    *,
    fast_path: bool = True,
    ops: Optional[Collection[Op]] = None,
) -> Tuple[Any, Any]:
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
        fast_path: for a list policy, or a policy function given ``ops``,
            cache below autograd with C++ kernels for those ops instead of
            two dispatch modes, so that the region's other ops do not go
            through Python (about the cost of a plain checkpoint). The same
            outputs are saved, and a write to a cached tensor in the forward
            pass is refused before it happens, naming both lines, as with
            the modes: only the ops that write an argument are looked at,
            in C++, while the region runs. Ignored for a policy function
            without ``ops``.
        ops: for a policy function only: the ops whose outputs it may save.
            The function is then asked only about calls of these ops (in the
            forward pass, after the op ran, as without ``ops``); every other
            op is recomputed without asking it. This is what lets a policy
            function take the fast path; the meaning is the same on every
            path (with ``fast_path=False`` and under ``torch.compile``).

    Returns:
        ``(forward_context, recompute_context)``: two ``TorchDispatchMode``,
        or for the fast path two plain context managers (which is all
        ``torch.utils.checkpoint.checkpoint`` requires outside
        ``torch.compile``).

    Raises:
        TypeError: ``policy_fn_or_list`` is neither callable nor a
            collection, or ``ops`` is not a collection; or
            ``allow_cache_entry_mutation`` or ``fast_path`` is not a Python
            ``bool`` (the message names the argument and the type given).
        ValueError: the collection (or ``ops``) holds something that is not
            an ``OpOverload`` (an ``OpOverloadPacket`` such as
            ``torch.ops.aten.mm`` is refused, naming it), as torch raises;
            ``ops`` was given with a list policy.

    The forward context raises :class:`CheckpointMutationError` before an
    in-place or ``out=`` op writes to a cached tensor (or to anything sharing
    its version counter), and :class:`CheckpointPolicyError` (a
    ``ValueError``) when the policy function returns something that is not a
    ``CheckpointPolicy`` or a bool (Python or numpy). The recompute context raises
    :class:`CheckpointMutationError` when a cached tensor was modified after
    the forward pass.
    """
    _check_flags(
        "create_selective_checkpoint_contexts()",
        allow_cache_entry_mutation=allow_cache_entry_mutation,
        fast_path=fast_path,
    )
    # It relies on detach keeping the counter, which uninstall() takes back.
    _install.require_installed("aliasguard.checkpoint")
    policy_fn, saved_ops = _as_policy(policy_fn_or_list, ops)
    # Under torch.compile the contexts must be dispatch modes (AOTAutograd
    # reads their graph ids), so a compiled region keeps the modes.
    use_fast_path = fast_path and not _semantics.is_tracing_for_compile() and not torch.compiler.is_compiling()
    if use_fast_path and (policy_fn is None or ops is not None):
        contexts = _fast_path_contexts(saved_ops, allow_cache_entry_mutation, policy_fn)
        if contexts is not None:
            return contexts
    if policy_fn is not None and ops is not None:
        policy_fn, saved_ops = _restricted(policy_fn, saved_ops), frozenset()
    if _semantics.is_tracing_for_compile():
        # See Note [SAC under torch.compile] in the module docstring.
        return _torch_checkpoint.create_selective_checkpoint_contexts(
            _coercing(policy_fn) if policy_fn is not None else list(saved_ops),
            allow_cache_entry_mutation,
        )
    _install.prepare_higher_order_ops_for_checkpoint(_HOP_MODE_TYPES)
    state = _C._sac_new_state(
        policy_fn,
        saved_ops,
        _semantics.policies_overridden_for_effects(),
        bool(allow_cache_entry_mutation),
    )
    return _CachingMode(state), _CachedMode(state)


def checkpoint(
    function: Callable[..., Any],
    *args: Any,
    policy: Union[PolicyFn, Collection[Op]],
    allow_cache_entry_mutation: bool = False,
    respect_saved_tensors_hooks: Optional[bool] = None,
    fast_path: bool = True,
    ops: Optional[Collection[Op]] = None,
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
        fast_path: see :func:`create_selective_checkpoint_contexts`.
        ops: for a policy function, the ops it may save; see
            :func:`create_selective_checkpoint_contexts`.
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
            ``respect_saved_tensors_hooks`` is not a bool or None. Raised
            before anything runs.
        CheckpointPolicyError: the policy function returned something that
            is not a ``CheckpointPolicy`` or a bool, for the op named in the
            message (raised from the op, in the forward pass; a
            ``ValueError``, so it also surfaces from ``@``, ``*``, ``+``).
    """
    # Before anything runs or changes (kwargs included).
    _check_flags(
        "checkpoint()",
        allow_cache_entry_mutation=allow_cache_entry_mutation,
        fast_path=fast_path,
    )
    # It relies on detach keeping the counter, which uninstall() takes back.
    _install.require_installed("aliasguard.checkpoint")
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
                f"{_type_name(respect_saved_tensors_hooks)}"
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
    # rather than inside the forward pass.
    _as_policy(policy, ops)
    return _torch_checkpoint.checkpoint(
        function,
        *args,
        use_reentrant=False,
        context_fn=functools.partial(
            create_selective_checkpoint_contexts,
            policy,
            allow_cache_entry_mutation=allow_cache_entry_mutation,
            fast_path=fast_path and respect_saved_tensors_hooks is None,
            ops=ops,
        ),
        **kwargs,
    )
