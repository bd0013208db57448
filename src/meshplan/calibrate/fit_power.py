"""Fit a device's power model (``specs.device.PowerModel``, read by meshplan.costs.power) on the
sustained power a calibration measured: ``fit_power(rows)``.

``power.csv`` (``calibrate/power.py``, or ``shared/calibration/h100-sxm/``) holds the NVML energy
of seconds of back-to-back kernels with the flop and bytes they did. The model is the one the
estimator charges (meshplan.costs.power: idle power plus energy per flop of each precision and
per HBM byte; Horowitz, ISSCC 2014):

    average power - idle power = sum_p e_flop(p) x flop/s(p) + e_hbm x bytes/s

solved by linear least squares over the GEMM and HBM rows (their flop counting at the GEMM's
precision, an HBM add's at bf16 as the estimator counts an elementwise op's). The L2-resident
copy is left out (its bytes never reach HBM) and gives the energy per L2 byte on its own: its
power above idle over its byte rate. fp16 is given bf16's figure (the same tensor cores), as
``catalog/efficiency.yaml`` does. Needs numpy alone; ``benchmarks/fit_power.py`` prints the fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: the least a power model needs: the idle row, a GEMM and a streaming HBM kernel
NEEDED = "an idle row, a gemm_bf16_* row and an hbm_* row"


@dataclass(frozen=True)
class PowerFit:
    """The fitted figures (joules per flop by precision, per HBM and L2 byte; watts idle) and,
    per row of power.csv, the measured and the fitted average power."""

    idle_w: float
    joules_per_flop: dict[str, float]
    joules_per_hbm_byte: float
    joules_per_l2_byte: float | None
    measured_w: dict[str, float] = field(default_factory=dict)
    predicted_w: dict[str, float] = field(default_factory=dict)

    @property
    def residual_w(self) -> dict[str, float]:
        return {name: self.predicted_w[name] - w for name, w in self.measured_w.items()}

    @property
    def max_abs_error(self) -> float:
        """The largest |predicted / measured - 1| over the rows."""
        return max(abs(self.predicted_w[n] / w - 1.0) for n, w in self.measured_w.items())


def _kind(workload: str) -> str:
    return workload.split("_", 1)[0]  # idle, gemm, hbm, l2


def _precision(workload: str) -> str:
    """gemm_fp8_8192 -> fp8; every other row's flop (an HBM add's) count at bf16."""
    parts = workload.split("_")
    return parts[1] if parts[0] == "gemm" and len(parts) > 2 else "bf16"


def _number(text: str | None) -> float:
    return float(text) if text not in (None, "") else 0.0


def missing_rows(rows: list[dict]) -> str | None:
    """Why ``rows`` (power.csv as mappings) cannot be fitted, or None if they can."""
    kinds = {_kind(r["workload"]) for r in rows if float(r["seconds"]) > 0}
    if not {"idle", "gemm", "hbm"} <= kinds:
        return f"power.csv has no {', '.join(sorted({'idle', 'gemm', 'hbm'} - kinds))} row ({NEEDED} needed)"
    return None


def fit_power(rows: list[dict]) -> PowerFit:
    """The power model that fits ``rows`` (power.csv as mappings of column to text) in least
    squares; raises ValueError naming what is missing (``missing_rows``)."""
    reason = missing_rows(rows)
    if reason is not None:
        raise ValueError(reason)
    rows = [r for r in rows if float(r["seconds"]) > 0]
    idle = float(np.mean([float(r["avg_power_w"]) for r in rows if _kind(r["workload"]) == "idle"]))
    used = [r for r in rows if _kind(r["workload"]) in ("gemm", "hbm")]
    precisions = sorted({_precision(r["workload"]) for r in used if _kind(r["workload"]) == "gemm"})
    design, target = [], []
    for r in used:
        seconds = float(r["seconds"])
        flop_rate, byte_rate = _number(r["flop"]) / seconds, _number(r["bytes"]) / seconds
        precision = _precision(r["workload"])
        design.append([flop_rate if p == precision else 0.0 for p in precisions] + [byte_rate])
        target.append(float(r["avg_power_w"]) - idle)
    solution, *_ = np.linalg.lstsq(np.array(design), np.array(target), rcond=None)
    per_flop = dict(zip(precisions, (float(j) for j in solution[:-1])))
    per_hbm_byte = float(solution[-1])
    l2 = [r for r in rows if _kind(r["workload"]) == "l2" and _number(r["bytes"]) > 0]
    per_l2_byte = None
    if l2:  # cache-resident traffic: its power above idle over its byte rate
        per_l2_byte = float(np.mean([(float(r["avg_power_w"]) - idle) / (float(r["bytes"]) / float(r["seconds"])) for r in l2]))
    fit = PowerFit(idle, per_flop, per_hbm_byte, per_l2_byte)
    for r in rows:
        fit.measured_w[r["workload"]] = float(r["avg_power_w"])
        fit.predicted_w[r["workload"]] = predicted_w(fit, r)
    return fit


def predicted_w(fit: PowerFit, row: dict) -> float:
    """The average power the fitted model gives one power.csv row."""
    seconds, kind = float(row["seconds"]), _kind(row["workload"])
    flop_rate, byte_rate = _number(row["flop"]) / seconds, _number(row["bytes"]) / seconds
    if kind == "idle":
        return fit.idle_w
    if kind == "l2":
        return fit.idle_w + byte_rate * (fit.joules_per_l2_byte or 0.0)
    per_flop = fit.joules_per_flop.get(_precision(row["workload"]), fit.joules_per_flop.get("bf16", 0.0))
    return fit.idle_w + flop_rate * per_flop + byte_rate * fit.joules_per_hbm_byte


def power_model(rows: list[dict], measured: str) -> tuple[dict | None, dict]:
    """The ``power:`` block of a profile (``PowerModel`` fields, 4 significant digits) fitted on
    ``rows``, and a note on the fit; (None, the reason) where the rows cannot give one (too few,
    or an energy per flop or byte that comes out negative: remeasure for longer)."""
    reason = missing_rows(rows)
    fit = None
    if reason is None:
        fit = fit_power(rows)
        bad = {p: j for p, j in fit.joules_per_flop.items() if j <= 0}
        if fit.joules_per_hbm_byte < 0:
            bad["hbm byte"] = fit.joules_per_hbm_byte
        if bad:
            reason = (f"the least-squares fit gives a non-positive energy per {', '.join(bad)} "
                      "(noisy power rows: remeasure with a longer --power-seconds)")
    if reason is not None:
        return None, {"fitted": False, "reason": reason}
    per_flop = {}
    for precision, joules in fit.joules_per_flop.items():
        per_flop[precision] = joules
        if precision == "bf16" and "fp16" not in fit.joules_per_flop:
            per_flop["fp16"] = joules
    residuals = fit.residual_w
    summary = (f"idle {fit.idle_w:.1f} W, " + ", ".join(f"{p} {j * 1e12:.3f} pJ/flop" for p, j in fit.joules_per_flop.items())
               + f", HBM {fit.joules_per_hbm_byte * 1e12:.1f} pJ/byte"
               + (f", L2 {fit.joules_per_l2_byte * 1e12:.1f} pJ/byte" if fit.joules_per_l2_byte is not None else "")
               + f"; residuals {min(residuals.values()):+.0f}..{max(residuals.values()):+.0f} W, "
               f"every row within {fit.max_abs_error:.1%} ({len(residuals)} rows)")
    block = {
        "idle_w": round(fit.idle_w, 1),
        "joules_per_flop": {p: _significant(j) for p, j in per_flop.items()},
        "joules_per_hbm_byte": _significant(fit.joules_per_hbm_byte),
    }
    if fit.joules_per_l2_byte is not None and fit.joules_per_l2_byte >= 0:
        block["joules_per_l2_byte"] = _significant(fit.joules_per_l2_byte)
    block["source"] = (f"{measured}: NVML energy of sustained kernels (power.csv), least squares over the GEMM and "
                       f"HBM rows by calibrate/fit_power.py: {summary}")
    note = {"fitted": True, "summary": summary, "residual_w": {n: round(w, 2) for n, w in residuals.items()}}
    return block, note


def _significant(value: float) -> float:
    return float(f"{value:.4g}")
