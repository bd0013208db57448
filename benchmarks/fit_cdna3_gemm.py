"""Fit the cdna3 profile's GEMM kernels on published MI300X GEMMs and print them.

    python benchmarks/fit_cdna3_gemm.py

The data (tests/data/published_gemms.yaml, ``cdna3_fit``) are GEMM rates at named shapes: Azure's
hipBLASLt FP8 sweep (nine shapes) and AMD's bf16 8192^3 preflight (one). Too few to fit tiles,
prologues and waves, so each kernel keeps Hopper's (the fitted H100 kernels of
catalog/efficiency.yaml) and only its fraction of the per-CU peak is fitted: the one at which the
model's time over the measured time has a geometric mean of 1 over the precision's shapes of at
least 1e11 flop (least squares on log time, by bisection), the size of a training step's GEMMs. The smaller ones take 2-7x the
model's time on this device (hipBLASLt's small-GEMM path is not modelled).
Both sources time a GEMM called back to back, so each shape is timed as a kernel in a stream (no
isolated launch overhead). The printed lines go into the cdna3 profile's kernels by hand.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

from meshplan import catalog
from meshplan.costs.kernels import Chip, gemm_s
from meshplan.specs.device import BYTES_PER_ELEMENT
from meshplan.specs.kernels import GemmKernel

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "published_gemms.yaml"
MIN_FLOP = 1e11


def chip_of(device_id: str, precision: str) -> Chip:
    d = catalog.device(device_id)
    return Chip(d.peak(precision), d.sm_count, d.hbm_bytes_per_s, d.sram_bytes)


def ratios(kernel: GemmKernel, chip: Chip, rows: list[list[float]], element_bytes: float) -> np.ndarray:
    """Model time over measured time at each (m, n, k, TFLOP/s) row."""
    return np.array([float(gemm_s(m, k, n, element_bytes, kernel, chip)) / (2.0 * m * n * k / (tf * 1e12)) for m, n, k, tf in rows])


def fit(data: dict | None = None) -> dict[str, GemmKernel]:
    data = data or yaml.safe_load(DATA.read_text())["cdna3_fit"]
    hopper = catalog.efficiency("hopper").kernels
    out = {}
    for precision in ("bf16", "fp8"):
        rows = [r for r in data[precision]["m_n_k_tflop_per_s"] if 2.0 * r[0] * r[1] * r[2] >= MIN_FLOP]
        chip = chip_of(data["device"], precision)
        base = hopper.gemm_of(precision)
        low, high = 0.05, 2.0
        for _ in range(60):
            mid = (low + high) / 2
            slow = np.mean(np.log(ratios(base.model_copy(update={"sm_fraction": mid}), chip, rows, BYTES_PER_ELEMENT[precision]))) > 0.0
            low, high = (mid, high) if slow else (low, mid)
        out[precision] = base.model_copy(update={"sm_fraction": round((low + high) / 2, 4)})
    return out


def main() -> None:
    data = yaml.safe_load(DATA.read_text())["cdna3_fit"]
    for precision, g in fit(data).items():
        r = ratios(g, chip_of(data["device"], precision), data[precision]["m_n_k_tflop_per_s"], BYTES_PER_ELEMENT[precision])
        print(f"# {precision}: model/measured " + ", ".join(f"{x:.2f}" for x in r))
        print(f"      {precision}: {g.catalog_line()}")


if __name__ == "__main__":
    main()
