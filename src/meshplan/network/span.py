"""Where a group of devices sits in the network: the levels it spans, innermost first.

A group of ``n`` devices whose ranks are ``stride`` apart spans the network levels from the
innermost outwards. At each level ``i`` it has ``k_i`` members per domain of the level below, and
``c_(i-1)`` members inside each such sub-domain, each with its own link; a collective crosses a
level-``i`` boundary over min(c_(i-1), rails) of them in parallel (NCCL stripes ring channels
over NICs; ``NetworkLevel.rails`` says how many a collective achieves).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.network.topology import Fabric, fabric
from meshplan.specs.cluster import Cluster


@dataclass(frozen=True)
class LevelHop:
    """The part of a group at one network level."""

    level: int
    members: int  # k_i: how many sub-domains (or devices at level 0) the group joins at this level
    inside: int  # c_(i-1): group members inside one sub-domain
    parallel_links: int  # links into the level used at once: min(c_(i-1), rails)
    bytes_per_s: float  # achieved per-device, per-direction bandwidth of the level
    latency_s: float
    fabric: Fabric = Fabric("switch", "network")
    line_bytes_per_s: float = 0.0  # the level's line rate (bytes_per_s before efficiency)
    gap: int = 1  # sub-domains between consecutive members (a strided group spreads over members x gap)


@dataclass(frozen=True)
class GroupSpan:
    size: int
    hops: tuple[LevelHop, ...]  # only levels with members > 1
    _hash: int = field(default=0, compare=False, repr=False)

    def __post_init__(self) -> None:
        # spans key the collective-time cache: hash once, not on every look-up
        object.__setattr__(self, "_hash", hash((self.size, self.hops)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(h.level for h in self.hops)


def group_span(cluster: Cluster, size: int, stride: int) -> GroupSpan:
    """Where a group of ``size`` devices, ``stride`` ranks apart, sits in the network."""
    hops = []
    inside = 1  # c_(i-1): members of the group inside one domain of the previous level
    inner_size = 1  # devices in one domain of the previous level
    for index, level in enumerate(cluster.levels):
        if level.size is None:
            within = size
        else:
            within = min(size, max(1, level.size // stride))
        members = within // inside
        if members > 1:
            links = min(inside, level.rails)
            hops.append(LevelHop(index, members, inside, links, level.effective_bytes_per_s, level.latency_s,
                                 fabric(level, index), level.bytes_per_s, max(1, stride // inner_size)))
        inside = within
        inner_size = level.size or inner_size
        if inside >= size:
            break
    return GroupSpan(size, tuple(hops))


def capped_rails(cluster: Cluster, rails: int | None) -> Cluster:
    """``cluster`` with no level driving more than ``rails`` links of a domain at once
    (``Plan.network_rails``: a framework or NCCL setting that reaches fewer NICs than the node has)."""
    if rails is None or all(level.rails <= rails for level in cluster.levels):
        return cluster
    levels = tuple(level.model_copy(update={"rails": min(level.rails, rails)}) for level in cluster.levels)
    return cluster.model_copy(update={"levels": levels})
