"""Pipeline schedules: the time of m micro-batches through p stages, and the bubble.

1F1B and GPipe take the same time (Narayanan et al. SC21, Sec. 2.2.1): with per-stage work
c_s = F_s + B_s per micro-batch, the step is m·max_s(c_s) plus a fill-and-drain bubble of
sum_s(c_s) - max_s(c_s); for uniform stages that is (m + p - 1)·c, the familiar bubble fraction
(p-1)/m. Interleaving v model chunks per device divides the bubble by v (Sec. 2.2.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StageWork:
    """One pipeline stage's work for one micro-batch (one model chunk of it when interleaved)."""

    forward_s: float
    backward_s: float  # input gradients (and recompute)
    weight_s: float = 0.0  # weight gradients; the full backward is backward_s + weight_s
    first_forward_s: float | None = None
    last_backward_s: float | None = None  # the last micro-batch's full backward
    paired_s: float | None = None  # DualPipe F&B
    count: int = 1


@dataclass(frozen=True)
class PipelineTime:
    total_s: float
    bubble_s: tuple[float, ...]
    finish_s: tuple[float, ...]


def pipeline_time(stages: Sequence[StageWork], micro_batches: int, schedule: str = "1f1b", virtual: int = 1,
                  p2p_s: float = 0.0, overlap_p2p: bool = True) -> PipelineTime:
    """Interim closed form (replaced by the exact composition). A blocking send holds its stage
    after every op; an overlapped one delays only the next stage (fill and drain)."""
    blocking = 0.0 if overlap_p2p else 2.0 * p2p_s
    cycles = [((s.forward_s + s.backward_s + s.weight_s + blocking) * virtual, s.count) for s in stages]
    total, bubble = pipeline_time_s(cycles, micro_batches, virtual)
    if overlap_p2p:
        total += 2.0 * p2p_s * (sum(s.count for s in stages) - 1)
    extra = virtual * max(((s.first_forward_s or s.forward_s) - s.forward_s) + ((s.last_backward_s or (s.backward_s + s.weight_s)) - s.backward_s - s.weight_s) for s in stages)
    total += extra
    finish = []
    offset = 0.0
    for s in stages:
        finish.append(total - offset)
        offset += (s.backward_s + s.weight_s) * virtual * s.count
    return PipelineTime(total, tuple(bubble for _ in stages), tuple(finish))


def pipeline_time_s(stage_times: list[tuple[float, int]], micro_batches: int, virtual: int = 1) -> tuple[float, float]:
    """(total, bubble) seconds for ``stage_times`` = [(c_s, number of stages like it), ...]."""
    slowest = max(c for c, _ in stage_times)
    fill_drain = sum(c * n for c, n in stage_times) - slowest
    bubble = fill_drain / virtual
    return micro_batches * slowest + bubble, bubble


def simulate_1f1b(forward_s: list[float], backward_s: list[float], micro_batches: int) -> list[list[tuple[str, int, float, float]]]:
    """Event-level 1F1B schedule (non-interleaved) for a trace: per stage, (phase, micro-batch,
    start, end). Each stage runs its warm-up forwards, then alternates one forward and one
    backward, then drains; an op starts when its input has arrived and the stage is free.
    Cost O(p·m): used only to draw the timeline, never on the estimate path."""
    p, m = len(forward_s), micro_batches
    f_end = [[0.0] * m for _ in range(p)]
    b_end = [[0.0] * m for _ in range(p)]
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        order = [("F", i) for i in range(warm)]
        fi, bi = warm, 0
        while bi < m:
            if fi < m:
                order.append(("F", fi))
                fi += 1
            order.append(("B", bi))
            bi += 1
        orders.append(order)
    events: list[list[tuple[str, int, float, float]]] = [[] for _ in range(p)]
    position = [0] * p
    free = [0.0] * p
    done = 0
    total = sum(len(o) for o in orders)
    while done < total:
        progressed = False
        for s in range(p):
            while position[s] < len(orders[s]):
                phase, i = orders[s][position[s]]
                if phase == "F":
                    if s > 0 and f_end[s - 1][i] == 0.0:
                        break
                    ready = f_end[s - 1][i] if s > 0 else 0.0
                    start = max(free[s], ready)
                    end = start + forward_s[s]
                    f_end[s][i] = end
                else:
                    if s < p - 1 and b_end[s + 1][i] == 0.0:
                        break
                    ready = b_end[s + 1][i] if s < p - 1 else f_end[s][i]
                    start = max(free[s], ready)
                    end = start + backward_s[s]
                    b_end[s][i] = end
                free[s] = end
                events[s].append((phase, i, start, end))
                position[s] += 1
                done += 1
                progressed = True
        if not progressed:  # cannot happen for a valid 1F1B order
            raise RuntimeError("1F1B schedule deadlocked")
    return events
