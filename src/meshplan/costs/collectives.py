"""Collective communication time: latency + size / bandwidth over the levels a group spans.

A group of ``n`` devices whose ranks are ``stride`` apart spans the network levels from the
innermost outwards. At each level ``i`` it has ``k_i`` members per domain of the level below, and
``c_(i-1)`` members inside each such sub-domain, each with its own link; a collective crosses a
level-``i`` boundary over min(c_(i-1), rails) of them in parallel (NCCL stripes ring channels
over NICs; ``NetworkLevel.rails`` says how many a collective achieves).

Formulas (Thakur et al. 2005, "Optimization of Collective Communication Operations in MPICH";
Patarasuk & Yuan 2009 for the bandwidth-optimal ring; NCCL's docs for bus bandwidth):
- ring all-reduce: each device sends and receives 2(n-1)/n of the buffer;
- all-gather and reduce-scatter: (n-1)/n of the (full) buffer;
- all-to-all: (n-1)/n of the per-device send buffer, each device over its own link;
- hierarchical all-reduce: reduce-scatter inside, all-reduce across, all-gather inside, the levels
  one after another;
- tree (double binary tree) all-reduce: 2 x buffer / bandwidth, 2·log2(n) latency steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from meshplan.specs.cluster import Cluster

CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
Algorithm = Literal["auto", "ring", "tree", "hierarchical"]


@dataclass(frozen=True)
class LevelHop:
    """The part of a group at one network level."""

    level: int
    members: int  # k_i: how many sub-domains (or devices at level 0) the group joins at this level
    inside: int  # c_(i-1): group members inside one sub-domain
    parallel_links: int  # links into the level used at once: min(c_(i-1), rails)
    bytes_per_s: float  # achieved per-device, per-direction bandwidth of the level
    latency_s: float


@dataclass(frozen=True)
class GroupSpan:
    size: int
    hops: tuple[LevelHop, ...]  # only levels with members > 1

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(h.level for h in self.hops)


def group_span(cluster: Cluster, size: int, stride: int) -> GroupSpan:
    """Where a group of ``size`` devices, ``stride`` ranks apart, sits in the network."""
    hops = []
    inside = 1  # c_(i-1): members of the group inside one domain of the previous level
    for index, level in enumerate(cluster.levels):
        if level.size is None:
            within = size
        else:
            within = min(size, max(1, level.size // stride))
        members = within // inside
        if members > 1:
            links = min(inside, level.rails)
            hops.append(LevelHop(index, members, inside, links, level.effective_bytes_per_s, level.latency_s))
        inside = within
        if inside >= size:
            break
    return GroupSpan(size, tuple(hops))


def _ring_s(span: GroupSpan, bytes_: float, passes: float) -> float:
    """``passes`` x (n-1)/n of the buffer through the slowest boundary, plus per-step latency."""
    n = span.size
    volume = passes * (n - 1) / n * bytes_
    bandwidth = min(h.bytes_per_s * h.parallel_links for h in span.hops)
    latency = max(h.latency_s for h in span.hops)
    return volume / bandwidth + passes * (n - 1) * latency


def _hierarchical_s(span: GroupSpan, bytes_: float, passes: float) -> float:
    """The levels one after another; each level works on its share of the buffer."""
    total = 0.0
    for hop in span.hops:
        k = hop.members
        # each of the c_(i-1) members works on 1/c_(i-1) of the buffer, over the links it shares
        total += passes * (k - 1) / k * bytes_ / (hop.parallel_links * hop.bytes_per_s) + passes * (k - 1) * hop.latency_s
    return total


def _tree_s(span: GroupSpan, bytes_: float) -> float:
    bandwidth = min(h.bytes_per_s * h.parallel_links for h in span.hops)
    latency = max(h.latency_s for h in span.hops)
    return 2.0 * bytes_ / bandwidth + 2.0 * math.log2(span.size) * latency


def collective_s(kind: CollectiveKind, bytes_: float, span: GroupSpan, algorithm: Algorithm = "auto") -> float:
    """Time of one collective of ``bytes_`` over ``span``.

    ``bytes_`` is the full buffer for all-reduce, all-gather (the gathered result) and
    reduce-scatter (the input); the per-device send buffer for all-to-all; the message for
    send/recv (``span`` then holds the one level the two peers are joined by).
    """
    if not span.hops or bytes_ <= 0:
        return 0.0
    if kind == "send_recv":
        hop = span.hops[-1]
        return bytes_ / hop.bytes_per_s + hop.latency_s
    if kind == "all_to_all":
        # each device sends (n-1)/n of its buffer; traffic leaving a level-i sub-domain goes over
        # the device's own level-i link (point-to-point sends: every device drives its own NIC)
        n = span.size
        worst = 0.0
        for hop in span.hops:
            outside = (n - hop.inside) / n
            worst = max(worst, outside * bytes_ / hop.bytes_per_s)
        return worst + (n - 1) * max(h.latency_s for h in span.hops)
    passes = 2.0 if kind == "all_reduce" else 1.0
    ring = _ring_s(span, bytes_, passes)
    hier = _hierarchical_s(span, bytes_, passes)
    if algorithm == "ring":
        return ring
    if algorithm == "hierarchical":
        return hier
    if kind == "all_reduce":
        tree = _tree_s(span, bytes_)
        if algorithm == "tree":
            return tree
        return min(ring, hier, tree)
    return min(ring, hier)


def bytes_sent_per_device(kind: CollectiveKind, bytes_: float, n: int) -> float:
    """Bytes each device sends in a bandwidth-optimal collective (for energy and for tests)."""
    if n <= 1:
        return 0.0
    factor = {"all_reduce": 2.0 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "all_to_all": (n - 1) / n, "send_recv": 1.0}[kind]
    return factor * bytes_
