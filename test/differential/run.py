#!/usr/bin/env python3
"""Differential runner: each scenario in a stock worker and an aliasguard worker, records compared.

    python test/differential/run.py                 # everything (inductor included), ~12 min on 2 cores
    python test/differential/run.py --sample 120    # a deterministic subset across every family
    python test/differential/run.py --filter 'njt/compile' --json out.json
    python test/differential/run.py --baseline ...  # both workers stock: measures the harness's own noise

Exit status 1 when a difference is neither intended (intended.py) nor a known bug (expected.py).
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

from differential.compare import classify  # noqa: E402

STATUSES = ("same", "intended", "known_bug", "unexpected", "skipped")


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

    def start(self) -> None:
        """Start the process and wait for its "ready" line; retry a failed start (a rebuild in progress)."""
        for attempt in range(START_TRIES):
            self._spawn()
            try:
                self.receive(300)
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


def _pair(logdir: str, baseline: bool, env_extra: dict[str, str] | None) -> dict[str, Worker]:
    return {"stock": Worker("stock", "stock", logdir, env_extra),
            "aliasguard": Worker("aliasguard", "stock" if baseline else "aliasguard", logdir, env_extra)}


def list_scenarios(logdir: str, env_extra: dict[str, str] | None = None) -> list[dict]:
    w = Worker("list", "stock", logdir, env_extra)
    w.send({"cmd": "list"})
    rows = w.receive(300)["scenarios"]
    w.close()
    return [{"id": i, "family": f, "full_only": fo, "timeout": t} for i, f, fo, t in rows]


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


def run(ids: list[str], timeouts: dict[str, float], jobs: int = 1, baseline: bool = False,
        env_extra: dict[str, str] | None = None, logdir: str | None = None, progress: bool = False) -> dict:
    """Run ``ids`` on ``jobs`` worker pairs; returns {"results": {...}, "workers": [...], "wall_s": ...}."""
    logdir = logdir or tempfile.mkdtemp(prefix="aliasguard-differential-")
    todo: queue.Queue = queue.Queue()
    for i in ids:
        todo.put(i)
    results: dict[str, Any] = {}
    closing: list[dict] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    fatal: list[Exception] = []

    def one_pair() -> None:
        pair = _pair(logdir, baseline, env_extra)
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
            secs = {}
            for w in pair.values():
                try:
                    w.send({"cmd": "run", "id": sid})
                except WorkerDied as e:
                    recs[w.label] = {"harness": f"worker {e}"}
            for label, w in pair.items():
                if label in recs:
                    continue
                try:
                    ans = w.receive(timeouts.get(sid, 60.0))
                    recs[label], secs[label] = ans["record"], ans["secs"]
                except WorkerDied as e:
                    recs[label] = {"harness": f"worker {e}"}
            verdict = classify(sid, recs["stock"], recs["aliasguard"])
            with lock:
                results[sid] = {"stock": recs["stock"], "aliasguard": recs["aliasguard"], "secs": secs, **verdict}
                if progress and verdict["status"] == "unexpected":
                    d = next(d for d in verdict["diffs"] if d["tag"] == "unexpected")
                    print(f"  unexpected: {sid} :: {d['path']}", file=sys.stderr)
                if progress and len(results) % 100 == 0:
                    print(f"  ... {len(results)}/{len(ids)} ({time.monotonic() - t0:.0f}s)", file=sys.stderr)

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
    return {"results": {i: results[i] for i in ids}, "workers": closing, "problems": problems,
            "wall_s": round(time.monotonic() - t0, 1), "logdir": logdir}


def summarize(out: dict) -> tuple[str, str, Counter]:
    res = out["results"]
    counts: Counter = Counter(r["status"] for r in res.values())
    fam: dict[str, Counter] = defaultdict(Counter)
    for sid, r in res.items():
        fam[sid.split("/")[0]][r["status"]] += 1
    line = (f"differential: {len(res)} scenarios, {counts['same']} same, {counts['intended']} intended, "
            f"{counts['known_bug']} known bugs, {counts['unexpected']} unexpected, {counts['skipped']} skipped "
            f"({out['wall_s']}s)")
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
    a = p.parse_args(argv)
    logdir = tempfile.mkdtemp(prefix="aliasguard-differential-")
    try:
        rows = list_scenarios(logdir)
        ids = select_ids(rows, a.filter, a.sample)
        if a.list:
            print("\n".join(ids))
            return 0
        timeouts = {r["id"]: r["timeout"] for r in rows}
        out = run(ids, timeouts, jobs=a.jobs, baseline=a.baseline, logdir=logdir, progress=a.progress)
    except WorkerWontStart as e:
        print(f"differential: not run: {e}", file=sys.stderr)
        return 2
    line, table, counts = summarize(out)
    res = out["results"]
    from differential import expected

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
    shown = 0
    for sid, r in res.items():
        if r["status"] != "unexpected" or shown >= a.show:
            continue
        shown += 1
        d = next(d for d in r["diffs"] if d["tag"] == "unexpected")
        extra = f"  [{d.get('stock_msg')!r} vs {d.get('aliasguard_msg')!r}]" if "stock_msg" in d else ""
        print(f"UNEXPECTED {sid} :: {d['path']}: stock={d['stock']!r} aliasguard={d['aliasguard']!r}{extra}")
    for prob in out["problems"]:
        print(f"PROBLEM: {prob}")
    print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": line, "counts": dict(counts), **out}, f, indent=1, default=str)
    return 1 if counts["unexpected"] or out["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
