"""Runs every benchmark and prints ratios of medians, ours against stock.

    make bench            (or: PYTHONPATH=. .venv/bin/python bench/run_benchmarks.py)

The C++ benchmarks run in one process (build/bench/aliasguard_bench) with
repetitions; the Python benchmarks (bench/bench_*.py) each print their own
table. Absolute times on a noisy machine mean little; the ratios are the result.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH_BINARY = ROOT / "build" / "bench" / "aliasguard_bench"

# (label, stock benchmark, ours, target ratio)
CPP_PAIRS = [
    ("detach below autograd", "BM_DetachStock", "BM_DetachAliasguard", 1.00),
    (
        "view bookkeeping: mark_as_view vs as_view",
        "BM_ViewBookkeepingStock",
        "BM_ViewBookkeepingMarkAsView",
        1.50,
    ),
]


def cpp_medians(repetitions: int = 15) -> dict[str, float]:
    result = subprocess.run(
        [
            str(BENCH_BINARY),
            f"--benchmark_repetitions={repetitions}",
            "--benchmark_enable_random_interleaving=true",
            "--benchmark_report_aggregates_only=true",
            "--benchmark_format=json",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    medians = {}
    for entry in json.loads(result.stdout)["benchmarks"]:
        if entry.get("aggregate_name") == "median":
            medians[entry["run_name"]] = entry["real_time"]
    return medians


def main() -> int:
    medians = cpp_medians()
    print("## C++ (Google Benchmark, median of 15 repetitions, interleaved)\n")
    print("| path | stock ns | aliasguard ns | ratio | target |")
    print("|---|---|---|---|---|")
    for label, stock, ours, target in CPP_PAIRS:
        ratio = medians[ours] / medians[stock]
        verdict = "met" if ratio <= target else "MISSED"
        print(
            f"| {label} | {medians[stock]:.1f} | {medians[ours]:.1f} | "
            f"{ratio:.2f}x | <= {target:.2f}x ({verdict}) |"
        )
    for script in sorted((ROOT / "bench").glob("bench_*.py")):
        print(f"\n## {script.name}\n", flush=True)
        subprocess.run([sys.executable, str(script)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
