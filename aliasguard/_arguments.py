"""Checks of the public API's arguments, with messages that name what was wrong."""

from __future__ import annotations

from typing import Any

__all__ = ["require_bool", "type_name"]


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
