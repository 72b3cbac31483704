"""Views and version counters: the Python face of the core patch (F1-F3)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Literal, Optional, TypeVar, cast

import torch

from aliasguard import _C
from aliasguard._arguments import SingleUseScope

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


def track_views() -> "_TrackViews":
    """Track views and in-place ops below autograd for the enclosed code.

    Inside ``__torch_dispatch__`` autograd's ``ADInplaceOrView`` kernels are
    skipped, so ``out.view_as(out)`` is a plain alias with its own version
    counter and in-place ops bump nothing. Within ``track_views()`` those
    kernels run again: views are real views (shared counter, ``_base``) and
    in-place ops bump counters. Autograd itself stays off. At top level, where
    the kernels already run, it changes nothing.

    Usable as ``with track_views():`` and as a decorator ``@track_views()``;
    nesting is fine, and the previous state is restored on exit, exceptions
    included. The object returned is used once: ``with`` it once, or
    decorate with it (each call then opens a scope of its own). Entering
    waits while :func:`aliasguard.uninstall` runs on another thread (see
    Note [Installing and uninstalling while bodies run] in
    ``torch/csrc/utils/running_bodies.h``).

    Raises:
        RuntimeError: this object was entered before (create a new
            ``track_views()`` per ``with`` block), or its ``__exit__`` is
            called without a matching ``__enter__``, twice, or on another
            thread than the one that entered it.
    """
    return _TrackViews()


F = TypeVar("F", bound=Callable[..., Any])



class _TrackViews:
    """One :func:`track_views` scope: a context manager used once, or a decorator."""

    __slots__ = ("_uses", "_was_excluded")

    def __init__(self) -> None:
        self._uses = SingleUseScope("track_views", "a")
        self._was_excluded = False

    def __enter__(self) -> None:
        self._uses.check_enter()
        self._was_excluded = _C._enable_view_tracking()
        self._uses.entered()

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self._uses.check_exit()
        self._uses.ended()
        _C._restore_view_tracking(self._was_excluded)

    def __call__(self, func: F) -> F:
        """Decorate ``func``: each call runs in a new tracked scope."""

        @functools.wraps(func)
        def tracked(*args: Any, **kwargs: Any) -> Any:
            with _TrackViews():
                return func(*args, **kwargs)

        return cast(F, tracked)
