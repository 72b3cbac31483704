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

How the hook is installed (and uninstalled) is :mod:`aliasguard._install`'s
business: the ``__torch_dispatch__`` found in the class ``__dict__`` of every
existing subclass is replaced by a wrapper of the same kind (classmethod,
staticmethod or plain method) that calls it and corrects its result;
``__init_subclass__`` of ``torch.Tensor`` and ``TorchDispatchMode`` does the
same for classes defined later. A ``__torch_dispatch__`` assigned to a class
after its creation, or a subclass whose own ``__init_subclass__`` does not
call ``super().__init_subclass__()``, is not seen.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator, List, Optional, TypeVar, cast

from aliasguard import _C, _install
from aliasguard._arguments import SingleUseScope, require_bool, type_name
from aliasguard._install import install_on as _install_on  # noqa: F401  (tests use this name)
from aliasguard._report import AuditReport, user_location
from aliasguard._torch_internals import (
    OpOverload,
    current_dispatch_modes,
    is_audit_quiet_infrastructure,
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


def correct_aliasing(func: OpOverload, args: tuple[Any, ...], kwargs: Optional[dict[str, Any]], out: T) -> T:
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

    Raises:
        TypeError: ``enabled`` is not a Python ``bool`` (a numpy bool, ``0``
            or ``None`` included); the setting is unchanged.
    """
    require_bool("set_alias_correction()", "enabled", enabled)
    return _C._set_alias_correction(enabled)


def is_alias_correction_enabled() -> bool:
    """Whether automatic alias correction is on (it is after import)."""
    return _C._is_alias_correction_enabled()


class _Scope:
    """One open audit scope: its identity, and its report (None: raise)."""

    __slots__ = ("report",)

    def __init__(self, report: Optional[AuditReport]) -> None:
        self.report = report


class _AuditScopes(threading.local):
    """This thread's open audit scopes, innermost last."""

    def __init__(self) -> None:
        self.stack: List[_Scope] = []


_scopes = _AuditScopes()
# Report scopes open on any thread, most recent last: where violations found
# on threads without a scope of their own go (autograd's worker threads run
# the backward of an audited thread with its dispatch state but not its
# Python thread-locals).
_open_reports: List[_Scope] = []
_open_reports_lock = threading.Lock()


def _infrastructure_active() -> bool:
    """Whether tracing infrastructure (fake, proxy, functional modes; functorch) is running."""
    if any(is_audit_quiet_infrastructure(type(mode)) for mode in current_dispatch_modes()):
        return True
    return _C._functorch_transform_active()


def _on_violation(error: RuntimeError, owner: object, repaired: bool) -> bool:
    """The audit's reporter (see Note [The audit's Python reporter]): True when handled."""
    if _infrastructure_active():
        return True  # see Note [What the audit leaves alone]
    report: Optional[AuditReport]
    if _scopes.stack:
        report = _scopes.stack[-1].report
    else:
        with _open_reports_lock:
            report = _open_reports[-1].report if _open_reports else None
    if report is None:
        return False
    if owner is None:  # from the fallback, on plain tensors: the innermost mode, if any, else a kernel
        modes = current_dispatch_modes()
        owner = modes[-1] if modes else None
    report.record(error, owner, repaired, location=user_location())
    return True


def audit(report: Optional[AuditReport] = None, *, kernels: bool = False) -> "_Audit":
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

    While any audit is open, on any thread, higher-order operators skip the
    key the audit borrows (see Note [Higher-order operators under an audit]
    in ``aliasguard/_install.py``).

    The object returned is used once: ``with`` it once, or decorate with
    it (each call of the decorated function then opens a scope of its own,
    with the same ``report`` and ``kernels``). A scope ends on the thread
    that entered it.

    Raises:
        TypeError: ``report`` is not an :class:`AuditReport`, or
            ``kernels`` is not a Python ``bool`` (raised by the call, before
            anything is entered).
        RuntimeError: on entering: the dispatch key the audit borrows
            (``DeferredInit``) has a fallback registered by someone else;
            :func:`aliasguard.uninstall` was called (no reporter, no
            correction: call :func:`aliasguard.install` first) or is running
            on another thread; or this object was entered before (create a
            new ``aliasguard.audit()`` per ``with`` block). On exiting: the
            object was never entered, has ended already, or is ended on
            another thread than the one that entered it.
    """
    if report is not None and not isinstance(report, AuditReport):
        raise TypeError(f"audit(): report must be an aliasguard.AuditReport or None, got {type_name(report)}")
    require_bool("audit()", "kernels", kernels)
    return _Audit(report, kernels)


F = TypeVar("F", bound=Callable[..., Any])


class _Audit:
    """One :func:`audit` scope: a context manager used once, or a decorator.

    Class-based rather than a generator so that misuse says what went wrong:
    a second ``with`` on the same object, or ``__exit__`` without
    ``__enter__``, is a ``RuntimeError`` naming the fix, and changes nothing.
    """

    __slots__ = ("_report", "_kernels", "_uses", "_scope")

    def __init__(self, report: Optional[AuditReport], kernels: bool) -> None:
        self._report = report
        self._kernels = kernels
        self._uses = SingleUseScope("audit", "an")
        self._scope: Optional[_Scope] = None

    def __enter__(self) -> Optional[AuditReport]:
        self._uses.check_enter()
        report, kernels = self._report, self._kernels
        scope = _Scope(report)
        # Checked and entered under the install lock, so that an uninstall()
        # on another thread either sees this scope or is seen by it.
        with _install.while_installed("aliasguard.audit()"):
            _C._enter_alias_audit(kernels)
            try:
                _install.enter_higher_order_op_scope()
            except BaseException:
                _C._exit_alias_audit(kernels)
                raise
        _scopes.stack.append(scope)
        if report is not None:
            with _open_reports_lock:
                _open_reports.append(scope)
        self._scope = scope
        self._uses.entered()
        return report

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self._uses.check_exit()
        scope, kernels = self._scope, self._kernels
        assert scope is not None
        self._uses.ended()
        self._scope = None
        _remove(_scopes.stack, scope)
        if scope.report is not None:
            with _open_reports_lock:
                _remove(_open_reports, scope)
        try:
            _install.exit_higher_order_op_scope()
        finally:
            _C._exit_alias_audit(kernels)

    def __call__(self, func: F) -> F:
        """Decorate ``func``: each call runs in a new audit scope with this one's arguments."""
        report, kernels = self._report, self._kernels

        @functools.wraps(func)
        def audited(*args: Any, **kwargs: Any) -> Any:
            with _Audit(report, kernels):
                return func(*args, **kwargs)

        return cast(F, audited)


class _NewThreadAudit:
    """The scopes whose reports threads started now are audited into (see ``_audit_new_threads``)."""

    lock = threading.Lock()
    scopes: List[_Scope] = []
    # threading.Thread._bootstrap_inner as it is without our patch.
    original: Any = _install.original_thread_bootstrap()


def _audited_bootstrap_inner(thread: threading.Thread, original: Callable[[threading.Thread], None]) -> None:
    with _NewThreadAudit.lock:
        target = _NewThreadAudit.scopes[-1].report if _NewThreadAudit.scopes else None
    if target is None or not _install.is_installed():
        return original(thread)
    with audit(report=target):
        return original(thread)


@contextlib.contextmanager
def _audit_new_threads(report: AuditReport) -> Iterator[None]:
    """Threads started (through ``threading.Thread``) inside the block run under ``audit(report=report)``.

    For the pytest plugin and the CLI. Patches ``Thread._bootstrap_inner``
    while open (see :func:`aliasguard._install.patch_thread_bootstrap`);
    nests (the innermost block's report receives); blocks may end in any
    order.
    """
    scope = _Scope(report)
    _install.patch_thread_bootstrap(_audited_bootstrap_inner)
    with _NewThreadAudit.lock:
        _NewThreadAudit.scopes.append(scope)
    try:
        yield
    finally:
        with _NewThreadAudit.lock:
            _remove(_NewThreadAudit.scopes, scope)
        _install.unpatch_thread_bootstrap()


def _remove(scopes: List[_Scope], scope: _Scope) -> None:
    """Remove ``scope`` itself (by identity) from ``scopes``, wherever it is."""
    for i in range(len(scopes) - 1, -1, -1):
        if scopes[i] is scope:
            del scopes[i]
            return
