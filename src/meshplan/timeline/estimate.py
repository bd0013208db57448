"""The result of one estimate: a frozen value with the full breakdown."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from meshplan.parallel.memory import MemoryBreakdown
from meshplan.units import format_bytes, format_devices, format_seconds


@dataclass(frozen=True)
class StepBreakdown:
    """Where the step time of the critical device goes. The fields sum to the step time."""

    compute_s: float
    recompute_s: float  # part of compute_s spent re-running forward
    exposed_comm_s: dict[str, float]  # per axis: tp, cp, pp, dp
    bubble_s: float
    optimizer_s: float

    @property
    def total_s(self) -> float:
        return self.compute_s + sum(self.exposed_comm_s.values()) + self.bubble_s + self.optimizer_s


@dataclass(frozen=True)
class RoleEstimate:
    name: str
    devices: int
    forward_s: float  # per micro-batch, including blocking communication
    backward_s: float
    memory: MemoryBreakdown


@dataclass(frozen=True)
class Estimate:
    model_id: str
    cluster_id: str
    num_devices: int
    plan: dict
    step_time_s: float
    tokens_per_s: float
    samples_per_s: float
    mfu: float  # model flop (no recompute) / (time x devices x peak)
    hfu: float  # hardware flop (with recompute) / (time x devices x peak)
    model_flop_per_step: float
    hardware_flop_per_step: float
    tflops_per_device: float  # achieved hardware TFLOP/s per device (Megatron's reported metric)
    breakdown: StepBreakdown
    serialized_s: float  # nothing overlapped: every op and collective one after another, plus the bubble
    overlapped_s: float  # the step time (as scheduled, with overlap)
    comm_total_s: dict[str, float]  # all communication per axis, hidden or not
    serialized_by_op_s: dict[str, float]  # MAD Max Fig. 15: compute by op kind (gemm, attention, ...)
    collectives: dict[str, dict[str, float]]  # per collective type: serialized_s, exposed_s, hidden_fraction
    memory: MemoryBreakdown  # the device with the least headroom
    roles: tuple[RoleEstimate, ...]
    fits: bool
    warnings: tuple[str, ...] = field(default=())
    train_tokens: float | None = None
    stage_layers: tuple[int, ...] = ()  # decoder layers per pipeline rank, first rank first
    pipeline_split: str = "even"  # how the layers were split (specs.scenario.pipeline_layout)

    def time_to_train_s(self, tokens: float) -> float:
        return tokens / self.tokens_per_s

    def device_hours(self, tokens: float) -> float:
        return self.time_to_train_s(tokens) * self.num_devices / 3600.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["breakdown"]["total_s"] = self.breakdown.total_s
        out["memory"] = self.memory.as_dict()
        out["memory"]["fits"] = self.memory.fits
        out["roles"] = [{**asdict(r), "memory": r.memory.as_dict()} for r in self.roles]
        if self.train_tokens:
            out["time_to_train_s"] = self.time_to_train_s(self.train_tokens)
            out["device_hours"] = self.device_hours(self.train_tokens)
        return out

    def __repr__(self) -> str:
        b = self.breakdown
        comm = ", ".join(f"{k}={format_seconds(v)}" for k, v in b.exposed_comm_s.items() if v > 0) or "none"
        status = "fits" if self.fits else "DOES NOT FIT"
        return (
            f"Estimate({self.model_id} on {format_devices(self.num_devices, self.cluster_id)}: "
            f"step {format_seconds(self.step_time_s)}, {self.tokens_per_s:,.0f} tokens/s, "
            f"MFU {self.mfu:.1%}, compute {format_seconds(b.compute_s)}, exposed comm [{comm}], "
            f"bubble {format_seconds(b.bubble_s)}, memory {format_bytes(self.memory.total_bytes)} "
            f"of {format_bytes(self.memory.capacity_bytes)} ({status}))"
        )
