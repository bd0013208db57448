"""Fit a device's power model (meshplan.costs.power) on measured sustained power.

    python benchmarks/fit_power.py [tests/data/h100-sxm/power.csv]

Reads a power.csv as in shared/calibration/h100-sxm (NVML energy over 15 s of back-to-back
kernels, with the flop and bytes they did) and solves, by least squares over the GEMM and HBM
rows, average power - idle power = e_flop(precision) x flop/s + e_byte x bytes/s. The L2-resident
copy is left out (its bytes never reach HBM) and gives the energy per L2 byte on its own. Prints the fitted figures and each row's residual.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

DEFAULT = Path(__file__).resolve().parent.parent / "tests" / "data" / "h100-sxm" / "power.csv"


def fit(path: Path) -> dict:
    rows = list(csv.DictReader(path.open()))
    idle = next(float(r["avg_power_w"]) for r in rows if r["workload"] == "idle")
    used = [r for r in rows if r["workload"] != "idle" and not r["workload"].startswith("l2")]
    precisions = sorted({"fp8" if "fp8" in r["workload"] else "bf16" for r in used if r["workload"].startswith("gemm")})
    design, target = [], []
    for r in used:
        seconds = float(r["seconds"])
        flop_rate, byte_rate = float(r["flop"] or 0) / seconds, float(r["bytes"] or 0) / seconds
        precision = "fp8" if "fp8" in r["workload"] else "bf16"
        design.append([flop_rate if p == precision else 0.0 for p in precisions] + [byte_rate])
        target.append(float(r["avg_power_w"]) - idle)
    solution, *_ = np.linalg.lstsq(np.array(design), np.array(target), rcond=None)
    residual = np.array(design) @ solution - np.array(target)
    l2 = [r for r in rows if r["workload"].startswith("l2")]
    l2_j = None
    if l2:  # cache-resident traffic: the power above idle over its byte rate
        r = l2[0]
        l2_j = (float(r["avg_power_w"]) - idle) / (float(r["bytes"]) / float(r["seconds"]))
    return {
        "joules_per_l2_byte": l2_j,
        "idle_w": idle,
        "joules_per_flop": dict(zip(precisions, solution[:-1].tolist())),
        "joules_per_hbm_byte": float(solution[-1]),
        "residual_w": dict(zip((r["workload"] for r in used), residual.tolist())),
    }


if __name__ == "__main__":
    result = fit(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
    print(f"idle_w: {result['idle_w']:.1f}")
    for p, j in result["joules_per_flop"].items():
        print(f"joules_per_flop.{p}: {j * 1e12:.3f} pJ")
    print(f"joules_per_hbm_byte: {result['joules_per_hbm_byte'] * 1e12:.1f} pJ")
    if result["joules_per_l2_byte"] is not None:
        print(f"joules_per_l2_byte: {result['joules_per_l2_byte'] * 1e12:.1f} pJ")
    for name, w in result["residual_w"].items():
        print(f"  {name}: {w:+.1f} W")
