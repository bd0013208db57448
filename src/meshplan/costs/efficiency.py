"""Achieved fraction of peak as a function of op size (Calculon-style tables, one per device).

The curve is piecewise linear in log10(flop per kernel). It is written with numpy so that the
same call serves one op or an array of candidate plans.
"""

from __future__ import annotations

import numpy as np

from meshplan.specs.device import EfficiencyCurve


def achieved_fraction(curve: EfficiencyCurve, flop):
    """Fraction of peak a kernel of ``flop`` floating-point operations reaches (scalar or array)."""
    sizes = np.log10([p[0] for p in curve.points])
    fractions = [p[1] for p in curve.points]
    value = np.interp(np.log10(np.maximum(flop, 1.0)), sizes, fractions)
    return float(value) if np.ndim(value) == 0 else value
