"""A bounded sample of the differential harness (test/differential, docs/differential.md).

The same scenarios run in a worker that never imports aliasguard and in one that
does; every difference must be intended (test/differential/intended.py), and every
intended difference listed for a scenario that ran (intended_where.json) must show.
Known bugs (expected.py) are ``xfail(strict=True)`` here, one test each, so a fix
shows up as XPASS and the entry must go. Each configuration (configs.py) runs on a
smaller sample, and each mutant (a feature switched off) must fail with its rules
reported missing. The full run is ``make test-differential``.
"""

from __future__ import annotations

import os
import sys

import pytest

TEST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TEST_DIR not in sys.path:
    sys.path.insert(0, TEST_DIR)

from differential import compare, configs, expected, intended, run  # noqa: E402
from differential.scenarios import FAMILIES  # noqa: E402

SAMPLE = int(os.environ.get("ALIASGUARD_DIFF_SAMPLE", "60"))
CONFIG_SAMPLE = int(os.environ.get("ALIASGUARD_DIFF_CONFIG_SAMPLE", "20"))  # per configuration, plus witnesses
PER_RULE = 2  # witnesses: scenarios per intended rule where intended_where.json says it shows

# Deliberate differences, made on the aliasguard side only (scenarios.Context.perturb).
INJECT = {
    "opdb/pass/sin/0": ("value", "outs/out0/value"),
    # a scenario whose other differences are intended or known: the injected one still stands out
    "opdb/saving/exp/0": ("value", "outs/out0/value"),
    "trace/eager/softmax": ("version", "outs/out0/version"),
    "njt/eager/clone": ("raise", "harness_error/exc"),
    "dtensor/eager/sin/shard0": ("raise", "harness_error/exc"),
    "trace/grad/softmax": ("value", "result/value"),
    "opdb_tx/make_fx/pass/sin": ("value", "outs/out0/value"),
    "opdb_tx/grad/twotensor/sin": ("raise", "harness_error/exc"),
    # intended differences elsewhere in the record (the saving mode runs tracked under compile)
    "opdb_tx/compile_aot_eager/saving/sin": ("value", "calls/0/outs/out0/value"),
    # one guard more than stock's, graphs and values unchanged (the guards dynamo installs are compared)
    "opdb_tx/compile_eager/pass/sin": ("guard", "guards/0/"),
    "dtensor_compile/eager/sin": ("raise", "harness_error/exc"),
    "torchao/eager/float8_linear": ("version", "outs/out0/version"),
    # NJT and DTensor under make_fx / torch.func, the datamode and wrapper modes under a transform
    "njt/make_fx_symbolic/sin": ("raise", "harness_error/exc"),
    "dtensor/grad/sin/shard0": ("raise", "harness_error/exc"),
    "opdb_tx/make_fx/datamode/sin": ("value", "outs/out0/value"),
    "opdb_tx/vjp/wrapper/sin": ("raise", "harness_error/exc"),
}
CONTROL = "opdb/pass/cos/0"


@pytest.fixture(scope="module")
def rows():
    return run.list_scenarios(run.tempfile.mkdtemp(prefix="aliasguard-differential-"))


@pytest.fixture(scope="module")
def witnesses(rows):
    """PER_RULE scenarios per intended rule where intended_where.json says it shows (quick families first)."""
    w = run.witnesses(rows, per_rule=PER_RULE)
    if not w:
        pytest.skip(f"intended_where.json has no record for torch {rows[0]['release']}: run.py --update-where")
    return w


def _witness_ids(rows) -> list[str]:
    return sorted({sid for v in run.witnesses(rows, per_rule=PER_RULE).values() for sid in v})


@pytest.fixture(scope="module")
def sample(rows):
    ids = run.select_ids(rows, None, SAMPLE)
    repro = [i for b in expected.EXPECTED_FAILURES + expected.FIXED for i in b.repro]
    ids += [i for i in repro + _witness_ids(rows) if i not in ids]
    timeouts = {r["id"]: r["timeout"] for r in rows}
    return run.run(ids, timeouts, jobs=1)


OTHER_CONFIGS = tuple(c for c in configs.CONFIG_NAMES if c != "default")


@pytest.fixture(scope="module")
def configured(rows):
    """Every configuration but the default on a smaller sample plus the witnesses (stock runs once)."""
    ids = run.select_ids(rows, None, CONFIG_SAMPLE)
    ids += [i for i in _witness_ids(rows) if i not in ids]
    timeouts = {r["id"]: r["timeout"] for r in rows}
    return run.run(ids, timeouts, jobs=1, config_names=OTHER_CONFIGS)


@pytest.fixture(scope="module")
def injected(rows):
    spec = ";".join(f"^{sid}$={kind}" for sid, (kind, _) in INJECT.items())
    ids = list(INJECT) + [CONTROL]
    return run.run(ids, {}, jobs=1, env_extra={"ALIASGUARD_DIFF_INJECT": spec})


def _show(res: dict, ids: list[str]) -> str:
    lines = []
    for sid in ids:
        for d in res[sid]["diffs"]:
            if d["tag"] == "unexpected":
                lines.append(f"{sid} :: {d['path']}: stock={d['stock']!r} aliasguard={d['aliasguard']!r}")
    return "\n".join(lines[:40])


def test_sample_is_deterministic_and_covers_every_family(rows):
    a = run.select_ids(rows, None, SAMPLE)
    assert a == run.select_ids(rows, None, SAMPLE)
    assert len(a) == SAMPLE
    assert {i.split("/")[0] for i in a} == set(FAMILIES)
    assert not any(r["full_only"] for r in rows if r["id"] in a)


def test_workers_are_what_they_claim(sample):
    assert sample["problems"] == []
    answers = {c["label"]: c["answer"] for c in sample["workers"]}
    assert answers["stock"] == {"aliasguard_imported": False, "side": "stock"}
    assert answers["aliasguard"] == {"aliasguard_imported": True, "side": "aliasguard"}


@pytest.mark.parametrize("family", FAMILIES)
def test_no_unexpected_difference(sample, family):
    res = sample["results"]
    ids = [i for i in res if i.startswith(family + "/")]
    assert ids, f"the sample has no {family} scenario"
    bad = [i for i in ids if res[i]["status"] in ("unexpected", "missing")]
    assert not bad, f"{len(bad)} scenarios differ unexpectedly or miss an intended difference:\n" + _show(
        res, bad) + "\n" + str({i: res[i]["missing"] for i in bad if res[i]["missing"]})


def test_every_listed_intended_difference_shows(sample, witnesses):
    # the two-sided half: a rule intended_where.json lists for a scenario that ran must show there
    res = sample["results"]
    assert "checked against" in sample["where"], sample["where"]
    missing = {sid: r["missing"] for sid, r in res.items() if r["missing"]}
    assert not missing, missing
    shown = {d["rule"] for r in res.values() for d in r["diffs"] if d["tag"] == "intended"}
    assert shown >= set(witnesses) - {r for r, ids in witnesses.items() if not ids}


@pytest.mark.parametrize("config", OTHER_CONFIGS)
def test_configuration_differs_by_its_own_rules_only(configured, witnesses, config):
    # the rules of the switched-off features are absent, every other rule listed shows, nothing else differs
    res = configured["by_config"][config]
    off = configs.CONFIGS[config].off
    bad = [i for i, r in res.items() if r["status"] in ("unexpected", "missing")]
    assert not bad, f"{len(bad)} scenarios fail in {config}:\n" + _show(res, bad) + "\n" + str(
        {i: res[i]["missing"] for i in bad if res[i]["missing"]})
    shown = {d["rule"] for r in res.values() for d in r["diffs"] if d["tag"] == "intended"}
    assert not {r for r in shown if intended.RULES[r].needs & off}
    kept = {r for r, ids in witnesses.items() if ids and not intended.RULES[r].needs & off}
    assert shown == kept, (shown, kept)


@pytest.mark.parametrize("mutant", list(configs.MUTANTS))
def test_mutant_fails_with_its_rules_missing(rows, witnesses, mutant):
    # The other half: with one feature switched off in the aliasguard worker (ALIASGUARD_DIFF_MUTANT) the
    # run fails, and by "intended difference missing" for the rules of that feature, in scenarios where
    # nothing raised on one side only: the harness notices the fix gone, not an error it causes.
    out, ok, lines = run.run_mutant(mutant, rows, per_rule=PER_RULE)
    assert ok, "\n".join(lines)
    res = out["results"]
    assert any(r["status"] in ("missing", "unexpected") for r in res.values())
    off = configs.MUTANTS[mutant]
    reported = {m for r in res.values() for m in r["missing"]}
    assert reported and all(intended.RULES[m].needs & off for m in reported), reported
    # the scenarios are the sample's witnesses: the sample above would have failed the same way
    assert set(res) <= set(_witness_ids(rows))


def test_known_bug_repros_show_their_bug_and_nothing_unexpected(sample):
    res = sample["results"]
    for b in expected.EXPECTED_FAILURES:
        assert all(res[i]["status"] != "unexpected" for i in b.repro), _show(res, list(b.repro))


@pytest.mark.parametrize(
    "bug",
    [pytest.param(b, id=b.id, marks=pytest.mark.xfail(strict=True, reason=b.description))
     for b in expected.EXPECTED_FAILURES],
)
def test_known_bug_fixed(sample, bug):
    # XPASS (a failure under strict) means the bug is gone: move its entry to expected.FIXED.
    res = sample["results"]
    shown = [(sid, d["path"]) for sid in bug.repro for d in res[sid]["diffs"] if d["rule"] == bug.id]
    assert not shown, shown[:5]


@pytest.mark.parametrize("fixed", expected.FIXED, ids=[f.id for f in expected.FIXED])
def test_fixed_bug_stays_fixed(sample, fixed):
    res = sample["results"]
    for sid in fixed.repro:
        assert res[sid]["status"] in ("same", "intended"), (sid, res[sid]["diffs"][:3])


@pytest.mark.parametrize("sid", list(INJECT))
def test_injected_difference_is_reported(injected, sid):
    kind, path = INJECT[sid]
    r = injected["results"][sid]
    assert r["status"] == "unexpected", r["diffs"]
    hits = [d for d in r["diffs"] if d["tag"] == "unexpected"]
    # the first difference is the injected observable; consequences may follow (a gradient, backward's check)
    assert hits and hits[0]["path"].startswith(path), hits[:3]


def test_control_scenario_without_injection_is_same(injected):
    assert injected["results"][CONTROL]["status"] == "same", injected["results"][CONTROL]["diffs"]


# --- the comparison itself, without workers --------------------------------------------


def test_diff_compares_exception_types_not_messages():
    a = {"call": {"exc": "RuntimeError", "msg": "one"}}
    assert compare.diff(a, {"call": {"exc": "RuntimeError", "msg": "two"}}) == []
    assert compare.diff(a, {"call": {"exc": "TypeError", "msg": "one"}}) == [(("call", "exc"), "RuntimeError",
                                                                              "TypeError")]
    assert compare.diff({"outs": {}}, a) == [(("call", "exc"), "<no exception>", "RuntimeError")]


def test_a_scenario_that_cannot_run_for_want_of_the_cpp_test_ops_fails_on_both_sides():
    # the C++ test ops missing (differential/cpp_ops.py): the same error on both sides, nothing compared
    err = {"harness_error": {"exc": "TestOpsNotBuilt", "msg": "build/test_ops/libagdiff_cpp_before.so is missing"}}
    v = compare.classify("dispatcher/pass/custom_cpp_before_mutate/plain", err, err)
    assert v["status"] == "unexpected" and v["diffs"][0]["path"] == "harness_error/exc", v


def test_the_cpp_test_ops_are_built_and_found():
    # `make build` makes them; a run without them fails their scenarios (above), so say so here first
    from differential import cpp_ops

    for ns in cpp_ops.NAMESPACES:
        assert os.path.isfile(cpp_ops.library_path(ns))


def test_diff_sees_nan_signed_zero_and_lengths():
    assert compare.diff({"v": ["nan", 1.0]}, {"v": ["nan", 1.0]}) == []
    assert compare.diff({"v": [0.0]}, {"v": ["-0.0"]}) != []
    assert compare.diff({"v": [1, 2]}, {"v": [1, 2, 3]}) != []


def _saving_record(view_version: int, base_version: int) -> dict:
    return {"saved": {"saved0": {"version": base_version, "is_view": False, "base": None},
                      "saved1": {"version": view_version, "is_view": True, "base": "saved0"}}}


def test_intended_rules_match_only_their_difference():
    stock = _saving_record(0, 3)
    stock["saved"]["saved1"].update(is_view=False, base=None)
    # the kept view carries its base's counter: intended
    v = compare.classify("opdb/saving/sin/0", stock, _saving_record(3, 3))
    assert v["status"] == "intended", v
    # a version that is not the base's is not explained by any rule
    v = compare.classify("opdb/saving/sin/0", stock, _saving_record(5, 3))
    assert v["status"] == "unexpected", v
    # nor is the same difference in another mode
    v = compare.classify("opdb/pass/sin/0", stock, _saving_record(3, 3))
    assert v["status"] == "unexpected", v
    assert {r.id for r in intended.INTENDED} >= {"saved-view-is-view"}


def test_a_listed_rule_that_does_not_show_is_missing():
    stock = _saving_record(0, 3)
    stock["saved"]["saved1"].update(is_view=False, base=None)
    shows = _saving_record(3, 3)
    # listed and shown: intended
    v = compare.classify("opdb/saving/sin/0", stock, shows, expected_rules={"saved-view-is-view"})
    assert v["status"] == "intended" and v["missing"] == [], v
    # listed, and the aliasguard side came back as stock: the fix is gone
    v = compare.classify("opdb/saving/sin/0", stock, stock, expected_rules={"saved-view-is-view"})
    assert v["status"] == "missing" and v["missing"] == ["saved-view-is-view"], v
    # shown but not listed for this scenario: unexpected
    v = compare.classify("opdb/saving/sin/0", stock, shows, expected_rules=set())
    assert v["status"] == "unexpected" and v["diffs"][0].get("unlisted"), v
    # a configuration that switches the rule's feature off: neither expected nor explained
    v = compare.classify("opdb/saving/sin/0", stock, shows, off=configs.CONFIGS["tracking-off"].off,
                         expected_rules=set())
    assert v["status"] == "unexpected" and not v["diffs"][0].get("unlisted"), v


def test_every_rule_names_known_features_and_every_configuration_its_switch():
    for r in intended.INTENDED:
        # a rule needs features, or shows only once one is off (unmasked_by)
        assert (r.needs or r.unmasked_by) and (r.needs | r.unmasked_by) <= set(configs.FEATURES), r.id
    assert configs.CONFIGS["default"].off == frozenset()
    assert {f for c in configs.CONFIGS.values() for f in c.off} <= set(configs.FEATURES)
    assert set(configs.MUTANTS) == set(configs.FEATURES)
    # every feature takes at least one rule with it, so each mutant has something to miss
    assert all(any(f in r.needs for r in intended.INTENDED) for f in configs.FEATURES)
