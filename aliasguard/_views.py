"""Views and version counters: the Python face of the core patch (F1-F3)."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Literal, Optional, TypeVar

import torch

from aliasguard import _C

CreationMetaName = Literal[
    "DEFAULT", "IN_CUSTOM_FUNCTION", "MULTI_OUTPUT_NODE", "NO_GRAD_MODE", "INFERENCE_MODE"
]
T = TypeVar("T", bound=torch.Tensor)


def mark_as_view(
    tensor: T,
    base: torch.Tensor,
    *,
    is_bw_differentiable: bool = True,
    is_fw_differentiable: bool = True,
    view_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    creation_meta: Optional[CreationMetaName] = None,
    alias_storage: bool = False,
) -> T:
    """Turn ``tensor``, in place, into a view of ``base`` and return it.

    This is autograd's ``as_view`` from Python. Afterwards ``tensor._is_view()``
    is true, ``tensor._base`` is ``base`` (or ``base._base`` when ``base`` is
    itself a view), both share one version counter, and gradients flowing into
    ``tensor`` reach ``base`` when ``base`` requires grad.

    Args:
        tensor: the tensor to mark. It must not carry autograd metadata yet
            (no ``requires_grad``, no ``grad_fn``, not already a view) and must
            share ``base``'s storage, unless it is a wrapper subclass whose
            storage is a placeholder, or ``alias_storage`` is true.
        base: the tensor ``tensor`` is a view of.
        is_bw_differentiable: gradients flow from the view to its base.
        is_fw_differentiable: forward-mode tangents are views of the base's.
            With both flags false, only the version counter is shared
            (a non-differentiable view, like ``detach``).
        view_fn: ``base -> view``, used to replay the view (rebuild its
            ``grad_fn`` after an in-place op on the base); defaults to
            ``as_strided`` replay.
        creation_meta: one of ``"DEFAULT"``, ``"IN_CUSTOM_FUNCTION"``,
            ``"MULTI_OUTPUT_NODE"``, ``"NO_GRAD_MODE"``, ``"INFERENCE_MODE"``;
            defaults to what a view op records in the current grad mode.
        alias_storage: first make ``tensor`` use ``base``'s storage, keeping
            its sizes, strides and storage offset (``set_`` semantics).

    Raises:
        TypeError: ``tensor`` or ``base`` is not a tensor, ``view_fn`` is
            not callable, or a flag (``is_bw_differentiable``,
            ``is_fw_differentiable``, ``alias_storage``) is not a ``bool``
            (``None`` and ``0`` are refused, not taken as False).
        RuntimeError: ``tensor`` already has autograd metadata, does not share
            ``base``'s storage, or is (or ``base`` is) an inference tensor.
        ValueError: ``creation_meta`` is not a known name, or not valid text
            (a lone surrogate).

    On error nothing is changed.
    """
    return _C._mark_as_view(
        tensor,
        base,
        is_bw_differentiable=is_bw_differentiable,
        is_fw_differentiable=is_fw_differentiable,
        view_fn=view_fn,
        creation_meta=creation_meta,
        alias_storage=alias_storage,
    )


def shares_version_counter(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` bump and observe one and the same version counter."""
    return _C.shares_version_counter(a, b)


@contextlib.contextmanager
def track_views() -> Iterator[None]:
    """Track views and in-place ops below autograd for the enclosed code.

    Inside ``__torch_dispatch__`` autograd's ``ADInplaceOrView`` kernels are
    skipped, so ``out.view_as(out)`` is a plain alias with its own version
    counter and in-place ops bump nothing. Within ``track_views()`` those
    kernels run again: views are real views (shared counter, ``_base``) and
    in-place ops bump counters. Autograd itself stays off. At top level, where
    the kernels already run, it changes nothing.

    Usable as ``with track_views():`` and as a decorator ``@track_views()``;
    nesting is fine, and the previous state is restored on exit, exceptions
    included.
    """
    was_excluded = _C._enable_view_tracking()
    try:
        yield
    finally:
        _C._restore_view_tracking(was_excluded)
