"""Views made inside ``__torch_dispatch__`` are tracked automatically.

After ``import aliasguard`` every ``__torch_dispatch__`` that alias correction
wraps (see :mod:`aliasguard._aliasing`) runs with autograd's
``ADInplaceOrView`` key re-enabled, so views made in the body are real views
(shared version counter, ``_base``, view replay) and in-place ops in the body
bump counters; autograd itself stays off. An in-place op dispatched through a
mode or subclass still bumps its arguments once, as without one, and a view
the body returns comes back as a view of the op's input. All of it is done in
C++ by the wrapper (Note [Tracked __torch_dispatch__ bodies] in
``torch/csrc/utils/python_alias_correction.cpp``).

Opting out: ``__aliasguard_track_views__ = False`` on a class (read at each
call, inherited, re-enabled by ``True`` on a subclass), or
:func:`set_view_tracking` process-wide. Turning alias correction off (for a
class or process-wide) turns automatic tracking off as well: the correction is
what hands tracked views back to autograd.
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar, cast

from aliasguard import _C
from aliasguard._arguments import require_bool

__all__ = ["is_view_tracking_enabled", "set_view_tracking", "with_tracking"]

R = TypeVar("R")


def set_view_tracking(enabled: bool) -> bool:
    """Turn automatic view tracking in ``__torch_dispatch__`` on or off, process-wide.

    Returns the previous setting. :func:`aliasguard.track_views` and
    :func:`with_tracking` keep working either way.

    Raises:
        TypeError: ``enabled`` is not a Python ``bool`` (a numpy bool, ``0``
            or ``None`` included); the setting is unchanged.
    """
    require_bool("set_view_tracking()", "enabled", enabled)
    return _C._set_automatic_view_tracking(enabled)


def is_view_tracking_enabled() -> bool:
    """Whether automatic view tracking is on (it is after import)."""
    return _C._is_automatic_view_tracking_enabled()


def with_tracking(op: Callable[..., R]) -> Callable[..., R]:
    """``op`` as a callable that runs tracked: ``with_tracking(op)(*args, **kwargs)``.

    Calls ``op(*args, **kwargs)`` with ``ADInplaceOrView`` re-enabled for that
    one call only, so the views it makes are real views and its in-place
    writes bump counters, while nothing else in the body (a call into a
    backend library, say) runs with the key enabled. For code whose class opts
    out of automatic tracking. The call goes through C++: no Python frame is
    added. While :func:`aliasguard.uninstall` runs on another thread, the call
    waits for it (Note [Installing and uninstalling while bodies run] in
    ``torch/csrc/utils/running_bodies.h``).

    Raises:
        TypeError: ``op`` is not callable.
    """
    if not callable(op):
        raise TypeError(f"with_tracking(): op must be callable, got {type(op).__name__}")
    tracked = functools.partial(_C._call_tracked, op)
    tracked.__wrapped__ = op  # type: ignore[attr-defined]
    tracked.__doc__ = getattr(op, "__doc__", None)
    return cast(Callable[..., R], tracked)
