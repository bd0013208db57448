"""Pipeline schedules: the time of m micro-batches through p stages, per-stage bubbles and finish.

Schedules (``schedule``):

- "gpipe": all forwards, then all backwards (Huang et al. 2019).
- "1f1b": PipeDream-Flush / Megatron non-interleaved 1F1B (Narayanan et al. SC21, Sec. 2.2.1);
  with ``virtual`` > 1 the interleaved 1F1B of Sec. 2.2.2: each stage holds ``virtual`` model
  chunks, ``stages`` describes one chunk per stage and chunk c of stage s is model chunk c·p + s;
  micro-batches go through a chunk in groups of ``group`` (Megatron-Core's
  microbatch_group_size_per_vp_stage, p by default), so m need not be a multiple of p.
- "zb-h1": ZB-H1 of Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Sec. 2.1: 1F1B's
  peak memory, the backward split into B (input gradient) and W (weight gradient), W deferred to
  fill the bubbles; bubble (p-1)(F+B-W) for uniform stages with W <= F, B.
- "dualpipe": DeepSeek-V3 technical report (arXiv 2412.19437), Sec. 3.2.1 and Table 2, in the order
  of deepseek-ai/DualPipe: two directions fed from both ends, device r holding stage r of one and
  stage p-1-r of the other; paired forward and backward chunks overlap ("F&B", ``paired_s``).

``simulate`` unrolls every op (the reference); ``pipeline_time`` computes the same numbers
exactly (to rounding) without unrolling all micro-batches:

- gpipe, and 1f1b without interleaving when p2p latency does not overlap compute (p2p_s = 0, or
  overlap_p2p=False): closed-form longest paths (``pipeline_closed_form``), a few dozen numpy
  operations on p x p arrays whatever m is (about 0.1-0.4 ms for p = 16-64,
  benchmarks/bench_pipeline.py).
- everything else (1f1b with overlapped latency, interleaved 1f1b, zb-h1, dualpipe, and any
  schedule where a stage has a ``release_s``): a bounded
  simulation with a periodicity certificate (``pipeline_periodic``): 2p-4p micro-batches (four
  groups where interleaved) are simulated and extrapolated; when the steady state has not
  settled by then (two stage kinds with nearly the same cycle time), the missing steady periods
  are inserted as max-plus powers of a small matrix. The cost grows with p² (p²·v interleaved;
  about 0.3-6 ms at p = 16, 3-25 ms at p = 64; p·group·v for an interleaved group larger than
  p), not with m (beyond log2(m) matrix products in the unsettled case).

p2p_s is one activation or gradient send between neighbouring stages. With overlap_p2p the send
runs on its own stream: the receiver can start p2p_s after the sender's op ended and the sender
goes on at once; without it the sender is also held for p2p_s (Megatron without
overlap_p2p_comm). Held time counts as bubble.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshplan.errors import MeshplanError
from meshplan.specs.plan import group_problem
from meshplan.timeline.pipeline_closed_form import gpipe_finish, one_f_one_b_finish
from meshplan.timeline.pipeline_orders import Op, simulate_orders
from meshplan.timeline.pipeline_periodic import periodic_finish
from meshplan.units import finite_number

SCHEDULES = ("gpipe", "1f1b", "zb-h1", "dualpipe")

__all__ = ["SCHEDULES", "Op", "PipelineTime", "StageWork", "pipeline_time", "simulate", "pipeline_time_s", "simulate_1f1b"]


@dataclass(frozen=True)
class StageWork:
    """One pipeline stage's work for ONE micro-batch (for interleaved: one model chunk of it)."""

    forward_s: float  # F
    backward_s: float  # B: input-gradient part of the backward (incl. recompute)
    # W: weight-gradient part; the full backward is B + W. Only zero-bubble schedules split it
    # out (zb-h1, and dualpipe's zero-bubble steps); the others run B + W as one op.
    weight_s: float = 0.0
    first_forward_s: float | None = None  # the first micro-batch's forward (it may wait for a parameter all-gather); None: forward_s
    # the last micro-batch's full backward B + W (a gradient reduce overlapped with it may make it
    # longer); None: backward_s + weight_s. Where W is split out, its W takes this minus B.
    last_backward_s: float | None = None
    # DualPipe: one forward chunk and one backward chunk of two micro-batches run overlapped ("F&B"
    # of DeepSeek-V3 Table 2); None: forward_s + backward_s + weight_s. Pairing chunks of two
    # different stages takes the mean of their paired_s.
    paired_s: float | None = None
    count: int = 1  # how many consecutive stages are like this one
    # the stage's first op starts no earlier than this (its parameters are still being gathered:
    # under interleaving Megatron-Core dispatches every stage's all-gathers at the same time)
    release_s: float = 0.0


@dataclass(frozen=True)
class PipelineTime:
    """One step of the pipeline schedule (the optimizer is not part of it)."""

    total_s: float  # first op start to the last op end, all stages
    bubble_s: tuple[float, ...]  # per StageWork entry: idle time of such a stage inside [0, total]
    finish_s: tuple[float, ...]  # per StageWork entry: when such a stage ends its last op (the latest of its stages)


def pipeline_time(stages: Sequence[StageWork], micro_batches: int, schedule: str = "1f1b", virtual: int = 1,
                  p2p_s: float = 0.0, overlap_p2p: bool = True, group: int | None = None) -> PipelineTime:
    """Makespan, per-entry bubble and finish of ``schedule``, exactly as ``simulate`` would time it.

    ``group`` (interleaved 1F1B only): micro-batches each model chunk runs in a row, Megatron-Core's
    microbatch_group_size_per_vp_stage; None: the number of stages, its default (a plan picks a
    larger one where m needs it, ``specs.plan.interleave_group``).

    For dualpipe, device r runs stage r's chunk of one direction and stage p-1-r's of the other;
    an entry's bubble and finish are the largest over the devices r in its range.
    """
    works = _validated(stages, micro_batches, schedule, virtual, p2p_s, overlap_p2p, group)
    m, ranges = micro_batches, _entry_ranges(stages)
    closed = schedule == "gpipe" or (schedule == "1f1b" and virtual == 1 and (p2p_s == 0 or not overlap_p2p))
    if closed and not any(w.release_s for w in works):
        finish = _closed_form(stages, m, schedule, p2p_s, overlap_p2p, [r.start for r in ranges])
        total = max(finish)
    else:
        per_stage = periodic_finish(schedule, works, m, virtual, float(p2p_s), bool(overlap_p2p), group)
        finish = [float(per_stage[r.start:r.stop].max()) for r in ranges]
        total = float(per_stage.max())
    if schedule == "dualpipe":
        busy = _dualpipe_busy(works, m)
        idle = [total - min(busy[r.start:r.stop]) for r in ranges]
    else:
        idle = [total - virtual * _chunk_busy(w, m) for w in stages]
    return PipelineTime(total_s=float(total), bubble_s=tuple(float(x) for x in idle), finish_s=tuple(float(f) for f in finish))


def simulate(stages: Sequence[StageWork], micro_batches: int, schedule: str = "1f1b", virtual: int = 1,
             p2p_s: float = 0.0, overlap_p2p: bool = True, group: int | None = None) -> list[list[Op]]:
    """Unrolled event simulation, the reference for ``pipeline_time``: per stage, its ops
    (kind, micro_batch, chunk, start_s, end_s) in execution order. Cost O(p·m·v)."""
    works = _validated(stages, micro_batches, schedule, virtual, p2p_s, overlap_p2p, group)
    return simulate_orders(works, schedule, micro_batches, virtual, float(p2p_s), bool(overlap_p2p), group)


def _closed_form(stages, m: int, schedule: str, p2p_s: float, overlap_p2p: bool, ends: list[int]) -> list[float]:
    """gpipe / 1f1b finish of each stage in ``ends`` (the latest stage of its entry), from the
    effective per-stage durations: without overlap a sending op holds its stage p2p_s longer,
    which is the same as a longer op whose output arrives when it ends."""
    counts = [w.count for w in stages]
    p = sum(counts)
    F = np.repeat([float(w.forward_s) for w in stages], counts)
    B = np.repeat([float(w.backward_s + w.weight_s) for w in stages], counts)
    first, last = F, B  # the same arrays when no stage sets them: the closed forms simplify
    if any(w.first_forward_s is not None for w in stages):
        first = np.repeat([float(w.forward_s if w.first_forward_s is None else w.first_forward_s) for w in stages], counts)
    if any(w.last_backward_s is not None for w in stages):
        last = np.repeat([float(w.backward_s + w.weight_s if w.last_backward_s is None else w.last_backward_s) for w in stages], counts)
    hold = 0.0 if overlap_p2p else float(p2p_s)
    if hold and p > 1:
        plain_first, plain_last = first is F, last is B
        F, B = F.copy(), B.copy()
        F[:-1] += hold  # a forward sends unless on the last stage
        B[1:] += hold  # a backward sends unless on the first stage
        first = F if plain_first else first + np.where(np.arange(p) < p - 1, hold, 0.0)
        last = B if plain_last else last + np.where(np.arange(p) > 0, hold, 0.0)
    if schedule == "gpipe":
        finish = gpipe_finish(F, first, B, last, m, float(p2p_s) - hold, ends)
    else:
        finish = one_f_one_b_finish(F, first, B, last, m, ends)
    return [f - (hold if t > 0 else 0.0) for f, t in zip(finish, ends)]  # the last op (a send) ends before its hold


def _chunk_busy(w: StageWork, n: int) -> float:
    """Compute time of one model chunk of a stage over n micro-batches."""
    full = w.backward_s + w.weight_s
    first = w.forward_s if w.first_forward_s is None else w.first_forward_s
    last = full if w.last_backward_s is None else w.last_backward_s
    return n * (w.forward_s + full) + (first - w.forward_s) + (last - full)


def _dualpipe_busy(works: list[StageWork], m: int) -> list[float]:
    """Per device, the compute time of its two chunks (stage r of one direction, p-1-r of the
    other) less what DualPipe.step's overlapped F&B steps save."""
    p, half, half_m = len(works), len(works) // 2, m // 2
    busy = []
    for r in range(p):
        hr = min(r, p - 1 - r)
        near, far = works[hr], works[p - 1 - hr]  # the stages of the device's phase 0 and phase 1
        steady = half_m - p + hr + 1  # step 4 iterations
        pair_fb = steady - (r in (half - 1, half))  # F(phase 0) & B(phase 1)
        pair_bf = steady + half - hr - 1  # F(phase 1) & B(phase 0), steps 4 and 5
        mean_pair = (_paired(near) + _paired(far)) / 2
        saved = pair_fb * (near.forward_s + far.backward_s + far.weight_s - mean_pair)
        saved += pair_bf * (far.forward_s + near.backward_s + near.weight_s - mean_pair)
        busy.append(_chunk_busy(near, half_m) + _chunk_busy(far, half_m) - saved)
    return busy


def _paired(w: StageWork) -> float:
    return w.forward_s + w.backward_s + w.weight_s if w.paired_s is None else w.paired_s


def _entry_ranges(stages: Sequence[StageWork]) -> list[range]:
    out, start = [], 0
    for w in stages:
        out.append(range(start, start + w.count))
        start += w.count
    return out


def _validated(stages, micro_batches, schedule, virtual, p2p_s, overlap_p2p, group=None) -> list[StageWork]:
    """The per-stage list of StageWork (counts expanded), after checking every input."""
    if schedule not in SCHEDULES:
        raise MeshplanError("plan.schedule", schedule, f"one of {', '.join(SCHEDULES)}")
    if not _is_int(virtual) or virtual < 1:
        raise MeshplanError("plan.virtual_pipeline_stages", virtual, "a whole number >= 1")
    if virtual > 1 and schedule != "1f1b":
        raise MeshplanError("plan.virtual_pipeline_stages", virtual, f"interleaving needs the 1f1b schedule, not {schedule}")
    if isinstance(stages, StageWork) or not isinstance(stages, Sequence) or not stages:
        raise MeshplanError("pipeline.stages", stages, "a non-empty list of StageWork")
    works: list[StageWork] = []
    for i, w in enumerate(stages):
        _check_work(w, f"pipeline.stages[{i}]")
        works += [w] * w.count
    p = len(works)
    if not _is_int(micro_batches) or micro_batches < 1:
        raise MeshplanError("pipeline.micro_batches", micro_batches, "a whole number >= 1")
    if virtual > 1:
        problem = group_problem(p, micro_batches, p if group is None else group)
        if problem and group is None:  # Megatron-Core's default group, pp
            problem = ("pipeline.micro_batches", micro_batches, f"{problem[2]} (groups of pp = {p}; a larger group may run it)")
        if problem:
            raise MeshplanError(*problem)
    if schedule == "dualpipe":
        if p % 2:
            raise MeshplanError("plan.pp", p, "dualpipe needs an even number of stages")
        if micro_batches % 2 or micro_batches < 2 * p:
            raise MeshplanError("pipeline.micro_batches", micro_batches,
                                f"dualpipe needs an even number >= 2 x {p} stages = {2 * p} (deepseek-ai/DualPipe)")
    if not finite_number(p2p_s) or p2p_s < 0:
        raise MeshplanError("pipeline.p2p_s", p2p_s, "a finite number of seconds >= 0")
    if not isinstance(overlap_p2p, (bool, np.bool_)):
        raise MeshplanError("pipeline.overlap_p2p", overlap_p2p, "true or false")
    return works


def _check_work(w: object, field: str) -> None:
    if not isinstance(w, StageWork):
        raise MeshplanError(field, w, "a StageWork")
    for name in ("forward_s", "backward_s", "weight_s"):
        value = getattr(w, name)
        if not finite_number(value) or value < 0:
            raise MeshplanError(f"{field}.{name}", value, "a finite number of seconds >= 0")
    if not finite_number(w.release_s) or w.release_s < 0:
        raise MeshplanError(f"{field}.release_s", w.release_s, "a finite number of seconds >= 0")
    for name in ("first_forward_s", "paired_s"):
        value = getattr(w, name)
        if value is not None and (not finite_number(value) or value < 0):
            raise MeshplanError(f"{field}.{name}", value, "unset or a finite number of seconds >= 0")
    value = w.last_backward_s
    if value is not None and (not finite_number(value) or value < w.backward_s):
        raise MeshplanError(f"{field}.last_backward_s", value,
                            f"unset or a finite number of seconds >= backward_s ({w.backward_s})")
    if not _is_int(w.count) or w.count < 1:
        raise MeshplanError(f"{field}.count", w.count, "a whole number >= 1")


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


# Backward-compatible entry points of the old module (timeline.step and timeline.trace call them).


def pipeline_time_s(stage_times: list[tuple[float, int]], micro_batches: int, virtual: int = 1) -> tuple[float, float]:
    """(total, bubble) seconds of 1F1B for ``stage_times`` = [(F+B per micro-batch and device, number
    of stages like it), ...]. Only F+B is known here, so the backward is taken as twice the
    forward, the usual ratio; with ``virtual`` > 1 each of the v chunks does 1/v of it. The bubble
    is the idle time of the busiest stage."""
    stages = [StageWork(forward_s=c / (3 * virtual), backward_s=2 * c / (3 * virtual), count=n) for c, n in stage_times]
    result = pipeline_time(stages, micro_batches, "1f1b", virtual)
    return result.total_s, min(result.bubble_s)


def simulate_1f1b(forward_s: list[float], backward_s: list[float], micro_batches: int) -> list[list[tuple[str, int, float, float]]]:
    """Non-interleaved 1F1B timeline per stage as (phase "F"/"B", micro-batch, start, end)."""
    stages = [StageWork(forward_s=f, backward_s=b) for f, b in zip(forward_s, backward_s)]
    return [[(op.kind, op.micro_batch, op.start_s, op.end_s) for op in ops] for ops in simulate(stages, micro_batches)]
