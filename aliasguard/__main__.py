"""`python -m aliasguard`: show what the core patch fixes, case by case.

Runs the reproduction from DESIGN.md: a tensor saved inside
``__torch_dispatch__`` shares memory with an op's output; the output is then
mutated in place. Stock PyTorch gives the saved tensor its own version counter,
so the mutation goes unseen; each aliasguard fix makes it visible. Exits
non-zero if any fixed case fails.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch

import aliasguard
from aliasguard import _torch_internals
from aliasguard._torch_internals import TorchDispatchMode

SaveFn = Callable[[torch.Tensor], torch.Tensor]


def _stock_view(out: torch.Tensor) -> torch.Tensor:
    return out.view_as(out)


def _detach(out: torch.Tensor) -> torch.Tensor:
    return out.detach()


def _mark_as_view(out: torch.Tensor) -> torch.Tensor:
    return torch.mark_as_view(_stock_view(out), out)  # type: ignore[attr-defined]


def _track_views(out: torch.Tensor) -> torch.Tensor:
    with aliasguard.track_views():
        return out.view_as(out)


def _mutation_seen(save: SaveFn) -> tuple[int, int, bool]:
    """Saves sin's output with `save` inside a mode, then mutates the output."""
    saved: list[torch.Tensor] = []

    class SaveMode(TorchDispatchMode):
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
    print("A tensor saved inside __torch_dispatch__, then the op's output is mutated:")
    cases: list[tuple[str, SaveFn, bool]] = [
        ("stock: out.view_as(out)", _stock_view, False),
        ("fixed: out.detach()", _detach, True),
        ("fixed: torch.mark_as_view(alias, out)", _mark_as_view, True),
        ("fixed: with track_views(): out.view_as(out)", _track_views, True),
    ]
    failures = 0
    for label, save, is_fix in cases:
        before, after, seen = _mutation_seen(save)
        if is_fix:
            status = "OK" if seen else "FAIL"
            failures += not seen
        else:
            status = "mutation missed (the bug)" if not seen else "mutation seen"
        print(f"  {label:<46} version {before} -> {after}  {status}")
    print()
    print("all fixed cases OK" if failures == 0 else f"{failures} fixed case(s) FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
