"""A measured device profile (``meshplan calibrate``'s profile.yaml) and how it replaces the
catalog's: the device's efficiency profile, and each measured network level's achieved
bandwidth and latency."""

from __future__ import annotations

import json
from typing import Any

from meshplan.specs.base import BytesPerS, Count, Natural, Seconds, Spec
from meshplan.specs.cluster import Cluster
from meshplan.specs.device import Efficiency

#: a Device.efficiency that holds its profile inline (JSON) instead of naming a catalog entry:
#: the value travels with the Cluster to search workers and into a --store job's identity
INLINE_PROFILE = "profile:"


class MeasuredLevel(Spec):
    """Collectives measured over one network level: bus bandwidth (nccl-tests' busbw) and the
    latency of one ring step (calibrate/fit.py)."""

    level: Natural  # index into Cluster.levels, innermost first
    ranks: Count
    nodes: Count
    bus_bytes_per_s: BytesPerS
    latency_s: Seconds
    source: str


class Profile(Spec):
    """``efficiency`` is one entry of catalog/efficiency.yaml; ``device`` the catalog device it
    was fitted for; ``fit`` the fit's diagnostics (kept for people, not read)."""

    device: str | None = None
    efficiency: Efficiency
    network: tuple[MeasuredLevel, ...] = ()
    fit: dict[str, Any] = {}

    def apply(self, cluster: Cluster) -> Cluster:
        """``cluster`` with this profile's efficiency on its device and, for each measured level it
        has, efficiency = measured bus bandwidth / the level's bandwidth (at most 1) and the
        measured latency. What calibrate does not measure, the device's own profile keeps
        (with_unmeasured)."""
        efficiency = with_unmeasured(self.efficiency, cluster.device.efficiency)
        device = cluster.device.model_copy(update={"efficiency": inline(efficiency)})
        levels = list(cluster.levels)
        for measured in self.network:
            if measured.level < len(levels):
                level = levels[measured.level]
                levels[measured.level] = level.model_copy(update={
                    "efficiency": min(1.0, measured.bus_bytes_per_s / level.bytes_per_s),
                    "latency_s": measured.latency_s,
                })
        return cluster.model_copy(update={"device": device, "levels": tuple(levels)})


def with_unmeasured(measured: Efficiency, profile_id: str) -> Efficiency:
    """``measured`` with what a calibration leaves out taken from the device's profile
    ``profile_id``: the other flash-attention generations' published speeds (attention_kernels)
    and the unaligned GEMMs' fractions (kernels.unaligned_gemm), both fractions of what the
    measured kernels run at."""
    from meshplan import catalog

    base = catalog.efficiency(profile_id)
    update: dict[str, Any] = {}
    if not measured.attention_kernels and base.attention_kernels:
        update["attention_kernels"] = base.attention_kernels
    if (measured.kernels is not None and measured.kernels.unaligned_gemm is None and base.kernels is not None
            and base.kernels.unaligned_gemm is not None):
        update["kernels"] = measured.kernels.model_copy(update={"unaligned_gemm": base.kernels.unaligned_gemm})
    return measured.model_copy(update=update) if update else measured


def inline(efficiency: Efficiency) -> str:
    return INLINE_PROFILE + json.dumps(efficiency.model_dump(mode="json"), sort_keys=True)
