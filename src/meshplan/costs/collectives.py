"""Collective communication time: the entry the rest of meshplan uses, delegating to ``network/``.

``group_span`` places a group in the network (``network.span``); ``collective_s`` times one
collective with the fastest algorithm x NCCL protocol for its size and span, as NCCL's tuner
picks it (``network.tuner``), or with a forced algorithm. The formulas and their sources are in
``network.algorithms`` (ring: Patarasuk & Yuan 2009; tree, NVLS, CollNet: NCCL's
``src/graph/tuning.cc``; halving-doubling: Thakur et al. 2005; torus bucket: Jouppi et al. 2023)
and ``network.topology`` (fat trees, rails, rings, tori, dragonflies, bisection bounds).
"""

from __future__ import annotations

from typing import Literal

from meshplan.network.span import GroupSpan, LevelHop, group_span
from meshplan.network.tuner import collective_time_s

CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
Algorithm = Literal["auto", "ring", "tree", "hierarchical", "halving_doubling", "bucket", "nvls", "nvls_tree",
                    "collnet", "direct"]
Protocol = Literal["auto", "LL", "LL128", "Simple"]

__all__ = ["Algorithm", "CollectiveKind", "GroupSpan", "LevelHop", "Protocol", "bytes_sent_per_device",
           "collective_s", "group_span"]


def collective_s(kind: CollectiveKind, bytes_: float, span: GroupSpan, algorithm: Algorithm = "auto",
                 protocol: Protocol = "auto") -> float:
    """Time of one collective of ``bytes_`` over ``span``.

    ``bytes_`` is the full buffer for all-reduce, all-gather (the gathered result) and
    reduce-scatter (the input); the per-device send buffer for all-to-all; the message for
    send/recv (``span`` then holds the one level the two peers are joined by).
    """
    return collective_time_s(kind, bytes_, span, algorithm, protocol)


def bytes_sent_per_device(kind: CollectiveKind, bytes_: float, n: int) -> float:
    """Bytes each device sends in a bandwidth-optimal collective (for energy and for tests)."""
    if n <= 1:
        return 0.0
    factor = {"all_reduce": 2.0 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "all_to_all": (n - 1) / n, "send_recv": 1.0}[kind]
    return factor * bytes_
