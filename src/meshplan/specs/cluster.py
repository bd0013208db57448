"""A cluster: one device kind and a hierarchy of network levels, innermost first."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from meshplan.errors import MeshplanError
from meshplan.specs.base import Bytes, BytesPerS, Count, Fraction, JoulesPerBit, Seconds, Spec
from meshplan.specs.device import Device

Topology = Literal[
    "switch", "fat-tree", "rail-optimized", "ring", "fully-connected", "torus-2d", "torus-3d", "dragonfly",
]
#: what carries a level's traffic: NCCL's latency model differs between NVLink, PCIe and the
#: network (src/graph/tuning.cc hwLatencies); "ici" is a torus of chip-to-chip links (TPU) with no
#: NCCL protocols, timed by ``latency_s`` per step
Link = Literal["nvlink", "pcie", "network", "ici"]


class NetworkLevel(Spec):
    """One tier of the network (Calculon: bandwidth + latency + efficiency per tier).

    ``size`` is how many devices share this level's domain (8 for an NVLink node, 72 for NVL72);
    the outermost level may leave it unset (it spans the whole cluster).
    ``bytes_per_s`` is per device, per direction. ``rails`` is how many of those per-device links
    inside one domain of the level below a single collective uses at once: NCCL can stripe a ring
    over every NIC of a node, but the measured Megatron-LM and ZeRO-3 runs on DGX A100 (SC21)
    reach about one NIC per collective, so 1 is the default until a measurement says more.
    """

    name: str
    size: Count | None = None
    bytes_per_s: BytesPerS
    latency_s: Seconds
    topology: Topology = "switch"
    efficiency: Fraction = 1.0  # achieved fraction of bytes_per_s for large collectives
    rails: Count = 1  # links of one lower-level domain a single collective drives at once
    energy_per_bit_j: JoulesPerBit = 0.0
    # what carries the traffic; None: NVLink for the innermost level, the network outside it
    link: Link | None = None
    # fat-tree / rail-optimized: leaf down-link bandwidth over up-link bandwidth (2 = 2:1 tapered)
    oversubscription: float = Field(default=1.0, ge=1.0, le=64.0)
    # fat-tree / rail-optimized: domains of the level below under one leaf switch (a rail leaf of a
    # DGX SuperPOD scalable unit joins 32 nodes); traffic between leaves climbs to the spine
    leaf_domains: Count | None = None
    # torus-2d / torus-3d: the torus shape, in domains of the level below (wrap-around links)
    torus_dims: tuple[Count, ...] | None = None
    # dragonfly: domains of the level below in one group (all-to-all local links inside it)
    group_domains: Count | None = None
    # dragonfly: global-link bandwidth per device over its injection bandwidth (Kim et al. 2008
    # balance the network at 1)
    global_taper: Fraction = 1.0
    # the switches reduce in the network: NVLink SHARP (NVLS) on NVSwitch, SHARP on InfiniBand
    in_network_reduction: bool = False
    # achieved in-network all-reduce algorithm bandwidth over ``bytes_per_s``, at NCCL's largest
    # NVLS chunks (a large buffer's)
    reduction_efficiency: Fraction = 1.0
    # the thread blocks NCCL runs NVLS on (transport/nvls.cc NVLS_NCHANNELS_SM90 16, _SM100 32)
    nvls_channels: Count = 16
    # the channels (thread blocks) NCCL runs its ring and tree collectives on at most, as its
    # log's "coll channels" line prints it: 24 on 8-GPU A100 SXM4 and H100 SXM NVSwitch nodes
    coll_channels: Count = 24
    # NCCL's LL protocol bandwidth ceiling (tuning.cc llMaxBws); None: half the link, no ceiling
    ll_bytes_per_s: BytesPerS | None = None
    # a small (LL) collective's measured fixed cost and latency per ring step over this level;
    # None: NCCL's tuning.cc table (baseLatencies, hwLatencies), which is one for every GPU
    ll_call_s: Seconds | None = None
    ll_step_s: Seconds | None = None
    # a collective call's measured fixed cost over this level, every protocol and algorithm, where
    # the library's calls cost more than NCCL's tuning tables say (RCCL); None: NCCL's tables
    call_s: Seconds | None = None

    @model_validator(mode="after")
    def _topology_fields(self) -> "NetworkLevel":
        dims = {"torus-2d": 2, "torus-3d": 3}.get(self.topology)
        if dims is not None and (self.torus_dims is None or len(self.torus_dims) != dims):
            raise MeshplanError("torus_dims", self.torus_dims, f"a {self.topology} level needs {dims} torus dimensions")
        if dims is None and self.torus_dims is not None:
            raise MeshplanError("torus_dims", self.torus_dims,
                                "only torus-2d and torus-3d levels have torus dimensions")
        if self.topology == "dragonfly" and self.group_domains is None:
            raise MeshplanError("group_domains", None, "a dragonfly level needs its group size (domains per group)")
        if self.topology != "dragonfly" and self.group_domains is not None:
            raise MeshplanError("group_domains", self.group_domains, "only dragonfly levels have groups")
        tapered = self.topology in ("fat-tree", "rail-optimized")
        for name in ("oversubscription", "leaf_domains"):
            value = getattr(self, name)
            if not tapered and value not in (None, 1.0):
                raise MeshplanError(name, value, "only fat-tree and rail-optimized levels have leaves that taper")
        if tapered and self.oversubscription > 1.0 and self.leaf_domains is None:
            raise MeshplanError("leaf_domains", None,
                                "an oversubscribed level needs leaf_domains (domains under one leaf)")
        return self

    @property
    def effective_bytes_per_s(self) -> float:
        return self.bytes_per_s * self.efficiency


class Host(Spec):
    """The host side of one node, as optimizer CPU offload uses it (meshplan.costs.offload).

    ``memory_bytes`` and ``memory_bytes_per_s`` are the node's DRAM (all its CPU sockets), shared
    by the node's devices; ``link_bytes_per_s`` is the achievable host<->device copy rate of one
    device, per direction (PCIe, or NVLink-C2C on Grace); the energies are per bit moved.
    ``memory_efficiency`` is the achieved fraction of the DRAM peak in the CPU optimizer's
    streaming loop (1.0: the peak, a lower bound on the CPU step's time).
    """

    memory_bytes: Bytes
    memory_bytes_per_s: BytesPerS
    link_bytes_per_s: BytesPerS
    link: Literal["pcie", "c2c"] = "pcie"
    memory_energy_per_bit_j: JoulesPerBit = 0.0
    link_energy_per_bit_j: JoulesPerBit = 0.0
    memory_efficiency: Fraction = 1.0


class Cluster(Spec):
    id: str
    name: str
    device: Device
    levels: tuple[NetworkLevel, ...] = Field(min_length=1)
    max_devices: Count | None = None
    # devices per host (a GB200 NVL72 compute tray holds 4); None: the scale-up domain is the node
    node_devices: Count | None = None
    # watts a node draws beyond its accelerators (CPUs, DRAM, NICs, switches, fans), with a
    # source; energy counts it only where the task asks (Task.host_w_per_node)
    host_w_per_node: float | None = Field(default=None, ge=0)
    # host DRAM and the host<->device link per node (optimizer offload); None: not described
    host: Host | None = None
    sources: dict[str, str] = {}

    @model_validator(mode="after")
    def _levels_nest(self) -> "Cluster":
        sizes = [lvl.size for lvl in self.levels]
        for index, (inner, outer) in enumerate(zip(sizes, sizes[1:])):
            if inner is None:
                raise MeshplanError(f"levels.{index}.size", None,
                                    "a size: only the outermost network level may leave it unset")
            if outer is not None and (outer <= inner or outer % inner):
                raise MeshplanError(f"levels.{index + 1}.size", outer,
                                    f"a whole multiple of the level below's {inner} devices, larger than it")
        inner = 1
        for index, level in enumerate(self.levels):
            if level.torus_dims is not None and level.size is not None:
                domains = level.size // inner
                if math.prod(level.torus_dims) != domains:
                    raise MeshplanError(f"levels.{index}.torus_dims", level.torus_dims,
                                        f"the torus must hold the level's {domains} domains of the level below")
            inner = level.size or inner
        return self

    def check_devices(self, num_devices: int) -> None:
        """A job of ``num_devices`` must fit the build and its outermost network level."""
        if self.max_devices is not None and num_devices > self.max_devices:
            raise MeshplanError("num_devices", num_devices, f"{self.id} has at most {self.max_devices} devices")
        outer = self.levels[-1]
        if outer.size is not None and num_devices > outer.size:
            raise MeshplanError(
                "num_devices", num_devices,
                f"{self.id}'s outermost network level ({outer.name}) joins {outer.size} devices",
                hint="add a level above it (e.g. the data-center network between pods) with no size",
            )

    @property
    def scale_up_devices(self) -> int:
        """Devices in the innermost (scale-up) domain."""
        return self.levels[0].size or 1

    @property
    def devices_per_node(self) -> int:
        """Devices per host: the scale-up domain unless it spans several hosts (NVL72)."""
        return self.node_devices or self.scale_up_devices
