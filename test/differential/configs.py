"""Configurations and mutants: aliasguard with its public opt-outs, and with one feature switched off.

A *configuration* is a documented way to run aliasguard (reference.md: ``set_view_tracking``,
``set_alias_correction``, ``__aliasguard_track_views__``, ``__aliasguard_fixup__``). The aliasguard
worker applies it around each scenario (``apply``), the stock worker ignores it, and the verdict expects
exactly the intended differences of the features the configuration leaves on (``intended.Rule.needs``).

A *mutant* (``ALIASGUARD_DIFF_MUTANT``, read by the aliasguard worker alone) switches one feature off for
the whole process while the verdict still expects every intended difference: the run must fail with the
rules of that feature reported missing. It shows that the harness notices a fix gone, not only a
difference added.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any, Callable

# What aliasguard does that the intended rules record, by the switch that takes it away.
# "torch-class-tracking": tracking in the bodies of torch's own subclasses (NestedTensor), which the class
# opt-outs, set on the harness's classes only, leave on; the process-wide switches take it with "tracking".
FEATURES = ("correction", "tracking", "torch-class-tracking", "detach", "version", "checkpoint", "write-guard")
_GLOBAL_TRACKING = frozenset({"tracking", "torch-class-tracking"})


@dataclass(frozen=True)
class Config:
    name: str
    off: frozenset[str]  # features this configuration switches off
    how: str  # what the aliasguard worker does (docs/differential.md)


CONFIGS: dict[str, Config] = {c.name: c for c in (
    Config("default", frozenset(), "aliasguard as imported"),
    Config("tracking-off", _GLOBAL_TRACKING, "aliasguard.set_view_tracking(False)"),
    # correction is what hands tracked views back to autograd: no correction, no automatic tracking
    Config("correction-off", _GLOBAL_TRACKING | {"correction"}, "aliasguard.set_alias_correction(False)"),
    Config("both-off", _GLOBAL_TRACKING | {"correction"},
           "aliasguard.set_view_tracking(False) and aliasguard.set_alias_correction(False)"),
    Config("class-tracking-off", frozenset({"tracking"}),
           "__aliasguard_track_views__ = False on the harness's modes and wrappers (opt_out_classes())"),
    Config("class-correction-off", frozenset({"correction", "tracking"}),
           "__aliasguard_fixup__ = False on the harness's modes and wrappers (opt_out_classes())"),
)}
CONFIG_NAMES = tuple(CONFIGS)

# Each mutant switches one feature off (correction takes tracking with it, as its opt-out does).
MUTANTS: dict[str, frozenset[str]] = {
    "correction": _GLOBAL_TRACKING | {"correction"},
    "tracking": _GLOBAL_TRACKING,
    "detach": frozenset({"detach"}),
    "version": frozenset({"version"}),
    "checkpoint": frozenset({"checkpoint", "write-guard"}),
    "write-guard": frozenset({"write-guard"}),
    "torch-class-tracking": frozenset({"torch-class-tracking"}),
}


def opt_out_classes() -> list[type]:
    """The classes the class-* configurations opt out: every mode and tensor subclass the scenarios define
    (any module of this package; subclasses inherit the attribute) and TwoTensor, which the ``twotensor``
    scenarios use. Torch's own (NJT, DTensor, tracing modes) keep aliasguard's defaults."""
    import torch
    from torch.testing._internal.two_tensor import TwoTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    from differential import feature_scenarios, nested_scenarios, scenarios  # noqa: F401  (their classes exist once imported)

    found: list[type] = [TwoTensor]
    todo = [torch.Tensor, TorchDispatchMode]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.split(".")[0] == "differential" and sub not in found:
                found.append(sub)
    return found


def _set_class_attribute(name: str) -> Callable[[], None]:
    touched = []
    for cls in opt_out_classes():
        if name not in cls.__dict__:
            setattr(cls, name, False)
            touched.append(cls)

    def undo() -> None:
        for cls in touched:
            delattr(cls, name)

    return undo


def apply(config: str, ag: Any) -> Callable[[], None]:
    """Switch ``config`` on in the aliasguard worker; returns what switches it back."""
    if config == "default":
        return lambda: None
    if config in ("tracking-off", "correction-off", "both-off"):
        tracking = ag.set_view_tracking(False) if config != "correction-off" else None
        correction = ag.set_alias_correction(False) if config != "tracking-off" else None

        def undo() -> None:
            if correction is not None:
                ag.set_alias_correction(correction)
            if tracking is not None:
                ag.set_view_tracking(tracking)

        return undo
    if config == "class-tracking-off":
        return _set_class_attribute("__aliasguard_track_views__")
    if config == "class-correction-off":
        return _set_class_attribute("__aliasguard_fixup__")
    raise ValueError(f"unknown configuration {config!r}; one of {', '.join(CONFIG_NAMES)}")


def apply_mutant(ag: Any) -> str | None:
    """ALIASGUARD_DIFF_MUTANT=<feature>: switch that feature off for the whole aliasguard worker."""
    name = os.environ.get("ALIASGUARD_DIFF_MUTANT")
    if not name:
        return None
    if name == "correction":
        ag.set_alias_correction(False)
    elif name == "tracking":
        ag.set_view_tracking(False)
    elif name == "detach":
        ag._C._set_detach_keep_version_counter(False)  # the F1 kernel's registrations go
    elif name == "version":
        ag._C._test_set_version_settling(False)  # Note [One bump per write through __torch_dispatch__] skipped
    elif name == "checkpoint":
        import aliasguard.checkpoint as ckpt

        # the checkpoint's own switch for both mutation checks, forced on
        ckpt.create_selective_checkpoint_contexts = functools.partial(ckpt.create_selective_checkpoint_contexts,
                                                                      allow_cache_entry_mutation=True)
    elif name == "write-guard":
        ag._C._test_set_write_guard(False)  # the fast path's regions check versions at their end only
    elif name == "torch-class-tracking":
        from torch.nested._internal.nested_tensor import NestedTensor

        NestedTensor.__aliasguard_track_views__ = False  # torch's own subclass opts out, as a user's class may
    else:
        raise SystemExit(f"ALIASGUARD_DIFF_MUTANT={name!r}: one of {', '.join(MUTANTS)}")
    return name
