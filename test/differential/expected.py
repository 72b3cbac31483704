"""Known aliasguard bugs: reported apart from unexpected differences.

Never an excuse for a new difference: each entry matches one bug's difference
exactly and names scenarios that reproduce it (``repro``); the pytest sample
has an ``xfail(strict=True)`` test per entry, which XPASSes (and so fails) once
no repro scenario shows the bug: then move the entry to FIXED.

FIXED lists bugs that were fixed; their repro scenarios must stay free of any
difference that is not intended.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from differential.compare import Diff


@dataclass(frozen=True)
class Bug:
    id: str
    description: str
    pred: Callable[[Diff], bool]
    repro: tuple[str, ...]

    def matches(self, d: Diff) -> bool:
        try:
            return bool(self.pred(d))
        except Exception:
            return False


MODES = ("pass", "saving", "datamode")  # op_db variants that run the op inside a TorchDispatchMode


def _inside_call(d: Diff) -> dict:
    return d.lookup(d.ag_rec, d.path[:2])


def _body_writes_bump_versions(d: Diff) -> bool:
    if d.family != "opdb" or d.variant not in MODES:
        return False
    if d.key not in ("version", "in_versions") and d.path[0] != "saved_versions_after_write":
        return False
    if not (isinstance(d.stock, int) and isinstance(d.ag, int) and d.ag > d.stock):
        return False
    if d.path[0] in ("outs", "args") and len(d.path) == 3:
        s, a = d.stock_rec[d.path[0]][d.path[1]], d.ag_rec[d.path[0]][d.path[1]]
        # a fresh tensor, or a view of a fresh tensor made inside the op (base "other" on both sides)
        return s["is_view"] == a["is_view"] and (a["is_view"] is False or s["base"] == a["base"] == "other")
    if d.path[0] == "inside":
        if d.key == "in_versions":
            return True
        return _inside_call(d)["view_op"] is False
    if d.path[0] == "saved" and len(d.path) == 3 and int(d.path[1][5:]) % 2 == 0:  # a kept output itself
        s, a = d.stock_rec["saved"][d.path[1]], d.ag_rec["saved"][d.path[1]]
        if s["is_view"] is True and a["is_view"] is True and s["base"] == a["base"] and a["base"] != "other":
            # a view output: it carries its base's counter, which the body's writes moved
            return d.ag == d.ag_rec["saved"][a["base"]]["version"] if a["base"].startswith("saved") else False
        return s["is_view"] is False and a["is_view"] is False
    if d.path[0] == "saved_versions_after_write" and int(d.path[1][5:]) % 2 == 0:
        # the same offset as before the write: the write itself was counted alike
        s, a = d.stock_rec["saved"][d.path[1]], d.ag_rec["saved"][d.path[1]]
        return s["is_view"] is False and a["is_view"] is False and d.ag - d.stock == a["version"] - s["version"]
    return False


def _mode_outputs_become_views(d: Diff) -> bool:
    if d.family != "opdb" or d.variant not in MODES:
        return False
    if d.key == "version" and d.path[0] == "outs" and len(d.path) == 3:
        # the fresh output turned view carries its base's counter
        s, a = d.stock_rec["outs"][d.path[1]], d.ag_rec["outs"][d.path[1]]
        return s["is_view"] is False and a["is_view"] is True
    if d.path[0] in ("saved", "saved_versions_after_write") and len(d.path) in (2, 3):
        # a kept output that came out a view, or a kept view of it (base "other" on the aliasguard side)
        n = int(d.path[1][5:])
        own = d.ag_rec["saved"][f"saved{n - n % 2}"]
        stock_own = d.stock_rec["saved"][f"saved{n - n % 2}"]
        return own["is_view"] is True and stock_own["is_view"] is False
    if d.key not in ("is_view", "base"):
        return False
    if not ((d.key == "is_view" and d.stock is False and d.ag is True) or (d.key == "base" and d.stock is None)):
        return False
    if d.path[0] == "outs":
        return True
    return d.path[0] == "inside" and _inside_call(d)["view_op"] is False


def _body_read_then_view_raises(d: Diff) -> bool:
    return (d.family == "opdb" and d.variant == "saving" and d.path == ("call", "exc") and d.ag == "RuntimeError"
            and "already had autograd metadata" in json.dumps(d.ag_rec.get("call")))


def _body_read_then_view_segfaults(d: Diff) -> bool:
    return d.family == "opdb" and d.variant == "saving" and d.path == ("harness", "exc") and d.ag == (
        "worker exited with -11")


def _saved_multi_view_unreadable(d: Diff) -> bool:
    if d.family != "opdb" or d.variant != "saving" or d.path[:1] != ("saved",) or len(d.path) != 3:
        return False
    if isinstance(d.ag, dict) and d.ag.get("exc") == "RuntimeError" and not isinstance(d.stock, dict):
        return True
    # requires_grad / is_leaf of the same kept view, whose grad_fn raised
    gf = d.ag_rec["saved"][d.path[1]]["grad_fn"]
    return isinstance(gf, dict) and gf.get("exc") == "RuntimeError" and d.key in ("requires_grad", "is_leaf")


def _saved_view_no_gradient(d: Diff) -> bool:
    if d.family != "opdb" or d.variant != "saving" or d.path[:1] != ("saved_view_backward",):
        return False
    ag, stock = d.ag_rec["saved_view_backward"], d.stock_rec["saved_view_backward"]
    return stock.get("exc") == "RuntimeError" and isinstance(ag, list) and all(g is None for g in ag)


def _view_of_detach_desynced(d: Diff) -> bool:
    # saved N-1 is the output of aten::detach, saved N the view kept of it: same _base, another counter
    if d.family != "opdb" or d.variant != "saving" or d.path[0] not in ("saved", "saved_versions_after_write"):
        return False
    n = int(d.path[1][5:])
    if n % 2 != 1 or d.ag_rec["saved_ops"][n - 1] != "aten.detach.default":
        return False
    view, base = d.ag_rec["saved"][f"saved{n}"], d.ag_rec["saved"][f"saved{n - 1}"]
    return view["base"] == f"saved{n - 1}" and view["version"] != base["version"]


EXPECTED_FAILURES: list[Bug] = [
    Bug("body-writes-bump-fresh-outputs",
        "under any TorchDispatchMode, a functional op whose kernel fills its fresh output through an out= "
        "call (abs, diag, cholesky, arange, ...) returns it with _version 1..8 (stock 0): the kernel's internal "
        "writes are counted in the tracked body",
        _body_writes_bump_versions, ("opdb/pass/abs/0", "opdb/pass/diag/0")),
    Bug("mode-outputs-become-views",
        "under a pass-through TorchDispatchMode, outputs of ops whose schema returns fresh tensors "
        "(unsafe_chunk, unsafe_split, matrix_exp, native_layer_norm) come out as views (_is_view() True, "
        "_base set): an in-place op on them then raises 'a view of a leaf Variable ... in-place', stock works",
        _mode_outputs_become_views, ("opdb/pass/unsafe_chunk/0", "opdb/pass/matrix_exp/1")),
    Bug("body-read-then-view-raises",
        "a body that reads an output's autograd state (grad_fn / requires_grad) and then keeps out.view_as(out) "
        "makes the op raise 'Attempted to make a tensor into a differentiable view, but the tensor already "
        "had autograd metadata' (broadcast_to, broadcast_tensors, ...); stock runs",
        _body_read_then_view_raises, ("opdb/saving/broadcast_to/0",)),
    Bug("body-read-then-view-segfaults",
        "the same pattern on view_as_complex / fft.ifft / fft.hfft / fft.ihfft kills the process (SIGSEGV)",
        _body_read_then_view_segfaults, ("opdb/saving/view_as_complex/0",)),
    Bug("saved-multi-output-view-unreadable",
        "a view_as kept from the body of a multi-output view op (chunk, split, unbind) raises RuntimeError "
        "('A view was created in no_grad mode ... returns multiple views') on .is_leaf / .requires_grad",
        _saved_multi_view_unreadable, ("opdb/saving/chunk/0",)),
]


EXPECTED_FAILURES += [
    Bug("saved-view-backward-no-gradient",
        "backward through a view_as kept in a saving mode's body runs but every gradient is None "
        "(linalg.slogdet; stock raises 'does not require grad'): the old silent gradient loss, on a "
        "multi-output op",
        _saved_view_no_gradient, ("opdb/saving/linalg.slogdet/0",)),
    Bug("view-of-detach-counter-desync",
        "torch.arange(..., requires_grad=True) under a mode: the view_as kept of the body's aten::detach "
        "output has _base = the returned leaf but another version counter (view 1, leaf 0)",
        _view_of_detach_desynced, ("opdb/saving/arange/0",)),
]


@dataclass(frozen=True)
class Fixed:
    id: str
    description: str
    repro: tuple[str, ...]


FIXED: list[Fixed] = [
    Fixed("njt-nested-view-from-jagged",
          "NJT under torch.compile / FakeTensorMode raised AliasingError on aten::_nested_view_from_jagged",
          ("njt/compile_eager/sin_mul2", "njt/compile_aot_eager/sin", "njt/fake/sin")),
    Fixed("datamode-view-on-data",
          "a mode answering a view op with func(args[0].data, ...) got AliasingError",
          ("opdb/datamode/view/0", "opdb/datamode/narrow/0")),
    Fixed("saved-view-requires-grad-no-grad-fn",
          "a view_as kept in a saving mode's body reported requires_grad=True with grad_fn=None and lost "
          "its gradient silently",
          ("opdb/saving/sin/0",)),
    Fixed("dtensor-audit-chunk-split-unbind",
          "DTensor chunk/split/unbind raised inside aliasguard.audit()",
          ("dtensor/audit/chunk/shard0", "dtensor/audit/split/replicate", "dtensor/audit/unbind/replicate")),
]
