"""Exact closed forms of the makespan: GPipe, and 1F1B when p2p latency does not overlap compute.

The makespan is the longest path through the schedule's dependency graph (ops are nodes weighted
by their durations; an op waits for the previous op on its stage and for its input). Arrays here
are per stage and "effective": without overlap_p2p a sending op also holds its stage for p2p_s,
the same as a longer op whose output arrives when it ends; ``delta`` is the latency that does not
hold the sender (p2p_s with overlap, else 0).

GPipe (Huang et al. 2019): all forwards, then all backwards. The longest path to stage t's last
backward descends the forward flow shop to a turn stage s >= t (with identical micro-batches it
rides one stage, the slowest on its way, for all m of them), turns to s's first backward and
climbs the backward flow shop to t.

1F1B (Narayanan et al. SC21, Sec. 2.2.1) with delta = 0: stage s runs, in iteration x, F_x and
then the backward of micro-batch x - w_s, w_s = p-1-s warm-up forwards. A path leaves the
forward-only warm-up at stage a (its first 1F1B iteration, x = w_a), walks through the steady
iterations and reaches the backward-only cool-down at stage b (x = m-1). Every iteration the walk
advances is either spent on a stage s (F_s + B_s = c_s) or is one step up the backward chain,
which pairs with a step down and is worth c_s as well, so the best walk spends its free
iterations on the slowest stage k it passes or visits: the makespan is the maximum over (a, b, k)
of warm-up + walk + cool-down, each a closed form below; a detour to k outside [a, b] only pays
when k is a stage where c steps up. Stages with w_s >= m never run a 1F1B iteration (all
forwards, then all backwards) and add GPipe-like paths. With overlapped latency (delta > 0) a
walk down and back up gains 2·delta per stage and the best walk is a small knapsack problem
instead; that case goes to ``pipeline_periodic``.

Cost: a few dozen numpy operations on p x p arrays, independent of the number of micro-batches.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

NEG = -np.inf


@lru_cache(maxsize=64)
def _grids(p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row index, column index, upper-triangle mask (col >= row), stage numbers."""
    i, j = np.indices((p, p))
    return i, j, j >= i, np.arange(p)


def _range_max(*xs: np.ndarray) -> np.ndarray:
    """M[n, i, j] = max(xs[n][i..j]) for j >= i (0 below the diagonal, masked by callers; x >= 0)."""
    p = len(xs[0])
    _, _, upper, _ = _grids(p)
    rows = np.empty((len(xs), 1, p))
    for n, x in enumerate(xs):
        rows[n, 0] = x
    return np.maximum.accumulate(np.where(upper, rows, 0.0), axis=2)


def _prefix(*xs: np.ndarray) -> np.ndarray:
    """Rows P[k] = x[0] + ... + x[k-1] (length p + 1) for each x."""
    out = np.zeros((len(xs), len(xs[0]) + 1))
    for n, x in enumerate(xs):
        out[n, 1:] = x
    return np.cumsum(out, axis=1, out=out)


def forward_stair(F, first, PF, Pf, MF, hops: np.ndarray, delta: float) -> np.ndarray:
    """Longest forward-only path from the first op to micro-batch ``hops[s]`` on each stage s (a
    flow shop; micro-batch 0's ops take ``first``): it leaves micro-batch 0 on a stage j <= s and
    spends its other forward steps on the slowest stage of [j, s] (without a slower first
    forward: all of them on the slowest stage of [0, s])."""
    p = len(F)
    _, _, upper, s = _grids(p)
    if first is F:
        return PF[1:] + hops * MF[0] + s * delta
    leave = (Pf[1:] - PF[1:] + F)[:, None] + PF[None, 1:] + (hops - 1)[None, :] * MF
    leave = np.where(upper, leave, NEG).max(axis=0)
    return np.where(hops >= 1, leave, Pf[1:]) + s * delta


def backward_stairs(B, last, PB, Pl, MB, start: np.ndarray, hops: np.ndarray, delta: float) -> np.ndarray:
    """S[t, s] for s >= t (else -inf): the longest backward-only path from a first node worth
    ``start[s]`` on stage s up to stage t's last backward, ``hops[s]`` micro-batch steps long (the
    last micro-batch's ops take ``last``): its last step to the last micro-batch is on a stage
    j in [t, s] and the others on the slowest stage of [j, s] (without a slower last backward:
    all of them on the slowest stage of [t, s])."""
    p = len(B)
    _, _, upper, s = _grids(p)
    if last is B:
        value = (start + PB[:-1])[None, :] - PB[:-1, None] + hops[None, :] * MB
    else:
        climb = (Pl[:-1] - PB[:-1] + last)[:, None] + PB[None, :-1] + (hops - 1)[None, :] * MB
        climb = np.where(upper, climb, NEG)  # [j, s], j <= s
        best = np.maximum.accumulate(climb[::-1], axis=0)[::-1]  # [t, s]: max over j in [t, s]
        value = np.where(hops >= 1, best, Pl[None, :-1]) - Pl[:-1, None] + start[None, :]
    if delta:
        value = value + (s[None, :] - s[:, None]) * delta
    return np.where(upper, value, NEG)


def gpipe_finish(F, first, B, last, m: int, delta: float, ends: list[int]) -> list[float]:
    """GPipe: end of stage t's last backward for each t in ``ends``."""
    p = len(F)
    PF, Pf, PB, Pl = _prefix(F, first, B, last)
    MF, MB = _range_max(F, B)
    hops = np.full(p, m - 1)
    down = forward_stair(F, first, PF, Pf, MF, hops, delta)
    up = backward_stairs(B, last, PB, Pl, MB, last if m == 1 else B, hops, delta)
    return (up[ends] + down[None, :]).max(axis=1).tolist()


def one_f_one_b_finish(F, first, B, last, m: int, ends: list[int]) -> list[float]:
    """1F1B with no overlapped latency (delta = 0): end of stage t's last backward, t in ``ends``."""
    p = len(F)
    c = F + B
    PF, Pf, PB, Pl, Pc = _prefix(F, first, B, last, c)
    MF, MB, Mc = _range_max(F, B, c)
    _, _, upper, s = _grids(p)
    warm = p - 1 - s  # w_s
    finish = np.full(len(ends), NEG)
    if m <= p - 1:  # stages with w_s >= m never run a 1F1B iteration: all forwards, then all backwards
        turn = warm >= m
        hops = np.full(p, m - 1)
        down = np.where(turn, forward_stair(F, first, PF, Pf, MF, hops, 0.0), NEG)
        up = backward_stairs(B, last, PB, Pl, MB, last if m == 1 else B, hops, 0.0)
        finish = np.maximum(finish, (up[ends] + down[None, :]).max(axis=1))
        if m == 0:
            return finish.tolist()
    # warm-up: first op .. F(a, w_a) (w_a micro-batch steps); cool-down: after B(b, m-1) .. the end
    wu = forward_stair(F, first, PF, Pf, MF, warm, 0.0)
    cd = backward_stairs(B, last, PB, Pl, MB, np.zeros(p), warm, 0.0)[ends]
    # the steady walk from F(a, w_a) (excluded) to B(b, m-1) (included): down through the
    # forwards of a+1..b, or up through the backwards of b+1..a (a-b iterations), and the
    # m-1-w_a-(a-b)^+ = m-p+min(a,b) free iterations (best[min, max])
    exit_node = B.copy()
    exit_node[-1] = last[-1]
    best = _free_iterations(c, Pc, Mc, m)
    descend = (wu - PF[1:])[:, None] + (PF[1:] + exit_node)[None, :] + best  # a <= b
    ascend = (wu + PB[1:])[:, None] + (exit_node - PB[1:])[None, :] + best.T  # a > b
    walk = np.where(upper, descend, ascend)
    if m <= p - 1:  # the walk needs both ends in steady iterations (w <= m - 1)
        steady = warm <= m - 1
        walk = np.where(steady[:, None] & steady[None, :], walk, NEG)
    reach = walk.max(axis=0)  # [b]
    return np.maximum(finish, (reach[None, :] + cd).max(axis=1)).tolist()


def _free_iterations(c, Pc, Mc, m: int) -> np.ndarray:
    """best[lo, hi] (lo <= hi): the most the m-p+lo free iterations of a walk spanning stages
    lo..hi are worth: all on the slowest stage of [lo, hi], or on a slower stage k found by a
    detour down from hi (stepping back up costs one iteration per stage, worth c of the stage
    left) or up from lo (at least one iteration there before turning down). Only a stage where c
    steps up can beat staying inside. -inf where lo > hi or there are too few iterations."""
    p = len(c)
    _, _, upper, s = _grids(p)
    spare = (m - p + s).astype(float)  # by lo
    best = np.where(upper & (spare >= 0)[:, None], spare[:, None] * Mc, NEG)
    steps = np.flatnonzero(c[1:] != c[:-1])  # c changes between stage k and k+1
    if len(steps):
        k = (steps + 1)[:, None]  # below hi: deficit sum_{hi < s <= k} (c_k - c_s), needs k - hi iterations
        deficit = (k - s) * c[k] - (Pc[k + 1] - Pc[s + 1])
        gain = spare[None, :, None] * c[k][:, :, None] - deficit[:, None, :]
        ok = (k[:, :, None] > s[None, None, :]) & (spare[None, :, None] >= (k - s)[:, None, :])
        best = np.maximum(best, np.where(ok & upper, gain, NEG).max(axis=0))
        k = steps[:, None]  # above lo: deficit sum_{k < s <= lo} (c_k - c_s), needs lo - k + 1
        deficit = (s - k) * c[k] - (Pc[s + 1] - Pc[k + 1])
        gain = np.where((k < s) & (spare >= s - k + 1), spare * c[k] - deficit, NEG).max(axis=0)
        best = np.maximum(best, np.where(upper, gain[:, None], NEG))
    return best
