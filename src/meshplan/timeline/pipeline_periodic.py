"""Exact makespan of any schedule from a bounded simulation: the steady state is periodic.

Identical micro-batches make the schedule a max-plus linear system whose steady state repeats:
after a transient, adding R micro-batches (a multiple of the schedule's own period: 1 for
1F1B/ZB-H1, p for interleaved 1F1B, 2 for DualPipe) delays everything after the steady part by the
same Δ (max-plus theory: powers of a max-plus matrix become periodic, Baccelli, Cohen, Olsder
and Quadrat, "Synchronization and Linearity", 1992, Ch. 3). We do not assume when: we simulate m1 < m
micro-batches and look for a *certificate*. Cut every stage's op list before the first forward
of micro-batch i (cut C) and of micro-batch i + R (cut C'). If

- both cuts are closed (no op before a cut depends on an op after it),
- the schedule for m1 + R micro-batches is the one for m1 with R micro-batches of steady ops
  inserted at C' (checked op by op on the orders), and
- every op before C' whose result an op after C' needs ends exactly Δ later than its
  counterpart R micro-batches earlier at C,

then the ops after C' of the longer schedule are those after C of the shorter one, Δ later, by
induction over the dependency graph; so every finish time grows by Δ per R micro-batches from
m1 on. Without that (the transient is longer: two stages whose cycles are nearly equally slow)
the same cuts still make the frontier at C' a max-plus linear function of the frontier at C,
and the missing periods are inserted as powers of that small matrix (``_matrix_power_finish``).

Cost: one simulation of m1 micro-batches (two when the period R is longer than the schedule's
own, as with overlapped p2p latency), m1 = 2p (1F1B), 3p (ZB-H1), 4p (interleaved, DualPipe)
micro-batches, where a certificate usually exists already (measured). The dependency graph is
compiled once per (schedule, p, v, m1) and cached; a run evaluates it one dependency depth at a
time with numpy. Without a certificate the matrix powers add two passes over the graph and
log2(m) products of F x F matrices. So the cost grows with p (p² ops, p²·v interleaved), not
with m (beyond log m in the unsettled case).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from meshplan.timeline.pipeline_orders import device_of, stage_orders

KIND_F, KIND_FF, KIND_BW, KIND_BWL, KIND_B, KIND_W, KIND_WL, KIND_PF, KIND_PFF, KIND_PB, KIND_PBL, KIND_NONE = range(12)
KEY_KINDS = ("F", "B", "b", "W", "FB")


def _key(c: "Compiled", i: int) -> tuple:
    """The op key of op i, as ``stage_orders`` spells it."""
    kind, mb, pos, mb_b, pos_b = c.keys[i].tolist()
    if kind == 4:
        return ("FB", mb, pos, mb_b, pos_b)
    return (KEY_KINDS[kind], mb, pos)


@dataclass(frozen=True)
class Compiled:
    """A schedule's dependency graph for one (schedule, p, v, m), without durations."""

    keys: np.ndarray  # (n, 5) op keys: kind code (KEY_KINDS), micro-batch, position, FB's backward micro-batch and position
    stage: np.ndarray  # stage (device) of each op
    position: np.ndarray  # index in its stage's order
    prev: np.ndarray  # previous op on the same stage, -1 for none
    deps: np.ndarray  # (n, 2) data predecessors, -1 for none
    cross: np.ndarray  # (n, 2) the predecessor ran on another stage (its output pays p2p_s)
    sends: np.ndarray  # the op's output leaves its stage
    code: np.ndarray  # (n, 2) duration table rows: the op (or FB's forward half), FB's backward half
    work: np.ndarray  # (n, 2) StageWork stage index of those rows
    last_of_stage: np.ndarray  # index of each stage's last op
    levels: np.ndarray  # ops are numbered by dependency depth; level k is ops levels[k]..levels[k+1]-1
    preds: np.ndarray  # (3, n): prev and the two deps, as ``run`` gathers them


@lru_cache(maxsize=64)  # ~70 bytes per op: interleaved 1F1B at p=64, v=4 (130k ops) is ~9 MB
def compile_schedule(schedule: str, p: int, m: int, v: int, group: int | None = None) -> Compiled:
    """Build the dependency graph once; durations and p2p come per call."""
    orders = stage_orders(schedule, p, m, v, group)
    depth = p * v
    dual = schedule == "dualpipe"

    def first_of(mb: int) -> bool:
        return mb == (m // 2 if dual and mb >= m // 2 else 0)

    def last_of(mb: int) -> bool:
        return mb == (m // 2 - 1 if dual and mb < m // 2 else m - 1)

    def cross(a: int, b: int, mb: int) -> bool:
        return device_of(schedule, p, m, a, mb) != device_of(schedule, p, m, b, mb)

    def forward_input(mb: int, pos: int) -> tuple | None:
        return ("F", mb, pos - 1) if pos > 0 else None

    def backward_input(mb: int, pos: int) -> tuple:
        return ("F", mb, pos) if pos == depth - 1 else ("B", mb, pos + 1)

    produced: dict[tuple, int] = {}
    keys, rows = [], []
    cursor, remaining = [0] * p, sum(len(o) for o in orders)
    last_index = [-1] * p
    while remaining:
        for s in range(p):
            while cursor[s] < len(orders[s]):
                key = orders[s][cursor[s]]
                kind = key[0]
                if kind == "FB":
                    _, mb, pos, mb_b, pos_b = key
                    inputs = [forward_input(mb, pos), backward_input(mb_b, pos_b)]
                    cr = [inputs[0] is not None and cross(pos - 1, pos, mb),
                          pos_b < depth - 1 and cross(pos_b + 1, pos_b, mb_b)]
                    code = [KIND_PFF if first_of(mb) else KIND_PF, KIND_PBL if last_of(mb_b) else KIND_PB]
                    work = [pos % p, pos_b % p]
                    sends = (pos < depth - 1 and cross(pos, pos + 1, mb)) or (pos_b > 0 and cross(pos_b, pos_b - 1, mb_b))
                    outputs = [("F", mb, pos), ("B", mb_b, pos_b)]
                else:
                    _, mb, pos = key
                    if kind == "F":
                        inputs = [forward_input(mb, pos), None]
                        cr = [inputs[0] is not None and cross(pos - 1, pos, mb), False]
                        code = [KIND_FF if first_of(mb) else KIND_F, KIND_NONE]
                        sends = pos < depth - 1 and cross(pos, pos + 1, mb)
                        outputs = [("F", mb, pos)]
                    elif kind == "W":
                        inputs, cr = [("B", mb, pos), None], [False, False]
                        code = [KIND_WL if last_of(mb) else KIND_W, KIND_NONE]
                        sends, outputs = False, []
                    else:
                        inputs = [backward_input(mb, pos), None]
                        cr = [pos < depth - 1 and cross(pos + 1, pos, mb), False]
                        code = [KIND_B if kind == "b" else (KIND_BWL if last_of(mb) else KIND_BW), KIND_NONE]
                        sends = pos > 0 and cross(pos, pos - 1, mb)
                        outputs = [("B", mb, pos)]
                    work = [pos % p, pos % p]
                if any(x is not None and x not in produced for x in inputs):
                    break
                index = len(keys)
                deps = [produced[x] if x is not None else -1 for x in inputs]
                rows.append((s, cursor[s], last_index[s], deps[0], deps[1], cr[0], cr[1], sends, code[0], code[1], work[0], work[1]))
                keys.append(key)
                for out in outputs:
                    produced[out] = index
                last_index[s] = index
                cursor[s] += 1
                remaining -= 1
    a = np.array(rows, dtype=np.int64)
    # number the ops by dependency depth (a topological order in which each depth is one
    # contiguous block of independent ops, evaluated together in ``run``)
    depth_of = [0] * len(rows)
    for i, row in enumerate(rows):
        depth_of[i] = 1 + max((depth_of[j] for j in (row[2], row[3], row[4]) if j >= 0), default=-1)
    order = np.argsort(np.array(depth_of), kind="stable")
    renumber = np.empty(len(order) + 1, dtype=np.int64)
    renumber[order] = np.arange(len(order))
    renumber[-1] = -1
    a = a[order]
    a[:, 2:5] = renumber[a[:, 2:5]]
    bounds = np.flatnonzero(np.diff(np.array(depth_of)[order], prepend=-1, append=-2))
    codes = {k: n for n, k in enumerate(KEY_KINDS)}
    key_rows = np.array([(codes[k[0]], k[1], k[2], *(k[3:] if k[0] == "FB" else (-1, -1))) for k in keys], dtype=np.int32)
    small = a.astype(np.int32)
    return Compiled(keys=key_rows[order], stage=small[:, 0], position=small[:, 1], prev=small[:, 2], deps=small[:, 3:5],
                    cross=a[:, 5:7].astype(bool), sends=a[:, 7].astype(bool), code=small[:, 8:10],
                    work=small[:, 10:12], last_of_stage=renumber[np.array(last_index)], levels=bounds,
                    preds=np.ascontiguousarray(a[:, 2:5].T))


def duration_table(works) -> np.ndarray:
    """Rows KIND_*, columns stages: the duration of each kind of op on each stage."""
    F = np.array([w.forward_s for w in works], dtype=float)
    B = np.array([w.backward_s for w in works], dtype=float)
    W = np.array([w.weight_s for w in works], dtype=float)
    Ff = np.array([F[i] if w.first_forward_s is None else w.first_forward_s for i, w in enumerate(works)])
    BWl = np.array([B[i] + W[i] if w.last_backward_s is None else w.last_backward_s for i, w in enumerate(works)])
    P = np.array([F[i] + B[i] + W[i] if w.paired_s is None else w.paired_s for i, w in enumerate(works)])
    return np.stack([F, Ff, B + W, BWl, B, W, BWl - B, P / 2, P / 2 + Ff - F, P / 2, P / 2 + BWl - B - W, 0 * F])


def run(c: Compiled, table: np.ndarray, p2p_s: float, overlap_p2p: bool, release: np.ndarray | None = None) -> np.ndarray:
    """End time of every op: the longest path, one dependency depth at a time (a Python loop
    over the ops when the depths are too thin to pay for numpy calls). Index -1 is a sentinel
    slot that stays 0.0, so a missing predecessor costs nothing. ``release``: per stage, the
    earliest start of its first op (StageWork.release_s)."""
    n = len(c.prev)
    dur = table[c.code[:, 0], c.work[:, 0]] + table[c.code[:, 1], c.work[:, 1]]
    hold = np.append(c.sends * (0.0 if overlap_p2p else p2p_s), 0.0)[c.prev]  # held after the previous op
    if release is not None:
        first = c.prev < 0
        hold[first] += release[c.stage[first]]
    if n < 12 * (len(c.levels) - 1):
        lat = c.cross * p2p_s
        end = [0.0] * (n + 1)
        for i, (j, h, d0, l0, d1, l1, duration) in enumerate(zip(
                c.prev.tolist(), hold.tolist(), c.deps[:, 0].tolist(), lat[:, 0].tolist(),
                c.deps[:, 1].tolist(), lat[:, 1].tolist(), dur.tolist())):
            end[i] = max(end[j] + h, end[d0] + l0, end[d1] + l1) + duration
        return np.array(end[:-1])
    preds = c.preds
    adds = np.stack([hold, *(c.cross * p2p_s).T])
    end = np.zeros(n + 1)
    bounds = c.levels.tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        ready = end[preds[:, lo:hi]]
        ready += adds[:, lo:hi]
        t = np.maximum(ready[0], ready[1])
        np.maximum(t, ready[2], out=t)
        t += dur[lo:hi]
        end[lo:hi] = t
    return end[:-1]


def _relative(schedule: str, m: int):
    """Key -> key with micro-batches counted within their direction (DualPipe numbers the second
    direction after the first); other schedules keep the key."""
    if schedule != "dualpipe":
        return lambda key: key
    half = m // 2

    def rel(mb: int) -> tuple[int, int]:
        return (1, mb - half) if mb >= half else (0, mb)

    def convert(key: tuple) -> tuple:
        if key[0] == "FB":
            return ("FB", *rel(key[1]), key[2], *rel(key[3]), key[4])
        return (key[0], *rel(key[1]), key[2])

    return convert


def _shift(key: tuple, step: int) -> tuple:
    """A relative key ``step`` micro-batches (per direction) later."""
    if key[0] == "FB":
        return ("FB", key[1], key[2] + step, key[3], key[4], key[5] + step, key[6])
    if len(key) == 4:  # DualPipe: (kind, direction, index, position)
        return (key[0], key[1], key[2] + step, key[3])
    return (key[0], key[1] + step, key[2])


def _forward_index(key: tuple) -> int | None:
    """Index (within its direction) of the micro-batch an F or FB op moves forward."""
    if key[0] == "FB":
        return key[2]
    if key[0] == "F":
        return key[2] if len(key) == 4 else key[1]
    return None


@lru_cache(maxsize=256)
def structure(schedule: str, p: int, v: int, m1: int, step: int,
              group: int | None = None) -> tuple[np.ndarray, ...] | None:
    """(frontier ops at C, their counterparts at C', cut C, cut C') for a cut pair ``step``
    micro-batches apart in the run of m1 micro-batches, or None when no such cut pair is valid
    (see module docstring)."""
    c = compile_schedule(schedule, p, m1, v, group)
    units = 2 if schedule == "dualpipe" else 1
    r = step * units
    rel_a = _relative(schedule, m1)
    long_orders = [[_relative(schedule, m1 + r)(k) for k in o] for o in stage_orders(schedule, p, m1 + r, v, group)]
    orders = [[rel_a(k) for k in o] for o in stage_orders(schedule, p, m1, v, group)]
    per_direction = m1 // units
    unit = _unit(schedule, p, v, group)
    for i in range((per_direction - step) // unit * unit, 0, -unit)[:4]:
        cut_a, cut_b = _cut(orders, i), _cut(orders, i + step)
        if cut_a is None or cut_b is None:
            continue
        front_a, front_b = _frontier(c, cut_a), _frontier(c, cut_b)
        if front_a is None or front_b is None or len(front_a) != len(front_b):
            continue
        rho = cut_b - cut_a
        partner = {(int(c.stage[x]), int(c.position[x] + rho[c.stage[x]])): int(x) for x in front_a}
        xs = [partner.get((int(c.stage[y]), int(c.position[y]))) for y in front_b]
        if any(x is None or _shift(rel_a(_key(c, x)), step) != rel_a(_key(c, y)) for x, y in zip(xs, front_b)):
            continue
        inserted = all(
            long_orders[s][: cut_b[s]] == orders[s][: cut_b[s]]
            and long_orders[s][cut_b[s]:] == [_shift(k, step) for k in orders[s][cut_a[s]:]]
            for s in range(p)
        )
        if inserted:
            return np.array(xs), np.array(front_b), cut_a, cut_b
    return None


def _cut(orders: list, i: int) -> np.ndarray | None:
    """Per stage, the position of the first forward of a micro-batch with index >= i."""
    cut = []
    for order in orders:
        n = next((n for n, key in enumerate(order) if _forward_index(key) is not None and _forward_index(key) >= i), None)
        if n is None:
            return None
        cut.append(n)
    return np.array(cut)


def _frontier(c: Compiled, cut: np.ndarray) -> np.ndarray | None:
    """Indices of ops before the cut whose result an op after it needs; None if the cut is not
    closed (an op before it depends on one after it)."""
    early = c.position < cut[c.stage]
    preds = np.concatenate([c.prev[:, None], c.deps], axis=1)
    valid = preds >= 0
    pred_early = np.where(valid, early[np.maximum(preds, 0)], True)
    if not pred_early[early].all():
        return None
    needed = np.zeros(len(early), dtype=bool)
    needed[preds[~early][valid[~early]]] = True
    return np.flatnonzero(needed & early)


def _unit(schedule: str, p: int, v: int, group: int | None) -> int:
    """Micro-batches per period of the steady pattern, per direction: interleaved 1F1B's group."""
    return (group or p) if (schedule == "1f1b" and v > 1) else 1


def _valid_count(schedule: str, p: int, v: int, m: int, target: int, group: int | None) -> int:
    """The smallest micro-batch count >= m the schedule accepts that ends the way ``target``
    micro-batches do: interleaved 1F1B's last group as long as target's."""
    if schedule == "dualpipe":
        return max(2 * p, m + (m % 2))
    if schedule == "1f1b" and v > 1:
        g = group or p
        tail = target % g
        return max(m - tail + g - 1, 0) // g * g + tail
    return m


def periodic_finish(schedule: str, works, m: int, v: int, p2p_s: float, overlap_p2p: bool,
                    group: int | None = None) -> np.ndarray:
    """Per stage, the end of its last op for m micro-batches, exactly (module docstring)."""
    p = len(works)
    table = duration_table(works)
    release = np.array([float(w.release_s) for w in works]) if any(w.release_s for w in works) else None
    unit = _unit(schedule, p, v, group)  # steady pattern period, per direction
    units = 2 if schedule == "dualpipe" else 1
    # where a certificate usually exists already (measured): 1F1B 2p, ZB-H1 3p, DualPipe 4p
    # micro-batches, interleaved four groups
    start = {"zb-h1": 3 * p + 2, "dualpipe": 4 * p}.get(schedule, 4 * unit if unit > 1 else 2 * p + 2)
    m1 = _valid_count(schedule, p, v, start, m, group)
    while m1 < m and structure(schedule, p, v, m1, unit, group) is None:  # too short for a cut pair
        m1 = _valid_count(schedule, p, v, 2 * m1, m, group)
    c = compile_schedule(schedule, p, min(m1, m), v, group)
    end = run(c, table, p2p_s, overlap_p2p, release)
    if m1 >= m:
        return end[c.last_of_stage]
    scale = 1e-11 * max(1.0, float(end.max()))
    for step in range(unit, max(2 * p, 2 * unit) + 1, unit):
        if step * units * 3 > m1:
            break
        cert = structure(schedule, p, v, m1, step, group)
        if cert is None:
            continue
        gaps = end[cert[1]] - end[cert[0]]
        if np.ptp(gaps) > scale:
            continue
        r = step * units
        m2 = m1 + (m - m1) % r
        if m2 != m1:
            c = compile_schedule(schedule, p, m2, v, group)
            end = run(c, table, p2p_s, overlap_p2p, release)
        return end[c.last_of_stage] + (m - m2) // r * float(gaps.mean())
    return _matrix_power_finish(c, table, p2p_s, overlap_p2p, end, structure(schedule, p, v, m1, unit, group),
                                (m - m1) // (unit * units))


def _matrix_power_finish(c: Compiled, table, p2p_s, overlap_p2p, end, cut_pair, periods: int) -> np.ndarray:
    """The steady state has not settled by m1 (stages with nearly equal cycle times): insert the
    ``periods`` missing steady periods as max-plus matrix powers. The frontier at C' is a max-plus
    linear function of the frontier at C (A, one pass over one period) and the stage finishes of
    the frontier at C' (S, one pass over the rest), so the finishes are S ⊗ A^periods ⊗ y0 with y0
    the frontier at C' of this run: log2(periods) squarings of an F x F matrix, F the frontier size
    (about 2p for 1F1B)."""
    xs, ys, cut_a, cut_b = cut_pair
    early_a = c.position < cut_a[c.stage]
    early_b = c.position < cut_b[c.stage]
    transfer = _transfer(c, table, p2p_s, overlap_p2p, xs, ~early_a & early_b, ys)
    finishes = _transfer(c, table, p2p_s, overlap_p2p, ys, ~early_b, c.last_of_stage)
    y = end[ys]
    while periods:
        if periods & 1:
            y = (transfer + y[None, :]).max(axis=1)
        periods >>= 1
        if periods:
            transfer = (transfer[:, :, None] + transfer[None, :, :]).max(axis=1)
    return (finishes + y[None, :]).max(axis=1)


def _transfer(c: Compiled, table, p2p_s, overlap_p2p, inputs: np.ndarray, region: np.ndarray, outputs: np.ndarray) -> np.ndarray:
    """T[j, i]: the longest path from the end of op inputs[i] to the end of op outputs[j] through
    the ops of ``region`` (-inf if none); every predecessor of a region op is an input or in the
    region (the cuts are closed)."""
    n, k = len(c.prev), len(inputs)
    dur = table[c.code[:, 0], c.work[:, 0]] + table[c.code[:, 1], c.work[:, 1]]
    hold = np.append(c.sends * (0.0 if overlap_p2p else p2p_s), 0.0)[c.prev]
    adds = np.stack([hold, *(c.cross * p2p_s).T])
    ops = np.flatnonzero(region)
    row_of = np.full(n + 1, k + len(ops))  # everything else: the sentinel row, no path
    row_of[inputs] = np.arange(k)
    row_of[ops] = k + np.arange(len(ops))
    values = np.full((k + len(ops) + 1, k), -np.inf)
    values[np.arange(k), np.arange(k)] = 0.0
    depth = np.searchsorted(c.levels, ops, side="right")  # ops are numbered by depth
    for level in np.unique(depth):
        idx = ops[depth == level]
        ready = values[row_of[c.preds[:, idx]]] + adds[:, idx][:, :, None]
        values[row_of[idx]] = ready.max(axis=0) + dur[idx][:, None]
    return values[row_of[outputs]]
