"""Differences aliasguard makes on purpose. Each rule matches exactly one kind of difference.

Mirrored as the table "Intended differences" at the end of docs/design.md. A
difference that no rule here and no known bug in expected.py matches fails the run.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Any, Callable

from differential.compare import Diff


@dataclass(frozen=True)
class Rule:
    id: str
    reason: str
    pred: Callable[[Diff], bool]

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
         _detach_keeps_counter),
    Rule("wrapper-inplace-sizes",
         "a wrapper subclass written by an in-place op takes the sizes the op returned, so its shape/stride "
         "match the op on plain tensors (stock keeps the wrapper's stale sizes)",
         _wrapper_takes_inplace_sizes),
]
