"""Achieved fraction of peak as a function of op size (Calculon-style tables, one per device).

The curve is piecewise linear in log10(flop per kernel). It is written with numpy so that the
same call serves one op or an array of candidate plans.

A bigger kernel never finishes sooner than a smaller one. Interpolating a steep curve linearly in
log10(flop) can break that: where the fraction grows almost tenfold per decade (small attention
kernels), flop / fraction dips between two table points, and a batch of 4 sequences would decode
faster than a batch of 2. So the time per unit of work, flop / fraction, is held at its running
maximum over the table: within a segment flop / fraction falls and then rises, so its largest
value up to any size is at that size or at a table point below it. Where the time already grows,
the curve is unchanged.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from meshplan.specs.device import EfficiencyCurve


@lru_cache(maxsize=64)
def _table(points: tuple[tuple[float, float], ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(log10 sizes, fractions, running maximum of size / fraction at the table points)."""
    sizes = np.array([p[0] for p in points], dtype=float)
    fractions = np.array([p[1] for p in points], dtype=float)
    return np.log10(sizes), fractions, np.maximum.accumulate(sizes / fractions)


def achieved_fraction(curve: EfficiencyCurve, flop):
    """Fraction of peak a kernel of ``flop`` floating-point operations reaches (scalar or array),
    such that flop / fraction (its time at a fixed peak) never decreases as flop grows."""
    log_sizes, fractions, time_floor = _table(curve.points)
    work = np.maximum(flop, 1.0)
    x = np.log10(work)
    value = np.interp(x, log_sizes, fractions)
    below = np.searchsorted(log_sizes, x, side="right") - 1  # the last table point at or below
    floor = np.where(below >= 0, time_floor[np.maximum(below, 0)], 0.0)
    value = np.where(floor > 0, np.minimum(value, work / np.where(floor > 0, floor, 1.0)), value)
    return float(value) if np.ndim(value) == 0 else value
