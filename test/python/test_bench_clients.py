"""bench/bench_clients.py's counters: the callgrind reader of ``--simulate`` and the
hardware counters of the timing mode (perf_event_open), without running a benchmark."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("bench_clients", os.path.join(ROOT, "bench", "bench_clients.py"))
assert _spec is not None and _spec.loader is not None
bench_clients = importlib.util.module_from_spec(_spec)
sys.modules["bench_clients"] = bench_clients
_spec.loader.exec_module(bench_clients)

# A callgrind file as valgrind 3.19 writes it with --cache-sim=yes --branch-sim=yes
# (compressed names: a name is spelled out the first time its id appears).
CALLGRIND = """# callgrind format
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw Bc Bcm Bi Bim
summary: 0

ob=(1) /lib/libc.so.6
fl=(1) ???
fn=(1) malloc
0 100 10 5 1 2 0 0 0 0 4 1 0 0

ob=(2) /lib/libpython3.11.so
fn=(2) PyObject_Malloc
0 50 5 5 0 1 0 0 0 0 2 0 0 0

ob=(3) /lib/libx.so
fn=(3) caller
0 20 2 2 1 0 0 0 0 0 1 1 1 1
cob=(1)
cfn=(1)
calls=3 0
0 100 10 5 1 2 0 0 0 0 4 1 0 0
cfn=(4) operator new(unsigned long)
calls=2 0
0 30 3 3 0 0 0 0 0 0 0 0 0 0
cob=(2)
cfn=(2)
calls=7 0
0 50 5 5 0 1 0 0 0 0 2 0 0 0

totals: 170 17 12 2 3 0 0 0 0 7 2 1 1
"""


def test_read_callgrind_totals_and_allocator_calls(tmp_path):
    path = tmp_path / "out.callgrind"
    path.write_text(CALLGRIND)
    counts = bench_clients.read_callgrind(str(path))
    assert counts["Ir"] == 170
    assert counts["D1mr"] == 3 and counts["I1mr"] == 2
    assert counts["Bcm"] == 2 and counts["Bim"] == 1
    # malloc named once (id 1) and called again by id only; operator new is not
    # counted again (it calls malloc, which callgrind counts as called from it).
    assert counts["malloc calls"] == 3
    assert counts["PyObject_Malloc calls"] == 7
    assert {column for column, _ in bench_clients.SIMULATED_COLUMNS} >= {"D1 miss", "br mispred", "malloc"}


def test_read_callgrind_without_totals_is_refused(tmp_path):
    path = tmp_path / "empty.callgrind"
    path.write_text("# callgrind format\nevents: Ir\n")
    with pytest.raises(SystemExit, match="no event totals"):
        bench_clients.read_callgrind(str(path))


def test_hardware_counters_open_or_say_why():
    counters, why_not = bench_clients.open_hardware_counters()
    if counters is None:
        assert why_not  # e.g. "perf_event_open(cycles): No such file or directory" on a VM
        return
    try:
        counters.start()
        sum(range(100000))
        counted = counters.stop()
    finally:
        counters.close()
    assert set(counted) == {"cycles", "instructions"}
    assert counted["instructions"] > 100000


def test_software_counters_count_this_thread():
    # The same code path as the hardware events, with an event every Linux kernel
    # offers; refused only where perf_event_open is (seccomp, perf_event_paranoid 3).
    try:
        counters = bench_clients.PerfCounters(
            [("task-clock", bench_clients._PERF_TYPE_SOFTWARE, bench_clients._PERF_COUNT_SW_TASK_CLOCK)]
        )
    except OSError as error:
        pytest.skip(f"perf_event_open refused here: {error}")
    try:
        counters.start()
        sum(range(1000000))
        busy = counters.stop()["task-clock"]
        counters.start()
        idle = counters.stop()["task-clock"]
    finally:
        counters.close()
    assert busy > idle and busy > 1_000_000  # nanoseconds: the loop takes milliseconds
