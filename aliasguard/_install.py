"""Every change aliasguard makes to torch's and Python's global state, and its undoing.

``import aliasguard`` calls :func:`install` once; :func:`uninstall` (public
as ``aliasguard.uninstall``) puts back exactly what was there before. What
:func:`install` changes, and what :func:`uninstall` restores:

* the ``__torch_dispatch__`` in the ``__dict__`` of every subclass of
  ``torch.Tensor`` and ``TorchDispatchMode`` that defines one, existing or
  defined later, is replaced by an alias-correcting wrapper; each class and
  its original descriptor object are recorded, and :func:`uninstall` puts
  that very object back (unless the class has been given another
  ``__torch_dispatch__`` since, which is then left alone);
* ``__init_subclass__`` of ``torch.Tensor`` and ``TorchDispatchMode`` is
  replaced by a hook that wraps new classes; restored afterwards (deleted from
  the class ``__dict__`` if it was not there);
* ``torch.mark_as_view`` is set (restored or deleted afterwards);
* the audit's reporter is set in C++ (unset afterwards);
* alias correction is switched on (off afterwards);
* ``aten::detach``'s kernel for the dense backend keys is registered with
  the dispatcher (the registrations are removed afterwards, leaving the
  table as stock torch has it; see Note [Reversible detach registration] in
  ``DetachKeepVersionCounter.cpp``);
* the kernels that mark views made in tracked bodies, registered on the
  first tracked body, are removed (a later ``track_views()`` registers them
  again). The selective checkpoint's fast-path kernels, registered on the
  first region that names an op, stay: outside a region they are exact
  pass-throughs, and taking them out could fail another thread's dispatch
  (Note [Fast path registrations are kept] in
  ``selective_checkpoint_fast_path.cpp``); so do its write guard's kernels.
  Before a checkpoint region is made, higher-order operators created since
  the last region are prepared for it (:func:`prepare_higher_order_ops_for_checkpoint`):
  the write guard's key is removed from their sets and torch's SAC-mode
  rules are registered for aliasguard's checkpoint modes; both are put back
  (the key) and taken out (the rules).

:func:`uninstall` runs while no ``__torch_dispatch__`` body, ``track_views()``
or ``with_tracking()`` scope runs on any thread: it waits for those running
on other threads and refuses when called from one on its own thread (Note
[Installing and uninstalling while bodies run] in
``torch/csrc/utils/running_bodies.h``).

Two changes are not made by :func:`install` but only while an audit needs
them, and are undone when the last such audit ends (so :func:`uninstall`
refuses to run while one is open):

* ``threading.Thread._bootstrap_inner`` while an ``_audit_new_threads``
  block is open (:func:`patch_thread_bootstrap`);
* the audit's dispatch key is removed from every higher-order operator's
  ``non_fallthrough_keys``, and ``HigherOrderOperator.__init__`` removes it
  from operators created meanwhile, while at least one ``audit()`` is open
  on any thread (:func:`enter_higher_order_op_scope`); see Note [Higher-order
  operators under an audit].

:func:`install` after :func:`uninstall` installs again (existing classes are
found again, as on import); :func:`install` while installed does nothing.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import types
import warnings
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from aliasguard import _C
from aliasguard._torch_internals import (
    HigherOrderOperator,
    TorchDispatchMode,
    audit_key_set,
    disabled_torch_dispatch_impl,
    higher_order_ops,
    is_tracing_infrastructure,
    mode_rule,
    num_higher_order_ops,
    register_mode_rule,
    unregister_mode_rule,
    write_guard_key_set,
)

__all__ = [
    "enter_higher_order_op_scope",
    "exit_higher_order_op_scope",
    "install",
    "install_on",
    "is_installed",
    "patch_thread_bootstrap",
    "prepare_higher_order_ops_for_checkpoint",
    "require_installed",
    "uninstall",
    "unpatch_thread_bootstrap",
]

# Our wrappers' attribute holding the wrapped function; marks our hooks too.
_WRAPPED_MARK = "__aliasguard_wrapped__"
_HOOK_MARK = "__aliasguard_hook__"
_WRAPPER_ASSIGNMENTS = ("__module__", "__name__", "__qualname__", "__doc__")

_ROOTS: Tuple[type, ...] = (torch.Tensor, TorchDispatchMode)
# The __torch_dispatch__ functions _C defines itself, bound like methods (the
# selective checkpoint's modes): they correct their results themselves.
_OWN_C_DISPATCHES: Tuple[object, ...] = tuple(
    value for value in vars(_C).values() if type(value).__name__ == "instancemethod"
)
_MISSING = object()


class _State:
    """What install() changed, so that uninstall() can put it back. Guarded by ``lock``."""

    lock = threading.RLock()
    # Held by install() and uninstall() throughout, never by a body: uninstall()
    # waits for running bodies while holding it, so a body must never wait
    # for it (see install()).
    transition = threading.Lock()
    installed = False
    # uninstall() is waiting for running bodies: audits and checkpoints are
    # refused meanwhile.
    uninstalling = False
    # class -> (its original raw __torch_dispatch__, our replacement). Weak:
    # a class that is gone needs no restoring, and must not be kept alive.
    wrapped: "weakref.WeakKeyDictionary[type, Tuple[object, object]]" = weakref.WeakKeyDictionary()
    # root class -> (its raw __init_subclass__ before, or _MISSING; our hook)
    init_subclass: Dict[type, Tuple[object, object]] = {}
    # torch.mark_as_view before install (or _MISSING), and what we set
    mark_as_view: Optional[Tuple[object, object]] = None
    # threading.Thread._bootstrap_inner: how many blocks patch it, the original
    thread_patches = 0
    thread_original: object = _MISSING
    # higher-order operators: open audit scopes (all threads), the operators
    # whose key we removed, HigherOrderOperator.__init__ before our hook
    hop_scopes = 0
    hop_changed: List[Any] = []
    hop_init: object = _MISSING
    # higher-order operators prepared for checkpoint regions: how many existed
    # at the last scan, those the write guard's key was removed from (Note
    # [Higher-order operators in a fast-path region]), and the (operator,
    # mode type) rules registered (Note [Higher-order operators in the modes]
    # in checkpoint.py)
    checkpoint_hops_seen = -1
    guard_key_removed_from: List[Any] = []
    mode_rules_registered: List[Tuple[Any, type]] = []


def is_installed() -> bool:
    """Whether aliasguard is installed (it is after import, until :func:`uninstall`)."""
    return _State.installed


def require_installed(what: str) -> None:
    """Raise ``RuntimeError`` naming ``what`` unless aliasguard is installed.

    Also while :func:`uninstall` runs on another thread: it is about to take
    away what ``what`` needs.
    """
    if not _State.installed:
        raise RuntimeError(
            f"{what} needs aliasguard installed, but aliasguard.uninstall() was called; "
            "call aliasguard.install() first"
        )
    if _State.uninstalling:
        raise RuntimeError(
            f"{what} needs aliasguard installed, but aliasguard.uninstall() is running on another "
            "thread; call aliasguard.install() after it returned"
        )


@contextlib.contextmanager
def while_installed(what: str) -> Iterator[None]:
    """:func:`require_installed`, then the block, both under the install lock.

    For scopes that :func:`uninstall` refuses to run under (an audit): one
    entered in the block is seen by an :func:`uninstall` that starts later,
    and one that starts earlier makes the block refuse.
    """
    with _State.lock:
        require_installed(what)
        yield


# --- the corrected __torch_dispatch__ ------------------------------------------


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
    if any(raw is own for own in _OWN_C_DISPATCHES):
        return None  # aliasguard's own C dispatch (the checkpoint modes): corrects itself
    if raw is not disabled_torch_dispatch_impl:
        warnings.warn(
            f"aliasguard: {cls.__module__}.{cls.__qualname__}.__torch_dispatch__ is a "
            f"{type(raw).__name__}, not a function, classmethod or staticmethod; its "
            "results will not be alias-corrected",
            stacklevel=4,
        )
    return None


def install_on(cls: type) -> bool:
    """Wrap the ``__torch_dispatch__`` defined by ``cls`` itself; True if wrapped.

    Does nothing (False) while aliasguard is not installed.
    """
    with _State.lock:
        if not _State.installed:
            return False
        raw = cls.__dict__.get("__torch_dispatch__")
        if raw is None or is_tracing_infrastructure(cls):
            return False
        replacement = _corrected_descriptor(cls, raw)
        if replacement is None:
            return False
        type.__setattr__(cls, "__torch_dispatch__", replacement)
        _State.wrapped[cls] = (raw, replacement)
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
    current = base.__dict__.get("__init_subclass__", _MISSING)
    if current is not _MISSING:
        previous = current.__func__ if isinstance(current, classmethod) else current

        def call_previous(cls: type, **kwargs: Any) -> None:
            previous(cls, **kwargs)

    else:

        def call_previous(cls: type, **kwargs: Any) -> None:
            super(base, cls).__init_subclass__(**kwargs)  # type: ignore[arg-type]

    def __init_subclass__(cls: type, **kwargs: Any) -> None:  # noqa: N807
        call_previous(cls, **kwargs)
        try:
            install_on(cls)  # nothing once uninstalled, should someone keep this hook
        except Exception as error:  # never make a class definition fail
            warnings.warn(
                f"aliasguard: could not install alias correction on {cls.__qualname__}: {error}",
                stacklevel=2,
            )

    setattr(__init_subclass__, _HOOK_MARK, True)
    hook: classmethod[Any, Any, None] = classmethod(__init_subclass__)
    type.__setattr__(base, "__init_subclass__", hook)
    _State.init_subclass[base] = (current, hook)


def _unhook_init_subclass(base: type) -> None:
    original, hook = _State.init_subclass.pop(base)
    if base.__dict__.get("__init_subclass__") is not hook:
        return  # replaced by someone since; our hook, if they call it, is inert now
    if original is _MISSING:
        type.__delattr__(base, "__init_subclass__")
    else:
        type.__setattr__(base, "__init_subclass__", original)


# --- install / uninstall ---------------------------------------------------------


def install() -> None:
    """Install aliasguard into torch (what ``import aliasguard`` does).

    Wraps the ``__torch_dispatch__`` of every existing tensor subclass and
    dispatch mode and hooks the creation of new ones, sets
    ``torch.mark_as_view``, the audit's reporter, alias correction and the
    detach kernel. After :func:`uninstall` it installs again; while
    installed it does nothing.
    """
    from aliasguard._aliasing import _on_violation
    from aliasguard._views import mark_as_view

    with _State.lock:
        if _State.installed:
            return
    # A body on this thread must not wait for an uninstall() that waits for
    # that body: see Note [Installing and uninstalling while bodies run].
    if not _State.transition.acquire(blocking=not _C._body_running_on_this_thread()):
        raise RuntimeError(
            "aliasguard.install() was called inside a __torch_dispatch__ body (or a track_views() "
            "or with_tracking() scope) while aliasguard.uninstall() runs on another thread and waits "
            "for that body to return; call install() once the body has returned (nothing was changed)"
        )
    try:
        _install_locked(_on_violation, mark_as_view)
    finally:
        _State.transition.release()


def _install_locked(on_violation: Callable[..., bool], mark_as_view: Callable[..., Any]) -> None:
    with _State.lock:
        if _State.installed:
            return
        _State.installed = True
        for root in _ROOTS:
            _hook_init_subclass(root)
        for root in _ROOTS:
            for cls in _subclasses(root):
                install_on(cls)
        _State.mark_as_view = (vars(torch).get("mark_as_view", _MISSING), mark_as_view)
        # The core patch would add this to torch/__init__.py.
        torch.mark_as_view = mark_as_view  # type: ignore[attr-defined]
        _C._set_alias_audit_reporter(on_violation)
        _C._set_alias_correction(True)
        _C._set_detach_keep_version_counter(True)


def _open_audit_problem() -> Optional[str]:
    if _State.hop_scopes or _C._alias_audit_scopes():
        return "an aliasguard.audit() is open (or its fallback is retained)"
    if _State.thread_patches:
        return "threads are being audited (an _audit_new_threads block is open)"
    return None


def uninstall() -> None:
    """Undo everything :func:`install` (``import aliasguard``) did to torch.

    Afterwards torch behaves as if aliasguard had never been imported: every
    wrapped ``__torch_dispatch__`` is the original descriptor object again,
    ``__init_subclass__`` of ``torch.Tensor`` and ``TorchDispatchMode`` is
    as it was, ``torch.mark_as_view`` is gone (or what it was before), alias
    correction is off, the audit has no reporter, ``aten::detach`` has
    stock torch's kernels, and the kernels that mark views made in tracked
    bodies are gone. The checkpoint's fast-path kernels, once registered,
    stay as exact pass-throughs (Note [Fast path registrations are kept]). A
    ``__torch_dispatch__`` or ``__init_subclass__`` replaced by someone else
    after install is left as they set it. :func:`aliasguard.mark_as_view`,
    :func:`aliasguard.track_views` and :func:`aliasguard.correct_aliasing`
    keep working; :func:`aliasguard.audit` refuses until :func:`install` is
    called again. Does nothing when not installed.

    Safe with other threads running: it first waits (the GIL released)
    until no ``__torch_dispatch__`` body that aliasguard tracks or corrects,
    and no ``track_views()`` or ``with_tracking()`` scope, runs on any
    thread; meanwhile new bodies run as stock and new scopes wait for it.
    See Note [Installing and uninstalling while bodies run] in
    ``torch/csrc/utils/running_bodies.h``.

    Raises:
        RuntimeError: called inside such a body or scope on this thread (it
            would wait for itself); or an :func:`aliasguard.audit` scope is
            open on some thread (or its fallback is retained), or threads
            are being audited. Nothing was changed.
    """
    if _C._body_running_on_this_thread():
        raise RuntimeError(
            "aliasguard.uninstall() was called inside a __torch_dispatch__ body (or a track_views() "
            "or with_tracking() scope) running on this thread, which still dispatches through what "
            "uninstall() takes away; call it once the body has returned (nothing was changed)"
        )
    with _State.transition:
        with _State.lock:
            if not _State.installed:
                return
            _refuse_if_audited()
            _State.uninstalling = True
        _C._close_bodies()
        try:
            # In slices, so that a KeyboardInterrupt gets through.
            while not _C._wait_for_no_running_bodies(0.05):
                pass
            with _State.lock:
                _refuse_if_audited()  # an audit opened on a thread meanwhile
                _uninstall_locked()
        finally:
            with _State.lock:
                _State.uninstalling = False
            _C._open_bodies()


def _refuse_if_audited() -> None:
    problem = _open_audit_problem()
    if problem is not None:
        raise RuntimeError(f"aliasguard.uninstall(): {problem}; end it first (nothing was changed)")


def _uninstall_locked() -> None:
    """What :func:`uninstall` changes, once no body runs (``_State.lock`` held)."""
    _State.installed = False
    for cls, (original, replacement) in list(_State.wrapped.items()):
        if cls.__dict__.get("__torch_dispatch__") is replacement:
            type.__setattr__(cls, "__torch_dispatch__", original)
    _State.wrapped.clear()
    for root in _ROOTS:
        _unhook_init_subclass(root)
    if _State.mark_as_view is not None:
        before, ours = _State.mark_as_view
        _State.mark_as_view = None
        if vars(torch).get("mark_as_view") is ours:
            if before is _MISSING:
                del torch.mark_as_view  # type: ignore[attr-defined]
            else:
                torch.mark_as_view = before  # type: ignore[attr-defined]
    _C._set_alias_audit_reporter(None)
    _undo_checkpoint_preparation_of_higher_order_ops()
    _C._set_alias_correction(False)
    _C._set_detach_keep_version_counter(False)
    # Registered on the first tracked body; a later track_views() scope
    # registers them again. No body runs anywhere now, so no thread has
    # their dispatch key included.
    _C._release_tracked_view_kernels()
    # The checkpoint's fast-path kernels stay: see Note [Fast path
    # registrations are kept] in selective_checkpoint_fast_path.cpp.


# --- threading.Thread._bootstrap_inner -----------------------------------------


def patch_thread_bootstrap(replacement: Callable[[threading.Thread, Callable[[threading.Thread], None]], None]) -> None:
    """Route every new ``threading.Thread`` through ``replacement(thread, original)``.

    Counted: the first call patches ``Thread._bootstrap_inner`` (the one place
    every ``threading.Thread`` passes through, whatever its ``run``), the
    matching last :func:`unpatch_thread_bootstrap` restores the original
    object. ``replacement`` must be the same for every call (the audit's).
    """
    with _State.lock:
        if _State.thread_patches == 0:
            original = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]
            _State.thread_original = original

            def _bootstrap_inner(thread: threading.Thread) -> None:
                replacement(thread, original)

            threading.Thread._bootstrap_inner = _bootstrap_inner  # type: ignore[attr-defined]
        _State.thread_patches += 1


def unpatch_thread_bootstrap() -> None:
    """End one :func:`patch_thread_bootstrap`; the last restores the original."""
    with _State.lock:
        if _State.thread_patches == 0:
            raise RuntimeError("unpatch_thread_bootstrap(): the thread bootstrap is not patched")
        _State.thread_patches -= 1
        if _State.thread_patches == 0:
            threading.Thread._bootstrap_inner = _State.thread_original  # type: ignore[attr-defined]
            _State.thread_original = _MISSING


def original_thread_bootstrap() -> Any:
    """``threading.Thread._bootstrap_inner`` as it is without our patch."""
    with _State.lock:
        if _State.thread_patches:
            return _State.thread_original
        return threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


# --- higher-order operators under an audit ---------------------------------------

# Note [Higher-order operators under an audit]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Higher-order operators (torch.cond, ...) dispatch in Python, on the highest
# key of their inputs' and the thread's include set that is in their
# non_fallthrough_keys, and fail with "could not find kernel" on a key they
# have no rule for, such as the one the audit includes. The audit has nothing
# to check on them anyway (the ops they run are dispatched, and audited, one
# by one), so while an audit is open the key is removed from every operator's
# set. That is process-wide state, so it is scoped by a count of open audits
# over all threads: the first to open removes the key, the last to end puts
# it back on exactly the operators it was removed from (any other change made
# to an operator's set meanwhile is kept).
#
# An operator created while an audit is open starts with the full key set.
# HigherOrderOperator.__init__ is replaced while an audit is open (and only
# then) by one that removes the key after the original ran; subclasses reach
# it through super().__init__, which every HigherOrderOperator must call.
# Re-scanning at each audit entry instead would miss an operator created and
# called within one audit, the common case (a HOP defined in a test body).


def _remove_audit_key(op: Any, key: Any) -> None:
    keys = op.non_fallthrough_keys
    without = keys - key
    if without != keys:
        op.non_fallthrough_keys = without
        _State.hop_changed.append(op)


def enter_higher_order_op_scope() -> None:
    """One more audit is open: the first makes higher-order operators skip the audit's key."""
    with _State.lock:
        _State.hop_scopes += 1
        if _State.hop_scopes > 1:
            return
        key = audit_key_set()
        original_init = HigherOrderOperator.__dict__["__init__"]
        _State.hop_init = original_init

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            original_init(self, *args, **kwargs)
            if hasattr(self, "non_fallthrough_keys"):
                with _State.lock:
                    if _State.hop_scopes:
                        _remove_audit_key(self, key)

        __init__.__wrapped__ = original_init  # type: ignore[attr-defined]
        type.__setattr__(HigherOrderOperator, "__init__", __init__)
        for op in higher_order_ops():
            _remove_audit_key(op, key)


def exit_higher_order_op_scope() -> None:
    """One audit fewer: the last puts the key back where the first removed it."""
    with _State.lock:
        if _State.hop_scopes == 0:
            raise RuntimeError("exit_higher_order_op_scope(): no audit scope is open")
        _State.hop_scopes -= 1
        if _State.hop_scopes:
            return
        key = audit_key_set()
        for op in _State.hop_changed:
            op.non_fallthrough_keys = op.non_fallthrough_keys | key
        _State.hop_changed = []
        type.__setattr__(HigherOrderOperator, "__init__", _State.hop_init)
        _State.hop_init = _MISSING


# Note [Higher-order operators in a fast-path region]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# While a checkpoint fast-path region's forward phase runs, its write guard
# includes a borrowed key in the thread's set (Note [Refusing a write where it
# happens] in selective_checkpoint_write_guard.h), and a higher-order operator
# called there (torch.cond, flex_attention) would find no rule for it, as
# with the audit's key (Note [Higher-order operators under an audit]). No
# operator has a rule for this key where the guard can run (a library that
# registers on it makes the guard unavailable), so the key is simply removed
# from each operator's set. The same scan registers torch's SAC-mode rules
# for aliasguard's modes (Note [Higher-order operators in the modes] in
# checkpoint.py). It runs before each checkpoint region is made, for the
# operators created since the last scan (counted, so the usual call costs a
# len()); uninstall() undoes both. An operator created inside a region is not
# seen before the next one.


def prepare_higher_order_ops_for_checkpoint(mode_types: Tuple[Tuple[type, type], ...]) -> None:
    """Ready the higher-order operators created since the last call for checkpoint regions.

    Removes the write guard's key from their sets, and for each ``(torch's
    mode type, ours)`` pair in ``mode_types`` registers the rule an operator
    has for torch's type for ours too (where ours has none). See Note
    [Higher-order operators in a fast-path region]. Undone by :func:`uninstall`.
    """
    if num_higher_order_ops() == _State.checkpoint_hops_seen:
        return
    with _State.lock:
        key = write_guard_key_set()
        ops = higher_order_ops()
        for op in ops:
            keys = op.non_fallthrough_keys
            if (keys - key) != keys:
                op.non_fallthrough_keys = keys - key
                _State.guard_key_removed_from.append(op)
            for theirs, ours in mode_types:
                rule = mode_rule(op, theirs)
                if rule is not None and mode_rule(op, ours) is None:
                    register_mode_rule(op, ours, rule)
                    _State.mode_rules_registered.append((op, ours))
        _State.checkpoint_hops_seen = len(ops)


def _undo_checkpoint_preparation_of_higher_order_ops() -> None:
    key = write_guard_key_set()
    for op in _State.guard_key_removed_from:
        op.non_fallthrough_keys = op.non_fallthrough_keys | key
    for op, mode_type in _State.mode_rules_registered:
        unregister_mode_rule(op, mode_type)
    _State.guard_key_removed_from = []
    _State.mode_rules_registered = []
    _State.checkpoint_hops_seen = -1


def higher_order_op_scopes() -> int:
    """Audit scopes counted by :func:`enter_higher_order_op_scope`, all threads."""
    return _State.hop_scopes
