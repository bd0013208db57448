"""Where a per-layer-kind strategy puts each entry on a cluster (MAD Max Sec. 2.2).

Each strategy entry takes one network level, innermost first; its group is the devices of that
level's domain that differ only in that entry (size = the level's fan-out, stride = the product
of the inner degrees); a single entry spans every device. meshplan.parallel.strategy builds a
DLRM's iteration on these groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshplan.errors import MeshplanError
from meshplan.specs.cluster import Cluster


@dataclass(frozen=True)
class Group:
    """``size`` devices, ``stride`` ranks apart (meshplan.costs.collectives.group_span)."""

    size: int
    stride: int


@dataclass(frozen=True)
class Layout:
    """One layer kind's strategy on this cluster: entries, their degrees and groups."""

    kind: str
    entries: tuple[str, ...]
    degrees: tuple[int, ...]
    groups: tuple[Group, ...]

    def degree(self, name: str) -> int:
        return math.prod(d for e, d in zip(self.entries, self.degrees) if e == name)

    def group(self, name: str) -> Group | None:
        for e, g in zip(self.entries, self.groups):
            if e == name and g.size > 1:
                return g
        return None

    @property
    def replicas(self) -> int:
        """How many ways the batch is split (ddp and fsdp degrees)."""
        return self.degree("ddp") * self.degree("fsdp")


def level_factors(cluster: Cluster, num_devices: int) -> tuple[int, ...]:
    """How many sub-domains each network level joins for ``num_devices`` (zionex, 128: (8, 16))."""
    factors, inner = [], 1
    for level in cluster.levels:
        domain = min(level.size or num_devices, num_devices)
        if domain % inner or (level.size is not None and num_devices > level.size and num_devices % level.size):
            size = level.size or domain
            raise MeshplanError("num_devices", num_devices, f"spans whole {level.name} domains of {size} devices on {cluster.id}; use a multiple of {size}")
        if domain // inner > 1:
            factors.append(domain // inner)
        inner = domain
        if inner >= num_devices:
            break
    return tuple(factors) or (1,)


def layout(kind: str, entries: tuple[str, ...], factors: tuple[int, ...], num_devices: int, label: str) -> Layout:
    """Degrees and groups of a strategy tuple: entry i takes level i, the last all levels beyond."""
    if len(entries) == 1:
        degrees = (num_devices,)
    elif len(entries) > len(factors):
        raise MeshplanError(
            f"strategy.{kind}", label,
            f"{len(entries)} levels, but {num_devices} devices span {len(factors)} network level(s) {factors}; "
            "give one entry per level, innermost first",
        )
    else:
        head = factors[: len(entries) - 1]
        degrees = (*head, num_devices // math.prod(head))
    groups, stride = [], 1
    for d in degrees:
        groups.append(Group(d, stride))
        stride *= d
    return Layout(kind, entries, degrees, tuple(groups))
