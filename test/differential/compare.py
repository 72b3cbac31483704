"""Compare two scenario records and sort each difference into intended / known bug / unexpected."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_DIFFS = 40
# exception messages: the type must match, the text may differ
LOOSE_KEYS = {"msg", "where"}
FAILED_STEP_KEYS = ("harness", "harness_error", "call", "trace", "from_tensor")
# Exceptions a scenario raises on both sides when something the build makes is missing (the C++ test ops,
# differential/cpp_ops.py): the scenario could not run, so it fails instead of comparing equal.
UNRUNNABLE = frozenset({"TestOpsNotBuilt"})


@dataclass
class Diff:
    scenario: str
    path: tuple
    stock: Any
    ag: Any
    stock_rec: Any = field(repr=False, default=None)
    ag_rec: Any = field(repr=False, default=None)

    @property
    def family(self) -> str:
        return self.scenario.split("/")[0]

    @property
    def variant(self) -> str:
        return self.scenario.split("/")[1] if "/" in self.scenario else ""

    @property
    def op(self) -> str:
        parts = self.scenario.split("/")
        return parts[2] if len(parts) > 2 else ""

    @property
    def key(self) -> str:
        """The last named key of the path (the observable: version, is_view, exc, ...)."""
        for k in reversed(self.path):
            if isinstance(k, str):
                return k
        return ""

    @property
    def path_str(self) -> str:
        return "/".join(str(k) for k in self.path)

    def lookup(self, rec: Any, path: tuple) -> Any:
        for k in path:
            try:
                rec = rec[k]
            except (KeyError, IndexError, TypeError):
                return None
        return rec

    def msg(self, side: str) -> str:
        """The exception message next to an ``exc`` difference (or the exc record at the path)."""
        rec = self.ag_rec if side == "ag" else self.stock_rec
        node = self.lookup(rec, self.path[:-1]) if self.key == "exc" else self.lookup(rec, self.path)
        if isinstance(node, dict):
            return f"{node.get('exc', '')}: {node.get('msg', '')}"
        return ""


def diff(a: Any, b: Any, path: tuple = ()) -> list[tuple]:
    out: list[tuple] = []
    _diff(a, b, path, out)
    return out


def _diff(a: Any, b: Any, path: tuple, out: list) -> None:
    if len(out) >= MAX_DIFFS:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        if "exc" in a or "exc" in b:  # an exception on one side at least
            if a.get("exc") != b.get("exc"):
                out.append((path + ("exc",), a.get("exc", _short(a)), b.get("exc", _short(b))))
                return
        for k in FAILED_STEP_KEYS:  # a step failed on one side only: one difference, not one per missing key
            if (k in a) != (k in b):
                present = a.get(k, b.get(k))
                kind = present.get("exc", present) if isinstance(present, dict) else present
                none = "<no exception>"
                out.append((path + (k, "exc"), kind if k in a else none, kind if k in b else none))
                return
        for k in list(a) + [k for k in b if k not in a]:
            if k in LOOSE_KEYS:
                continue
            if k not in a or k not in b:
                present = a.get(k, b.get(k))
                if isinstance(present, dict) and "exc" in present:  # raised on one side only
                    out.append((path + (k, "exc"), a.get(k, {}).get("exc", "<no exception>"),
                                b.get(k, {}).get("exc", "<no exception>")))
                else:
                    out.append((path + (k,), _short(a.get(k, "<absent>")), _short(b.get(k, "<absent>"))))
            else:
                _diff(a[k], b[k], path + (k,), out)
        return
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, path + (i,), out)
        return
    if a != b:
        out.append((path, _short(a), _short(b)))


def _short(v: Any) -> Any:
    s = repr(v)
    return v if len(s) <= 120 else s[:117] + "..."


RANK = {"same": 0, "intended": 1, "known_bug": 2, "missing": 3, "unexpected": 4}


def classify(scenario: str, stock: Any, ag: Any, off: frozenset = frozenset(),
             expected_rules: set[str] | None = None) -> dict:
    """Status of one scenario and its differences, each tagged with the rule that explains it.

    ``off``: the features the configuration switched off; their rules explain nothing. ``expected_rules``:
    the intended rules this scenario must show (intended.WHERE_FILE, less those of ``off``), or None
    (not checked). A rule that matches but is not expected is unexpected (``unlisted``); an expected rule
    that no difference shows is ``missing`` (status "missing" unless something worse is there)."""
    from differential import expected, intended

    if isinstance(stock, dict) and "skipped" in stock and stock == ag:
        return {"status": "skipped", "diffs": [], "missing": [], "reason": stock["skipped"]}
    if all(isinstance(r, dict) and r.get("harness_error", {}).get("exc") in UNRUNNABLE for r in (stock, ag)):
        # the same on both sides, but nothing was compared: the scenario's coverage is lost, never "same"
        err = ag["harness_error"]
        return {"status": "unexpected", "missing": [], "diffs": [{
            "path": "harness_error/exc", "stock": stock["harness_error"]["exc"], "aliasguard": err["exc"],
            "tag": "unexpected", "rule": None, "stock_msg": stock["harness_error"].get("msg", ""),
            "aliasguard_msg": err.get("msg", "")}]}
    rules = intended.allowed(off)
    raw = diff(stock, ag)
    diffs = []
    status = "same"
    shown: set[str] = set()
    for path, s, a in raw:
        d = Diff(scenario, path, s, a, stock, ag)
        tag, rule, unlisted = "unexpected", None, False
        bug = next((b for b in expected.EXPECTED_FAILURES if b.matches(d)), None)
        if bug is not None:
            tag, rule = "known_bug", bug.id
        else:
            ok = next((r for r in rules if r.matches(d)), None)
            if ok is not None:
                rule = ok.id
                if expected_rules is None or ok.id in expected_rules or ok.unmasked_by & off:
                    tag = "intended"
                    shown.add(ok.id)
                else:
                    unlisted = True  # an intended kind of difference, where it is not listed
        if RANK[tag] > RANK[status]:
            status = tag
        entry = {"path": d.path_str, "stock": s, "aliasguard": a, "tag": tag, "rule": rule}
        if unlisted:
            entry["unlisted"] = True
        if d.key == "exc":
            entry["stock_msg"], entry["aliasguard_msg"] = d.msg("stock"), d.msg("ag")
        diffs.append(entry)
    missing = sorted(expected_rules - shown) if expected_rules is not None else []
    # (a rule some switched-off feature unmasks may show unlisted, and is never required there)
    if missing and RANK["missing"] > RANK[status]:
        status = "missing"
    return {"status": status, "diffs": diffs, "missing": missing}
