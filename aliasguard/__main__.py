"""`python -m aliasguard`: show what the core patch fixes, case by case.

First runs the upstream issue's own script, as written: a mode saves
``out.view_as(out)`` inside ``__torch_dispatch__``, then the output and the
saved view are mutated in turn. Stock PyTorch prints ``True False / False
True`` (each mutation unseen by the other tensor); with aliasguard imported it
prints ``True True / True True``. Then the reproduction from docs/design.md with
each explicit fix. Exits non-zero if any fixed case fails.

``python -m aliasguard --help`` lists the commands (``demo``, the default, and
``audit``); an unknown command is an error (exit status 2).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from typing import Any, Callable, Sequence

import torch

import aliasguard
from aliasguard import _torch_internals
from aliasguard._torch_internals import TorchDispatchMode

SaveFn = Callable[[torch.Tensor], torch.Tensor]

# The reproduction posted upstream, verbatim (its imports are provided by
# _run_seed_script).
SEED_SCRIPT = """\
saved_b = None

class SaveATensorMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        global saved_b
        kwargs = {} if kwargs is None else kwargs
        out = func(*args, **kwargs)
        if func == torch.ops.aten.sin.default:
          saved_b = out.view_as(out)
        return out

a = torch.tensor(1.)
with SaveATensorMode():
    b = torch.sin(a)

assert b.data_ptr() == saved_b.data_ptr()

old_b_version = b._version
old_saved_b_version = saved_b._version
b.mul_(2)

print(b._version > old_b_version)  # True
print(saved_b._version > old_saved_b_version)  # False

old_b_version = b._version
old_saved_b_version = saved_b._version
saved_b.mul_(2)

print(b._version > old_b_version)  # False
print(saved_b._version > old_saved_b_version)  # True
"""


def _run_seed_script() -> str:
    """Runs SEED_SCRIPT; returns its four printed lines as "a b / c d"."""
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(SEED_SCRIPT, {"torch": torch, "TorchDispatchMode": TorchDispatchMode})
    a, b, c, d = output.getvalue().split()
    return f"{a} {b} / {c} {d}"


def _stock_view(out: torch.Tensor) -> torch.Tensor:
    return out.view_as(out)


def _detach(out: torch.Tensor) -> torch.Tensor:
    return out.detach()


def _mark_as_view(out: torch.Tensor) -> torch.Tensor:
    return torch.mark_as_view(_stock_view(out), out)  # type: ignore[attr-defined]


def _track_views(out: torch.Tensor) -> torch.Tensor:
    with aliasguard.track_views():
        return out.view_as(out)


def _mutation_seen(save: SaveFn, track: bool) -> tuple[int, int, bool]:
    """Saves sin's output with `save` inside a mode, then mutates the output.
    `track=False` opts the mode out of automatic tracking."""
    saved: list[torch.Tensor] = []

    class SaveMode(TorchDispatchMode):
        __aliasguard_track_views__ = track

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.sin.default:
                saved.append(save(out))
            return out

    with SaveMode():
        b = torch.sin(torch.tensor(1.0))
    assert b.data_ptr() == saved[0].data_ptr(), "saved tensor must share memory"
    before = saved[0]._version
    b.mul_(2)
    after = saved[0]._version
    return before, after, after > before


def _active_features() -> list[str]:
    features = []
    if _torch_internals.has_kernel_for_dispatch_key("aten::detach", "CPU"):
        features.append("detach keeps the version counter below autograd (F1)")
    if getattr(torch, "mark_as_view", None) is aliasguard.mark_as_view:
        features.append("torch.mark_as_view (F3)")
    if aliasguard.is_view_tracking_enabled():
        features.append("views made in every __torch_dispatch__ are tracked")
    features.append("aliasguard.track_views() (F2)")
    for name, label in (
        ("correct_aliasing", "alias correction after __torch_dispatch__ (F4)"),
        ("checkpoint", "selective checkpointing with mutation errors (F5)"),
    ):
        if hasattr(aliasguard, name):
            features.append(label)
    return features


def main() -> int:
    print(f"torch {torch.__version__}, aliasguard {aliasguard.__version__}")
    print("active:")
    for feature in _active_features():
        print(f"  - {feature}")
    print()
    print("The upstream issue's script, unchanged (b.mul_(2), then saved_b.mul_(2)):")
    previous = aliasguard.set_view_tracking(False)
    try:
        stock = _run_seed_script()
    finally:
        aliasguard.set_view_tracking(previous)
    fixed = _run_seed_script()
    failures = 0 if fixed == "True True / True True" else 1
    print(f"  {'stock (aliasguard.set_view_tracking(False))':<46} {stock}")
    print(f"  {'import aliasguard':<46} {fixed}  {'OK' if not failures else 'FAIL'}")
    print()
    print("A tensor saved inside __torch_dispatch__, then the op's output is mutated:")
    cases: list[tuple[str, SaveFn, bool, bool]] = [
        ("automatic: out.view_as(out)", _stock_view, True, True),
        ("opted out: out.view_as(out)", _stock_view, False, False),
        ("opted out, fixed: out.detach()", _detach, True, False),
        ("opted out, fixed: torch.mark_as_view(alias, out)", _mark_as_view, True, False),
        ("opted out, fixed: with track_views(): ...", _track_views, True, False),
    ]
    for label, save, is_fix, track in cases:
        before, after, seen = _mutation_seen(save, track)
        if is_fix:
            status = "OK" if seen else "FAIL"
            failures += not seen
        else:
            status = "mutation missed (the bug)" if not seen else "mutation seen"
        print(f"  {label:<50} version {before} -> {after}  {status}")
    print()
    print("all fixed cases OK" if failures == 0 else f"{failures} fixed case(s) FAILED")
    return 1 if failures else 0


_COMMANDS = {
    "demo": "show what aliasguard fixes, case by case (the default)",
    "audit": "run a script under aliasguard.audit() and report its aliasing violations "
    "(python -m aliasguard audit --help)",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m aliasguard",
        description="aliasguard's command line. Without a command, runs the demo.",
        epilog="commands:\n" + "\n".join(f"  {name:<8}{what}" for name, what in _COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", nargs="?", default="demo", choices=list(_COMMANDS), help="what to run")
    return parser


def command_line(argv: Sequence[str]) -> int:
    """``python -m aliasguard [demo | audit ...]``; usage errors exit with status 2, as argparse's."""
    if argv[:1] == ["audit"]:  # everything after it is the audit's (aliasguard/_audit_cli.py)
        from aliasguard._audit_cli import main as audit_main

        return audit_main(argv[1:])
    _parser().parse_args(argv)  # --help, an unknown command or extra arguments end here
    return main()


if __name__ == "__main__":
    sys.exit(command_line(sys.argv[1:]))
