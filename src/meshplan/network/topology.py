"""The topology of one network level, and what it does to a group of devices placed on it.

A level joins ``members`` domains of the level below (devices, or nodes of devices) with
``inside`` group members in each. Its ``bytes_per_s`` is what one device injects per direction;
the topology decides how much of that survives when many devices talk at once:

- **switch**: one non-blocking crossbar (an NVSwitch domain of 8, 72 or 576 GPUs, a single
  InfiniBand switch): full bisection, one switch hop.
- **fat-tree**: leaves of ``leaf_domains`` domains under spines; traffic leaving a leaf shares
  its up-links, ``oversubscription`` times fewer than its down-links (Leiserson 1985; a 2:1
  tapered tree halves cross-spine bandwidth).
- **rail-optimized**: the DGX SuperPOD fabric: GPU ``r`` of every node hangs off leaf ``r`` (its
  rail), so traffic between same-rank GPUs of up to ``leaf_domains`` nodes stays on one leaf and
  NCCL moves the rest onto the right rail over NVLink first (PXN) (NVIDIA DGX SuperPOD reference
  architecture; DFModel, shared/papers/dfmodel.txt, Sec. on DGX topologies).
- **ring**: each device has two neighbours (``bytes_per_s`` split over them); bisection is two
  links.
- **fully-connected**: a direct link to every other domain (``bytes_per_s`` split over them).
- **torus-2d / torus-3d**: ``torus_dims`` with wrap-around; ``bytes_per_s`` is split over the
  2·D links of a device (TPU v4: six ICI links, Jouppi et al. ISCA 2023 Sec. 2). The bisection
  cuts the longest dimension: 2·n/d_max links (Dally & Towles 2004, Ch. 5).
- **dragonfly**: groups of ``group_domains`` domains with local all-to-all links, groups joined
  by global links carrying ``global_taper`` of a device's bandwidth (Kim, Dally, Scott & Abts,
  "Technology-Driven, Highly-Scalable Dragonfly Topology", ISCA 2008: balanced at 1).

Load model: the collectives of a training step run in every group of the same shape at once (the
tensor-parallel groups of every pipeline stage, the data-parallel group of every tensor rank), so
a leaf's or a dragonfly group's up-links are shared by every device under it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshplan.specs.cluster import NetworkLevel


@dataclass(frozen=True)
class Fabric:
    """The topology facts of one level that collective formulas need (plain, hashable values)."""

    kind: str
    link: str  # nvlink, pcie, network or ici: which NCCL latency table applies
    oversubscription: float = 1.0
    leaf_domains: int | None = None
    torus_dims: tuple[int, ...] | None = None
    group_domains: int | None = None
    global_taper: float = 1.0
    in_network_reduction: bool = False
    reduction_efficiency: float = 1.0
    ll_bytes_per_s: float | None = None
    nvls_channels: int = 16
    coll_channels: int = 24
    ll_call_s: float | None = None
    ll_step_s: float | None = None
    call_s: float | None = None


def fabric(level: NetworkLevel, index: int) -> Fabric:
    """``level``'s topology; an unset ``link`` is NVLink for the innermost sized level, else the network."""
    link = level.link or ("nvlink" if index == 0 and level.size is not None else "network")
    return Fabric(level.topology, link, level.oversubscription, level.leaf_domains, level.torus_dims,
                  level.group_domains, level.global_taper, level.in_network_reduction,
                  level.reduction_efficiency, level.ll_bytes_per_s, level.nvls_channels, level.coll_channels, level.ll_call_s, level.ll_step_s,
                  level.call_s)


def torus_group_dims(dims: tuple[int, ...], members: int) -> tuple[int, ...]:
    """The sub-torus a group of ``members`` domains fills: dimensions filled in order (a TPU slice
    is carved as whole rows, then planes). The wrap-around is kept: TPU v4's optical switches close
    every slice into a torus (Jouppi et al. ISCA 2023 Sec. 2.3)."""
    shape = []
    left = members
    for d in dims:
        take = math.gcd(left, d) if left < d else d
        take = min(take, left)
        shape.append(take)
        left //= max(take, 1)
        if left <= 1:
            break
    if left > 1:  # a group larger than the torus (never for a valid span): stretch the last dim
        shape[-1] *= left
    return tuple(s for s in shape if s > 1) or (1,)


def links_per_device(fab: Fabric, members: int) -> int:
    """How many links a device's ``bytes_per_s`` is split over on this level."""
    if fab.kind == "ring":
        return 2
    if fab.kind == "fully-connected":
        return max(members - 1, 1)
    if fab.torus_dims is not None:
        return 2 * len(fab.torus_dims)
    return 1


def hop_count(fab: Fabric, members: int, gap: int = 1) -> float:
    """Mean links a message crosses between two members of a group of ``members`` domains.

    Switch and fully connected: 1 link (through one switch or direct). Fat tree / rail: 2 inside
    a leaf (up, down), 4 through a spine. Ring: n/4 on average (shorter way round). Torus: sum of
    d_i/4 over the group's dimensions. Dragonfly: local-global-local, 3 between groups.
    """
    if fab.kind in ("switch", "fully-connected"):
        return 1.0
    if fab.kind in ("fat-tree", "rail-optimized"):
        return 2.0 if fab.leaf_domains is None or members * gap <= fab.leaf_domains else 4.0
    if fab.kind == "ring":
        return max(members / 4.0, 1.0)
    if fab.torus_dims is not None:
        return max(sum(d / 4.0 for d in torus_group_dims(fab.torus_dims, members)), 1.0)
    if fab.kind == "dragonfly":
        return 1.0 if members * gap <= (fab.group_domains or members) else 3.0
    return 1.0


def members_per_pod(fab: Fabric, members: int, inside: int, gap: int = 1) -> tuple[int, float] | None:
    """(group members under one leaf or dragonfly group, bandwidth fraction of the links out of
    it), or None where the group fits under one (or nothing tapers). A group whose members are
    ``gap`` domains apart spreads over members x gap domains, leaf_domains / gap under each leaf.
    Rail-optimized leaves hold one GPU per node, so only one of a node's ``inside`` members is
    under each."""
    if fab.kind in ("fat-tree", "rail-optimized"):
        pod, taper = fab.leaf_domains, 1.0 / fab.oversubscription
    elif fab.kind == "dragonfly":
        pod, taper = fab.group_domains, fab.global_taper
    else:
        return None
    if pod is None or members * gap <= pod:
        return None
    per_pod = max(1, min(members, pod // gap)) * (1 if fab.kind == "rail-optimized" else inside)
    return per_pod, taper


def ring_edge_factor(fab: Fabric, members: int, inside: int, gap: int = 1) -> float:
    """Bandwidth of a ring edge leaving a leaf (or dragonfly group), over a device's bandwidth.

    A leaf's up-links carry ``taper`` x (devices under it) of bandwidth; the rings crossing them
    number (devices under it) / (group members under it), one per concurrent group; so each gets
    min(1, members_under_leaf x taper) (Leiserson 1985 fat-tree capacity argument)."""
    pod = members_per_pod(fab, members, inside, gap)
    if pod is None:
        return 1.0
    per_pod, taper = pod
    return min(1.0, per_pod * taper)


def bisection_bytes_per_s(fab: Fabric, bytes_per_s: float, devices: int) -> float:
    """Bandwidth across the worst cut into halves of ``devices`` devices on this level, per direction.

    Switch and fully connected: n/2 x b. Fat tree / rail with ratio r: n/2 x b / r. Ring: two links
    (b/2 each). Torus: 2·n/d_max links of b/(2D). Dragonfly: n/2 x b x taper across groups.
    """
    half = devices / 2.0
    if fab.kind in ("switch", "fully-connected"):
        return half * bytes_per_s
    if fab.kind in ("fat-tree", "rail-optimized"):
        return half * bytes_per_s / fab.oversubscription
    if fab.kind == "ring":
        return bytes_per_s  # two links cut, each carrying b/2 per direction
    if fab.torus_dims is not None:
        dims = torus_group_dims(fab.torus_dims, devices)
        links = 2.0 * devices / max(dims)
        return links * bytes_per_s / (2 * len(fab.torus_dims))
    if fab.kind == "dragonfly":
        return half * bytes_per_s * fab.global_taper
    return half * bytes_per_s


def all_to_all_bound_s(fab: Fabric, bytes_: float, bytes_per_s: float, parallel_links: int,
                       members: int, inside: int, n: int, gap: int = 1) -> float:
    """Lower bound on a level's share of an all-to-all of ``bytes_`` per device among ``n`` devices.

    Injection: each device sends (n - inside)/n of its buffer out of its sub-domain over its own
    link. Taper: where the level has leaves or dragonfly groups, the part addressed outside a
    device's leaf/group shares the tapered up-links. Bisection: the k·c group members on this level
    exchange (k·c/2)^2·bytes/n across the level's worst cut, per direction, which holds
    ``bisection_bytes_per_s`` of the k domains (each injecting ``parallel_links`` links) (the
    bisection bound of DFModel, shared/papers/dfmodel.txt; Jouppi et al. ISCA 2023 Sec. 4 for TPU
    v4's torus; Dally & Towles 2004 Ch. 3).
    """
    bound = (n - inside) / n * bytes_ / bytes_per_s
    pod = members_per_pod(fab, members, inside, gap)
    if pod is not None:
        per_pod, taper = pod
        bound = max(bound, (n - per_pod) / n * bytes_ / (bytes_per_s * taper))
    if fab.kind in ("ring", "fully-connected") or fab.torus_dims is not None:
        on_level = members * inside
        crossing = (on_level / 2.0) ** 2 * bytes_ / n
        cut = bisection_bytes_per_s(fab, bytes_per_s * parallel_links, members)
        if fab.kind == "fully-connected":  # (k/2)^2 direct links of b/(k-1) each cross the cut
            cut = (members / 2.0) ** 2 * bytes_per_s * parallel_links / max(members - 1, 1)
        bound = max(bound, crossing / cut)
    return bound
