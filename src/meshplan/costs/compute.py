"""Time of one op on one device: a roofline with an achieved-efficiency model.

COMET (Kumar et al.), Sec. 3.3.1, Eq. (1)-(2): time = flop / min(peak, OI x bandwidth), i.e. the
larger of the compute time and the memory time. Peaks are scaled by the device's efficiency
curves (meshplan.costs.efficiency) and every kernel pays a fixed launch overhead.

A kernel's size for its efficiency curve is max(flop, bytes x ridge), with the ridge point
(flop per byte) of the device family's profile: a kernel that streams a large KV cache or weight
matrix for few flop (decoding) is a big kernel, not a small one.

A profile with kernel models (``kernels:``, meshplan.costs.kernels) times GEMMs, attention and
memory-bound kernels from their shapes instead of the size curves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.costs.efficiency import achieved_fraction
from meshplan.costs.kernels import (
    FITTED_HEAD_DIMS, AttentionShape, Chip, attention_s, gemm_s, gemm_traffic_bytes, memory_op_s, unfused_attention_s,
)
from meshplan.errors import MeshplanError
from meshplan.specs.device import Device, Efficiency
from meshplan.specs.kernels import AttentionKernel, AttentionPass, KernelModels

__all__ = ["Roofline", "gemm_traffic_bytes", "attention_precision"]


def attention_precision(precision: str, fp8: bool = False) -> str:
    """Attention runs in 16 bits when the GEMMs run in fp8 or fp4 (Transformer Engine keeps
    dot-product attention in bf16 unless FP8 attention is asked for: ``fp8``, Plan.fp8_attention)."""
    if precision in ("fp8", "fp4"):
        return "fp8" if fp8 else "bf16"
    return precision


def fp8_attention_kernel(a: AttentionKernel, speedup: float) -> AttentionKernel:
    """The profile's flash attention run on FP8 operands (cuDNN's FP8 fused attention), timed at
    the FP8 peak, ``speedup`` times the 16-bit one: its matmuls go that much faster, its
    exponentials no faster (the special-function units do not take FP8), so each score's
    exponential costs ``speedup`` times the head dimensions it cost in 16 bits (softmax_dims).
    On H100 that gives 1.5x forward for head dimensions of 128 and up ((256 + 128) / ((256 + 256)
    / 2), Hopper's fitted 128 dimensions of exponential for d_qk + d_v of 256) and 1.33x at 64;
    FlashAttention-3's best forward figures (Shah et al. 2024, abstract) are close to 1.2 PFLOP/s
    in FP8 against 740 TFLOP/s in FP16, 1.6x. On Blackwell, whose exponentials cost 256
    dimensions, 1.33x at 128 (tests/test_fp8_attention.py)."""
    return a.model_copy(update={
        "forward": a.forward.model_copy(update={"softmax_dims": a.forward.softmax_dims * speedup}),
        "backward": a.backward.model_copy(update={"softmax_dims": a.backward.softmax_dims * speedup}),
    })


def slower_pass(p: AttentionPass, speed: float, softmax_dims: float | None = None) -> AttentionPass:
    """``p`` run by an older flash-attention generation that is ``speed`` times as fast at the
    fitted head dimension (Efficiency.attention_kernels, published at head dim 128): at
    D = FITTED_HEAD_DIMS the pass takes 1/speed as long. Its exponentials cost ``softmax_dims``
    head dimensions where the generation's published speeds say so; otherwise they run on the same
    special-function units while only the matmuls slow, to m = D·speed / (D + s·(1 - speed)) of
    their rate (s: the family's softmax_dims), and so cost s·m head dimensions of them."""
    d, own = FITTED_HEAD_DIMS, p.softmax_dims
    if softmax_dims is None:
        softmax_dims = own * d * speed / (d + own * (1.0 - speed))
    fraction = p.sm_fraction * speed * (d + softmax_dims) / (d + own)
    return p.model_copy(update={"sm_fraction": fraction, "softmax_dims": softmax_dims})


@dataclass(frozen=True)
class Roofline:
    """What a device achieves, resolved once for a precision."""

    peak_flop_per_s: float
    bytes_per_s: float  # achieved HBM bandwidth
    buffer_bytes: float
    efficiency: Efficiency
    lookup_bytes_per_s: float  # achieved HBM bandwidth of embedding lookups
    precision: str = "bf16"
    kernels: KernelModels | None = None  # the profile's kernel models, if it has them
    chip: Chip | None = None  # the device for GEMMs, in ``precision``
    attention_chip: Chip | None = None  # the device for attention, in attention_precision()
    # how the GEMM operands are scaled (Plan.quant_scaling): picks a block-scaled GEMM kernel
    scaling: str | None = None
    # forward and backward speed of the plan's flash-attention generation, as a fraction of the
    # profile's fitted attention (Efficiency.attention_kernels; already applied to ``kernels``)
    attention_speed: tuple[float, float] = (1.0, 1.0)
    # bytes of an attention operand (Q, K, V): 1 where FP8 attention is asked for
    attention_element_bytes: float | None = None

    @classmethod
    def of(cls, device: Device, efficiency: Efficiency, precision: str, attention_kernel: str | None = None,
           scaling: str | None = None, fp8_attention: bool = False) -> "Roofline":
        lookup = efficiency.memory if efficiency.lookup is None else efficiency.lookup
        kernels = efficiency.kernels
        chip = attention_chip = None
        attention, sixteen = attention_precision(precision, fp8_attention), attention_precision(precision)
        speed = efficiency.attention_kernels.get(attention_kernel) if attention_kernel else None
        attention_speed = (speed.forward, speed.backward) if speed is not None else (1.0, 1.0)
        if kernels is not None:
            if speed is not None:  # an older generation: fewer of the SMs' flop per second reach the math
                a = kernels.attention
                own = speed.softmax_dims or (None, None)
                slower = a.model_copy(update={
                    "forward": slower_pass(a.forward, speed.forward, own[0]),
                    "backward": slower_pass(a.backward, speed.backward, own[1]),
                })
                kernels = kernels.model_copy(update={"attention": slower})
            if device.sm_count is None:
                raise MeshplanError("device.sm_count", None, f"a whole number: the {device.efficiency} profile times kernels by tiles over the SMs")
            chip = Chip(device.sustained_peak(precision), device.sm_count, device.hbm_bytes_per_s, device.sram_bytes)
            attention_chip = Chip(device.sustained_peak(attention), device.sm_count, device.hbm_bytes_per_s, device.sram_bytes)
            if attention != sixteen:  # FP8 attention: the same kernel on FP8 operands
                speedup = device.sustained_peak(attention) / device.sustained_peak(sixteen)
                kernels = kernels.model_copy(update={"attention": fp8_attention_kernel(kernels.attention, speedup)})
        return cls(
            peak_flop_per_s=device.sustained_peak(precision),
            bytes_per_s=device.hbm_bytes_per_s * efficiency.memory,
            buffer_bytes=device.sram_bytes,
            efficiency=efficiency,
            lookup_bytes_per_s=device.hbm_bytes_per_s * lookup,
            precision=precision,
            kernels=kernels,
            chip=chip,
            attention_chip=attention_chip,
            attention_speed=attention_speed,
            scaling=scaling,
            attention_element_bytes=1.0 if attention != sixteen else None,
        )

    def matmul_s(self, m, k, n, element_bytes):
        """One GEMM (m x k)·(k x n): from its tiles (meshplan.costs.kernels.gemm_s) where the
        profile has kernel models, else max(compute, memory) + launch overhead."""
        if self.kernels is not None:
            return gemm_s(m, k, n, element_bytes, self.kernels.gemm_of(self.precision, self.scaling), self.chip)
        flop = 2.0 * m * k * n
        traffic = gemm_traffic_bytes(m * k * element_bytes, k * n * element_bytes, m * n * element_bytes, self.buffer_bytes)
        compute = flop / (self.peak_flop_per_s * achieved_fraction(self.efficiency.matmul, self._size(flop, traffic)))
        return np.maximum(compute, traffic / self.bytes_per_s) + self.efficiency.kernel_overhead_s

    def matmul_passes_s(self, m, k, n, element_bytes):
        """The forward, input-gradient and weight-gradient GEMMs of an (m x k)·(k x n) layer:
        matmul_s each, or, for a 16-bit layer whose k or n rows the family's kernels cannot align
        (KernelModels.unaligned_gemm), its 2·m·k·n flop at that pass's fraction of the peak."""
        slow = self.kernels.unaligned_gemm if self.kernels is not None else None
        if slow is not None and element_bytes == 2.0 and not slow.aligned(k, n, element_bytes):
            flop = 2.0 * m * k * n
            return tuple(flop / (self.chip.peak_flop_per_s * f) + self.kernels.gemm_of(self.precision).launch_s
                         for f in (slow.forward, slow.input_grad, slow.weight_grad))
        return self.matmul_s(m, k, n, element_bytes), self.matmul_s(m, n, k, element_bytes), self.matmul_s(k, m, n, element_bytes)

    def _size(self, flop, traffic_bytes):
        """Work in flop-equivalents: max(flop, bytes x the profile's ridge point)."""
        return np.maximum(flop, traffic_bytes * self.efficiency.size_flop_per_byte)

    def attention_op_s(self, shape: AttentionShape | None, flop, traffic_bytes, backward: bool):
        """One attention call, forward or backward: from its shape where the profile has kernel
        models (meshplan.costs.kernels.attention_s; unfused_attention_s without flash fusion),
        else from its flop on the size curve (backward: twice the forward's flop and bytes, COMET
        Table 1). A call that runs as several kernel calls (AttentionShape.calls: a context-parallel
        ring's steps) pays each one's fixed cost."""
        if self.kernels is not None and shape is not None:
            element = self.attention_element_bytes or (4.0 if self.precision == "fp32" else 2.0)
            if not shape.flash:
                gemm = self.kernels.gemm_of(attention_precision(self.precision))
                return unfused_attention_s(shape, gemm, self.kernels.memory, element, self.attention_chip, backward)
            return attention_s(shape, self.kernels.attention, element, traffic_bytes, self.attention_chip, backward)
        scale = 2.0 if backward else 1.0
        calls = shape.calls if shape is not None else 1.0
        return (self.attention_s(scale * flop, scale * traffic_bytes, self.attention_speed[backward])
                + (calls - 1.0) * self.efficiency.kernel_overhead_s)

    def attention_s(self, flop, traffic_bytes, speed: float = 1.0):
        fraction = speed * achieved_fraction(self.efficiency.attention, self._size(flop, traffic_bytes))
        compute = flop / (self.peak_flop_per_s * fraction)
        return np.maximum(compute, traffic_bytes / self.bytes_per_s) + self.efficiency.kernel_overhead_s

    def memory_s(self, traffic_bytes, kind: str = "copy"):
        """A streaming (elementwise, optimizer) kernel of class ``kind`` (specs.kernels.MemoryClass):
        at its class's measured bandwidth where the profile has kernel models
        (meshplan.costs.kernels.memory_op_s), else at the profile's streaming bandwidth."""
        if self.kernels is not None:
            return memory_op_s(traffic_bytes, kind, self.kernels.memory, self.chip.hbm_bytes_per_s)
        return traffic_bytes / self.bytes_per_s + self.efficiency.kernel_overhead_s

    def lookup_s(self, traffic_bytes):
        """An embedding lookup: lookup bytes / (HBM bandwidth x lookup utilization) (MAD Max
        Sec. 4.2, "Embedding Bags"), plus the launch overhead."""
        return traffic_bytes / self.lookup_bytes_per_s + self.efficiency.kernel_overhead_s
