"""Report mode of :func:`aliasguard.audit`: every aliasing violation, once.

An :class:`AuditReport` collects the violations the audit finds instead of
raising at the first one. Entries are de-duplicated by (op, class or mode
responsible, kind of violation, source line of the user frame) and counted;
each says whether aliasguard's alias correction repaired the result at run
time (code run without aliasguard would have the bug) or could not.

What counts as a violation, and of which kind, is decided in C++ (see
``Note [Kinds of aliasing violations]`` in ``alias_correction.h``); this module
only groups, counts and words them.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from aliasguard import _C

__all__ = ["AuditReport", "Violation", "VIOLATION_KINDS", "describe_violation", "json_report_path_problem"]

#: What each kind of violation means, in one sentence: what the schema
#: promises, what the handler returned, what to change. ``{op}``,
#: ``{ret}`` (the return), ``{arg}`` (the argument) are filled in per entry.
VIOLATION_KINDS: dict[str, str] = {
    "view_copy": (
        "The schema of {op} says {ret} is a view of {arg}, but the handler returned a tensor with memory "
        "of its own (a copy): apply the view op to the input (for a wrapper, to its inner tensors) "
        "instead of copying it."
    ),
    "view_storage": (
        "The schema of {op} says {ret} is a view of {arg}, but the handler returned a wrapper whose "
        "storage is not the input's: give the view the input's storage by ending __torch_dispatch__ "
        "with torch.utils._python_dispatch.return_and_correct_aliasing (or aliasguard.correct_aliasing)."
    ),
    "view_version_counter": (
        "The schema of {op} says {ret} is a view of {arg}, but the returned tensor has a version counter "
        "of its own, so an in-place change through one is invisible to autograd through the other: "
        "share the counter (make the view under aliasguard.track_views(), or end __torch_dispatch__ "
        "with aliasguard.correct_aliasing)."
    ),
    "view_inner_copy": (
        "The schema of {op} says {ret} is a view of {arg}, but an inner tensor of the returned wrapper "
        "shares no memory with the input's inner tensors, so writes through the view are lost: apply "
        "the view op to each inner tensor instead of copying it."
    ),
    "write_not_argument": (
        "The schema of {op} says {ret} is {arg}, written in place (Tensor(a!)), but the handler returned "
        "another object (a new tensor, or None): return the argument itself (e.g. `return args[0]`)."
    ),
    "write_new_memory": (
        "The schema of {op} says {ret} is {arg}, written in place (Tensor(a!)), but the handler returned "
        "a new tensor with memory of its own, so the write never reached the argument: write into the "
        "argument (or its inner tensors) and return it."
    ),
    "write_metadata": (
        "The schema of {op} says {ret} is {arg}, written in place, but the returned tensor's sizes or "
        "strides differ from the argument's: update the argument's metadata (an in-place view op such "
        "as t_ changes the argument itself) and return it."
    ),
    "fresh_is_argument": (
        "The schema of {op} says {ret} is a new tensor (no alias annotation), but the handler returned "
        "{arg} itself: return a new tensor (e.g. `.clone()`), or use the op's view variant."
    ),
    "fresh_shares_memory": (
        "The schema of {op} says {ret} is a new tensor (no alias annotation), but it shares memory with "
        "{arg}: return a tensor with memory of its own (clone it), or use the op's view variant."
    ),
    "other_argument": (
        "The schema of {op} says {ret} aliases {arg}, but the handler returned a different argument of "
        "the op: return the argument the schema names, or a view of it."
    ),
    "wrong_type": (
        "The schema of {op} says what {ret} is (a tensor, a list of tensors, or an argument's type), "
        "but the handler returned something else: return what the schema declares."
    ),
}

_NO_OWNER = "(a kernel: no __torch_dispatch__ involved)"
_NO_FRAME = "(no Python frame: backward or a C++ caller)"


def describe_violation(kind: str, op: str, return_index: int, argument: Optional[str]) -> str:
    """The one-sentence explanation of a violation of ``kind`` in ``op``."""
    template = VIOLATION_KINDS.get(kind, "{op}: {ret} breaks the schema's alias annotation ({kind}).")
    arg = f"argument '{argument}'" if argument else "an argument"
    return template.format(op=op, ret=f"return {return_index}", arg=arg, kind=kind)


@dataclass
class Violation:
    """One distinct violation and how often it happened.

    ``owner`` is the tensor subclass or mode whose ``__torch_dispatch__``
    returned the result (``"mode pkg.Mode"`` for modes), ``location`` the
    source line of the innermost frame outside torch and aliasguard when it
    happened first, ``repaired`` whether alias correction made every
    occurrence keep the schema (the run went on with the repaired result; code
    without aliasguard has the bug), ``example`` what was running at the first
    occurrence (a test id, a script).
    """

    op: str
    owner: str
    kind: str
    location: str
    return_index: int
    argument: Optional[str]
    message: str
    example: Optional[str] = None
    count: int = 0
    repaired_count: int = 0

    @property
    def repaired(self) -> bool:
        return self.count > 0 and self.repaired_count == self.count

    @property
    def repaired_label(self) -> str:
        if self.repaired_count == self.count:
            return "yes"
        return "no" if self.repaired_count == 0 else f"{self.repaired_count} of {self.count}"

    @property
    def advice(self) -> str:
        return describe_violation(self.kind, self.op, self.return_index, self.argument)

    def key(self) -> tuple[str, str, str, str]:
        return (self.op, self.owner, self.kind, self.location)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["repaired"] = self.repaired
        data["advice"] = self.advice
        return data


def owner_name(owner: object) -> str:
    """``pkg.mod.Class`` for a class, ``mode pkg.mod.Mode`` for a mode instance."""
    if owner is None:
        return _NO_OWNER
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    cls = type(owner)
    return f"mode {cls.__module__}.{cls.__qualname__}"


def _package_dir(module_name: str) -> Optional[str]:
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) + os.sep if path else None


def _library_dirs() -> tuple[str, ...]:
    """torch, aliasguard and test runners: never the place a violation is blamed on."""
    return tuple(d for d in (_package_dir(name) for name in ("torch", "aliasguard", "_pytest", "pluggy")) if d)


def _installed_dirs() -> tuple[str, ...]:
    """The standard library and installed packages: blamed only when no other frame is on the stack."""
    paths = sysconfig.get_paths()
    return tuple(
        os.path.abspath(paths[key]) + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths
    )


def user_location() -> str:
    """``path:line`` of the innermost frame of the user's own code.

    Skips torch, aliasguard and pytest; prefers code outside the standard
    library and installed packages (the script or test being run, or a
    library in development), else the innermost installed package's frame (a
    library's dispatch glue). The walk itself is the one the C++ side makes
    (see Note [Walking the Python stack for the user's line]).
    """
    library = ("<",) + _library_dirs()
    found = _C._innermost_user_frame([*library, *_installed_dirs()]) or _C._innermost_user_frame(list(library))
    if found is None:
        return _NO_FRAME
    filename, line = found
    return f"{_display_path(filename)}:{line}"


def _display_path(filename: str) -> str:
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive
        return filename
    return filename if relative.startswith(".." + os.sep + "..") else relative


def json_report_path_problem(path: str) -> Optional[str]:
    """Why a JSON report could not be written to ``path``, or None if it can.

    The pytest plugin and ``python -m aliasguard audit`` ask before the run, so
    that a mistyped folder is reported at once instead of after the whole run.
    The folder is not created: a report lands only where the user said.
    """
    if not path:
        return "the file name is empty"
    if os.path.isdir(path):
        return "is a folder; name a file in it"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(folder):
        return f"the folder {folder} does not exist; create it first"
    if not os.path.isdir(folder):
        return f"{folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder {folder} is not writable"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return "the file exists and is not writable"
    return None


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    parts: list[str] = []
    start = previous = numbers[0]
    for n in numbers[1:]:
        if n == previous + 1:
            previous = n
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = n
    parts.append(str(start) if start == previous else f"{start}-{previous}")
    return ", ".join(parts)


@dataclass
class AuditReport:
    """Every aliasing violation an audit found, de-duplicated and counted.

    Pass one to :func:`aliasguard.audit` (``with aliasguard.audit(report=r):``)
    to record instead of raising. Thread-safe: the ops of several threads (and
    of autograd's worker threads) may report into one report. ``context``
    names what is running (the pytest plugin sets it to the test's id); it is
    kept with the first occurrence of each violation.
    """

    context: Optional[str] = None
    # State, not arguments: `AuditReport(ctx, entries)` is refused at construction.
    _entries: dict[tuple[str, str, str, str], Violation] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.context is not None and not isinstance(self.context, str):
            raise TypeError(
                f"AuditReport(context=...): expected a str naming what runs (a test id, a script) or None, "
                f"got {type(self.context).__name__}"
            )

    def record(
        self,
        error: BaseException,
        owner: object = None,
        repaired: bool = False,
        *,
        location: Optional[str] = None,
        context: Optional[str] = None,
    ) -> Violation:
        """Add one occurrence of ``error`` (an :class:`aliasguard.AliasingError`).

        ``owner`` is the class or mode responsible (or None: a kernel),
        ``location`` defaults to the innermost user frame of the caller.
        """
        op = getattr(error, "op", None)
        kind = getattr(error, "kind", None)
        if not isinstance(op, str) or not isinstance(kind, str):
            raise TypeError(f"AuditReport.record(): expected an aliasguard.AliasingError, got {type(error).__name__}")
        if location is None:
            location = user_location()
        violation = Violation(
            op=op,
            owner=owner if isinstance(owner, str) else owner_name(owner),
            kind=kind,
            location=location,
            return_index=int(getattr(error, "return_index", 0)),
            argument=getattr(error, "argument", None),
            message=str(error).split("\n", 1)[0],
            example=context if context is not None else self.context,
        )
        with self._lock:
            entry = self._entries.setdefault(violation.key(), violation)
            entry.count += 1
            entry.repaired_count += bool(repaired)
        return entry

    def merge(self, other: AuditReport) -> None:
        """Add every entry of ``other`` (counts add up, first examples kept)."""
        for violation in other.violations():
            with self._lock:
                entry = self._entries.get(violation.key())
                if entry is None:
                    self._entries[violation.key()] = Violation(**{**asdict(violation)})
                else:
                    entry.count += violation.count
                    entry.repaired_count += violation.repaired_count

    def violations(self) -> list[Violation]:
        """The distinct violations, grouped by op, then by class or mode."""
        with self._lock:
            entries = list(self._entries.values())
        return sorted(entries, key=lambda v: (v.op, v.owner, v.kind, v.location))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __bool__(self) -> bool:
        return len(self) > 0

    @property
    def occurrences(self) -> int:
        with self._lock:
            return sum(v.count for v in self._entries.values())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary: ``{"violations": [...], "distinct": n, "occurrences": m}``."""
        entries = self.violations()
        return {
            "distinct": len(entries),
            "occurrences": sum(v.count for v in entries),
            "violations": [v.to_dict() for v in entries],
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **{"indent": 2, **kwargs})

    def format(self, *, title: str = "aliasguard audit") -> str:
        """The report as text: a table grouped by op and by class or mode, then one sentence per entry."""
        entries = self.violations()
        if not entries:
            return f"{title}: no aliasing violations"
        total = sum(v.count for v in entries)
        ops = len({v.op for v in entries})
        lines = [
            f"{title}: {len(entries)} distinct aliasing violation{'s' if len(entries) != 1 else ''} "
            f"({total} occurrence{'s' if total != 1 else ''}) in {ops} op{'s' if ops != 1 else ''}"
        ]
        header = ("#", "op", "class or mode", "kind", "count", "repaired", "first seen at", "example")
        rows = [
            (str(i), v.op, v.owner, v.kind, str(v.count), v.repaired_label, v.location, v.example or "")
            for i, v in enumerate(entries, 1)
        ]
        widths = [max(len(row[c]) for row in (header, *rows)) for c in range(len(header))]
        numeric = {0, 4}

        def render(row: tuple[str, ...]) -> str:
            cells = [cell.rjust(w) if c in numeric else cell.ljust(w) for c, (cell, w) in enumerate(zip(row, widths))]
            return "  ".join(cells).rstrip()

        lines.append(render(header))
        lines.append(render(tuple("-" * w for w in widths)))
        lines.extend(render(row) for row in rows)
        lines.append("")
        lines.append(
            "repaired: yes = aliasguard's alias correction fixed the result at run time "
            "(without aliasguard the bug is live); no = it could not."
        )
        # One sentence per distinct advice, with the rows it explains.
        rows_by_advice: dict[str, list[int]] = {}
        for i, v in enumerate(entries, 1):
            rows_by_advice.setdefault(v.advice, []).append(i)
        for advice, numbers in rows_by_advice.items():
            lines.append(f"[{_ranges(numbers)}] {advice}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()
