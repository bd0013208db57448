"""Op orders of the pipeline schedules and the reference event simulation.

Every micro-batch on every stage is unrolled; an op starts when its stage is free and its inputs
have arrived (the longest path through the schedule's dependency graph). This is the reference
that ``pipeline_time``'s fast path is tested against, and what a trace draws.

An op key is ``(kind, micro_batch, position)``: ``position`` is the model chunk along the
micro-batch's path (0 .. pipeline depth - 1). Kinds: ``F`` forward; ``B`` the full backward
(input and weight gradient in one op); ``b`` the input-gradient part only, its ``W`` run as a
separate op later; ``FB`` (DualPipe) one forward and one backward chunk overlapped, keyed
``("FB", forward_mb, forward_position, backward_mb, backward_position)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class Op(NamedTuple):
    """One op of ``simulate``'s timeline, in its stage's execution order.

    ``kind``: "F", "B", "W" or "FB". "B" is the whole backward unless the same stage later runs a
    "W" for the same micro-batch and chunk (zero-bubble schedules split it). ``chunk``: the
    interleaved model chunk on this stage (model chunk ``chunk * p + stage``), DualPipe's
    direction (0: fed at stage 0), else 0. For "FB" (DualPipe), ``micro_batch`` and ``chunk`` are
    the forward half's and ``backward_micro_batch`` the backward half's (its chunk is the other
    direction); -1 for every other kind.
    """

    kind: str
    micro_batch: int
    chunk: int
    start_s: float
    end_s: float
    backward_micro_batch: int = -1


def stage_orders(schedule: str, p: int, m: int, v: int = 1, group: int | None = None) -> list[list[tuple]]:
    """Per stage, the op keys in execution order (inputs assumed valid, see ``pipeline_schedule``);
    ``group``: interleaved 1F1B's micro-batches per model chunk in a row (None: p)."""
    if schedule == "gpipe":
        return [[("F", i, s) for i in range(m)] + [("B", i, s) for i in range(m)] for s in range(p)]
    if schedule == "1f1b" and v > 1:
        return [_interleaved(p, m, v, s, group or p) for s in range(p)]
    if schedule == "1f1b":
        return [_one_f_one_b(p, m, s, split=False) for s in range(p)]
    if schedule == "zb-h1":
        return [_one_f_one_b(p, m, s, split=True) for s in range(p)]
    if schedule == "dualpipe":
        return [_dualpipe(p, m, r) for r in range(p)]
    raise ValueError(schedule)


def _one_f_one_b(p: int, m: int, s: int, split: bool) -> list[tuple]:
    """PipeDream-Flush 1F1B (Narayanan et al. SC21 Sec. 2.2.1), and ZB-H1 (Qi et al. ICLR 2024,
    Sec. 2.1) when ``split``: iteration x runs F_x, then the backward of micro-batch x - (p-1-s)
    (stage s keeps p-1-s warm-up forwards in flight), then in ZB-H1 the weight gradient W of
    micro-batch x - (p-1): every stage delays W by the same p-1 iterations, so the B passes run
    early and the deferred W fill the cool-down, with 1F1B's peak activation memory."""
    warm = p - 1 - s
    order = []
    for x in range(m + (p - 1 if split else warm)):
        if x < m:
            order.append(("F", x, s))
        if 0 <= x - warm < m:
            order.append(("b" if split else "B", x - warm, s))
        if split and 0 <= x - (p - 1) < m:
            order.append(("W", x - (p - 1), s))
    return order


def warm_up_forwards(p: int, m: int, v: int, s: int, group: int) -> int:
    """Forwards stage ``s`` runs before its first backward (as many backwards close its schedule):
    p-1-s in 1F1B; in interleaved 1F1B 2(p-1-s) + (v-1)·group, capped at m·v (_interleaved)."""
    if v == 1:
        return min(p - 1 - s, m)
    total = m * v
    return total if m == p == group else min(2 * (p - 1 - s) + (v - 1) * group, total)


def _interleaved(p: int, m: int, v: int, s: int, group: int) -> list[tuple]:
    """Interleaved 1F1B (Narayanan et al. SC21 Sec. 2.2.2), in the order of Megatron-Core's
    forward_backward_pipelining_with_interleaving (schedules.py, get_schedule_table and
    get_pp_rank_microbatches; NVIDIA/Megatron-LM at d98e8a64): micro-batches go in groups of
    ``group`` (microbatch_group_size_per_vp_stage, p by default), each group through chunk 0, then
    chunk 1, ..., the last group holding what is left; virtual step k runs the k-th (micro-batch,
    chunk) of that table forward, and backward on chunk v - 1 - chunk. Stage s warms up with
    2(p-1-s) + (v-1)·group forwards, capped at m·v; when m == p == group every stage warms up with
    all of them, as Megatron-LM did until its tunable schedule (commit 4295be1a6c, Nov 2024)."""
    table = []
    for start in range(0, m, group):
        end = m if start + group >= m else start + group
        table += [(mb, chunk) for chunk in range(v) for mb in range(start, end)]
    total = m * v

    def forward(k: int) -> tuple:
        mb, chunk = table[k]
        return ("F", mb, chunk * p + s)

    def backward(k: int) -> tuple:
        mb, chunk = table[k]
        return ("B", mb, (v - 1 - chunk) * p + s)

    warm = warm_up_forwards(p, m, v, s, group)
    order = [forward(k) for k in range(warm)]
    for k in range(total - warm):
        order += [forward(warm + k), backward(k)]
    return order + [backward(k) for k in range(total - warm, total)]


def _dualpipe(p: int, m: int, r: int) -> list[tuple]:
    """DualPipe (DeepSeek-V3 technical report, Sec. 3.2.1; the order of deepseek-ai/DualPipe's
    ``DualPipe.step``, steps 1-8). Rank r holds model stage r of direction 0 (micro-batches
    0 .. m/2-1 fed at rank 0) and stage p-1-r of direction 1 (m/2 .. m-1 fed at rank p-1). Phase 0
    is the direction fed on the rank's own half. Backward chunks marked zero-bubble leave their
    weight gradient W in a FIFO that later W steps pop; paired steps overlap a forward and a full
    backward chunk of the two directions ("F&B")."""
    half, half_m = p // 2, m // 2
    hr = min(r, p - 1 - r)
    second_half = r >= half
    middle = r in (half - 1, half)
    next_f, next_b = [0, 0], [0, 0]
    weights: list[tuple] = []
    order: list[tuple] = []

    def key(direction: int, k: int) -> tuple[int, int]:
        return (k if direction == 0 else half_m + k), (r if direction == 0 else p - 1 - r)

    def forward(phase: int) -> tuple:
        d = phase ^ second_half
        mb, pos = key(d, next_f[d])
        next_f[d] += 1
        return ("F", mb, pos)

    def backward(phase: int, zero_bubble: bool = False) -> tuple:
        d = phase ^ second_half
        mb, pos = key(d, next_b[d])
        next_b[d] += 1
        if zero_bubble:
            weights.append(("W", mb, pos))
            return ("b", mb, pos)
        return ("B", mb, pos)

    def paired(phase_f: int, phase_b: int) -> tuple:
        f, b = forward(phase_f), backward(phase_b)
        return ("FB", f[1], f[2], b[1], b[2])

    order += [forward(0) for _ in range((half - hr - 1) * 2)]  # 1: nF0
    for _ in range(hr + 1):  # 2: nF0F1
        order += [forward(0), forward(1)]
    for _ in range(half - hr - 1):  # 3: nB1W1F1
        order += [backward(1, True), weights.pop(0), forward(1)]
    for i in range(half_m - p + hr + 1):  # 4: nF0B1F1B0
        order += [forward(0), backward(1)] if (i == 0 and middle) else [paired(0, 1)]
        order.append(paired(1, 0))
    for _ in range(half - hr - 1):  # 5: nB1F1B0
        order += [backward(1), paired(1, 0)]
    zero_bubble = False
    for i in range(hr + 1):  # 6: nB1B0, the second half zero-bubble
        if i == (hr + 1) // 2 and hr % 2 == 1:
            zero_bubble = True
        order.append(backward(1, zero_bubble))
        if i == (hr + 1) // 2 and hr % 2 == 0:
            zero_bubble = True
        order.append(backward(0, zero_bubble))
    for _ in range(half - hr - 1):  # 7: nWB0
        order += [weights.pop(0), backward(0, True)]
    order += weights  # 8: nW
    return order


def chunk_of(schedule: str, p: int, m: int, position: int, micro_batch: int) -> int:
    """The ``Op.chunk`` of a position: interleaved chunk, DualPipe direction, else 0."""
    if schedule == "dualpipe":
        return int(micro_batch >= m // 2)
    return position // p


def device_of(schedule: str, p: int, m: int, position: int, micro_batch: int) -> int:
    """The stage (device) that runs ``position`` of ``micro_batch``."""
    if schedule == "dualpipe" and micro_batch >= m // 2:
        return p - 1 - position
    return position % p


def simulate_orders(works: Sequence, schedule: str, m: int, v: int, p2p_s: float, overlap_p2p: bool,
                    group: int | None = None) -> list[list[Op]]:
    """Run every stage's order; ``works`` is one StageWork per stage (counts expanded).

    An op's input arrives p2p_s after the producing op on a neighbouring stage ends; without
    overlap the sender also stays blocked for p2p_s after an op whose output leaves the stage."""
    p = len(works)
    depth = p * v
    orders = stage_orders(schedule, p, m, v, group)
    split_dirs = (0, m // 2) if schedule == "dualpipe" else (0,)
    first = {d: d for d in split_dirs}
    last = {d: (split_dirs[i + 1] if i + 1 < len(split_dirs) else m) - 1 for i, d in enumerate(split_dirs)}

    def direction_start(mb: int) -> int:
        return m // 2 if (schedule == "dualpipe" and mb >= m // 2) else 0

    def forward_s(mb: int, pos: int) -> float:
        w = works[pos % p]
        if mb == first[direction_start(mb)] and w.first_forward_s is not None:
            return w.first_forward_s
        return w.forward_s

    def backward_s(kind: str, mb: int, pos: int) -> float:
        w = works[pos % p]
        is_last = mb == last[direction_start(mb)]
        whole = w.backward_s + w.weight_s
        last_whole = w.last_backward_s if w.last_backward_s is not None else whole
        if kind == "B":
            return last_whole if is_last else whole
        if kind == "b":
            return w.backward_s
        return last_whole - w.backward_s if is_last else w.weight_s  # "W"

    def paired_s(mb_f: int, pos_f: int, mb_b: int, pos_b: int) -> float:
        wf, wb = works[pos_f % p], works[pos_b % p]
        pf = wf.paired_s if wf.paired_s is not None else wf.forward_s + wf.backward_s + wf.weight_s
        pb = wb.paired_s if wb.paired_s is not None else wb.forward_s + wb.backward_s + wb.weight_s
        extra_f = forward_s(mb_f, pos_f) - wf.forward_s
        extra_b = backward_s("B", mb_b, pos_b) - (wb.backward_s + wb.weight_s)
        return (pf + pb) / 2 + extra_f + extra_b

    def cross(pos_a: int, pos_b: int, mb: int) -> bool:
        return device_of(schedule, p, m, pos_a, mb) != device_of(schedule, p, m, pos_b, mb)

    done: dict[tuple, float] = {}  # ("F" | "B", mb, pos) -> end time (input gradient for "B")

    def ready(kind: str, mb: int, pos: int) -> float | None:
        """When the input of this op has arrived, or None if its producer has not run yet."""
        if kind == "F":
            if pos == 0:
                return 0.0
            src = ("F", mb, pos - 1)
        elif kind == "W":
            return done.get(("B", mb, pos))
        else:
            src = ("F", mb, pos) if pos == depth - 1 else ("B", mb, pos + 1)
        end = done.get(src)
        if end is None or src[2] == pos:
            return end
        return end + (p2p_s if cross(src[2], pos, mb) else 0.0)

    def sends(kind: str, mb: int, pos: int) -> bool:
        if kind == "F":
            return pos < depth - 1 and cross(pos, pos + 1, mb)
        if kind in ("B", "b"):
            return pos > 0 and cross(pos, pos - 1, mb)
        return False

    timeline: list[list[Op]] = [[] for _ in range(p)]
    free = [float(w.release_s) for w in works]
    cursor = [0] * p
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            while cursor[s] < len(orders[s]):
                key = orders[s][cursor[s]]
                if key[0] == "FB":
                    _, mb_f, pos_f, mb_b, pos_b = key
                    inputs = (ready("F", mb_f, pos_f), ready("B", mb_b, pos_b))
                    if None in inputs:
                        break
                    duration = paired_s(mb_f, pos_f, mb_b, pos_b)
                    blocks = sends("F", mb_f, pos_f) or sends("B", mb_b, pos_b)
                    start = max(free[s], *inputs)
                    done[("F", mb_f, pos_f)] = done[("B", mb_b, pos_b)] = start + duration
                    op = Op("FB", mb_f, chunk_of(schedule, p, m, pos_f, mb_f), start, start + duration, mb_b)
                else:
                    kind, mb, pos = key
                    arrival = ready(kind, mb, pos)
                    if arrival is None:
                        break
                    duration = forward_s(mb, pos) if kind == "F" else backward_s(kind, mb, pos)
                    blocks = sends(kind, mb, pos)
                    start = max(free[s], arrival)
                    if kind != "W":
                        done[("F" if kind == "F" else "B", mb, pos)] = start + duration
                    op = Op("B" if kind == "b" else kind, mb, chunk_of(schedule, p, m, pos, mb), start, start + duration)
                timeline[s].append(op)
                free[s] = op.end_s + (p2p_s if blocks and not overlap_p2p else 0.0)
                cursor[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # cannot happen for the orders above; a guard against a bad edit
            raise RuntimeError(f"{schedule} schedule deadlocked (p={p}, m={m}, v={v})")
    return timeline
