"""Fit a device profile to measured kernels and collectives: ``fit_profile(folder, device)``.

The profile is one entry of ``catalog/efficiency.yaml`` (the efficiency-vs-size model that
``costs/compute.py`` reads today) plus, where collectives were measured, each network level's
bus bandwidth and per-step latency. Every fit is a linear least-squares problem in relative
error (each row weighted by 1 / its measured time, so a 20 us kernel counts as much as a
20 ms one), solved with numpy:

- memory ops:  t = bytes / (hbm_bytes_per_s x memory) + kernel_overhead_s
- GEMMs, attention:  t - kernel_overhead_s = flop / peak x (1 / e_max) x (1 + f_half / size)
  i.e. the profile's curve e(size) = e_max / (1 + f_half / size), tabulated at decades of size,
  with size = max(flop, bytes x size_flop_per_byte) as the estimator sizes a kernel;
- collectives:  t = steps x latency_s + bus_bytes / bus_bytes_per_s, with ring steps
  2(n-1) for all-reduce, n-1 for all-gather, reduce-scatter and all-to-all, 1 for send/recv
  (Thakur et al. 2005), bus bytes as nccl-tests counts them (``collectives.bus_factor``).

Attention flop follow the estimator's convention (``workloads/transformer.py``: the full
4·b·s²·heads·d square, no causal halving; backward twice forward), not FlashAttention's
benchmark convention the CSV's ``fwd_flop`` column uses; a causal kernel computes half the square
the estimator counts, so its fraction may pass 1 and is capped there (a Fraction). What is not measured (embedding
lookups, ridge point) is kept from the device's catalog profile; the overlap slowdown too, unless
GEMMs were timed beside all-gathers on GPUs under torchrun (overlap.csv, ``fit_overlap``). Where
the profile is applied, the catalog profile's other flash-attention generations and unaligned
GEMMs join it too (``specs.profile.with_unmeasured``).

Where the folder holds enough GEMM, attention and memory rows (a full run, not ``--quick``), the
profile also carries a ``kernels:`` block (the shape-aware kernel models, which then replace the
curves in estimates) fitted by ``calibrate/fit_kernels.py``; the curves stay, as the Efficiency
spec requires them. ``fit.kernels`` says whether the block was fitted, and why not. Where it
holds power.csv (NVML energy of sustained kernels, ``calibrate/power.py``), the profile carries a
``power:`` model fitted by ``calibrate/fit_power.py`` (estimates then charge the measured energy
per flop and byte, and cap clocks at the device's TDP as the catalog's measured Hopper profile
does); ``fit.power`` says whether it was fitted, and why not. Without power.csv the profile has
no power model, as before.

This module is the one seam to the kernel model: when that model changes, this fitter does.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np

from meshplan.calibrate.collectives import bus_factor
from meshplan.calibrate.table import read_rows
from meshplan.errors import MeshplanError
from meshplan.specs.device import Device

#: sizes (flop per kernel) at which the fitted curves are tabulated, as in efficiency.yaml
DECADES = tuple(10.0 ** p for p in range(8, 14))


def fit_profile(folder: str | Path, device: Device) -> dict:
    """The profile fitted to the CSV files in ``folder`` for ``device`` (a catalog Device: its
    peaks turn times into fractions), as plain data ready for YAML."""
    from meshplan import catalog

    folder = Path(folder)
    base = catalog.efficiency(device.efficiency)
    gemms = read_rows(folder / "gemm_bf16.csv")
    attention = read_rows(folder / "attention.csv")
    memory = read_rows(folder / "memory_ops.csv")
    if not (gemms and attention and memory):
        missing = [n for n, rows in (("gemm_bf16.csv", gemms), ("attention.csv", attention), ("memory_ops.csv", memory)) if not rows]
        raise MeshplanError(str(folder), f"no rows in {', '.join(missing)}", "a folder `meshplan calibrate` measured kernels into")
    ridge = base.size_flop_per_byte
    peak = device.peak("bf16")
    mem = _fit_memory(memory, device.hbm_bytes_per_s)
    overhead = mem["kernel_overhead_s"]
    matmul = _fit_curve(*_gemm_samples(gemms, ridge), peak, overhead)
    attn = _fit_curve(*_attention_samples(attention, ridge), peak, overhead)
    env = _environment(folder)
    when = env.get("measured_at") or dt.date.fromtimestamp((folder / "gemm_bf16.csv").stat().st_mtime).isoformat()
    on = f"{env.get('device', 'an unnamed device')} (torch {env.get('torch', '?')})"
    slowdown, overlap = fit_overlap(read_rows(folder / "overlap.csv"), base.overlap_slowdown)
    kept = "lookup, size_flop_per_byte" if overlap["fitted"] else "lookup, overlap_slowdown, size_flop_per_byte"
    source = (
        f"meshplan calibrate, measured on {on} on {when}, fitted for {device.id} by least squares: "
        f"matmul e_max {matmul['e_max']:.3f}, f_half {matmul['f_half']:.3g} on {matmul['rows']} bf16 GEMMs "
        f"(median |error| {matmul['median_abs_error']:.1%}); attention e_max {attn['e_max']:.3f}, "
        f"f_half {attn['f_half']:.3g} on {attn['rows']} forward and backward rows (median |error| "
        f"{attn['median_abs_error']:.1%}); memory {mem['memory']:.3f} of {device.hbm_bytes_per_s / 1e9:.0f} GB/s "
        f"and kernel overhead {overhead * 1e6:.2f} us on {mem['rows']} memory ops (median |error| "
        f"{mem['median_abs_error']:.1%}); {kept} kept from the {device.efficiency} profile"
        + (f"; {overlap['summary']}" if overlap["fitted"] else "")
    )
    efficiency = {
        "matmul": {"points": _points(matmul)},
        "attention": {"points": _points(attn)},
        "memory": round(float(mem["memory"]), 4),
        "lookup": base.lookup,
        "kernel_overhead_s": float(f"{overhead:.4g}"),
        "overlap_slowdown": slowdown,
        "size_flop_per_byte": base.size_flop_per_byte,
        "source": source,
    }
    if efficiency["lookup"] is None:
        del efficiency["lookup"]
    profile = {"device": device.id, "efficiency": efficiency}
    network = fit_network(read_rows(folder / "collectives.csv"), on, when)
    if network:
        profile["network"] = network
    profile["fit"] = {"matmul": matmul, "attention": attn, "memory": mem, "overlap": overlap}
    kernels, note = _fit_kernels(folder, device, f"meshplan calibrate, measured on {on} on {when}")
    profile["fit"]["kernels"] = note
    if kernels is not None:
        efficiency["kernels"] = kernels
        efficiency["source"] += f"; kernels: {note['summary']}"
    else:
        efficiency["source"] += f"; no kernel models fitted ({note['reason']}): the matmul and attention curves serve"
    power_rows = read_rows(folder / "power.csv")
    if power_rows:
        from meshplan.calibrate.fit_power import power_model

        block, note = power_model(power_rows, f"meshplan calibrate, measured on {on} on {when}")
        profile["fit"]["power"] = note
        if block is not None:
            efficiency["power"] = block
            efficiency["source"] += f"; power: {note['summary']}"
    fp8 = read_rows(folder / "gemm_fp8.csv")
    if len(fp8) >= 2 and "fp8" in device.peak_flop_per_s:  # not read by today's model: one matmul curve
        profile["fit"]["matmul_fp8"] = _fit_curve(*_gemm_samples(fp8, ridge, 1.0), device.peak("fp8"), overhead)
    return profile


def _fit_kernels(folder: Path, device: Device, measured: str) -> tuple[dict | None, dict]:
    """The ``kernels:`` block fitted on the measured files (calibrate/fit_kernels.py) and a note on
    the fit; (None, the reason) where the files have too few rows (a --quick run) or scipy is missing."""
    from meshplan.calibrate.fit_kernels import error_summary, fit_kernels, missing_data

    reason = missing_data(folder, device)
    if reason is None:
        try:
            import scipy.optimize  # noqa: F401
        except ImportError:
            reason = "scipy is not installed: pip install 'meshplan[calibrate]'"
    if reason is not None:
        return None, {"fitted": False, "reason": reason}
    source = f"{measured}, fitted for {device.id} ({device.sm_count} SMs) by calibrate/fit_kernels.py"
    fit = fit_kernels(folder, device, source)
    errors = {kind: {"rows": len(e), "median_abs_error": float(np.median(e)), "p90_abs_error": float(np.percentile(e, 90))}
              for kind, e in fit.errors.items()}
    summary = "; ".join(f"{kind} {error_summary(e)}" for kind, e in fit.errors.items())
    host = fit.kernels.host
    summary += (f"; host dispatch {host.forward_s * 1e6:.1f} us forward, {host.backward_s * 1e6:.1f} us backward per op (layer.csv)"
                if host is not None else "; no host dispatch (no layer.csv)")
    return _significant(fit.kernels.model_dump(mode="json")), {"fitted": True, "errors": errors, "summary": summary}


def _significant(data):
    """``data`` with every float to 4 significant digits (as the catalog writes its fits)."""
    if isinstance(data, dict):
        return {k: _significant(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_significant(v) for v in data]
    return float(f"{data:.4g}") if isinstance(data, float) else data


def _environment(folder: Path) -> dict:
    try:
        return json.loads((folder / "env.json").read_text())
    except (OSError, ValueError):
        return {}


def _solve(columns: list[np.ndarray], times: np.ndarray) -> np.ndarray:
    """Non-negative least squares of sum(c_j x_j) = t in relative error: the best of the fits
    over every subset of the columns whose coefficients are all >= 0 (two or three columns).
    The first column (the term that grows with the work) is always kept, so noisy times of
    tiny kernels still give a finite rate rather than none."""
    a = np.stack(columns, axis=1) / times[:, None]
    ones = np.ones_like(times)
    best, best_residual = np.zeros(len(columns)), float(np.sum(ones ** 2))
    for mask in range(1, 2 ** len(columns), 2):
        keep = [j for j in range(len(columns)) if mask >> j & 1]
        sub, *_ = np.linalg.lstsq(a[:, keep], ones, rcond=None)
        residual = float(np.sum((a[:, keep] @ sub - ones) ** 2))
        if np.all(sub >= 0) and residual < best_residual:
            best = np.zeros(len(columns))
            best[keep] = sub
            best_residual = residual
    return best


def _median_abs_error(predicted: np.ndarray, times: np.ndarray) -> float:
    return float(np.median(np.abs(predicted - times) / times))


def _fit_memory(rows: list[dict], hbm_bytes_per_s: float) -> dict:
    nbytes = np.array([float(r["bytes_moved"]) for r in rows])
    times = np.array([float(r["time_s"]) for r in rows])
    inverse_bw, overhead = _solve([nbytes, np.ones_like(nbytes)], times)
    if inverse_bw <= 0:
        raise MeshplanError("memory_ops.csv", "time_s", "times that grow with the bytes moved (remeasure with larger sizes)")
    fraction = float(min(1.0, 1.0 / (inverse_bw * hbm_bytes_per_s)))
    predicted = nbytes / (fraction * hbm_bytes_per_s) + overhead
    return {"memory": fraction, "kernel_overhead_s": float(overhead), "rows": len(rows),
            "median_abs_error": _median_abs_error(predicted, times)}


def _gemm_samples(rows: list[dict], ridge: float, operand_bytes: float = 2.0):
    m, n, k = (np.array([float(r[c]) for r in rows]) for c in "mnk")
    flop = 2.0 * m * n * k
    traffic = operand_bytes * (m * k + k * n) + 2.0 * m * n  # operands read once, bf16 result written once
    return flop, np.maximum(flop, traffic * ridge), np.array([float(r["time_s"]) for r in rows])


def _attention_samples(rows: list[dict], ridge: float):
    flop, size, times = [], [], []
    for r in rows:
        b, s, d = float(r["batch"]), float(r["seq"]), float(r["head_dim"])
        heads, kv = float(r["heads"]), float(r["kv_heads"])
        fwd_flop = 4.0 * b * s * s * heads * d  # the estimator's count: the full square
        traffic = 2.0 * b * s * d * (2 * heads + 2 * kv)  # Q, K, V read and O written once, bf16
        fwd, both = float(r["fwd_s"]), float(r["fwd_bwd_s"])
        flop.append(fwd_flop), size.append(max(fwd_flop, traffic * ridge)), times.append(fwd)
        if both > fwd:
            flop.append(2 * fwd_flop), size.append(max(2 * fwd_flop, 2 * traffic * ridge)), times.append(both - fwd)
    return np.array(flop), np.array(size), np.array(times)


def _fit_curve(flop: np.ndarray, size: np.ndarray, times: np.ndarray, peak: float, overhead: float) -> dict:
    """e(size) = e_max / (1 + f_half / size) from t = overhead + flop / (peak e(size))."""
    if np.count_nonzero(times > overhead) < 2:  # noisy tiny kernels, all as fast as the overhead
        overhead = 0.0
    usable = times > overhead
    flop, size, times = flop[usable], size[usable], times[usable]
    compute = times - overhead
    inverse_max, half_over_max = _solve([flop / peak, flop / (peak * size)], compute)
    if inverse_max <= 0:
        raise MeshplanError("calibration", "kernel times", "times that grow with the flop (remeasure with larger sizes)")
    e_max, f_half = 1.0 / inverse_max, half_over_max / inverse_max
    achieved = flop / (peak * times)  # as measured, launch overhead included
    predicted = overhead + flop / (peak * _curve(e_max, f_half, size))
    return {"e_max": float(e_max), "f_half": float(f_half), "rows": int(len(flop)),
            "median_abs_error": _median_abs_error(predicted, times),
            "measured_min": float(achieved.min()), "measured_max": float(achieved.max())}


def _curve(e_max: float, f_half: float, size):
    return np.minimum(1.0, e_max / (1.0 + f_half / size))


def _points(fit: dict) -> list[list[float]]:
    return [[float(f"{s:.0e}"), float(f"{_curve(fit['e_max'], fit['f_half'], s):.4g}")] for s in DECADES]


def fit_network(rows: list[dict], on: str, when: str) -> list[dict]:
    """Per network level (nodes = 1: the scale-up level 0; more: level 1), the bus bandwidth and
    per-step latency that fit every collective measured over it."""
    levels: dict[int, list[dict]] = {}
    for r in rows:
        levels.setdefault(0 if int(r["nodes"]) == 1 else 1, []).append(r)
    out = []
    for level, group in sorted(levels.items()):
        ranks = max(int(r["ranks"]) for r in group)
        group = [r for r in group if int(r["ranks"]) == ranks]
        steps = np.array([_steps(r["collective"], ranks) for r in group])
        bus_bytes = np.array([float(r["bytes"]) * bus_factor(r["collective"], ranks) for r in group])
        times = np.array([float(r["time_s"]) for r in group])
        inverse_bw, latency = _solve([bus_bytes, steps], times)
        if inverse_bw <= 0:
            continue
        error = _median_abs_error(steps * latency + bus_bytes * inverse_bw, times)
        out.append({
            "level": level, "ranks": ranks, "nodes": int(group[0]["nodes"]),
            "bus_bytes_per_s": float(f"{1.0 / inverse_bw:.4g}"), "latency_s": float(f"{latency:.4g}"),
            "source": f"meshplan calibrate, {len(group)} collectives over {ranks} ranks measured on {on} on {when}; "
                      f"least squares of t = steps x latency + bus bytes / bandwidth (median |error| {error:.1%})",
        })
    return out


#: an overlap row counts where the collectives ran beside at least this share of the GEMM loop
COVERED = 0.95


def fit_overlap(rows: list[dict], kept: float) -> tuple[float, dict]:
    """The profile's overlap_slowdown from overlap.csv (``collectives.overlap``): the median
    slowdown of the GPU rows whose collectives lasted the whole GEMM loop, none below 0; else
    ``kept`` (the catalog profile's) and why. CPU rows are not used: gloo's threads share the
    host's cores, not a GPU's SMs and memory, so they say nothing of a device."""
    if not rows:
        return kept, {"fitted": False, "reason": "no overlap.csv rows (they are measured under torchrun)"}
    gpu = [r for r in rows if r["on"] == "cuda"]
    if not gpu:
        return kept, {"fitted": False, "reason": "measured on a CPU: gloo's threads share its cores, not a GPU's SMs"}
    covered = [r for r in gpu if float(r["covered"]) >= COVERED]
    if not covered:
        return kept, {"fitted": False, "reason": f"no GEMM loop ran beside the collectives for {COVERED:.0%} of it"}
    value = float(np.median([max(0.0, float(r["slowdown"])) for r in covered]))
    ranks = sorted({int(r["ranks"]) for r in covered})
    summary = (f"overlap_slowdown {value:.3f}: the median of {len(covered)} GEMM loops beside all-gathers over "
               f"{', '.join(map(str, ranks))} ranks (the catalog's {kept})")
    return round(value, 4), {"fitted": True, "rows": len(covered), "summary": summary}


def _steps(collective: str, ranks: int) -> int:
    if collective == "all_reduce":
        return 2 * (ranks - 1)
    return 1 if collective == "send_recv" else ranks - 1
