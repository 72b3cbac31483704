"""Checks of the public API's arguments, with messages that name what was wrong."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["SingleUseScope", "require_bool", "type_name"]


def type_name(value: Any) -> str:
    """The type of ``value`` as a user can look it up: ``bool``, ``numpy.bool``, ``torch.Tensor``."""
    cls = type(value)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def require_bool(function: str, argument: str, value: Any) -> None:
    """Raise ``TypeError`` unless ``value`` is a Python ``bool``.

    Flags take ``True`` or ``False`` only: ``None``, ``0``, a ``str`` or a
    one-element tensor are refused rather than read as a truth value, and so
    are numpy's bools (``numpy.bool_``), whose ``type(...).__name__`` is also
    ``bool``: the message names the type with its module, so that the two
    cannot be confused.
    """
    if isinstance(value, bool):
        return
    hint = " (True or False; convert it with bool(...))" if type(value).__module__ == "numpy" else ""
    raise TypeError(f"{function}: {argument} must be a bool, got {type_name(value)}{hint}")


class SingleUseScope:
    """How a scope object of the public API (``audit()``, ``track_views()``) may be used: entered once, left
    once, on the thread that entered it. Each misuse raises ``RuntimeError`` naming it and what to do."""

    __slots__ = ("_name", "_article", "_state", "_thread")

    def __init__(self, name: str, article: str) -> None:
        self._name, self._article = name, article  # "audit", "an"
        self._state = "new"
        self._thread = 0

    def check_enter(self) -> None:
        """Before entering: refuses an object entered before."""
        if self._state != "new":
            where = "is open" if self._state == "open" else "has ended"
            name = self._name
            raise RuntimeError(
                f"aliasguard.{name}(): this {name}() object was entered before (it {where}); it is used once: "
                f"create a new aliasguard.{name}() for each with-block (or use @aliasguard.{name}() as a "
                "decorator, which opens a new scope per call)"
            )

    def entered(self) -> None:
        """After entering succeeded, on the entering thread."""
        self._state, self._thread = "open", threading.get_ident()

    def check_exit(self) -> None:
        """Before leaving: refuses a scope not open, or left on another thread."""
        name = self._name
        if self._state != "open":
            what = "was never entered" if self._state == "new" else "has ended already"
            raise RuntimeError(
                f"aliasguard.{name}(): __exit__ called on {self._article} {name}() scope that {what}; use "
                f"`with aliasguard.{name}():` (or @aliasguard.{name}() as a decorator), which enters and "
                "exits each scope once"
            )
        if self._thread != threading.get_ident():
            raise RuntimeError(
                f"aliasguard.{name}(): __exit__ called on another thread than the one that entered the scope; "
                f"end each {name}() scope on the thread that entered it"
            )

    def ended(self) -> None:
        self._state = "ended"
