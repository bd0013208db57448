"""Time of one op on one device: a roofline with an achieved-efficiency model.

COMET (Kumar et al.), Sec. 3.3.1, Eq. (1)-(2): time = flop / min(peak, OI x bandwidth), i.e. the
larger of the compute time and the memory time. Peaks are scaled by the device's efficiency
curves (meshplan.costs.efficiency) and every kernel pays a fixed launch overhead.

A kernel's size for its efficiency curve is max(flop, bytes x ridge), with the ridge point
(flop per byte) of the device family's profile: a kernel that streams a large KV cache or weight
matrix for few flop (decoding) is a big kernel, not a small one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.costs.efficiency import achieved_fraction
from meshplan.specs.device import Device, Efficiency


def gemm_traffic_bytes(u_bytes, v_bytes, w_bytes, buffer_bytes):
    """HBM traffic of a GEMM with inputs of U and V bytes and an output of W bytes.

    COMET Sec. 3.3.2: one operand is tiled to fit the on-chip buffer of S bytes, the other is
    streamed once per tile; traffic = min(ceil(U/S)·V + U, ceil(V/S)·U + V) + W.
    """
    psi1 = np.ceil(u_bytes / buffer_bytes) * v_bytes + u_bytes
    psi2 = np.ceil(v_bytes / buffer_bytes) * u_bytes + v_bytes
    return np.minimum(psi1, psi2) + w_bytes


@dataclass(frozen=True)
class Roofline:
    """What a device achieves, resolved once for a precision."""

    peak_flop_per_s: float
    bytes_per_s: float  # achieved HBM bandwidth
    buffer_bytes: float
    efficiency: Efficiency
    lookup_bytes_per_s: float  # achieved HBM bandwidth of embedding lookups

    @classmethod
    def of(cls, device: Device, efficiency: Efficiency, precision: str) -> "Roofline":
        lookup = efficiency.memory if efficiency.lookup is None else efficiency.lookup
        return cls(
            peak_flop_per_s=device.peak(precision),
            bytes_per_s=device.hbm_bytes_per_s * efficiency.memory,
            buffer_bytes=device.sram_bytes,
            efficiency=efficiency,
            lookup_bytes_per_s=device.hbm_bytes_per_s * lookup,
        )

    def matmul_s(self, m, k, n, element_bytes):
        """One GEMM (m x k)·(k x n): max(compute, memory) + launch overhead."""
        flop = 2.0 * m * k * n
        traffic = gemm_traffic_bytes(m * k * element_bytes, k * n * element_bytes, m * n * element_bytes, self.buffer_bytes)
        compute = flop / (self.peak_flop_per_s * achieved_fraction(self.efficiency.matmul, self._size(flop, traffic)))
        return np.maximum(compute, traffic / self.bytes_per_s) + self.efficiency.kernel_overhead_s

    def _size(self, flop, traffic_bytes):
        """Work in flop-equivalents: max(flop, bytes x the profile's ridge point)."""
        return np.maximum(flop, traffic_bytes * self.efficiency.size_flop_per_byte)

    def attention_s(self, flop, traffic_bytes):
        compute = flop / (self.peak_flop_per_s * achieved_fraction(self.efficiency.attention, self._size(flop, traffic_bytes)))
        return np.maximum(compute, traffic_bytes / self.bytes_per_s) + self.efficiency.kernel_overhead_s

    def memory_s(self, traffic_bytes):
        """A streaming (elementwise, optimizer) kernel."""
        return traffic_bytes / self.bytes_per_s + self.efficiency.kernel_overhead_s

    def lookup_s(self, traffic_bytes):
        """An embedding lookup: lookup bytes / (HBM bandwidth x lookup utilization) (MAD Max
        Sec. 4.2, "Embedding Bags"), plus the launch overhead."""
        return traffic_bytes / self.lookup_bytes_per_s + self.efficiency.kernel_overhead_s
