"""An accelerator: peak rates per precision, memory, and the efficiency profile it achieves."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from meshplan.errors import MeshplanError
from meshplan.specs.base import Bytes, BytesPerS, FlopPerS, Fraction, Seconds, Spec
from meshplan.specs.kernels import AttentionGeneration, AttentionSpeed, KernelModels

Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "fp4"]

#: bytes per element of each precision (fp4 is half a byte, never 4 // 8 == 0)
BYTES_PER_ELEMENT: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "fp4": 0.5,
}


def activation_bytes(precision: str) -> float:
    """Bytes per activation (and KV-cache) element: fp32 training keeps fp32 activations, every
    lower precision keeps 16-bit ones (fp8/fp4 cast only the matmul operands)."""
    return 4.0 if precision == "fp32" else 2.0


class EfficiencyCurve(Spec):
    """Achieved fraction of peak as a function of an op's size (piecewise linear in log10 size).

    ``points`` are (flop per kernel, fraction) pairs sorted by flop; below the first point the first
    fraction applies, above the last the last (Calculon's efficiency-vs-size tables).
    """

    points: tuple[tuple[float, Fraction], ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _sorted(self) -> "EfficiencyCurve":
        sizes = [p[0] for p in self.points]
        if any(s <= 0 for s in sizes) or sizes != sorted(sizes):
            raise MeshplanError("points", sizes, "positive sizes in increasing order")
        return self


class PowerModel(Spec):
    """What a device draws: idle power plus energy per flop and per HBM byte of its work
    (meshplan.costs.power). Fitted on measured power, not on runs."""

    idle_w: float = Field(ge=0)
    joules_per_flop: dict[Precision, float] = Field(min_length=1)
    joules_per_hbm_byte: float = Field(ge=0)
    joules_per_l2_byte: float | None = Field(default=None, ge=0)  # on-chip cache traffic, where measured
    # whether work drawing more than the TDP slows down (meshplan.costs.power); false where the
    # profile's efficiencies were fitted on sustained runs that already ran at the capped clock
    cap_clocks: bool = True
    source: str

    @model_validator(mode="after")
    def _positive(self) -> "PowerModel":
        bad = {p: j for p, j in self.joules_per_flop.items() if not j > 0}
        if bad:
            raise MeshplanError("joules_per_flop", bad, "positive joules per flop for every precision")
        return self


class Efficiency(Spec):
    """How close a device gets to its peaks, per op kind. See catalog/efficiency.yaml."""

    matmul: EfficiencyCurve
    attention: EfficiencyCurve
    memory: Fraction  # achieved fraction of HBM bandwidth for streaming kernels
    # achieved fraction of HBM bandwidth for embedding lookups (rows gathered from large tables;
    # MAD Max Sec. 4.2, "Embedding Bags"); None: as streaming kernels
    lookup: Fraction | None = None
    kernel_overhead_s: Seconds  # launch and tail cost added to every kernel
    # compute slows by this fraction while a collective runs beside it (the collective's kernels
    # take SMs and HBM bandwidth: Rashidi et al. 2021, "Enabling Compute-Communication Overlap in
    # Distributed Deep Learning Training Platforms", ISCA, Sec. 3)
    overlap_slowdown: float = Field(default=0.0, ge=0.0, le=1.0)
    # flop-equivalents per byte when sizing a kernel for its curve: the family's ridge point,
    # fixed here so that a faster memory or compute never shrinks a kernel's size
    size_flop_per_byte: float = Field(default=0.0, ge=0.0)
    # GEMM, attention and memory-bound kernel times from their shapes (meshplan.costs.kernels);
    # where given, they replace the matmul and attention curves and the streaming fraction
    kernels: KernelModels | None = None
    # flash-attention generations other than the one the family's attention was fitted on, each
    # at its published fraction of that speed (plan.attention_kernel); one not listed runs as fitted
    attention_kernels: dict[AttentionGeneration, AttentionSpeed] = Field(default_factory=dict)
    # sustained power: work drawing more than the device's TDP runs at lower clocks; None: the
    # family has no power measurement and runs uncapped (its fit then absorbs the cap)
    power: PowerModel | None = None
    source: str


class Device(Spec):
    id: str
    name: str
    peak_flop_per_s: dict[Precision, FlopPerS]  # dense (no sparsity) peaks
    hbm_bytes: Bytes
    hbm_bytes_per_s: BytesPerS
    sram_bytes: Bytes  # on-chip buffer used by COMET's GEMM traffic model (L2 / shared SRAM)
    tdp_w: float = Field(gt=0)
    # streaming multiprocessors (NVIDIA), compute units (AMD) or matrix units (TPU) that GEMM
    # and attention tiles spread over; needed by profiles with kernel models
    sm_count: int | None = Field(default=None, ge=1, le=100_000)
    efficiency: str  # a profile id in catalog/efficiency.yaml
    # the share of the datasheet peaks its tensor cores hold in training, where measured runs
    # show less (a datasheet quoted at a clock the part does not sustain): kernels are timed at
    # peak x this, MFU stays against the datasheet
    sustained_peak_fraction: float = Field(default=1.0, gt=0.0, le=1.0)
    sources: dict[str, str]

    @model_validator(mode="after")
    def _every_number_has_a_source(self) -> "Device":
        needed = {"peak_flop_per_s", "hbm_bytes", "hbm_bytes_per_s", "sram_bytes", "tdp_w"}
        if self.sm_count is not None:
            needed.add("sm_count")
        if self.sustained_peak_fraction != 1.0:
            needed.add("sustained_peak_fraction")
        missing = needed - set(self.sources)
        if missing:
            raise MeshplanError("sources", sorted(self.sources),
                                f"a source for each of {', '.join(sorted(needed))}; missing {', '.join(sorted(missing))}")
        return self

    def with_compute_units(self, sm_count: int, idle_w: float = 0.0) -> "Device":
        """This device with ``sm_count`` SMs (compute units) instead of its own: the peaks scale
        with them, and the power above ``idle_w`` that the TDP leaves for work scales with them
        too; memory, its bandwidth and the on-chip buffer stay. The rack-scale energy/latency
        study's sweep of compute units ("block size") per GPU (its Sec. IV-B)."""
        if self.sm_count is None:
            raise MeshplanError("device.sm_count", None, f"{self.id} states no SM count to scale from")
        if not isinstance(sm_count, int) or isinstance(sm_count, bool) or not 1 <= sm_count <= 100_000:
            raise MeshplanError("sm_count", sm_count, "a whole number of SMs from 1 to 100000")
        ratio = sm_count / self.sm_count
        note = f"{self.id} scaled to {sm_count} of its {self.sm_count} SMs (peaks and TDP above idle in proportion)"
        return self.model_copy(update={
            "id": f"{self.id}-{sm_count}sm",
            "sm_count": sm_count,
            "peak_flop_per_s": {p: f * ratio for p, f in self.peak_flop_per_s.items()},
            "tdp_w": idle_w + (self.tdp_w - idle_w) * ratio,
            "sources": {**self.sources, "sm_count": note, "peak_flop_per_s": note, "tdp_w": note},
        })

    def peak(self, precision: str) -> float:
        """Peak dense flop/s for matmuls in ``precision``."""
        if precision not in self.peak_flop_per_s:
            supported = ", ".join(self.peak_flop_per_s)
            raise MeshplanError("plan.precision", precision, f"{self.id} supports {supported}")
        return self.peak_flop_per_s[precision]

    def sustained_peak(self, precision: str) -> float:
        """The dense flop/s kernels are timed against: the peak in ``precision`` times the share
        of it the part sustains (``sustained_peak_fraction``)."""
        return self.peak(precision) * self.sustained_peak_fraction
