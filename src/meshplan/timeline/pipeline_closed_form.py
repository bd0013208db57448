"""Exact closed forms of the makespan: GPipe, and 1F1B when p2p latency does not overlap compute.

The makespan is the longest path through the schedule's dependency graph (ops are nodes weighted
by their durations; an op waits for the previous op on its stage and for its input). Arrays here
are per stage, already "effective": without overlap_p2p a sending op also holds its stage for
p2p_s, which is the same as a longer op whose output arrives when it ends, so ``delta`` (the
latency that does not hold the sender) is p2p_s with overlap and 0 without.

GPipe (Huang et al. 2019): all forwards, then all backwards. The longest path to stage t's last
backward descends the forward "flow shop" to some turn stage s >= t (identical micro-batches: it
rides one stage for all m micro-batches, that stage being the slowest on its way), turns to s's
first backward and climbs the backward flow shop to t.

1F1B (Narayanan et al. SC21, Sec. 2.2.1) with ``delta = 0``: stage s runs its op of iteration x
(F_x, then the backward of micro-batch x - w_s, w_s = p-1-s). A path leaves the forward-only
warm-up at some stage a (where its first 1F1B iteration starts, layer w_a), walks through the
steady iterations and enters the backward-only cool-down at some stage b (layer m-1). In the
steady part every layer the path advances is either one iteration spent on a stage s (worth
c_s = F_s + B_s) or one step up the backward chain (worth c_s too once paired with the step down
it needs), so the best walk spends all free layers on the slowest stage it can reach (k) and
the makespan is max over (a, b, k) of warm-up + steady walk + cool-down, each in closed form.
Stages with w_s >= m never leave warm-up (all forwards, then all backwards) and add GPipe-like
paths. With overlapped latency (delta > 0) a walk down and up collects 2·delta per stage and the
best walk is a small knapsack; that case goes to ``pipeline_periodic``.

Cost: O(p²) numpy work on p-vectors (p <= 64 in practice), independent of the micro-batch count.
"""

from __future__ import annotations

import numpy as np

NEG = -np.inf


def _range_max(x: np.ndarray) -> np.ndarray:
    """M[i, j] = max(x[i..j]) for j >= i (0 below the diagonal, where callers mask it out)."""
    p = len(x)
    i, j = np.indices((p, p))
    return np.maximum.accumulate(np.where(j >= i, x[None, :], 0.0), axis=1)


def _prefix(x: np.ndarray) -> np.ndarray:
    """P[k] = x[0] + ... + x[k-1] (length p + 1)."""
    return np.concatenate(([0.0], np.cumsum(x)))


def forward_stair(F: np.ndarray, first: np.ndarray, m: int, hops: np.ndarray, delta: float) -> np.ndarray:
    """Longest forward-only path from the first op to micro-batch ``hops[s]`` on stage s (a flow
    shop: every step either goes to the next stage or the next micro-batch). Micro-batch 0's ops
    take ``first``; the path leaves micro-batch 0 at stage j and spends its other forward steps on
    the slowest stage of [j, s]."""
    p = len(F)
    PF, Pf = _prefix(F), _prefix(first)
    MF = _range_max(F)
    j, s = np.indices((p, p))
    leave = Pf[j + 1] + (PF[s + 1] - PF[j + 1]) + F[j] + (hops[None, :] - 1) * MF
    leave = np.where(j <= s, leave, NEG).max(axis=0)
    stay = Pf[1:]  # hops == 0: all on micro-batch 0
    return np.where(hops >= 1, leave, stay) + np.arange(p) * delta


def backward_stair(B: np.ndarray, last: np.ndarray, start: np.ndarray, hops: np.ndarray, t: int, delta: float) -> np.ndarray:
    """For each stage s >= t: the longest backward-only path from ``start[s]`` (the value of its
    first node, on stage s) up to stage t's last backward, taking ``hops[s]`` micro-batch steps;
    the last micro-batch's ops take ``last``. -inf for s < t."""
    p = len(B)
    PB, Pl = _prefix(B), _prefix(last)
    MB = _range_max(B)
    j, s = np.indices((p, p))
    climb = (PB[s] - PB[j]) + (Pl[j] - Pl[t]) + last[j] + (hops[None, :] - 1) * MB
    climb = np.where((j >= t) & (j <= s), climb, NEG).max(axis=0)
    direct = Pl[np.arange(p)] - Pl[t]  # hops == 0: start is already the last micro-batch
    value = start + np.where(hops >= 1, climb, direct) + (np.arange(p) - t) * delta
    return np.where(np.arange(p) >= t, value, NEG)


def gpipe_finish(F, first, B, last, m: int, delta: float, ends: list[int]) -> list[float]:
    """GPipe: end of stage t's last backward for each t in ``ends``."""
    p = len(F)
    down = forward_stair(F, first, m, np.full(p, m - 1), delta)
    start = np.where(m == 1, last, B)
    return [float((down + backward_stair(B, last, start, np.full(p, m - 1), t, delta)).max()) for t in ends]


def one_f_one_b_finish(F, first, B, last, m: int, ends: list[int]) -> list[float]:
    """1F1B with no overlapped latency (delta = 0): end of stage t's last backward, t in ``ends``."""
    p = len(F)
    s_idx = np.arange(p)
    warm = p - 1 - s_idx  # w_s: warm-up forwards of stage s
    c = F + B
    finish = np.full(len(ends), NEG)

    # stages that never reach a 1F1B iteration (w_s >= m): GPipe-like turn
    turn = warm >= m
    if turn.any():
        down = np.where(turn, forward_stair(F, first, m, np.full(p, m - 1), 0.0), NEG)
        start = np.where(m == 1, last, B)
        for n, t in enumerate(ends):
            up = backward_stair(B, last, start, np.full(p, m - 1), t, 0.0)
            finish[n] = max(finish[n], (down + up).max())

    steady = warm <= m - 1  # stages whose F(w_s) exists: warm-up can end there
    if steady.any():
        # warm-up: first op .. F(a, w_a), forward flow shop with w_a micro-batch steps
        wu = np.where(steady, forward_stair(F, first, m, warm, 0.0), NEG)
        x = _steady_walk(F, B, last, c, m, wu, steady)
        for n, t in enumerate(ends):
            # cool-down: after B(b, m-1) .. stage t's last op; w_b micro-batch steps upward
            cd = backward_stair(B, last, np.zeros(p), warm, t, 0.0)
            finish[n] = max(finish[n], (x + np.where(steady, cd, NEG)).max())
    return [float(v) for v in finish]


def _steady_walk(F, B, last, c, m: int, wu: np.ndarray, steady: np.ndarray) -> np.ndarray:
    """X[b] = max over entry stages a of warm-up(a) + the best steady walk from F(a, w_a)
    (excluded) to B(b, m-1) (included), with delta = 0."""
    p = len(F)
    a, b = np.indices((p, p))
    n_layers = m - p + a  # m - 1 - w_a layers from the entry to the exit layer
    forced = np.maximum(a - b, 0)  # upward steps the exit needs, one layer each
    spare = n_layers - forced
    PF, PB, Pc = _prefix(F), _prefix(B), _prefix(c)
    down = PF[np.maximum(a, b) + 1] - PF[a + 1]  # forwards of stages a+1..b (a < b)
    up = PB[a + 1] - PB[np.minimum(a, b) + 1]  # backwards of stages b+1..a (a > b)
    exit_node = np.where(b == p - 1, last[b], B[b])
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    best = spare * _range_max(c)[lo, hi]  # free layers on the slowest stage of the transit
    # or go below hi to stage k (one layer per stage k, k-1, .., hi+1 for the step back up);
    # the best such k is a prefix maximum of c below hi: hi + 1 or the first stage of a run
    starts = [k for k in range(1, p) if c[k] != c[k - 1]]
    for k in [None, *starts]:
        kk = hi + 1 if k is None else np.full_like(hi, k)
        ok = (kk > hi) & (kk < p)
        kk = np.minimum(kk, p - 1)
        value = (Pc[kk + 1] - Pc[hi + 1]) + (spare - (kk - hi)) * c[kk]
        best = np.where(ok & (spare - (kk - hi) >= 0), np.maximum(best, value), best)
    # or above lo to stage k (needs at least one layer there to turn back down)
    ends_ = [k for k in range(p - 1) if c[k] != c[k + 1]]
    for k in [None, *ends_]:
        kk = lo - 1 if k is None else np.full_like(lo, k)
        ok = (kk < lo) & (kk >= 0)
        kk = np.maximum(kk, 0)
        value = (Pc[lo + 1] - Pc[kk + 1]) + (spare - (lo - kk)) * c[kk]
        best = np.where(ok & (spare - (lo - kk) >= 1), np.maximum(best, value), best)
    walk = exit_node + down + up + best
    valid = (spare >= 0) & steady[a] & steady[b]
    return np.where(valid, wu[:, None] + walk, NEG).max(axis=0)
