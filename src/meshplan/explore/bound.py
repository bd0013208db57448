"""A lower bound on step time, provably never above the exact estimate, for arrays of plans.

Every layer's compute tasks take at least the time meshplan's costs give its ops (the passes
schedule exactly those ops, plus collectives, contention and waiting), so one layer forward,
backward and recomputed costs at least ``layer_s``: the ops of the cheapest layer kind through
``costs.costed.op_times`` at the plan's tp, cp, micro-batch and sequence length (cached per
distinct shape). The pipeline schedules of meshplan.timeline.pipeline_schedule take at least
(m + (p-1)/v)·min_s(c_s) for 1F1B and GPipe (interleaving divides the fill by v), at least
m·min_s(c_s) for zero-bubble and DualPipe, and every stage computes at least the layers of the
fewest-layer stage. So

    step >= (m + (p - 1)/v) · min_s(L_s) · layer_s

holds for every plan; search evaluates exactly only the plans whose bound can beat the best.
Finetuning with frozen layers (they run no backward) keeps the flop bound at the best efficiency;
LoRA finetuning runs every layer backward, so ``layer_s`` holds for it with its adapters and its
frozen base GEMMs' input gradients only (op_times of meshplan.workloads.lora's graph).

Energy (meshplan.costs.energy) has a bound of the same kind: every device idles through at least
the time bound and does at least the work of the fewest-layer stage's layers of the cheapest
layer kind (forward, backward, recompute; forward only when finetuning), so

    energy >= N · (idle_w · step_bound + m · min_s(L_s) · layer_j).
"""

from __future__ import annotations

import numpy as np

from meshplan import catalog
from meshplan.costs.compute import Roofline
from meshplan.costs.costed import op_times
from meshplan.costs.power import WorkTally
from meshplan.parallel.recompute import whole_recompute_share
from meshplan.parallel.shard import shard_op
from meshplan.specs import Scenario
from meshplan.specs.device import BYTES_PER_ELEMENT, activation_bytes
from meshplan.workloads.lora import lower_task
from meshplan.workloads.ops import dense_flop
from meshplan.workloads.transformer import lower


def lower_bounds(scenarios: list[Scenario]) -> np.ndarray:
    """Lower bound on step time for each scenario (all of one model and cluster)."""
    if not scenarios:
        return np.zeros(0)
    first = scenarios[0]
    device = first.cluster.device
    profile = catalog.efficiency(device.efficiency)
    best = max(f for curve in (profile.matmul, profile.attention) for _, f in curve.points)
    if profile.kernels is not None:  # no kernel runs above its main loop's fraction of the peak
        k = profile.kernels
        best = max(best, *(g.sm_fraction for g in k.gemm.values()), k.attention.forward.sm_fraction, k.attention.backward.sm_fraction)

    per_shape: dict[tuple, float] = {}
    rows = []
    for s in scenarios:
        p = s.plan
        if s.task.kind == "finetune" and not s.task.lora_rank:
            layer_s = _flop_layer_s(s, best)
        else:
            key = (p.tp, p.cp, p.sequence_parallel, p.expert_tp, p.micro_batch_size, s.seq_len, p.precision,
                   p.flash_attention, p.recompute, _whole_share(s), s.task.lora_rank, s.task.lora_targets)
            if key not in per_shape:
                per_shape[key] = _layer_s(s, profile)
            layer_s = per_shape[key]
        # zero-bubble and DualPipe schedules fill the fill-and-drain bubble: no bubble term for them
        fill = p.pp if p.schedule in ("1f1b", "gpipe") else 1
        rows.append((s.num_micro_batches, fill, p.virtual_pipeline_stages, min(s.stage_layers), layer_s))
    m, pp, v, fewest, layer_s = (np.array(col, dtype=float) for col in zip(*rows))
    return (m + (pp - 1.0) / v) * fewest * layer_s


def _whole_share(s: Scenario) -> float:
    """Of the fewest layers a stage holds, the share that re-runs whole in backward."""
    return whole_recompute_share(s.plan, min(s.stage_layers))


def _rerun(s: Scenario, op) -> float:
    """The share of ``op``'s forward re-run in backward, per layer, at the least."""
    p = s.plan
    if p.recompute == "selective" and not p.whole_layer_recompute and not p.flash_attention and op.kind == "attention":
        return 1.0
    return _whole_share(s)


def _layer_s(s: Scenario, profile) -> float:
    """Compute seconds of the cheapest layer kind, one micro-batch: forward, backward and what
    the recompute policy runs again, each op through the roofline the estimate uses (LoRA's
    adapters included)."""
    p = s.plan
    roof = Roofline.of(s.cluster.device, profile, p.precision, p.attention_kernel, p.quant_scaling, p.fp8_attention)
    element = BYTES_PER_ELEMENT[p.precision]
    sp = p.sequence_parallel and p.tp > 1
    blocks = lower_task(s.model, s.task, p.micro_batch_size, s.seq_len, activation_bytes(p.precision), p.flash_attention).blocks
    cheapest = float("inf")
    for block in blocks:
        seconds = 0.0
        for op in block.ops:
            t = op_times(shard_op(op, p.tp, p.cp, sp, p.expert_tp, p.precision, p.quant_scaling), roof, element)
            seconds += t.forward_s * (1.0 + _rerun(s, op)) + t.backward_s
        cheapest = min(cheapest, seconds)
    return cheapest


def _flop_layer_s(s: Scenario, best: float) -> float:
    """Matmul and attention flop of the cheapest layer kind at the profile's best efficiency."""
    p = s.plan
    blocks = lower(s.model, 1, s.seq_len, 2.0, p.flash_attention).blocks
    forward, attention = min((dense_flop(b.ops), dense_flop(b.ops, {"attention"})) for b in blocks)
    recompute = forward * _whole_share(s) if p.whole_layer_recompute else attention if p.recompute == "selective" and not p.flash_attention else 0.0
    flop = p.micro_batch_size * (3.0 * forward + recompute) / (p.tp * p.cp)
    return flop / (s.cluster.device.peak(p.precision) * best)


def energy_lower_bounds(scenarios: list[Scenario], time_bounds: np.ndarray) -> np.ndarray | None:
    """Lower bound on the energy of a step, all devices, for each scenario; None when the
    device's profile has no power model."""
    if not scenarios:
        return np.zeros(0)
    power = catalog.efficiency(scenarios[0].cluster.device.efficiency).power
    if power is None:
        return None
    per_shape: dict[tuple, float] = {}
    out = []
    for s, bound_s in zip(scenarios, time_bounds):
        p = s.plan
        key = (p.tp, p.cp, p.sequence_parallel, p.expert_tp, p.micro_batch_size, s.seq_len, p.precision,
               p.flash_attention, p.recompute, _whole_share(s), s.task.kind)
        if key not in per_shape:
            per_shape[key] = _layer_j(s, power)
        dynamic = s.num_micro_batches * min(s.stage_layers) * per_shape[key]
        out.append(s.num_devices * (power.idle_w * bound_s + dynamic))
    return np.array(out)


def _layer_j(s: Scenario, power) -> float:
    """Dynamic energy of the cheapest layer kind on one device, one micro-batch."""
    p = s.plan
    element = BYTES_PER_ELEMENT[p.precision]
    sp = p.sequence_parallel and p.tp > 1
    blocks = lower(s.model, p.micro_batch_size, s.seq_len, activation_bytes(p.precision), p.flash_attention).blocks
    cheapest = float("inf")
    for block in blocks:
        tally = WorkTally(p.precision, element)
        for op in block.ops:
            tally.add(shard_op(op, p.tp, p.cp, sp, p.expert_tp, p.precision, p.quant_scaling), 1.0 if s.task.kind == "finetune" else 3.0 + _rerun(s, op))
        cheapest = min(cheapest, tally.energy_j(power))
    return cheapest
