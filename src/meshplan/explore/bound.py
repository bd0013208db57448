"""A lower bound on step time, provably never above the exact estimate, for arrays of plans.

Every op's time is max(compute, memory) + overhead >= flop / (peak * best fraction), where the
best fraction is the highest point of the device's efficiency curves. The pipeline time of
meshplan.timeline.pipeline_schedule, m·max_s(c_s) + (sum_s c_s - max_s c_s)/v, is at least
(m + (p-1)/v)·min_s(c_s), and every stage computes at least the layers of the fewest-layer
stage (L/p for an even pipeline). So

    step >= (m + (p - 1)/v) · min_s(L_s) · layer_flop_per_device / (peak · best fraction)

holds for every plan of the 1F1B and GPipe schedules; for zero-bubble and DualPipe schedules the
bubble term is dropped (m·min_s(L_s)·...). Search evaluates exactly only the plans whose bound can
beat the best.
"""

from __future__ import annotations

import numpy as np

from meshplan import catalog
from meshplan.specs import Scenario
from meshplan.workloads.ops import dense_flop
from meshplan.workloads.transformer import lower


def lower_bounds(scenarios: list[Scenario]) -> np.ndarray:
    """Lower bound on step time for each scenario (all of one model and cluster)."""
    if not scenarios:
        return np.zeros(0)
    first = scenarios[0]
    model, device = first.model, first.cluster.device
    profile = catalog.efficiency(device.efficiency)
    best = max(f for curve in (profile.matmul, profile.attention) for _, f in curve.points)

    # flop of one decoder layer for one sequence, forward, by sequence length and attention kind
    per_sequence: dict[tuple[int, bool], tuple[float, float]] = {}
    rows = []
    for s in scenarios:
        p = s.plan
        key = (s.seq_len, p.flash_attention)
        if key not in per_sequence:
            # the cheapest layer kind bounds every layer of a stage (MoE models have two)
            blocks = lower(model, 1, s.seq_len, 2.0, p.flash_attention).blocks
            per_sequence[key] = min((dense_flop(b.ops), dense_flop(b.ops, {"attention"})) for b in blocks)
        forward, attention = per_sequence[key]
        if p.recompute == "full":
            recompute = forward
        elif p.recompute == "selective" and not p.flash_attention:
            recompute = attention
        else:
            recompute = 0.0
        # zero-bubble and DualPipe schedules fill the fill-and-drain bubble: no bubble term for them
        fill = p.pp if p.schedule in ("1f1b", "gpipe") else 1
        rows.append((s.num_micro_batches, fill, p.virtual_pipeline_stages, p.micro_batch_size, p.tp * p.cp,
                     3.0 * forward + recompute, device.peak(p.precision), min(s.stage_layers)))
    m, pp, v, b, split, flop, peak, fewest = (np.array(col, dtype=float) for col in zip(*rows))
    layer_s = b * flop / split / (peak * best)
    return (m + (pp - 1.0) / v) * fewest * layer_s
