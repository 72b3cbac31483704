"""What the running torch's selective checkpointing does, found out at run time.

``aliasguard.checkpoint`` follows the semantics of the torch it runs on, and
those move between releases: torch 2.14 added ``respect_saved_tensors_hooks``
(tensors SAC caches may go through the user's ``saved_tensors_hooks``), and
later releases keep the outputs of ops with ordered side effects whatever the
policy says. Each difference is detected here by what torch exposes or does,
never by comparing version numbers, so a backport or a new release is
followed without a code change.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Callable, FrozenSet, Iterator, Optional, Tuple

import torch
import torch.utils.checkpoint as _torch_checkpoint
from torch.utils.checkpoint import CheckpointPolicy

from aliasguard import _torch_internals as _internals

__all__ = [
    "TorchCachingMode",
    "TorchCachedMode",
    "current_user_saved_tensors_hooks",
    "caches_effectful_op",
    "has_ordered_effects",
    "is_tracing_for_compile",
    "ops_kept_for_effect",
    "policies_overridden_for_effects",
    "supports_respect_saved_tensors_hooks",
]

# torch's own SAC modes. Our modes derive from them so that torch's
# checkpoint() hands them the options it hands its own (it sets
# ``respect_saved_tensors_hooks`` on an instance of its caching mode).
TorchCachingMode: type = _internals.sac_caching_mode_type()
TorchCachedMode: type = _internals.sac_cached_mode_type()

Hooks = Tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]]


@functools.lru_cache(maxsize=None)
def supports_respect_saved_tensors_hooks() -> bool:
    """Whether ``torch.utils.checkpoint.checkpoint`` takes ``respect_saved_tensors_hooks``."""
    return "respect_saved_tensors_hooks" in inspect.signature(_torch_checkpoint.checkpoint).parameters


def current_user_saved_tensors_hooks() -> Optional[Hooks]:
    """The user's ``(pack, unpack)`` in effect here, skipping checkpoint's own hooks.

    None when there is none, or when the running torch has no notion of
    routing SAC's cache through them.
    """
    return _internals.current_user_saved_tensors_hooks()


def has_ordered_effects(op: Any) -> bool:
    """Whether ``op`` has an ordered side effect registered (e.g. ``aten._print``)."""
    return _internals.has_ordered_effects(op)


def caches_effectful_op(op: Any) -> bool:
    """Whether the running torch's SAC keeps ``op``'s output for its effect, where a policy overrides.

    Every op with an ordered effect before torch 2.15; from 2.15 on, those
    but the raw ``c10d`` collectives (their output is an asynchronous work
    handle, no cache boundary).
    """
    return _internals.sac_caches_effectful_op(op)


_NON_SAVING_POLICIES = (
    CheckpointPolicy.PREFER_RECOMPUTE,
    CheckpointPolicy.MUST_RECOMPUTE,
    CheckpointPolicy.PREFER_CPU_OFFLOAD,
    CheckpointPolicy.MUST_CPU_OFFLOAD,
)


# Note [Probing outside any trace]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The probe runs once per process, on the first selective checkpoint, and
# that may be inside torch.compile: AOTAutograd calls the context_fn while it
# traces the checkpointed region, with its fake, proxy and functional modes
# (and possibly functorch transforms) active. A tensor made there would be a
# FunctionalTensor or a fake, and running torch's caching mode on it outside
# its mode fails ("Attempting to use FunctionalTensor on its own"). So the
# probe's tensor is made, and its op run, with every dispatch mode stashed
# (infra and pre-dispatch modes included) and functorch's layers off: what it
# sees is what eager torch does, whatever is tracing around it. Upstream: the
# public "what would SAC do" query of Note [Probing torch's SAC decision]
# would answer without running an op.
@contextlib.contextmanager
def _outside_tracing() -> Iterator[None]:
    """Eager dispatch for the probe: no dispatch mode, no functorch transform."""
    with _internals.disable_current_modes(), _internals.disable_functorch():
        yield


def _torch_sac_keeps_effectful_op(policy: CheckpointPolicy) -> bool:
    """Whether torch's own SAC keeps an op with an ordered side effect under ``policy``.

    ``aten._linalg_check_errors`` is registered with an ordered effect by
    every supported torch and does nothing for an all-zero ``info``. See
    Note [Probing torch's SAC decision] in _torch_internals.py and
    Note [Probing outside any trace] above.
    """
    op = torch.ops.aten._linalg_check_errors.default
    with _outside_tracing():
        info = torch.zeros((), dtype=torch.int32)
        return _internals.sac_probe_saves(
            lambda ctx, func, *args, **kwargs: policy, op, (info, "aliasguard probe"), {"is_matrix": False}
        )


@functools.lru_cache(maxsize=None)
def policies_overridden_for_effects() -> FrozenSet[CheckpointPolicy]:
    """The non-saving policies under which the running torch still saves an effectful op.

    Empty for torch 2.13 and 2.14 (their SAC replays such ops in the
    recompute); later releases keep them so the effect happens once.
    Probed on the first call (the first selective checkpoint of the
    process), eagerly even under ``torch.compile``; not at import, because
    running torch's SAC mode once imports ``torch._dynamo`` (about a second).
    """
    return frozenset(policy for policy in _NON_SAVING_POLICIES if _torch_sac_keeps_effectful_op(policy))


# (key the set was computed under, the set); see ops_kept_for_effect.
_kept_for_effect: Tuple[Any, FrozenSet[Any]] = (None, frozenset())


def ops_kept_for_effect() -> FrozenSet[Any]:
    """The ops whose outputs the running torch's SAC keeps for their effect where a policy recomputes.

    Empty where no policy is overridden for effects (torch 2.13, 2.14).
    Otherwise every registered ``OpOverload`` that torch's own predicate takes
    as an effectful op SAC caches (``caches_effectful_op``), computed again
    only when an operator is registered or deregistered, or an op's effect
    entry is created (an effect registered for an op whose entry existed
    already, after this was computed, is not seen until then). See Note
    [Effectful ops on the fast path] in ``checkpoint.py``.
    """
    global _kept_for_effect
    if not policies_overridden_for_effects():
        return frozenset()
    key, kept = _kept_for_effect
    if key != _internals.effect_registry_key():
        kept = frozenset(op for op in _internals.effect_candidate_ops() if caches_effectful_op(op))
        # After the scan: asking for an op's effect creates its registry entry.
        _kept_for_effect = (_internals.effect_registry_key(), kept)
    return kept


def is_tracing_for_compile() -> bool:
    """Whether AOTAutograd (torch.compile) or export is tracing right now.

    Then the forward and recompute contexts must be torch's own: under
    tracing its caching mode tags each traced node with the policy, and the
    partitioner, not a runtime cache, decides what is saved.
    """
    return _internals.is_aot_tracing()
