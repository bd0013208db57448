"""Extract an MLPerf Training power submission's measured runs into one CSV row per run.

Reads the result logs (``result_*.txt``: MLLOG run_start/run_stop, block and eval intervals,
samples_count at run_stop) and their node power logs (``power/<run>/node_*.txt``: MLLOG
power_reading in watts, one every ~2 s) of one system and benchmark, as the MLCommons
training_results repositories publish them, e.g.

    git clone https://github.com/mlcommons/training_results_v4.0
    python benchmarks/mlperf_power_logs.py \
        training_results_v4.0/smc-dc-power/results/1xSMC-H100-SXM-80GB/llama2_70b_lora > out.csv

Energy is each reading held until the next, summed over run_start..run_stop (MLPerf Training
power rules: the energy of the timed run), and over the training blocks alone (evaluations
left out). ``idle_w`` is the median node reading more than 30 s before run_start.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path


def mllog(path: Path) -> list[dict]:
    events = []
    for line in path.read_text(errors="replace").splitlines():
        if ":::MLLOG" in line:
            try:
                events.append(json.loads(line.split(":::MLLOG", 1)[1]))
            except json.JSONDecodeError:
                continue
    return events


def energy_j(readings: list[tuple[int, float]], start_ms: int, stop_ms: int) -> float:
    total = 0.0
    for (t0, watts), (t1, _) in zip(readings, readings[1:]):
        lo, hi = max(t0, start_ms), min(t1, stop_ms)
        if hi > lo:
            total += watts * (hi - lo) / 1000.0
    return total


def run_row(result: Path) -> dict:
    events = mllog(result)
    times = {key: [e["time_ms"] for e in events if e["key"] == key] for key in
             ("run_start", "run_stop", "block_start", "block_stop", "eval_start", "eval_stop")}
    stop = next(e for e in events if e["key"] == "run_stop")
    readings: list[tuple[int, float]] = []
    for node in sorted((result.parent / "power" / result.stem).glob("node_*.txt")):
        readings += [(e["time_ms"], float(e["value"])) for e in mllog(node) if e["key"] == "power_reading"]
    readings.sort()  # one node per file; the runs here are single-node
    start_ms, stop_ms = times["run_start"][0], times["run_stop"][0]
    blocks = list(zip(times["block_start"], times["block_stop"]))
    return {
        "run": result.stem,
        "samples": stop["metadata"]["samples_count"],
        "run_s": (stop_ms - start_ms) / 1000.0,
        "energy_j": energy_j(readings, start_ms, stop_ms),
        "train_s": sum(b - a for a, b in blocks) / 1000.0,
        "train_energy_j": sum(energy_j(readings, a, b) for a, b in blocks),
        "evals": len(times["eval_start"]),
        "eval_s": sum(b - a for a, b in zip(times["eval_start"], times["eval_stop"])) / 1000.0,
        "idle_w": statistics.median(w for t, w in readings if t < start_ms - 30_000),
    }


def main(folder: str) -> None:
    rows = [run_row(p) for p in sorted(Path(folder).glob("result_*.txt"))]
    out = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]))
    out.writeheader()
    out.writerows(rows)


if __name__ == "__main__":
    main(sys.argv[1])
