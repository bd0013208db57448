"""Memory per device: weights, gradients, optimizer states, activations, buffers.

- Mixed-precision Adam: 16-bit weights, fp32 master weights, momentum and variance (12 bytes per
  parameter), gradients in the reduce precision (Rajbhandari et al. 2020, "ZeRO", Sec. 3.1).
- ZeRO stage 1 shards the optimizer states over dp, stage 2 also the gradients, stage 3 (FSDP
  full shard) also the weights (ZeRO, Sec. 5).
- Activations: the tensors each op saves (meshplan.workloads.transformer, Korthikanti et al. 2022)
  times the micro-batches in flight: 1F1B keeps up to pp micro-batches on the first stage,
  interleaving adds a factor 1 + (pp-1)/(pp·v) (Korthikanti et al. 2022, Sec. 4.2.3); GPipe keeps
  all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from meshplan.specs.device import BYTES_PER_ELEMENT


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device, by category. ``total_bytes`` is their sum."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    gathered_weights_bytes: float  # ZeRO-3 / FSDP: layers gathered ahead of use
    comm_buffers_bytes: float
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self) if f.name != "capacity_bytes")

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.total_bytes

    def as_dict(self) -> dict[str, float]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["total_bytes"] = self.total_bytes
        return out


def state_bytes_per_param(precision: str, grad_precision: str) -> tuple[float, float, float]:
    """(weight, gradient, optimizer) bytes per parameter for Adam.

    fp32 training keeps fp32 weights and two fp32 moments (8 bytes); mixed precision keeps 16-bit
    weights plus an fp32 master copy and two moments (12 bytes). fp8/fp4 training keeps 16-bit
    weights (the low-precision copies are transient).
    """
    if precision == "fp32":
        return 4.0, 4.0, 8.0
    return 2.0, BYTES_PER_ELEMENT[grad_precision], 12.0


def activations_in_flight(schedule: str, pp: int, virtual: int, micro_batches: int, stage: int) -> float:
    """How many micro-batches' activations stage ``stage`` (0 = first) holds at its peak."""
    if schedule == "gpipe":
        return float(micro_batches)
    in_flight = min(micro_batches, pp - stage)
    if virtual > 1:
        return min(float(micro_batches), in_flight * (1.0 + (pp - 1) / (pp * virtual)))
    return float(in_flight)
