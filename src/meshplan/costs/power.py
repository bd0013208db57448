"""Power-capped clocks: work that would draw more than a device's power limit runs slower.

A device draws its idle power plus the energy of its work per second: energy per flop (by
precision) times the flop rate plus energy per HBM byte times the byte rate (the rack-scale
energy/latency study's per-flop and per-byte energies; Horowitz, ISSCC 2014). When that exceeds
the board's power limit (TDP), its power management lowers the SM clock until it does not
(NVIDIA GPU Boost / power capping). Measured on an H100 SXM at 700 W
(shared/calibration/h100-sxm/power.csv): back-to-back 8192³ bf16 GEMMs hold the cap with the SM
clock at 1350 of 1980 MHz and run at 672 TFLOP/s where a short burst reaches 738.

With the energy per unit of work taken as fixed, work of dynamic energy E that would take t seconds
takes max(t, E / (TDP - P_idle)) under the cap. It is applied to each op (its forward and backward
together): a large GEMM runs for milliseconds, long against the power manager's control loop, and
the sustained GEMMs measured at the cap are exactly that case; a layer's memory-bound kernels do
not lend their headroom to its GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.costs.kernels import BACKWARD_FLOP_RATIO, keys_per_query
from meshplan.specs.device import PowerModel
from meshplan.workloads.ops import OP_KIND, backward_work

#: the query block of a flash-attention tile (FlashAttention-2, head dim 128; AttentionKernel.block_q)
FLASH_BLOCK_Q = 128


@dataclass(frozen=True)
class Work:
    """What one op's forward does: flop in a precision, and a floor on its HBM traffic (a
    GEMM's operands and result read or written once; another op's bytes)."""

    precision: str
    flop: float
    hbm_bytes: float


def executed_attention_fraction(op) -> float:
    """Of a sharded attention op's flop (the full score square, Megatron's count), what its
    kernel computes: flash attention skips the blocks a causal mask hides (keys_per_query, as
    its time is modelled); unfused attention computes the whole square."""
    shape = getattr(op, "attention", None)
    if shape is None or not shape.flash or not shape.causal or shape.kv <= 0:
        return 1.0
    return float(keys_per_query(shape.seq, shape.kv, True, FLASH_BLOCK_Q, shape.window)) / shape.kv


def backward_energy_work(op) -> float:
    """Forwards' worth of computed work in a sharded op's backward: flash attention's backward
    recomputes the scores (BACKWARD_FLOP_RATIO forwards), every other op as backward_work."""
    shape = getattr(op, "attention", None)
    if op.op.kind == "attention" and shape is not None and shape.flash:
        return BACKWARD_FLOP_RATIO
    return backward_work(op.op)


def op_work(op, plan_precision: str, element_bytes: float) -> Work:
    """The forward work of a sharded op (meshplan.parallel.program.ShardedOp). Low-precision
    GEMMs run in the plan's precision; attention, the router and the output layer in 16 bits.
    Attention counts the flop its kernel computes (executed_attention_fraction)."""
    inner = op.op
    if inner.kind == "matmul":
        low = inner.low_precision or plan_precision not in ("fp8", "fp4")
        precision = plan_precision if low else "bf16"
        # the casts of FP8/FP4 GEMMs (forward and backward) spread over the three forwards' worth
        # of work a training step counts for a GEMM
        casts = sum(op.cast_bytes) / 3.0
        return Work(precision, op.flop, (op.m * op.k + op.k * op.n + op.m * op.n) * element_bytes + casts)
    flop = op.flop * executed_attention_fraction(op) if inner.kind == "attention" else op.flop
    return Work("fp32" if plan_precision == "fp32" else "bf16", flop, op.bytes)


class WorkTally:
    """Flop by precision and HBM bytes of sharded ops, each counted ``times`` forwards' worth
    (a backward is two, COMET Table 1), in all and per op kind (workloads.ops.OP_KIND)."""

    def __init__(self, precision: str, element_bytes: float):
        self.precision, self.element_bytes = precision, element_bytes
        self.flop: dict[str, float] = {}
        self.hbm = 0.0
        self.kind_flop: dict[str, dict[str, float]] = {}  # op kind -> precision -> flop
        self.kind_hbm: dict[str, float] = {}

    def add(self, op, times: float) -> None:
        work = op_work(op, self.precision, self.element_bytes)
        self.flop[work.precision] = self.flop.get(work.precision, 0.0) + times * work.flop
        self.hbm += times * work.hbm_bytes
        kind = OP_KIND[op.op.kind]
        flop = self.kind_flop.setdefault(kind, {})
        flop[work.precision] = flop.get(work.precision, 0.0) + times * work.flop
        self.add_hbm(kind, times * work.hbm_bytes, counted=True)

    def add_hbm(self, kind: str, hbm_bytes: float, counted: bool = False) -> None:
        """HBM traffic of ``kind`` (e.g. the optimizer's); ``counted``: already in ``hbm``."""
        if not counted:
            self.hbm += hbm_bytes
        self.kind_hbm[kind] = self.kind_hbm.get(kind, 0.0) + hbm_bytes

    def kind_energy_j(self, power: PowerModel) -> dict[str, float]:
        """Dynamic energy per op kind; the kinds sum to energy_j."""
        return {kind: dynamic_energy_j(power, self.kind_flop.get(kind, {}), self.kind_hbm.get(kind, 0.0))
                for kind in {*self.kind_flop, *self.kind_hbm}}

    def energy_j(self, power: PowerModel) -> float:
        return dynamic_energy_j(power, self.flop, self.hbm)


def dynamic_energy_j(power: PowerModel, flop_by_precision: dict[str, float], hbm_bytes: float) -> float:
    """Energy above idle of ``flop_by_precision`` flop and ``hbm_bytes`` bytes of HBM traffic.
    Precisions the model has no figure for count at its 16-bit figure."""
    per_flop = power.joules_per_flop
    fallback = per_flop.get("bf16", max(per_flop.values(), default=0.0))
    flop_j = sum(f * per_flop.get(p, fallback) for p, f in flop_by_precision.items())
    return flop_j + hbm_bytes * power.joules_per_hbm_byte


def capped_scale(power: PowerModel | None, tdp_w: float, dynamic_j: float, time_s: float) -> float:
    """How much longer work of ``dynamic_j`` joules above idle takes than its uncapped
    ``time_s`` (1 when the device stays under ``tdp_w``, or has no power model)."""
    if power is None or time_s <= 0 or dynamic_j <= 0:
        return 1.0
    headroom_w = tdp_w - power.idle_w
    return max(1.0, dynamic_j / (headroom_w * time_s))
