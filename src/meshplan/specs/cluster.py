"""A cluster: one device kind and a hierarchy of network levels, innermost first."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from meshplan.errors import MeshplanError
from meshplan.specs.base import BytesPerS, Count, Fraction, JoulesPerBit, Seconds, Spec
from meshplan.specs.device import Device

Topology = Literal["switch", "ring", "fully-connected", "torus-2d", "torus-3d", "dragonfly", "fat-tree"]


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

    @property
    def effective_bytes_per_s(self) -> float:
        return self.bytes_per_s * self.efficiency


class Cluster(Spec):
    id: str
    name: str
    device: Device
    levels: tuple[NetworkLevel, ...] = Field(min_length=1)
    max_devices: Count | None = None
    # devices per host (a GB200 NVL72 compute tray holds 4); None: the scale-up domain is the node
    node_devices: Count | None = None
    sources: dict[str, str] = {}

    @model_validator(mode="after")
    def _levels_nest(self) -> "Cluster":
        sizes = [lvl.size for lvl in self.levels]
        for inner, outer in zip(sizes, sizes[1:]):
            if inner is None:
                raise ValueError("only the outermost network level may leave size unset")
            if outer is not None and (outer <= inner or outer % inner):
                raise ValueError(f"level sizes must grow by whole multiples, got {sizes}")
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
