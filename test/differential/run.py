#!/usr/bin/env python3
"""Differential runner: each scenario in a stock worker and an aliasguard worker, records compared.

    python test/differential/run.py                 # everything (inductor included), ~12 min on 2 cores
    python test/differential/run.py --sample 120    # a deterministic subset across every family
    python test/differential/run.py --filter 'njt/compile' --json out.json
    python test/differential/run.py --baseline ...  # both workers stock: measures the harness's own noise
    python test/differential/run.py --config all    # every configuration (configs.py): stock runs once
    python test/differential/run.py --mutant tracking --filter ...  # a feature off: must fail, rules missing

Exit status 1 when a difference is neither intended (intended.py) nor a known bug (expected.py), or when
an intended difference listed for a scenario (intended_where.json) is missing from it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
TEST_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(TEST_DIR)
if TEST_DIR not in sys.path:
    sys.path.insert(0, TEST_DIR)

from differential import configs, intended  # noqa: E402
from differential.compare import classify  # noqa: E402

STATUSES = ("same", "intended", "known_bug", "missing", "unexpected", "skipped")


class WorkerDied(Exception):
    pass


class WorkerWontStart(Exception):
    """A worker failed at start-up (e.g. ``import aliasguard`` during a rebuild) on every try."""


START_TRIES = 4
START_RETRY_WAIT_S = 30.0


class Worker:
    """One worker process; ``label`` is what the records are filed under, ``side`` what it runs as."""

    def __init__(self, label: str, side: str, logdir: str, env_extra: dict[str, str] | None = None):
        self.label, self.side, self.logdir = label, side, logdir
        self.env_extra = env_extra or {}
        self.proc: subprocess.Popen | None = None
        self.buf = b""
        self.starts = 0
        self.ready: dict = {}

    def start(self) -> None:
        """Start the process and wait for its "ready" line; retry a failed start (a rebuild in progress)."""
        for attempt in range(START_TRIES):
            self._spawn()
            try:
                self.ready = self.receive(300)
                return
            except WorkerDied as e:
                why = str(e)
            if attempt + 1 < START_TRIES:
                print(f"[{self.label} worker failed to start ({why}); retrying in {START_RETRY_WAIT_S:.0f}s, "
                      f"log in {self.logdir}]", file=sys.stderr)
                time.sleep(START_RETRY_WAIT_S)
        raise WorkerWontStart(f"the {self.label} worker did not start ({why}); see {self.logdir}")

    def _spawn(self) -> None:
        env = dict(os.environ)
        env.update(self.env_extra)
        env["PYTHONPATH"] = os.pathsep.join([TEST_DIR, REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        if self.side == "stock":
            env["ALIASGUARD"] = "0"
        else:
            env.pop("ALIASGUARD", None)
        self.starts += 1
        log = open(os.path.join(self.logdir, f"{self.label}-{id(self)}-{self.starts}.log"), "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "differential.worker", self.side], cwd=TEST_DIR,
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        log.close()
        self.buf = b""

    def send(self, obj: dict) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError as e:
            raise WorkerDied("broken pipe") from e

    def receive(self, timeout: float) -> dict:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerDied("timeout")
            ready, _, _ = select.select([fd], [], [], min(left, 5.0))
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    rc = self.proc.wait()
                    self.proc = None
                    raise WorkerDied(f"exited with {rc}")
                self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def close(self) -> dict | None:
        """Ask the worker to stop; its answer says whether aliasguard was imported."""
        if self.proc is None:
            return None
        try:
            self.send({"cmd": "bye"})
            answer = self.receive(60)
        except WorkerDied:
            answer = None
        if self.proc is not None:
            self.proc.wait(timeout=30)
            self.proc = None
        return answer


def _pair(logdir: str, baseline: bool, env_extra: dict[str, str] | None,
          config_names: tuple[str, ...] = ("default",)) -> dict[str, Worker]:
    """The stock worker and one aliasguard worker per configuration: each aliasguard process then runs
    exactly the scenarios the stock one runs, in the same order (dynamo's counters and caches depend on
    what ran before in the process: a scenario run twice in one process compiles fewer frames)."""
    workers = {"stock": Worker("stock", "stock", logdir, env_extra)}
    for k, c in enumerate(config_names):
        label = "aliasguard" if k == 0 else f"aliasguard[{c}]"
        workers[label] = Worker(label, "stock" if baseline else "aliasguard", logdir, env_extra)
    return workers


def _label(k: int, config: str) -> str:
    return "aliasguard" if k == 0 else f"aliasguard[{config}]"


def list_scenarios(logdir: str, env_extra: dict[str, str] | None = None) -> list[dict]:
    """Every scenario: id, family, full_only, timeout, and the torch release the workers run (``release``)."""
    w = Worker("list", "stock", logdir, env_extra)
    w.send({"cmd": "list"})
    rows = w.receive(300)["scenarios"]
    release = ".".join(str(w.ready.get("torch", "?")).split("+")[0].split(".")[:2])
    w.close()
    return [{"id": i, "family": f, "full_only": fo, "timeout": t, "release": release} for i, f, fo, t in rows]


# Families whose scenarios are quick (eager, no compile): witnesses are taken from them first.
QUICK_FIRST = ("opdb", "rewrite", "detach", "checkpoint", "dispatcher", "nested", "trace", "njt", "dtensor", "opdb_tx",
               "compile", "dtensor_compile", "torchao")


def witnesses(rows: list[dict], per_rule: int = 2, rules: list[str] | None = None) -> dict[str, list[str]]:
    """For each intended rule, ``per_rule`` scenarios intended_where.json lists it in (quick families first,
    then in hash order): where a run must show it. Empty when there is no record for this torch."""
    table = intended.load_where(rows[0]["release"]) if rows else None
    if not table:
        return {}
    runnable = {r["id"]: r for r in rows if not r["full_only"]}
    prio = {f: i for i, f in enumerate(QUICK_FIRST)}
    out: dict[str, list[str]] = {}
    for rule in rules or list(intended.RULES):
        ids = [sid for sid, rs in table.items() if rule in rs and sid in runnable]
        ids.sort(key=lambda sid: (prio.get(sid.split("/")[0], len(prio)), "/compile_" in sid, _rank(sid)))
        out[rule] = ids[:per_rule]
    return out


def _aliasguard_raised(r: dict) -> bool:
    """Whether the aliasguard side raised (or its worker failed) where the stock side did not."""
    return any(d["path"].startswith("harness") or (d["path"].endswith("exc") and d["stock"] == "<no exception>")
               for d in r["diffs"])


def mutant_verdict(out: dict, mutant: str) -> tuple[bool, list[str]]:
    """Whether a mutant run failed as it must: every rule needing the switched-off feature that its
    scenarios expect is reported missing in at least one scenario where the aliasguard side raised nothing
    that the stock side did not (the fix gone, not an error of the mutant). Returns (ok, lines)."""
    off = configs.MUTANTS[mutant]
    res = out["results"]
    lines, ok = [], True
    affected = sorted({r.id for r in intended.INTENDED if r.needs & off})
    for rule in affected:
        where = [sid for sid, r in res.items() if rule in r.get("missing", [])]
        clean = [sid for sid in where if not _aliasguard_raised(res[sid])]
        expected_somewhere = any(rule in (r.get("missing", []) + [d["rule"] for d in r["diffs"]])
                                 for r in res.values())
        if not expected_somewhere:
            lines.append(f"  {rule}: not expected in any scenario that ran")
            continue
        good = bool(clean)
        ok = ok and good
        lines.append(f"  {rule}: missing in {len(where)} scenarios, {len(clean)} of them where the aliasguard "
                     f"side raised nothing the stock side did not{'' if good else '  <-- NOT NOTICED'}")
    if not any(r.id in (m for x in res.values() for m in x.get("missing", [])) for r in intended.INTENDED
               if r.needs & off):
        ok = False
        lines.append("  no rule of the switched-off feature was reported missing: NOT CAUGHT")
    return ok, lines


def _rank(sid: str) -> str:
    return hashlib.sha1(sid.encode()).hexdigest()


def select_ids(rows: list[dict], filter_re: str | None, sample: int | None, full: bool = True) -> list[str]:
    """The scenarios to run. A sample is deterministic: round robin over the families, each in hash order."""
    rows = [r for r in rows if not filter_re or re.search(filter_re, r["id"])]
    if sample is None:
        return [r["id"] for r in rows if full or not r["full_only"]]
    by_family: dict[str, list[str]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: _rank(r["id"])):
        if not r["full_only"]:
            by_family[r["family"]].append(r["id"])
    picked: list[str] = []
    iters = [iter(v) for _, v in sorted(by_family.items())]
    while len(picked) < sample and iters:
        for it in list(iters):
            nxt = next(it, None)
            if nxt is None:
                iters.remove(it)
            elif len(picked) < sample:
                picked.append(nxt)
    return picked


class Where:
    """The intended rules each scenario must show (intended_where.json), for the torch the workers run."""

    def __init__(self, check: bool):
        self.check, self.release, self.table = check, None, None
        self.lock = threading.Lock()

    def expected(self, ready: dict, sid: str, off: frozenset) -> set[str] | None:
        if not self.check:
            return None
        with self.lock:
            if self.release is None:
                self.release = ".".join(str(ready.get("torch", "?")).split("+")[0].split(".")[:2])
                self.table = intended.load_where(self.release)
        if self.table is None:
            return None
        return {r for r in self.table.get(sid, []) if r in intended.RULES and not (intended.RULES[r].needs & off)}

    def note(self) -> str:
        if not self.check:
            return "not checked"
        if self.table is None:
            return f"not checked: intended_where.json has no record for torch {self.release}"
        return f"checked against intended_where.json (torch {self.release})"


def run(ids: list[str], timeouts: dict[str, float], jobs: int = 1, baseline: bool = False,
        env_extra: dict[str, str] | None = None, logdir: str | None = None, progress: bool = False,
        config_names: tuple[str, ...] = ("default",), check_where: bool = True) -> dict:
    """Run ``ids`` on ``jobs`` worker pairs, the aliasguard side once per configuration.

    Returns {"results": {...} (the first configuration's), "by_config": {config: {...}}, "workers": [...],
    "wall_s": ..., "where": ...}. ``check_where``: expect the rules intended_where.json lists (not with
    ``baseline``)."""
    logdir = logdir or tempfile.mkdtemp(prefix="aliasguard-differential-")
    for c in config_names:
        if c not in configs.CONFIGS:
            raise ValueError(f"unknown configuration {c!r}; one of {', '.join(configs.CONFIG_NAMES)}")
    where = Where(check_where and not baseline)
    todo: queue.Queue = queue.Queue()
    for i in ids:
        todo.put(i)
    by_config: dict[str, dict[str, Any]] = {c: {} for c in config_names}
    done = [0]
    seen_torch: list[str] = []
    closing: list[dict] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    fatal: list[Exception] = []

    def one_pair() -> None:
        pair = _pair(logdir, baseline, env_extra, config_names)
        try:
            scenarios_of(pair)
        except WorkerWontStart as e:
            fatal.append(e)
            for w in pair.values():
                w.kill()
            while not todo.empty():  # the other pairs stop too
                try:
                    todo.get_nowait()
                except queue.Empty:
                    break
            return
        if pair["stock"].ready.get("torch"):
            seen_torch.append(pair["stock"].ready["torch"])
        for label, w in pair.items():
            ans = w.close()
            with lock:
                closing.append({"label": label, "side": w.side, "answer": ans})

    def scenarios_of(pair: dict[str, Worker]) -> None:
        while True:
            try:
                sid = todo.get_nowait()
            except queue.Empty:
                break
            recs: dict[str, Any] = {}
            secs: dict[str, Any] = {}
            config_of = {_label(k, c): c for k, c in enumerate(config_names)}
            for label, w in pair.items():
                try:
                    w.send({"cmd": "run", "id": sid, "config": config_of.get(label, "default")})
                except WorkerDied as e:
                    recs[label] = {"harness": f"worker {e}"}
            for label, w in pair.items():
                if label in recs:
                    continue
                try:
                    ans = w.receive(timeouts.get(sid, 60.0))
                    recs[label], secs[label] = ans["record"], ans["secs"]
                except WorkerDied as e:
                    recs[label] = {"harness": f"worker {e}"}
            stock = recs["stock"]
            for k, config in enumerate(config_names):
                label = _label(k, config)
                off = configs.CONFIGS[config].off
                verdict = classify(sid, stock, recs[label], off, where.expected(pair["stock"].ready, sid, off))
                with lock:
                    by_config[config][sid] = {"stock": stock, "aliasguard": recs[label],
                                              "secs": {"stock": secs.get("stock"), "aliasguard": secs.get(label)},
                                              **verdict}
                    if progress and verdict["status"] in ("unexpected", "missing"):
                        what = (next(d["path"] for d in verdict["diffs"] if d["tag"] == "unexpected")
                                if verdict["status"] == "unexpected" else "missing " + ", ".join(verdict["missing"]))
                        print(f"  {verdict['status']}: [{config}] {sid} :: {what}", file=sys.stderr)
            with lock:
                done[0] += 1
                if progress and done[0] % 100 == 0:
                    print(f"  ... {done[0]}/{len(ids)} ({time.monotonic() - t0:.0f}s)", file=sys.stderr)

    threads = [threading.Thread(target=one_pair) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if fatal:
        raise fatal[0]
    problems = []
    for c in closing:
        ans = c["answer"]
        if ans is None:
            continue
        if c["side"] == "stock" and ans["aliasguard_imported"]:
            problems.append(f"the stock worker ({c['label']}) imported aliasguard")
        if c["side"] == "aliasguard" and not ans["aliasguard_imported"]:
            problems.append("the aliasguard worker did not import aliasguard")
    ordered = {c: {i: r[i] for i in ids} for c, r in by_config.items()}
    return {"results": ordered[config_names[0]], "by_config": ordered, "workers": closing, "problems": problems,
            "wall_s": round(time.monotonic() - t0, 1), "logdir": logdir, "where": where.note(),
            "configs": list(config_names), "torch": seen_torch[0] if seen_torch else None}


def summarize(out: dict, config: str | None = None) -> tuple[str, str, Counter]:
    res = out["by_config"][config] if config is not None else out["results"]
    counts: Counter = Counter(r["status"] for r in res.values())
    fam: dict[str, Counter] = defaultdict(Counter)
    for sid, r in res.items():
        fam[sid.split("/")[0]][r["status"]] += 1
    label = "differential" if config in (None, "default") else f"differential [{config}]"
    line = (f"{label}: {len(res)} scenarios, {counts['same']} same, {counts['intended']} intended, "
            f"{counts['known_bug']} known bugs, {counts['missing']} missing, {counts['unexpected']} unexpected, "
            f"{counts['skipped']} skipped ({out['wall_s']}s)")
    rows = [f"| family | scenarios | {' | '.join(STATUSES)} |", "|---|---:|" + "---:|" * len(STATUSES)]
    for f in sorted(fam):
        c = fam[f]
        rows.append(f"| {f} | {sum(c.values())} | " + " | ".join(str(c[s]) for s in STATUSES) + " |")
    return line, "\n".join(rows), counts


def rule_counts(res: dict, tag: str) -> Counter:
    c: Counter = Counter()
    for r in res.values():
        for rule in {d["rule"] for d in r["diffs"] if d["tag"] == tag}:
            c[rule] += 1
    return c


def missing_counts(res: dict) -> dict[str, dict[str, int]]:
    """Per rule reported missing: in how many scenarios, and how many of those came back "same"
    (no difference at all: the fix is simply gone, not drowned in errors) or raised on one side only."""
    out: dict[str, dict[str, int]] = {}
    for r in res.values():
        raised = any(d["path"].endswith("exc") for d in r["diffs"])
        for rule in r.get("missing", []):
            c = out.setdefault(rule, {"scenarios": 0, "same": 0, "raised": 0})
            c["scenarios"] += 1
            c["same" if not r["diffs"] else "raised" if raised else "other"] = (
                c.get("same" if not r["diffs"] else "raised" if raised else "other", 0) + 1)
    return out


def report(out: dict, config: str, show: int) -> tuple[str, Counter]:
    """Print one configuration's table, rule counts and first failures; returns its summary line."""
    from differential import expected

    line, table, counts = summarize(out, config)
    res = out["by_config"][config]
    if len(out["by_config"]) > 1:
        print(f"\n## configuration {config}: {configs.CONFIGS[config].how}")
    print(table)
    bugs = rule_counts(res, "known_bug")
    if bugs:
        print("\nknown bugs (expected.py), scenarios showing each:")
        descr = {b.id: b.description for b in expected.EXPECTED_FAILURES}
        for b, n in sorted(bugs.items()):
            print(f"  {b}: {n}  ({descr[b]})")
    oks = rule_counts(res, "intended")
    if oks:
        print("\nintended differences (intended.py), scenarios showing each:")
        for b, n in sorted(oks.items()):
            print(f"  {b}: {n}")
    missing = missing_counts(res)
    if missing:
        print("\nintended differences MISSING (listed in intended_where.json, not shown), scenarios each:")
        for b, c in sorted(missing.items()):
            print(f"  {b}: {c['scenarios']} ({c.get('same', 0)} came back same, {c.get('raised', 0)} raised on one "
                  f"side, {c.get('other', 0)} other differences)")
    shown = 0
    for sid, r in res.items():
        if r["status"] not in ("unexpected", "missing") or shown >= show:
            continue
        shown += 1
        if r["status"] == "missing":
            print(f"MISSING {sid} :: intended difference missing: {', '.join(r['missing'])}")
            continue
        d = next(d for d in r["diffs"] if d["tag"] == "unexpected")
        extra = f"  [{d.get('stock_msg')!r} vs {d.get('aliasguard_msg')!r}]" if "stock_msg" in d else ""
        why = f"  (rule {d['rule']} does not apply here)" if d.get("unlisted") or d["rule"] else ""
        print(f"UNEXPECTED {sid} :: {d['path']}: stock={d['stock']!r} aliasguard={d['aliasguard']!r}{extra}{why}")
    return line, counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sample", type=int, help="run a deterministic subset of N scenarios across all families")
    p.add_argument("--filter", help="regex on scenario ids (opdb/<mode>/<op>/<i>, njt/<variant>/<op>, ...)")
    p.add_argument("--jobs", type=int, default=1, help="worker pairs (each pair is two processes); default 1")
    p.add_argument("--json", help="write every record, difference and verdict here")
    p.add_argument("--baseline", action="store_true", help="both workers stock: any difference is harness noise")
    p.add_argument("--list", action="store_true", help="list the selected scenario ids and stop")
    p.add_argument("--show", type=int, default=30, help="unexpected differences to print (default 30)")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--config", default="default",
                   help=f"configuration(s), comma-separated, or 'all': {', '.join(configs.CONFIG_NAMES)}")
    p.add_argument("--mutant", choices=sorted(configs.MUTANTS),
                   help="switch this feature off in the aliasguard worker (ALIASGUARD_DIFF_MUTANT): must fail")
    p.add_argument("--update-where", action="store_true",
                   help="record the intended rules each scenario that ran shows in intended_where.json "
                        "(default configuration; nothing is checked against the old record)")
    p.add_argument("--check-mutants", nargs="?", const=",".join(configs.MUTANTS), metavar="M1,M2",
                   help="run each mutant (default: all) on the scenarios intended_where.json lists for its rules "
                        "(--per-rule each); exit 0 only if every one fails with its rules reported missing")
    p.add_argument("--per-rule", type=int, default=4, help="scenarios per rule for --check-mutants (default 4)")
    a = p.parse_args(argv)
    if a.check_mutants:
        return check_mutants(a.check_mutants.split(","), a.per_rule, a.jobs)
    names = configs.CONFIG_NAMES if a.config == "all" else tuple(a.config.split(","))
    bad = [c for c in names if c not in configs.CONFIGS]
    if bad:
        p.error(f"unknown configuration {bad[0]!r}; one of {', '.join(configs.CONFIG_NAMES)} or all")
    if a.update_where and (names != ("default",) or a.mutant or a.baseline):
        p.error("--update-where records the default configuration of an unmutated aliasguard")
    env = {"ALIASGUARD_DIFF_MUTANT": a.mutant} if a.mutant else None
    logdir = tempfile.mkdtemp(prefix="aliasguard-differential-")
    try:
        rows = list_scenarios(logdir)
        ids = select_ids(rows, a.filter, a.sample)
        if a.list:
            print("\n".join(ids))
            return 0
        timeouts = {r["id"]: r["timeout"] for r in rows}
        out = run(ids, timeouts, jobs=a.jobs, baseline=a.baseline, env_extra=env, logdir=logdir,
                  progress=a.progress, config_names=names, check_where=not a.update_where)
    except WorkerWontStart as e:
        print(f"differential: not run: {e}", file=sys.stderr)
        return 2
    lines, failed = [], False
    summary: dict[str, Any] = {}
    for c in names:
        line, counts = report(out, c, a.show)
        lines.append(line)
        summary[c] = dict(counts)
        failed = failed or bool(counts["unexpected"] or counts["missing"])
    for prob in out["problems"]:
        print(f"PROBLEM: {prob}")
    if a.mutant:
        print(f"mutant: {a.mutant} switched off in the aliasguard worker (the run must fail, its rules missing)")
    print(f"intended differences' places: {out['where']}")
    if a.update_where:
        res = out["results"]
        shown = {sid: sorted({d["rule"] for d in r["diffs"] if d["tag"] == "intended"}) for sid, r in res.items()}
        release = _release(out)
        intended.save_where(release, shown, [sid for sid, r in res.items() if r["status"] != "skipped"])
        print(f"intended_where.json: recorded {sum(1 for v in shown.values() if v)} scenarios for torch {release}")
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": lines, "counts": summary, **out}, f, indent=1, default=str)
    return 1 if failed or out["problems"] else 0


def run_mutant(mutant: str, rows: list[dict], per_rule: int, jobs: int = 1) -> tuple[dict, bool, list[str]]:
    """One mutant on the witnesses of the rules it must take away."""
    off = configs.MUTANTS[mutant]
    rules = [r.id for r in intended.INTENDED if r.needs & off]
    ids = sorted({sid for v in witnesses(rows, per_rule, rules).values() for sid in v})
    timeouts = {r["id"]: r["timeout"] for r in rows}
    out = run(ids, timeouts, jobs=jobs, env_extra={"ALIASGUARD_DIFF_MUTANT": mutant})
    ok, lines = mutant_verdict(out, mutant)
    return out, ok, lines


def check_mutants(mutants: list[str], per_rule: int, jobs: int) -> int:
    logdir = tempfile.mkdtemp(prefix="aliasguard-differential-")
    try:
        rows = list_scenarios(logdir)
    except WorkerWontStart as e:
        print(f"differential: not run: {e}", file=sys.stderr)
        return 2
    if not witnesses(rows):
        print(f"mutants: not checked: intended_where.json has no record for torch {rows[0]['release']}")
        return 0
    all_ok = True
    for m in mutants:
        out, ok, lines = run_mutant(m, rows, per_rule, jobs)
        line, _, _ = summarize(out)
        verdict = "failed as it must" if ok else "NOT CAUGHT"
        print(f"mutant {m} ({', '.join(sorted(configs.MUTANTS[m]))} off): {verdict}")
        print("\n".join(lines))
        print(f"  {line}")
        all_ok = all_ok and ok
    return 0 if all_ok else 1


def _release(out: dict) -> str:
    torch_version = out.get("torch") or "?"
    return ".".join(str(torch_version).split("+")[0].split(".")[:2])


if __name__ == "__main__":
    sys.exit(main())
