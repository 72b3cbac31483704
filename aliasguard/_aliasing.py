"""Alias correction after ``__torch_dispatch__``, and the alias audit (F4).

After ``import aliasguard`` the result of every ``__torch_dispatch__`` of a
``torch.Tensor`` subclass or of a :class:`~torch.utils._python_dispatch.TorchDispatchMode`
is corrected, in C++, before it goes back to the dispatcher, following the
op's schema:

* view returns (``Tensor(a)``, ``Tensor(a)[]``): an output that is a wrapper
  subclass (placeholder storage) gets its input's storage, keeping its sizes,
  strides and offset; every output shares its input's version counter; a real
  output that does not alias its input raises :class:`AliasingError`;
* write returns (``Tensor(a!)``: in-place and ``out=`` ops): the argument
  object itself is returned;
* returns without alias annotations are left alone.

How the hook is installed: the ``__torch_dispatch__`` found in the class
``__dict__`` of every existing subclass is replaced by a wrapper of the same
kind (classmethod, staticmethod or plain method) that calls it and corrects
its result; ``__init_subclass__`` of ``torch.Tensor`` and ``TorchDispatchMode``
does the same for classes defined later. A ``__torch_dispatch__`` assigned to
a class after its creation, or a subclass whose own ``__init_subclass__`` does
not call ``super().__init_subclass__()``, is not seen.
"""

from __future__ import annotations

import contextlib
import functools
import types
import warnings
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch

from aliasguard import _C
from aliasguard._torch_internals import (
    TorchDispatchMode,
    disabled_torch_dispatch_impl,
    is_tracing_infrastructure,
)

__all__ = [
    "AliasingError",
    "audit",
    "correct_aliasing",
    "is_alias_correction_enabled",
    "set_alias_correction",
]

#: Raised when an op's outputs do not alias its inputs the way its schema
#: says and cannot be made to (a ``RuntimeError``). Carries ``op`` (e.g.
#: ``"aten::view"``), ``return_index`` and ``argument`` (the schema name of
#: the argument involved, or ``None``).
AliasingError: type[RuntimeError] = _C.AliasingError

T = TypeVar("T")

# Set to False on a tensor subclass or mode class to leave its results alone.
_OPT_OUT_ATTRIBUTE = "__aliasguard_fixup__"
# Our wrappers' attribute holding the wrapped function; marks our hooks too.
_WRAPPED_MARK = "__aliasguard_wrapped__"
_HOOK_MARK = "__aliasguard_hook__"

_WRAPPER_ASSIGNMENTS = ("__module__", "__name__", "__qualname__", "__doc__")


def correct_aliasing(func: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: Optional[dict[str, Any]], out: T) -> T:
    """Correct the aliasing of ``out``, the result of ``func(*args, **kwargs)``.

    Same call shape as upstream's
    ``torch.utils._python_dispatch.return_and_correct_aliasing``: call it at
    the end of a ``__torch_dispatch__`` and return what it returns. It works
    whether automatic correction is on or off (it is the explicit form).

    Returns ``out``, except that write returns (in-place and ``out=`` ops) are
    replaced by the argument objects they alias. View outputs are corrected in
    place (see the module docstring).

    Raises:
        AliasingError: an output cannot be made to alias its input (a view
            answered with a copy, an in-place op answered with new memory, an
            output that is another argument); nothing was changed.
        TypeError: ``func`` is not an ``OpOverload`` of a registered operator,
            or ``args``/``kwargs`` are not a tuple/dict.
    """
    return _C._correct_aliasing(func, args, kwargs, out)


def set_alias_correction(enabled: bool) -> bool:
    """Turn automatic alias correction on or off, process-wide.

    Returns the previous setting. Explicit :func:`correct_aliasing` calls and
    :func:`audit` are not affected.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"set_alias_correction(): enabled must be a bool, got {type(enabled).__name__}")
    return _C._set_alias_correction(enabled)


def is_alias_correction_enabled() -> bool:
    """Whether automatic alias correction is on (it is after import)."""
    return _C._is_alias_correction_enabled()


@contextlib.contextmanager
def audit() -> Iterator[None]:
    """Check every op run inside the block against its schema's alias annotations.

    For every op dispatched on this thread (plain tensors, tensor subclasses
    and modes alike, and the backward ops it triggers), after it ran:

    * outputs without alias annotation share memory with no input;
    * view outputs share their input's storage and version counter;
    * in-place and ``out=`` ops return the very argument they wrote;

    and the result of every ``__torch_dispatch__`` is checked the same way
    (after alias correction, when it is on). The first violation raises
    :class:`AliasingError` naming the op, the return and the argument. The
    checks run in C++ (a dispatcher fallback), at a small fraction of the cost
    of ``torch._subclasses.schema_check_mode.SchemaCheckMode``, which also
    compares values to detect mutations; the audit does not.

    Not checked: ``CompositeImplicitAutograd`` ops as a whole (their
    decomposed ops are), empty outputs, and ``aten::_unsafe_view`` (aliases by
    design). Usable as a decorator; nests; restores the previous state on exit.
    """
    previous = _C._set_alias_audit(True)
    try:
        yield
    finally:
        _C._set_alias_audit(previous)


# --- automatic installation ------------------------------------------------


def _wrap_bound(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrapper for a dispatch called with its owner (cls or self) first.

    A C callable that binds like a function (see Note [The corrected
    __torch_dispatch__ wrapper] in python_corrected_dispatch.cpp).
    """
    wrapper = _C._CorrectedDispatch(fn)
    functools.update_wrapper(wrapper, fn, assigned=_WRAPPER_ASSIGNMENTS, updated=())
    return wrapper


def _wrap_static(fn: Callable[..., Any], owner: type) -> Callable[..., Any]:
    """Wrapper for a staticmethod dispatch; the opt-out is read on ``owner``."""
    wrapper = _C._CorrectedDispatch(fn, owner)
    functools.update_wrapper(wrapper, fn, assigned=_WRAPPER_ASSIGNMENTS, updated=())
    return wrapper


def _corrected_descriptor(cls: type, raw: object) -> Optional[object]:
    """The replacement for ``cls.__dict__['__torch_dispatch__']``, or None to keep it."""
    if isinstance(raw, (classmethod, staticmethod)):
        fn = raw.__func__
        if hasattr(fn, _WRAPPED_MARK) or fn is disabled_torch_dispatch_impl:
            return None
        if isinstance(raw, classmethod):
            return classmethod(_wrap_bound(fn))
        return staticmethod(_wrap_static(fn, cls))
    if isinstance(raw, _C._CorrectedDispatch):
        return None
    if isinstance(raw, types.FunctionType):
        return None if hasattr(raw, _WRAPPED_MARK) else _wrap_bound(raw)
    if raw is not disabled_torch_dispatch_impl:
        warnings.warn(
            f"aliasguard: {cls.__module__}.{cls.__qualname__}.__torch_dispatch__ is a "
            f"{type(raw).__name__}, not a function, classmethod or staticmethod; its "
            "results will not be alias-corrected",
            stacklevel=3,
        )
    return None


def _install_on(cls: type) -> bool:
    """Wrap the ``__torch_dispatch__`` defined by ``cls`` itself; True if wrapped."""
    raw = cls.__dict__.get("__torch_dispatch__")
    if raw is None or is_tracing_infrastructure(cls):
        return False
    replacement = _corrected_descriptor(cls, raw)
    if replacement is None:
        return False
    type.__setattr__(cls, "__torch_dispatch__", replacement)
    return True


def _subclasses(root: type) -> Iterator[type]:
    seen: set[type] = set()
    pending = [root]
    while pending:
        sub: type
        for sub in type.__subclasses__(pending.pop()):
            if sub not in seen:
                seen.add(sub)
                pending.append(sub)
                yield sub


def _hook_init_subclass(base: type) -> None:
    """Make ``base.__init_subclass__`` install the correction on new subclasses."""
    current = base.__dict__.get("__init_subclass__")
    if hasattr(getattr(current, "__func__", None), _HOOK_MARK):
        return
    if current is not None:
        previous = current.__func__ if isinstance(current, classmethod) else current

        def call_previous(cls: type, **kwargs: Any) -> None:
            previous(cls, **kwargs)

    else:

        def call_previous(cls: type, **kwargs: Any) -> None:
            super(base, cls).__init_subclass__(**kwargs)  # type: ignore[arg-type]

    def __init_subclass__(cls: type, **kwargs: Any) -> None:  # noqa: N807
        call_previous(cls, **kwargs)
        try:
            _install_on(cls)
        except Exception as error:  # never make a class definition fail
            warnings.warn(
                f"aliasguard: could not install alias correction on {cls.__qualname__}: {error}",
                stacklevel=2,
            )

    setattr(__init_subclass__, _HOOK_MARK, True)
    type.__setattr__(base, "__init_subclass__", classmethod(__init_subclass__))


def _install() -> None:
    """Correct every existing and future tensor subclass and dispatch mode."""
    for root in (torch.Tensor, TorchDispatchMode):
        _hook_init_subclass(root)
        for cls in _subclasses(root):
            _install_on(cls)


_install()
