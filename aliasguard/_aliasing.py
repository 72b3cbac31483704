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
  object itself is returned, also when the handler returned ``None`` or a
  tensor of other sizes (stock ignores what an in-place handler returns);
* a value of a type the schema does not allow (a ``str``) is passed through
  for torch to report, as without aliasguard;
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
import sys
import threading
import types
import warnings
from typing import Any, Callable, Iterator, Optional, TypeVar

import torch

from aliasguard import _C
from aliasguard._report import AuditReport, user_location
from aliasguard._torch_internals import (
    TorchDispatchMode,
    audit_key_set,
    current_dispatch_modes,
    disabled_torch_dispatch_impl,
    functorch_transform_active,
    higher_order_ops,
    is_audit_quiet_infrastructure,
    is_tracing_infrastructure,
)

__all__ = [
    "AliasingError",
    "AuditReport",
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
    replaced by the argument objects they alias (also when ``out`` holds
    ``None`` there, as upstream does). View outputs are corrected in place
    (see the module docstring).

    Raises:
        AliasingError: an output cannot be made to alias its input (a view
            answered with a copy, an in-place op answered with new memory, an
            output that is another argument); nothing was changed.
        TypeError: ``func`` is not an ``OpOverload`` of a registered operator;
            ``args``/``kwargs`` are not a tuple/dict or do not match the op's
            schema (more positional arguments than it has, an unknown or
            repeated keyword); or ``out`` has the wrong type (a view return
            that is not a tensor, a list return that is not a list of
            tensors, a multi-return op's ``out`` that is not a tuple of one
            value per return). Nothing was changed.
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


class _AuditScopes(threading.local):
    """This thread's open audit scopes, innermost last: the report of each (or None: raise)."""

    def __init__(self) -> None:
        self.reports: list[Optional[AuditReport]] = []


_scopes = _AuditScopes()
# Report scopes open on any thread, most recent last: where violations found
# on threads without a scope of their own go (autograd's worker threads run
# the backward of an audited thread with its dispatch state but not its
# Python thread-locals).
_open_reports: list[AuditReport] = []
_open_reports_lock = threading.Lock()


def _infrastructure_active() -> bool:
    """Whether tracing infrastructure (fake, proxy, functional modes; functorch) is running."""
    if any(is_audit_quiet_infrastructure(type(mode)) for mode in current_dispatch_modes()):
        return True
    return functorch_transform_active()


def _on_violation(error: RuntimeError, owner: object, repaired: bool) -> bool:
    """The audit's reporter (see Note [The audit's Python reporter]): True when handled."""
    if _infrastructure_active():
        return True  # see Note [What the audit leaves alone]
    report: Optional[AuditReport]
    if _scopes.reports:
        report = _scopes.reports[-1]
    else:
        with _open_reports_lock:
            report = _open_reports[-1] if _open_reports else None
    if report is None:
        return False
    if owner is None:  # from the fallback, on plain tensors: the innermost mode, if any, else a kernel
        modes = current_dispatch_modes()
        owner = modes[-1] if modes else None
    report.record(error, owner, repaired, location=user_location(sys._getframe(1)))
    return True


@contextlib.contextmanager
def audit(report: Optional[AuditReport] = None, *, kernels: bool = False) -> Iterator[Optional[AuditReport]]:
    """Check every op run inside the block against its schema's alias annotations.

    For every op dispatched on this thread (and the backward ops it
    triggers) that reaches a ``__torch_dispatch__`` (a tensor subclass's or
    an active mode's), after it ran:

    * outputs without alias annotation share memory with no input;
    * view outputs share their input's storage and version counter (and, for
      traceable wrapper subclasses, their inner tensors share memory with
      the input's inner tensors);
    * in-place and ``out=`` ops return the very argument they wrote;

    and the result of every ``__torch_dispatch__`` is checked the same way,
    before and after alias correction. Without ``report``, the first
    violation that correction cannot repair raises :class:`AliasingError`
    naming the op, the return, the argument and the ``kind`` of violation.
    With an :class:`AuditReport`, every violation is recorded there instead
    (repaired ones too, marked as such) and the block runs to its end: the
    report is what the ``with`` statement binds. The checks run in C++ (a
    dispatcher fallback, registered only while some thread audits), at a
    small fraction of the cost of
    ``torch._subclasses.schema_check_mode.SchemaCheckMode``, which also
    compares values to detect mutations; the audit does not.

    Not checked: ``CompositeImplicitAutograd`` ops as a whole (their
    decomposed ops are), empty outputs, ops that alias by design
    (``_unsafe_view``, ``unsafe_split``/``unsafe_chunk``, c10d collectives),
    functorch's wrappers (vmap, grad, functionalize) and tracing
    infrastructure (fake, proxy and functional tensors). Usable as a
    decorator; nests (the innermost scope's report receives); scopes may end
    in any order.

    Args:
        report: where to record violations instead of raising.
        kernels: also check ops that reach no ``__torch_dispatch__``: plain
            tensors' kernels, in C++ or registered with ``torch.library`` on
            a backend or autograd key. Off by default: autograd trusts
            kernels as it trusts torch's own, and
            ``torch.library.opcheck`` is made for testing them. While a
            scope with ``kernels=True`` is open, every audited thread checks
            kernels (backward ops may run on autograd's worker threads).

    Raises:
        RuntimeError: the dispatch key the audit borrows (``DeferredInit``)
            has a fallback registered by someone else.
        TypeError: ``report`` is not an :class:`AuditReport`, or
            ``kernels`` is not a bool.
    """
    if report is not None and not isinstance(report, AuditReport):
        raise TypeError(f"audit(): report must be an aliasguard.AuditReport or None, got {type(report).__name__}")
    if not isinstance(kernels, bool):
        raise TypeError(f"audit(): kernels must be a bool, got {type(kernels).__name__}")
    _C._enter_alias_audit(kernels)
    _higher_order_ops_fall_through()
    _scopes.reports.append(report)
    if report is not None:
        with _open_reports_lock:
            _open_reports.append(report)
    try:
        yield report
    finally:
        _remove_last(_scopes.reports, report)
        if report is not None:
            with _open_reports_lock:
                _remove_last(_open_reports, report)
        _C._exit_alias_audit(kernels)


class _NewThreadAudit:
    """The reports that threads started now are audited into (see ``_audit_new_threads``)."""

    lock = threading.Lock()
    reports: list[AuditReport] = []
    # Captured at import, before anything of ours could have replaced it.
    original: Any = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _audited_bootstrap_inner(thread: threading.Thread) -> None:
    with _NewThreadAudit.lock:
        target = _NewThreadAudit.reports[-1] if _NewThreadAudit.reports else None
    if target is None:
        return _NewThreadAudit.original(thread)
    with audit(report=target):
        return _NewThreadAudit.original(thread)


@contextlib.contextmanager
def _audit_new_threads(report: AuditReport) -> Iterator[None]:
    """Threads started (through ``threading.Thread``) inside the block run under ``audit(report=report)``.

    For the pytest plugin and the CLI. Patches ``Thread._bootstrap_inner``, the
    one place every ``threading.Thread`` passes through, whatever its ``run``;
    nests (the innermost block's report receives).
    """
    with _NewThreadAudit.lock:
        if not _NewThreadAudit.reports:
            threading.Thread._bootstrap_inner = _audited_bootstrap_inner  # type: ignore[attr-defined]
        _NewThreadAudit.reports.append(report)
    try:
        yield
    finally:
        with _NewThreadAudit.lock:
            _remove_last(_NewThreadAudit.reports, report)
            if not _NewThreadAudit.reports:
                threading.Thread._bootstrap_inner = _NewThreadAudit.original  # type: ignore[attr-defined]


def _higher_order_ops_fall_through() -> None:
    """Make every higher-order operator (torch.cond, ...) skip the audit's dispatch key.

    Higher-order operators dispatch in Python, on the highest key of their
    inputs' and the thread's include set, and fail with "could not find
    kernel" on a key they have no rule for, such as the one the audit includes.
    The audit has nothing to check on them anyway: the ops they run are
    dispatched, and audited, one by one.
    """
    audit_key = audit_key_set()
    for op in higher_order_ops():
        op.non_fallthrough_keys = op.non_fallthrough_keys - audit_key


def _remove_last(scopes: list[Any], item: Any) -> None:
    for i in range(len(scopes) - 1, -1, -1):
        if scopes[i] is item:
            del scopes[i]
            return


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
_C._set_alias_audit_reporter(_on_violation)
