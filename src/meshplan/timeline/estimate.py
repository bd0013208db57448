"""The result of one estimate: a frozen value with the full breakdown (a training step, or a
DLRM iteration under a per-layer-kind strategy)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from meshplan.costs.energy import EnergyBreakdown
from meshplan.parallel.memory import DLRMMemory, MemoryBreakdown
from meshplan.timeline.engine import Placed
from meshplan.units import format_bytes, format_devices, format_seconds

#: MAD Max Fig. 15's compute kinds and collectives of a DLRM iteration
COMPUTE_KINDS = ("embedding_lookup", "gemm", "other")
COLLECTIVES = ("all_to_all", "all_reduce", "all_gather", "reduce_scatter")


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
    mtp_layers: int = 0  # multi-token-prediction layers, counted in the last rank's stage_layers
    energy: EnergyBreakdown | None = None  # None: the device's profile has no power model

    footprint: dict = field(default_factory=dict)  # costs.footprint: pue, grid (and its source), price or tco
    params: float = 0.0  # the model's parameters (LoRA's adapters included)
    trainable_params: float = 0.0  # of those, what gets gradients and optimizer state (finetuning: fewer)
    # optimizer offload: the optimizer phase's parts (meshplan.costs.offload.OffloadTimes); empty without
    offload_s: dict = field(default_factory=dict)

    def time_to_train_s(self, tokens: float) -> float:
        return tokens / self.tokens_per_s

    def device_hours(self, tokens: float) -> float:
        return self.time_to_train_s(tokens) * self.num_devices / 3600.0

    def energy_to_train_j(self, tokens: float) -> float | None:
        """Facility energy to train ``tokens``: the steps' energy times the PUE."""
        if self.energy is None:
            return None
        steps = self.time_to_train_s(tokens) / self.step_time_s
        return steps * self.energy.total_j * self.footprint.get("pue", 1.0)

    def co2e_to_train_kg(self, tokens: float) -> float | None:
        """Emissions of that energy at the grid's carbon intensity (kg CO2e per kWh)."""
        energy, grid = self.energy_to_train_j(tokens), self.footprint.get("grid_kg_co2e_per_kwh")
        return None if energy is None or grid is None else energy / 3.6e6 * grid

    def cost_breakdown_to_train(self, tokens: float) -> dict[str, float] | None:
        """USD to train ``tokens`` by component. A flat price: ``device_hours`` (device-hours x
        price). The TCO (meshplan.costs.tco): each capital component's USD per device-hour times
        the device-hours, and ``power``, the facility energy times the electricity price."""
        tco = self.footprint.get("tco")
        if tco is None:
            price = self.footprint.get("price_per_device_hour")
            return None if price is None else {"device_hours": self.device_hours(tokens) * price}
        energy = self.energy_to_train_j(tokens)
        if energy is None:
            return None
        hours = self.device_hours(tokens)
        out = {name: hours * usd for name, usd in tco["capital_per_device_hour"].items()}
        out["power"] = energy / 3.6e6 * tco["electricity_usd_per_kwh"]
        return out

    def cost_to_train(self, tokens: float) -> float | None:
        """USD to train ``tokens``: device-hours times the price per device-hour, and with the
        TCO the energy at the wall times the electricity price (the sum of the breakdown)."""
        parts = self.cost_breakdown_to_train(tokens)
        return None if parts is None else sum(parts.values())

    def cost_per_device_hour(self) -> float | None:
        """The price a device-hour comes to: the flat price, or the TCO's capital per device-hour
        plus this plan's average power x PUE x electricity price."""
        cost = self.cost_to_train(self.tokens_per_s * 3600.0)
        return None if cost is None else cost / self.num_devices

    def to_dict(self) -> dict:
        out = asdict(self)
        out["breakdown"]["total_s"] = self.breakdown.total_s
        out["memory"] = self.memory.as_dict()
        out["memory"]["fits"] = self.memory.fits
        out["roles"] = [{**asdict(r), "memory": r.memory.as_dict()} for r in self.roles]
        out["energy"] = self.energy.as_dict() if self.energy else None
        if self.train_tokens:
            out["time_to_train_s"] = self.time_to_train_s(self.train_tokens)
            out["device_hours"] = self.device_hours(self.train_tokens)
            out["energy_to_train_j"] = self.energy_to_train_j(self.train_tokens)
            out["co2e_to_train_kg"] = self.co2e_to_train_kg(self.train_tokens)
            out["cost_to_train"] = self.cost_to_train(self.train_tokens)
            out["cost_breakdown_to_train"] = self.cost_breakdown_to_train(self.train_tokens)
        out["cost_per_device_hour"] = self.cost_per_device_hour()
        return out

    def _repr_html_(self) -> str:
        """Key numbers and small charts in notebooks (meshplan.plots.notebook)."""
        from meshplan.plots.notebook import estimate_html

        return estimate_html(self)

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


@dataclass(frozen=True)
class CollectiveBreakdown:
    """One collective type over the iteration (MAD Max Fig. 15 b)."""

    total_s: float
    hidden_s: float  # time it runs while compute runs
    exposed_s: float  # total - hidden
    hidden_behind_s: dict[str, float]  # hidden time by the compute kind beside it


@dataclass(frozen=True)
class DLRMEstimate:
    """One iteration of a DLRM under a per-layer-kind strategy (meshplan.timeline.iteration)."""

    model_id: str
    cluster_id: str
    num_devices: int
    strategy: str
    global_batch_size: int
    precision: str
    iteration_s: float  # overlapped, as scheduled
    serialized_s: float  # nothing overlapped: every task (compute and collective) one after another
    compute_s: float
    comm_s: float
    exposed_comm_s: float  # iteration with communication and no compute
    comm_exposed_fraction: float  # exposed / all communication (MAD Max Table 1)
    exposed_comm_per_iteration: float  # exposed / iteration
    samples_per_s: float  # QPS
    model_flop_per_step: float  # 3 x forward flop x samples (forward, input and weight gradients)
    tflops_per_device: float
    serialized_by_kind_s: dict[str, float]  # MAD Max Fig. 15 a: lookups, GEMM, other, each collective
    comm_by_collective: dict[str, CollectiveBreakdown]  # MAD Max Fig. 15 b
    memory: DLRMMemory
    fits: bool
    tasks: tuple[Placed, ...] = field(repr=False, default=())  # as scheduled; task.kind is the compute kind or collective
    warnings: tuple[str, ...] = ()
    energy: EnergyBreakdown | None = None  # one iteration, all devices (None: no power model)

    @property
    def step_time_s(self) -> float:
        return self.iteration_s

    @property
    def mqps(self) -> float:
        """Throughput in million samples (queries) per second."""
        return self.samples_per_s / 1e6

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("tasks")
        out["step_time_s"] = self.iteration_s
        out["memory"] = self.memory.as_dict()
        out["memory"]["fits"] = self.fits
        out["energy"] = self.energy.as_dict() if self.energy else None
        return out

    def _repr_html_(self) -> str:
        from meshplan.plots.notebook import dlrm_html

        return dlrm_html(self)

    def __repr__(self) -> str:
        status = "fits" if self.fits else "DOES NOT FIT"
        return (
            f"DLRMEstimate({self.model_id} on {format_devices(self.num_devices, self.cluster_id)}, {self.strategy}: "
            f"iteration {format_seconds(self.iteration_s)}, {self.mqps:.3g} MQPS, serialized "
            f"{format_seconds(self.serialized_s)}, comm exposed {self.comm_exposed_fraction:.1%}, memory "
            f"{format_bytes(self.memory.total_bytes)} of {format_bytes(self.memory.capacity_bytes)} ({status}))"
        )
