"""Fit a device's power model (meshplan.costs.power) on measured sustained power.

    python benchmarks/fit_power.py [tests/data/h100-sxm/power.csv]

Reads a power.csv as in shared/calibration/h100-sxm (NVML energy over 15 s of back-to-back
kernels, with the flop and bytes they did) and fits it with meshplan.calibrate.fit_power, the
fit `meshplan calibrate` puts in a profile: by least squares over the GEMM and HBM rows,
average power - idle power = e_flop(precision) x flop/s + e_byte x bytes/s; the L2-resident copy
gives the energy per L2 byte on its own. Prints the fitted figures and each row's residual.
"""

from __future__ import annotations

import sys
from pathlib import Path

from meshplan.calibrate.fit_power import fit_power
from meshplan.calibrate.table import read_rows

DEFAULT = Path(__file__).resolve().parent.parent / "tests" / "data" / "h100-sxm" / "power.csv"


if __name__ == "__main__":
    result = fit_power(read_rows(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT))
    print(f"idle_w: {result.idle_w:.1f}")
    for p, j in result.joules_per_flop.items():
        print(f"joules_per_flop.{p}: {j * 1e12:.3f} pJ")
    print(f"joules_per_hbm_byte: {result.joules_per_hbm_byte * 1e12:.1f} pJ")
    if result.joules_per_l2_byte is not None:
        print(f"joules_per_l2_byte: {result.joules_per_l2_byte * 1e12:.1f} pJ")
    for name, w in result.residual_w.items():
        print(f"  {name}: {w:+.1f} W ({w / result.measured_w[name]:+.1%})")
