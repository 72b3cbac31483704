"""Differences aliasguard makes on purpose. Each rule matches exactly one kind of difference.

Mirrored as the table "Intended differences" at the end of docs/design.md. A
difference that no rule here and no known bug in expected.py matches fails the run.

The check is two-sided: each rule names the features it needs (``needs``, configs.FEATURES), and
``intended_where.json`` lists, per torch release, the scenarios in which each rule shows (recorded from
a full run in the default configuration, ``run.py --update-where``). A scenario that ran, in a
configuration leaving every feature of a listed rule on, and does not show that rule fails the run
("intended difference missing"); a rule that shows where it is not listed, or whose feature the
configuration switched off, is unexpected.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

from dataclasses import dataclass
from typing import Any, Callable

from differential.compare import Diff

TRACKED = frozenset({"correction", "tracking"})  # automatic tracking needs correction to hand views back
WHERE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "intended_where.json")


@dataclass(frozen=True)
class Rule:
    id: str
    reason: str
    pred: Callable[[Diff], bool]
    needs: frozenset = TRACKED  # the features (configs.FEATURES) without which the difference is gone
    # features that hide the difference where they are on: with one of them off the rule may also show in
    # scenarios intended_where.json does not list it for (detach's counter, where tracking did the job)
    unmasked_by: frozenset = frozenset()

    def matches(self, d: Diff) -> bool:
        try:
            return bool(self.pred(d))
        except Exception:
            return False


def _mode(d: Diff) -> str | None:
    """The mode or wrapper of an op_db scenario in which aliasguard tracks what a __torch_dispatch__ body does.

    ``opdb/<mode>/<op>/<i>``, and ``opdb_tx/compile_<backend>/<mode>/<op>``: the compiled code runs with the mode
    set and no tracing infrastructure at work (the mode is off while torch.compile traces), so its body is
    tracked as in eager. Under the other transforms (fake, make_fx, functionalize, torch.func) a body runs as
    stock (Note [Tracing infrastructure is left alone]): no rule applies there."""
    if d.family == "opdb":
        return d.variant
    if d.family == "opdb_tx" and d.variant.startswith("compile_"):
        return d.op
    return None


def _named(rec: dict, name: str) -> Any:
    """The record of a tensor by its pool name (argN / outN / savedN), wherever the scenario filed it."""
    for section in ("args", "outs", "saved"):
        if name in rec.get(section, {}):
            return rec[section][name]
    return None


def _inside_view(d: Diff) -> bool:
    # SavingMode's record of an op's outputs *inside* __torch_dispatch__: path inside/<call>/outs/<j>/<key>
    if _mode(d) != "saving" or d.path[:1] != ("inside",) or len(d.path) != 5:
        return False
    out = d.lookup(d.ag_rec, d.path[:4])
    call = d.lookup(d.ag_rec, d.path[:2])
    base = out["base"]
    if call.get("view_op") is not True:  # only ops whose schema says the output is a view
        return False
    if not (out["is_view"] is True and isinstance(base, str) and (base.startswith("in") or base == "other")):
        return False
    if d.key == "is_view":
        return d.stock is False
    if d.key == "base":
        return d.stock is None
    if d.key == "version":  # the view carries its input's counter (base "other": the input is itself a view)
        if base == "other":
            return d.ag in call["in_versions"]
        return d.ag == call["in_versions"][int(base[2:])]
    return False


def _saved_view(d: Diff) -> bool:
    # A view_as kept inside __torch_dispatch__: path saved/savedN/<key>, N odd (the view of saved N-1)
    if _mode(d) != "saving" or d.path[:1] != ("saved",) or len(d.path) != 3:
        return False
    name = d.path[1]
    if int(name[5:]) % 2 != 1:
        return False
    rec = d.ag_rec["saved"][name]
    if rec["is_view"] is not True or rec["base"] is None:
        return False
    if d.key == "is_view":
        return d.stock is False
    if d.key == "base":
        return d.stock is None
    if d.key == "version":
        # base "other": the output it was taken from is itself a view of an unnamed tensor; that output
        # (saved N-1) carries the same counter
        taken_from = d.ag_rec["saved"][f"saved{int(name[5:]) - 1}"]
        base = _named(d.ag_rec, rec["base"]) if rec["base"] != "other" else taken_from
        return base is not None and d.ag == base["version"]
    return False


def _saved_alias_shares_counter(d: Diff) -> bool:
    # A view_as kept inside __torch_dispatch__ that autograd could not make a view of its own (a view of a
    # view made in no-grad mode, or of an output that is not a view for autograd): a plain alias, as in
    # stock, with the counter of the output it was taken from (saved N-1).
    if _mode(d) != "saving" or len(d.path) not in (2, 3):
        return False
    if d.path[0] not in ("saved", "saved_versions_after_write"):
        return False
    n = int(d.path[1][5:])
    if n % 2 != 1:
        return False
    rec, stock_rec = d.ag_rec["saved"][d.path[1]], d.stock_rec["saved"][d.path[1]]
    if rec["is_view"] is not False or stock_rec["is_view"] is not False or rec["base"] is not None:
        return False
    if d.path[0] == "saved":
        return d.key == "version" and d.ag == d.ag_rec["saved"][f"saved{n - 1}"]["version"]
    return d.ag == d.ag_rec["saved_versions_after_write"][f"saved{n - 1}"]


def _body_writes_count_inside(d: Diff) -> bool:
    # Inside a tracked body an in-place op (or one inside a composite op) bumps what it writes, as at top
    # level; stock counts nothing below ADInplaceOrView. The body's own bump of the op it answers is taken
    # back when it returns, so the versions seen after the op are stock's (compared elsewhere).
    if _mode(d) not in ("pass", "saving", "datamode"):
        return False
    if d.path[:1] != ("inside",) or len(d.path) < 4:
        return False
    written_output = d.path[2] == "outs" and d.key == "version" and len(d.path) == 5
    written_argument = d.path[2] == "in_versions" and len(d.path) == 4
    if not (written_output or written_argument):
        return False
    return isinstance(d.ag, int) and isinstance(d.stock, int) and d.ag > d.stock


def _saved_view_after_write(d: Diff) -> bool:
    # saved_versions_after_write/savedN, N odd: the saved view moves with the output it views
    if _mode(d) != "saving" or d.path[:1] != ("saved_versions_after_write",):
        return False
    n = int(d.path[1][5:])
    after = d.ag_rec["saved_versions_after_write"]
    return n % 2 == 1 and d.ag_rec["saved"][d.path[1]]["is_view"] is True and d.ag == after[f"saved{n - 1}"]


def _saved_view_autograd(d: Diff) -> bool:
    # design.md "Views made in a tracked body are views for autograd": the kept view gets a grad_fn from its base
    if _mode(d) != "saving":
        return False
    if d.path[:1] == ("saved",) and len(d.path) == 3:
        if int(d.path[1][5:]) % 2 != 1:
            return False
        rec = d.ag_rec["saved"][d.path[1]]
        grad_fn = rec["grad_fn"]
        has_history = rec["is_view"] is True and isinstance(grad_fn, str) and grad_fn.endswith("Backward0")
        if not has_history:
            return False
        return ((d.key == "requires_grad" and d.stock is False and d.ag is True)
                or (d.key == "grad_fn" and d.stock is None)
                or (d.key == "is_leaf" and d.stock is True and d.ag is False))
    if d.path[:1] == ("saved_view_backward",):
        # stock: "does not require grad"; aliasguard: backward runs through the output's own history, so
        # the gradients are what backward through that output gives (None for slogdet's sign, as at top level)
        ag, stock = d.ag_rec["saved_view_backward"], d.stock_rec["saved_view_backward"]
        return stock.get("exc") == "RuntimeError" and isinstance(ag, list)
    return False


def _wrapper_takes_inplace_sizes(d: Diff) -> bool:
    # A wrapper argument of an in-place op takes the sizes the op returned (t_, resize_, squeeze_ inside
    # composite ops): the wrapper's output then has the shape the op has on plain tensors; stock's has not.
    # opdb/<mode>/...: path outs/outN/<key>; opdb_tx/compile_*/<mode>/...: calls/<i>/outs/outN/<key>, where the
    # wrapper's body runs outside dynamo's graph (a graph break in it) on real tensors, as in eager.
    if d.family == "opdb_tx" and d.op == "wrapper" and d.variant in ("make_fx", "functionalize", "grad", "vjp",
                                                                     "vmap"):
        return _wrapper_inplace_sizes_outside_tracing(d)
    if _mode(d) not in ("wrapper", "twotensor") or d.key not in ("shape", "stride"):
        return False
    if d.family == "opdb" and len(d.path) == 3 and d.path[0] == "outs":
        ag, stock = d.ag_rec["outs"], d.stock_rec["outs"]
    elif d.family == "opdb_tx" and len(d.path) == 5 and d.path[0] == "calls" and d.path[2] == "outs":
        ag, stock = d.ag_rec["calls"][d.path[1]]["outs"], d.stock_rec["calls"][d.path[1]]["outs"]
    else:
        return False
    name = d.path[-2]
    plain = d.ag_rec["plain_shapes"][int(name[3:])]
    return ag[name]["shape"] == plain and stock[name]["shape"] != plain


def _shape_is_plain(d: Diff, outs_key: str, plain: list) -> bool:
    # path <outs_key>/outN/<shape|stride>: aliasguard's output has the op's shape on plain tensors, stock's not
    if len(d.path) != 3 or d.path[0] != outs_key or d.key not in ("shape", "stride"):
        return False
    name = d.path[1]
    want = plain[int(name[3:])]
    return d.ag_rec[outs_key][name]["shape"] == want and d.stock_rec[outs_key][name]["shape"] != want


def _wrapper_inplace_sizes_outside_tracing(d: Diff) -> bool:
    """The same correction where the wrapper's body runs with no tracing infrastructure to see.

    make_fx / functionalize: the traced graph run afterwards on the wrapper inputs (path outs/...; while
    tracing, traced_outs and the graph code are stock's). torch.func grad / vjp / vmap: functorch hands the
    body its unwrapped tensors below its own layer, where no transform is visible, so the body is corrected
    as in eager; the outputs then have the plain op's shapes, their gradients the plain run's strides, and a
    vjp on stock's stale shape raises where the plain run's and aliasguard's do not.
    """
    if d.variant in ("make_fx", "functionalize"):
        return _shape_is_plain(d, "outs", d.ag_rec["plain_shapes"])
    ref = d.ag_rec["plain"]
    if d.path[:1] == ("outs",):
        return _shape_is_plain(d, "outs", [ref["outs"][n]["shape"] for n in sorted(ref["outs"], key=_index)])
    outs_plain = all(t["shape"] == ref["outs"][n]["shape"] for n, t in d.ag_rec["outs"].items())
    if d.path[:1] == ("grads",) and len(d.path) >= 3 and d.path[2] == "stride":
        name = d.path[1]
        want = ref["grads"][name]["stride"]
        return outs_plain and d.ag_rec["grads"][name]["stride"] == want and d.stock_rec["grads"][name]["stride"] != want
    if d.path == ("vjp", "exc"):
        return outs_plain and d.stock == "RuntimeError" and d.ag == "<no exception>" and "vjp" not in ref
    if d.path == ("grads",):
        grads = d.ag_rec["grads"]
        return (outs_plain and "grads" not in d.stock_rec and "vjp" in d.stock_rec
                and {n: {"shape": t["shape"], "stride": t["stride"]} for n, t in grads.items()} == ref["grads"])
    return False


def _index(name: str) -> int:
    return int(re.sub(r"\D", "", name))


DETACH = "aten.detach.default"


def _detach_keeps_counter(d: Diff) -> bool:
    # detach below autograd (here: inside a mode's __torch_dispatch__) shares its input's version counter
    if d.family == "detach":
        # detach/<op>: kept/keptN/version (the output's, stock 0), kept_versions_after_write/keptN (the output's
        # after the write, stock 0); kept N is output N's
        if d.path[:1] == ("kept",) and len(d.path) == 3 and d.key == "version":
            return d.stock == 0 and d.ag == d.ag_rec["outs"][f"out{d.path[1][4:]}"]["version"]
        if d.path[:1] == ("kept_versions_after_write",) and len(d.path) == 2:
            return d.stock == 0 and d.ag == d.ag_rec["out_versions_after_write"][f"out{d.path[1][4:]}"]
        return False
    if _mode(d) not in ("pass", "saving", "datamode"):
        return False
    if d.path[:1] == ("inside",) and len(d.path) == 5 and d.key == "version":
        call = d.lookup(d.ag_rec, d.path[:2])
        return call["op"] == DETACH and d.ag == call["in_versions"][0] and d.stock == 0  # stock: a fresh counter
    if d.path[:1] in (("saved",), ("saved_versions_after_write",)) and len(d.path) in (2, 3):
        n = int(d.path[1][5:])
        both_plain = all(r["saved"][d.path[1]]["is_view"] is False for r in (d.ag_rec, d.stock_rec))
        is_version = d.path[0] == "saved_versions_after_write" or d.key == "version"
        return (d.ag_rec["saved_ops"][n] == DETACH and both_plain and is_version
                and isinstance(d.ag, int) and isinstance(d.stock, int) and d.ag > d.stock)
    return False


def _checkpoint_refuses(variant: str) -> Callable[[Diff], bool]:
    # aliasguard.checkpoint refuses a cached tensor that was written: CheckpointMutationError, in the forward
    # pass (a write inside the region) or in backward (after it), where torch's SAC raises its own
    # RuntimeError at recompute or, for a batched matmul's result (its _unsafe_view), computes silently
    # wrong gradients. Only where the aliasguard side used aliasguard.checkpoint (``variant``).
    def pred(d: Diff) -> bool:
        if d.family != "checkpoint" or d.variant != variant or d.key != "exc":
            return False
        return d.ag == "CheckpointMutationError" and d.stock in ("RuntimeError", "<no exception>")

    return pred


def _checkpoint_refuses_before_the_write(variant: str, paths: tuple[str, ...]) -> Callable[[Diff], bool]:
    # checkpoint/<variant>/write_in_forward_kept: aliasguard.checkpoint refuses the write inside the region
    # (CheckpointMutationError from the call: path "refused") before it happens, so the tensor it would have
    # written keeps its value and version (path "kept"); torch's SAC lets the write through (and finds it at
    # recompute). The fast path's two halves are two rules: the refusal alone would also come from the
    # version check at the region's end, without its write guard.
    def pred(d: Diff) -> bool:
        if d.family != "checkpoint" or d.variant != variant or d.path[0] not in paths:
            return False
        if d.path == ("refused",):
            return d.ag == "CheckpointMutationError" and d.stock == "<no exception>"
        if d.key == "version":
            return isinstance(d.ag, int) and isinstance(d.stock, int) and d.ag < d.stock
        return d.key in ("value", "grad_fn")  # the write's value and its AddBackward0 are not there

    return pred


def _untracked_saving_counter(d: Diff) -> bool:
    # dispatcher/saving/... with tracking off: the saving mode's outputs of view ops share their input's
    # counter by correction alone (as top level), so writing the outputs afterwards moves what was kept of
    # them (stock: each kept tensor its own counter). In the default configuration the dispatcher rules
    # explain these; this rule is never listed and only shows while tracking is off (unmasked_by).
    if d.family != "dispatcher" or d.variant != "saving" or d.path[:1] != ("saved_versions_after_write",):
        return False
    return isinstance(d.ag, int) and isinstance(d.stock, int) and d.ag > d.stock


def _audit_reports_uncorrected(d: Diff) -> bool:
    # an audit variant (njt/audit/..., dtensor/audit/..., trace/audit/...): a step that raised AliasingError on
    # the aliasguard side only
    return d.variant == "audit" and d.key == "exc" and d.ag == "AliasingError" and d.stock != "AliasingError"


def _body_rewrite_counts(d: Diff) -> bool:
    # rewrite/<op>: the body writes the op's argument once more after answering it; that write counts
    # (one more than stock, in the argument and in the output that is the argument or its view)
    if d.family != "rewrite" or d.key != "version" or len(d.path) != 3 or d.path[0] not in ("args", "outs"):
        return False
    return isinstance(d.ag, int) and isinstance(d.stock, int) and d.ag == d.stock + 1


def _dispatcher_top(d: Diff) -> dict | None:
    # dispatcher/<mode>/<op>/<variant>: the op at top level, recorded alike on both sides
    top = d.ag_rec.get("top") if d.family == "dispatcher" and isinstance(d.ag_rec, dict) else None
    if not isinstance(top, dict) or "tensors" not in top or top != d.stock_rec.get("top"):
        return None
    return top


def _dispatcher_settled_writes(d: Diff) -> bool:
    # dispatcher/*: an op that writes arguments, returns nothing and has no ADInplaceOrView kernel (_foreach_*_,
    # _fused_sgd_, _cummax_helper): through a mode each written argument's version is what top level gives
    # (once per list element: a tensor listed twice, two views of one base count twice), or, where top level
    # counts nothing (a kernel that writes without calling in-place ops), one bump per written argument
    top = _dispatcher_top(d)
    if top is None or not d.ag_rec.get("settled_writes") or d.path[:1] != ("args",) or len(d.path) != 3:
        return False
    if d.key != "version" or not isinstance(d.ag, int) or not isinstance(d.stock, int):
        return False
    at_top = top["tensors"].get(d.path[1], {}).get("version")
    writes = 2 if d.scenario.rsplit("/", 1)[-1] in ("repeated", "halves", "overlap") else 1
    return d.ag == at_top or (at_top == d.stock and d.ag == d.stock + writes)


def _dispatcher_as_top_level(d: Diff) -> bool:
    # dispatcher/*: an argument or output after the op through a mode, or a kept tensor that is one of the op's
    # outputs (saving, keep), is what top level gives: version, _is_view, _base, and the version after the
    # outputs are written. Custom ops (any registration time) count and make views as at top level.
    top = _dispatcher_top(d)
    if top is None or d.ag_rec.get("settled_writes") and d.path[:1] == ("args",):
        return False
    section = d.path[0] if d.path else None
    name = d.path[1] if len(d.path) > 1 else None
    if section in ("args", "outs") and len(d.path) == 3 and d.key in ("version", "is_view", "base"):
        want = top["tensors"].get(name, {}).get(d.key, "<none>")
    elif section == "saved" and len(d.path) == 3 and d.key in ("version", "is_view", "base"):
        out = d.ag_rec.get("saved_is", {}).get(name)
        want = top["tensors"].get(out, {}).get(d.key, "<none>") if out else "<none>"
    elif section == "saved_versions_after_write" and len(d.path) == 2:
        out = d.ag_rec.get("saved_is", {}).get(name)
        want = top.get("after_write", {}).get(out, "<none>") if out else "<none>"
    else:
        return False
    return want == d.ag and want != d.stock


# --- family nested: two modes in every opt-out combination, wrappers inside modes, a mode inside a wrapper ---

NESTED_INT_PATHS = ("written_after_call", "written_after_rewrite")


def _nested_top(d: Diff) -> Any:
    """What the top-level emulation (the bodies as plain functions at top level, ``top``: recorded alike on both
    sides) has at the difference's path; ``<none>`` where it has nothing there."""
    top = d.ag_rec.get("top") if d.family == "nested" and isinstance(d.ag_rec, dict) else None
    if not isinstance(top, dict) or top != d.stock_rec.get("top"):
        return "<none>"
    node = d.lookup(top, d.path)
    return "<none>" if node is None and d.lookup(top, d.path[:-1]) is None else node


def _nested_versionish(d: Diff) -> bool:
    """A version read anywhere in a nested record (argument, output, kept view, inside a body, after a write)."""
    if d.key == "version" or d.path[:1] == ("kept_versions_after_write",):
        return True
    return len(d.path) >= 4 and d.path[0].startswith("inside_") and d.path[2] in NESTED_INT_PATHS


def _nested_autograd_view(d: Diff, want_view: Callable[[], bool]) -> bool:
    """A kept view's autograd fields (tracked-body-views-are-autograd-views), or an output's grad_fn regenerated
    as as_strided's after a write that now counts (a view whose base's counter moved, as at top level)."""
    section = d.path[0] if d.path else ""
    if section.startswith("kept_") and section != "kept_versions_after_write" and len(d.path) == 3:
        rec = d.ag_rec[section][d.path[1]]
        if rec.get("is_view") is not True or not want_view():
            return False
        return ((d.key == "requires_grad" and d.stock is False and d.ag is True)
                or (d.key == "is_leaf" and d.stock is True and d.ag is False)
                or (d.key == "grad_fn" and d.stock is None and isinstance(d.ag, str) and d.ag.endswith("Backward0")))
    if section == "outs" and len(d.path) == 3 and d.key == "grad_fn" and d.ag == "AsStridedBackward0":
        ag, stock = d.ag_rec["outs"][d.path[1]], d.stock_rec["outs"][d.path[1]]
        return ag["is_view"] is True and isinstance(ag["version"], int) and ag["version"] > stock["version"]
    return False


def _nested_tracking_seen(rec: dict, stock: dict | None = None) -> bool:
    """Whether a body's view, or a view kept from one, is a view on this side, or a write made in a body (other
    than a _foreach_ op's, which correction settles alone) counts there: what tracking alone makes (with tracking
    off, a body's views are plain aliases and its writes count nothing, as in stock). The tracked rules show
    only then."""
    for section, node in (stock or {}).items():
        if not section.startswith("inside_") or not isinstance(node, dict):
            continue
        for i, c in node.items():
            mine = rec.get(section, {}).get(i)
            if not mine or "_foreach_" in c["op"]:
                continue
            for key in NESTED_INT_PATHS:
                if any(isinstance(a, int) and isinstance(b, int) and a > b
                       for a, b in zip(mine.get(key, []), c.get(key, []))):
                    return True
    for section, node in rec.items():
        if section.startswith("inside_") and isinstance(node, dict):
            if any(v.get("is_view") is True for c in node.values() for v in c.get("outs", []) + c.get("kept", [])):
                return True
        if section.startswith("kept_") and section != "kept_versions_after_write" and isinstance(node, dict):
            if any(v.get("is_view") is True for v in node.values()):
                return True
    return False


def _nested_as_top_level(d: Diff) -> bool:
    # nested/tracked-tracked/<op>: both bodies tracked, so every op they run counts and views as at top level:
    # each version, _is_view, _base and stale-version flag is the emulation's (and not stock's)
    if d.family != "nested" or d.variant != "tracked-tracked" or not _nested_tracking_seen(d.ag_rec, d.stock_rec):
        return False
    want = _nested_top(d)
    if want != "<none>" and (d.key in ("version", "is_view", "base") or _nested_versionish(d)
                             or d.path[:1] == ("stale",)):
        return d.ag == want and d.stock != want
    return _nested_autograd_view(d, lambda: _nested_top_kept_is_view(d))


def _nested_top_kept_is_view(d: Diff) -> bool:
    return _nested_top(dataclasses.replace(d, path=d.path[:2] + ("is_view",))) is True


def _nested_between(d: Diff) -> bool:
    # nested/<outer>-<inner>/<op> with a body that opts out: what the tracked bodies run counts and views as at
    # top level, what the untracked ones run as stock, so each observable lies between stock's and the
    # emulation's: a version above stock's and at most top level's, a view where top level has one, a stale
    # version that matches no more (top level's flag)
    if d.family != "nested" or d.variant.startswith(("wrapper_in_", "mode_in_")):
        return False
    want = _nested_top(d)
    if want == "<none>":
        return _nested_autograd_view(d, lambda: _nested_top_kept_is_view(d))
    if _nested_versionish(d):
        return isinstance(d.ag, int) and isinstance(d.stock, int) and isinstance(want, int) and d.stock < d.ag <= want
    if d.key == "is_view":
        return d.stock is False and d.ag is True and want is True
    if d.key == "base":
        # the view top level makes; its _base the emulation's, or the tensor it was taken from where an untracked
        # body handed that tensor on as a plain alias (no kernel above it to make it a view of its root)
        return d.stock is None and isinstance(d.ag, str) and want is not None
    if d.path[:1] == ("stale",):
        return d.stock is True and d.ag is False and want is False
    return _nested_autograd_view(d, lambda: _nested_top_kept_is_view(d))


def _nested_wrapper_tracked(d: Diff) -> bool:
    # the same, with a tracked body: the mode's (nested/wrapper_in_tracked/...) or the wrapper's own, which
    # enters the mode (nested/mode_in_wrapper/<mode>/...: the wrapper class tracks whatever the mode does)
    # (the wrapper's own body is not recorded: there, a write other than a _foreach_ op's counting is tracking's)
    wrapper_counted = d.variant == "mode_in_wrapper" and "foreach" not in d.scenario and (any(
        isinstance(a.get("version"), int) and a["version"] > d.stock_rec.get("args", {}).get(n, {}).get("version", 0)
        for n, a in d.ag_rec.get("args", {}).items()) or d.ag_rec.get("stale") != d.stock_rec.get("stale"))
    return (d.variant in ("wrapper_in_tracked", "mode_in_wrapper")
            and (wrapper_counted or _nested_tracking_seen(d.ag_rec, d.stock_rec)) and _nested_wrapper(d))


def _nested_between_tracked(d: Diff) -> bool:
    # the same, in a combination with a tracked body (what it runs counts and views as at top level)
    return "tracked" in d.variant.split("-") and _nested_tracking_seen(d.ag_rec, d.stock_rec) and _nested_between(d)


VIEW_OPS_REPLAYED = ("aten.slice.Tensor", "aten.as_strided.default", "aten.view.default")


def _nested_wrapper(d: Diff) -> bool:
    # nested/wrapper_in_<mode>/<wrapper>/<op> and nested/mode_in_wrapper/<mode>/<op>: a wrapper's body below a
    # mode's, or a mode's below a wrapper's; the corrected (tracked) bodies count writes and make views, the rest
    # run as stock: versions only above stock's, views only where stock has a plain alias, stale versions that
    # match no more; autograd regenerating a written view's grad_fn replays the view op through the body (more
    # calls seen there, all of them view ops, after stock's)
    if d.family != "nested" or not d.variant.startswith(("wrapper_in_", "mode_in_")):
        return False
    if _nested_versionish(d):
        if isinstance(d.ag, int) and isinstance(d.stock, int):
            return d.ag > d.stock
        return d.path[:1] == ("kept_versions_after_write",) and d.stock == "<absent>" and isinstance(d.ag, int)
    if d.key == "is_view":
        return d.stock is False and d.ag is True
    if d.key == "base":
        return d.stock is None and isinstance(d.ag, str)
    if d.path[:1] == ("stale",):
        return d.stock is True and d.ag is False
    section = d.path[0] if d.path else ""
    if section.startswith("inside_") and len(d.path) == 2 and d.stock == "<absent>":
        return d.ag_rec[section][d.path[1]]["op"] in VIEW_OPS_REPLAYED  # a call stock's body did not see
    if section.startswith(("inside_", "kept_")) and len(d.path) == 1 and d.stock == "<absent>":
        return section.startswith("kept_") or all(c["op"] in VIEW_OPS_REPLAYED for c in d.ag_rec[section].values())
    if section.startswith("kept_") and len(d.path) == 2 and d.stock == "<absent>":
        return True  # a view kept by the replayed view op's body
    return _nested_autograd_view(d, lambda: True)


_OPDB_SAVING_RULES = ("inside-dispatch-views-are-views", "saved-view-is-view", "saved-alias-shares-counter",
                      "body-writes-count-inside", "saved-view-sees-writes")


def _dispatcher_saving_as_opdb(d: Diff) -> bool:
    # dispatcher/saving/*: the saving mode of the opdb family, on the dispatcher's ops: what its rules accept
    if d.family != "dispatcher" or d.variant != "saving":
        return False
    as_opdb = dataclasses.replace(d, scenario="opdb/" + d.scenario.split("/", 1)[1])
    return any(RULES[r].matches(as_opdb) for r in _OPDB_SAVING_RULES)



# --- dynamo's guards for frames compiled inside a tracked body ---------------------------------

_KEY_SET = re.compile(r"DispatchKeySet\(([^)]*)\)")
# The keys a tracked body's thread state adds (Note [The tracked views' dispatch key]; the body runs with
# ADInplaceOrView as top level does), which dynamo's tensor guards read from the thread's include set.
_TRACKED_BODY_KEYS = frozenset({"ADInplaceOrView", "AutocastIPU"})


def _global_state(line: str) -> Any:
    try:
        return json.loads(line.split(" against ", 1)[1])
    except (IndexError, ValueError):
        return None


def _tracked_body_guards(d: Diff) -> bool:
    """A frame dynamo compiles inside a tracked ``__torch_dispatch__`` body (a graph break there) records the
    body's thread state in its guards: its tensors' dispatch key sets hold the body's keys (and a tensor the
    body made as a view requires grad, as tracked-body-views-are-autograd-views has it), and the global
    state reads autocast as enabled for exactly one device (IPU, the borrowed key's). Nothing else of the
    line differs."""
    if _mode(d) is None or d.path[:1] != ("guards",) or len(d.path) != 3:
        return False
    _, frame, line = d.path
    stock_line, ag_line = d.stock_rec["guards"][frame][line], d.ag_rec["guards"][frame][line]  # not shortened
    if "TENSOR_MATCH:" in ag_line:
        s, a = _KEY_SET.search(stock_line), _KEY_SET.search(ag_line)
        if s is None or a is None:
            return False
        stock_keys, ag_keys = s.group(1).split(", "), a.group(1).split(", ")
        added = set(ag_keys) - set(stock_keys)
        rest_stock, rest_ag = stock_line.replace(s.group(0), ""), ag_line.replace(a.group(0), "")
        # a tensor the body made as a view requires grad (tracked-body-views-are-autograd-views)
        made_view = rest_ag.replace("requires_grad=True", "requires_grad=False") == rest_stock
        return (set(stock_keys) <= set(ag_keys) and bool(added) and added <= _TRACKED_BODY_KEYS
                and (rest_stock == rest_ag or made_view))
    if "GLOBAL_STATE:" in ag_line:
        stock, ag = _global_state(stock_line), _global_state(ag_line)
        if not isinstance(stock, dict) or not isinstance(ag, dict):
            return False
        s_on, a_on = stock["autocast_state"]["enabled"], ag["autocast_state"]["enabled"]
        turned_on = [i for i, (x, y) in enumerate(zip(s_on, a_on)) if x != y]
        if len(s_on) != len(a_on) or len(turned_on) != 1 or a_on[turned_on[0]] is not True:
            return False
        ag["autocast_state"]["enabled"] = s_on
        return ag == stock
    return False


_VALUES_BASE_GUARD = re.compile(
    r"^(?:\| )*\+- LAMBDA_GUARD: (L\['[^']+'\])\._values\._base\.size\(\)\[\d+\] == \1\._values\.size\(\)\[\d+\]$")


def _njt_values_base_guard(d: Diff) -> bool:
    """torch.compile of a function whose input is an NJT view made by an op whose NJT body views its values:
    the input's ``_values`` is an autograd view there (its body was tracked), so dynamo also guards the size
    of its ``_base`` against the values' own, one line per such input; every other guard is stock's."""
    if d.family != "njt" or not d.variant.startswith("compile_") or d.path[:1] != ("guards",) or len(d.path) != 2:
        return False
    stock, ag = d.stock_rec["guards"][d.path[1]], d.ag_rec["guards"][d.path[1]]
    extra = [line for line in ag if line not in stock]
    return bool(extra) and set(stock) <= set(ag) and all(_VALUES_BASE_GUARD.match(line) for line in extra)

INTENDED: list[Rule] = [
    Rule("inside-dispatch-views-are-views",
         "inside __torch_dispatch__ a view op's output is an autograd view of its input and shares its "
         "version counter (view tracking below autograd)",
         _inside_view),
    Rule("saved-view-is-view",
         "a view made inside __torch_dispatch__ and kept (saving mode) is a view of the output it was "
         "taken from: _is_view, _base and the shared _version",
         _saved_view),
    Rule("saved-alias-shares-counter",
         "a view_as kept inside __torch_dispatch__ that autograd cannot make a view of its own (one made from a "
         "view created in no-grad mode) stays a plain alias, as in stock, but shares the counter of the output "
         "it was taken from",
         _saved_alias_shares_counter),
    Rule("body-writes-count-inside",
         "inside __torch_dispatch__ an in-place op (also inside a composite op) bumps what it writes, as at top "
         "level (stock: nothing below ADInplaceOrView counts); the body's bump of the op it answers is taken "
         "back when it returns, so versions after the op equal stock's",
         _body_writes_count_inside),
    Rule("saved-view-sees-writes",
         "a write to an op's output after the forward bumps the version of a view of it kept inside "
         "__torch_dispatch__ (stock: the kept view has its own counter and never moves)",
         _saved_view_after_write),
    Rule("tracked-body-views-are-autograd-views",
         "a view kept from a __torch_dispatch__ body gets its grad_fn from its base once read: requires_grad, "
         "grad_fn, is_leaf, and backward through it reaches the op's inputs (stock: a plain alias, no grad)",
         _saved_view_autograd),
    Rule("detach-keeps-counter",
         "aten::detach below autograd shares its input's version counter (design.md: detach keeps the version "
         "counter), so the detached tensor's _version follows its input's and moves with writes to it",
         _detach_keeps_counter, frozenset({"detach"}), frozenset({"tracking"})),
    Rule("tracked-body-guards",
         "dynamo's guards for a frame it compiles inside a tracked __torch_dispatch__ body (a graph break in a "
         "wrapper's body, opdb_tx/compile_*) read the body's thread state: its tensors' dispatch key sets hold "
         "ADInplaceOrView (the body runs as top level does) and AutocastIPU (the borrowed tracked-views key), "
         "and the global state reads autocast as enabled for IPU, the device of that key",
         _tracked_body_guards),
    Rule("njt-values-base-guard",
         "torch.compile of a function whose input is a view of a nested jagged tensor made by narrow or unsqueeze "
         "(whose NJT bodies view the values): the input's _values is an autograd view of its base's values (views "
         "made in a tracked body are views for autograd), so dynamo guards that base's size too: one more guard",
         _njt_values_base_guard, frozenset({"torch-class-tracking"})),
    Rule("wrapper-inplace-sizes",
         "a wrapper subclass written by an in-place op takes the sizes the op returned, so its shape/stride "
         "match the op on plain tensors (stock keeps the wrapper's stale sizes)",
         _wrapper_takes_inplace_sizes, frozenset({"correction"})),
    Rule("audit-reports-uncorrected",
         "with alias correction off for the process, aliasguard.audit() raises AliasingError for a subclass's "
         "results that break their schema's aliasing (a nested jagged tensor's views: no shared storage or "
         "counter), which correction otherwise repairs before the audit looks; stock has no audit",
         _audit_reports_uncorrected, frozenset(), frozenset({"correction"})),
    Rule("checkpoint-refuses-mutated-cache",
         "aliasguard.checkpoint (its fast path: C++ kernels for the listed ops) raises CheckpointMutationError "
         "for a write to a cached tensor (before the write inside the forward region, or at backward for a "
         "write after it), where torch's SAC raises a RuntimeError at recompute or, when a batched matmul's "
         "_unsafe_view hides the write, computes wrong gradients silently",
         _checkpoint_refuses("sac"), frozenset({"checkpoint"})),
    Rule("checkpoint-refuses-in-the-region",
         "aliasguard.checkpoint's fast path refuses a write to a cached tensor inside the region: the call "
         "raises CheckpointMutationError, where torch's SAC lets the write through",
         _checkpoint_refuses_before_the_write("sac", ("refused",)), frozenset({"checkpoint"})),
    Rule("checkpoint-refuses-before-the-write",
         "and it refuses it before it happens (its write guard: C++ kernels for the ops that write, on while "
         "the region runs): the tensor keeps its value and version",
         _checkpoint_refuses_before_the_write("sac", ("kept",)), frozenset({"checkpoint", "write-guard"})),
    Rule("checkpoint-modes-refuse-before-the-write",
         "the same with fast_path=False: its forward dispatch mode refuses the write before it happens",
         _checkpoint_refuses_before_the_write("sac_modes", ("refused", "kept")), frozenset({"checkpoint", "detach"})),
    Rule("checkpoint-modes-refuse-mutated-cache",
         "the same with fast_path=False (its dispatch modes: the write is refused before it happens); the modes "
         "keep cached outputs with detach below autograd, so this rests on detach keeping the counter too",
         _checkpoint_refuses("sac_modes"), frozenset({"checkpoint", "detach"})),
    Rule("body-rewrite-counts",
         "a __torch_dispatch__ body that writes an in-place op's argument once more after answering the op: "
         "that write counts (_version one more than stock); only the bump of the body's own call of the op is "
         "taken back (Note [One bump per write through __torch_dispatch__])",
         _body_rewrite_counts, TRACKED | {"version"}),
    Rule("dispatcher-settled-writes-count",
         "through a mode, an op that writes arguments, returns nothing and has no ADInplaceOrView kernel "
         "(_foreach_*_, _fused_sgd_, _cummax_helper) bumps each written argument as top level does, once per "
         "list element (stock: 0 below ADInplaceOrView); where top level counts nothing, once per written "
         "argument (Note [One bump per write through __torch_dispatch__])",
         _dispatcher_settled_writes, frozenset({"correction", "version"})),
    Rule("dispatcher-mode-as-top-level",
         "through a mode, the arguments and outputs of an op, and outputs kept in the body, are what top level "
         "gives (versions, _is_view, _base, versions after a write), custom ops included whenever registered "
         "(Note [What a tracked body's call runs as], Note [Ops registered after the tracked views' kernels])",
         _dispatcher_as_top_level),
    Rule("dispatcher-saving-as-opdb",
         "the saving mode on the dispatcher's ops: the differences the opdb saving mode's rules accept",
         _dispatcher_saving_as_opdb),
]
INTENDED += [
    Rule("nested-tracked-as-top-level",
         "two tracked modes nested (nested/tracked-tracked): every op their bodies run, the op they answer included, "
         "counts and makes views as at top level (the emulation: the same bodies as plain functions at top level), "
         "so a version recorded between two writes never matches again; stock counts nothing below autograd",
         _nested_as_top_level),
    Rule("nested-between-stock-and-top-level",
         "two nested modes of which one opts out (__aliasguard_track_views__ or __aliasguard_fixup__ False): what "
         "a tracked body runs counts as at top level, what an untracked one runs as stock; each version lies above "
         "stock's and at most at top level's, views only where top level has them",
         _nested_between_tracked),
    Rule("nested-untracked-bodies-corrected",
         "two nested modes, neither tracked (one opts out of tracking, the other of tracking or correction): the "
         "corrected body's results share their input's counter (a kept view of an output sees the output's "
         "writes) and _foreach_* writes are counted once per element, as at top level; nothing else moves",
         _nested_between, frozenset({"correction"}), frozenset({"tracking"})),
    Rule("nested-wrapper-tracked-mode",
         "a wrapper subclass inside a tracked mode, or a mode inside a (tracked) wrapper's __torch_dispatch__: the "
         "tracked body counts writes and makes views as at top level (versions above stock's, views where stock has "
         "plain aliases, stale versions that match no more)",
         _nested_wrapper_tracked),
    Rule("nested-wrapper-counts-writes",
         "a wrapper subclass inside a mode that opts out, or such a mode inside a wrapper's __torch_dispatch__: the "
         "corrected bodies "
         "count writes and make views (versions above stock's, views where stock has plain aliases, stale versions "
         "that match no more); autograd replays a written view's view op through the body when it regenerates its "
         "grad_fn, as at top level",
         _nested_wrapper, frozenset({"correction"}), frozenset({"tracking"})),
]
# Last: it may explain only what no rule above does, and only while tracking is off.
INTENDED.append(Rule(
    "untracked-saving-views-share-counter",
    "tracking off: a saving mode's kept outputs of view ops (dispatcher family) share their input's counter by "
    "alias correction alone, so the writes made to the outputs after the op move them (stock: fresh counters)",
    _untracked_saving_counter, frozenset({"correction"}), frozenset({"tracking"})))
RULES: dict[str, Rule] = {r.id: r for r in INTENDED}


def allowed(off: frozenset) -> list[Rule]:
    """The rules that can show when the features in ``off`` are switched off."""
    return [r for r in INTENDED if not (r.needs & off)]


def torch_release() -> str:
    import torch

    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def load_where(release: str) -> dict[str, list[str]] | None:
    """scenario id -> the rules it shows in the default configuration, as recorded for this torch release."""
    if not os.path.exists(WHERE_FILE):
        return None
    with open(WHERE_FILE) as f:
        return json.load(f).get("releases", {}).get(release)


def save_where(release: str, shown: dict[str, list[str]], ran: list[str]) -> None:
    """Record the rules each scenario in ``ran`` showed (others keep their entry)."""
    data: dict[str, Any] = {"releases": {}}
    if os.path.exists(WHERE_FILE):
        with open(WHERE_FILE) as f:
            data = json.load(f)
    data["about"] = ("scenario id -> the intended rules it shows in the default configuration, per torch "
                     "release; written by test/differential/run.py --update-where (docs/differential.md)")
    where = data.setdefault("releases", {}).setdefault(release, {})
    for sid in ran:
        where.pop(sid, None)
        if shown.get(sid):
            where[sid] = sorted(shown[sid])
    data["releases"][release] = dict(sorted(where.items()))
    # one line per scenario, so that a change reads as a diff of the scenarios it concerns
    lines = ["{", f' "about": {json.dumps(data["about"])},', ' "releases": {']
    releases = sorted(data["releases"].items())
    for k, (rel, table) in enumerate(releases):
        lines.append(f"  {json.dumps(rel)}: {{")
        rows = [f"   {json.dumps(sid)}: {json.dumps(rules)}" for sid, rules in table.items()]
        lines.append(",\n".join(rows))
        lines.append("  }" + ("," if k + 1 < len(releases) else ""))
    lines += [" }", "}"]
    with open(WHERE_FILE, "w") as f:
        f.write("\n".join(lines) + "\n")
