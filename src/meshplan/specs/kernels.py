"""Kernel models of a device family: the parameters of GEMM, attention and memory-bound kernel
times (meshplan.costs.kernels), fitted on measured kernels. See catalog/efficiency.yaml.

Every parameter is per device family, and the same formulas serve every family: a family
differs in its numbers (tile, per-SM efficiency, launch cost), never in its code.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from meshplan.errors import MeshplanError
from meshplan.specs.base import Fraction, Seconds, Spec

#: flash-attention generations (plan.attention_kernel, Efficiency.attention_kernels): FlashAttention-3
#: class (FA3, cuDNN's fused attention), FlashAttention-2, FlashAttention and its Triton port
AttentionGeneration = Literal["flash3", "flash2", "flash1"]

#: memory-bound kernel classes, by how fast they stream (memory_ops.csv of the calibration data)
MemoryClass = Literal["copy", "add", "activation", "gated_activation", "norm", "softmax", "optimizer"]


class GemmKernel(Spec):
    """A tiled GEMM in one precision: output tiles in waves over the SMs, a per-tile main loop
    over K.

    ``tile``: (rows, columns) of one output tile; ``split_k``: the K-splits the library may pick
    (the fastest one is taken, as cuBLAS's heuristics do); ``sm_fraction``: main-loop fraction of
    the per-SM peak; ``prologue_k``: a tile's fixed prologue and epilogue, in K elements of its
    main loop; ``wave_quantization``: the share of an unfilled last wave that is paid (1: whole
    waves, as in NVIDIA's Matrix Multiplication Background guide; less where persistent or
    stream-K kernels balance the tail); ``split_reduce_passes``: fp32 partial outputs each split
    writes and the reduction reads, in passes over m·n·4 bytes; ``launch_s``: added to every GEMM.
    """

    tile: tuple[int, int] = Field(default=(128, 128))
    split_k: tuple[int, ...] = Field(default=(1,), min_length=1)
    sm_fraction: Fraction
    prologue_k: float = Field(ge=0.0)
    wave_quantization: float = Field(ge=0.0, le=1.0)
    split_reduce_passes: float = Field(default=0.0, ge=0.0)
    launch_s: Seconds
    isolated_floor_s: Seconds = 0.0  # see KernelModels
    isolated_overhead_s: Seconds = 0.0  # see KernelModels

    def catalog_line(self) -> str:
        """This kernel as a catalog/efficiency.yaml flow mapping (what the fitting scripts print)."""
        us = lambda s: f"{s * 1e6:.2f} us"  # noqa: E731
        return (f"{{tile: {list(self.tile)}, split_k: {list(self.split_k)}, sm_fraction: {self.sm_fraction:.4f}, "
                f"prologue_k: {self.prologue_k:.1f}, wave_quantization: {self.wave_quantization:.3f}, "
                f"split_reduce_passes: {self.split_reduce_passes:.3f}, launch_s: {us(self.launch_s)}, "
                f"isolated_floor_s: {us(self.isolated_floor_s)}, isolated_overhead_s: {us(self.isolated_overhead_s)}}}")

    @model_validator(mode="after")
    def _valid(self) -> "GemmKernel":
        if min(self.tile) < 1:
            raise MeshplanError("tile", self.tile, "tile sizes of at least 1")
        if min(self.split_k) < 1:
            raise MeshplanError("split_k", self.split_k, "split-k factors of at least 1")
        return self


#: AttentionPass.softmax_dims: head dimensions, at least 0
SoftmaxDims = Annotated[float, Field(ge=0.0)]


class AttentionPass(Spec):
    """One pass (forward or backward) of flash attention, as GemmKernel over query blocks.

    ``sm_fraction``: main-loop fraction of the per-SM peak; ``prologue_kv``: per-tile fixed cost
    in keys of main loop; ``wave_quantization`` as for GEMMs; ``q_passes`` / ``kv_passes``:
    extra passes over the Q (and O) and the K, V bytes beyond the main loop (the backward's
    preprocessing, dQ accumulation in fp32, dK/dV reduction over grouped heads); ``launch_s``.

    ``softmax_dims``: the exponential each score takes, on the special-function units beside the
    tensor cores, as the head dimensions of main-loop matmul that take as long (per key of a query
    row the pass does flop_ratio·2·(d_qk + d_v) flop; the exponential costs as much as
    flop_ratio·2·softmax_dims more). It does not shrink with a narrower head, which so runs at a
    lower fraction of peak (FlashAttention-3, Shah et al. 2024, Figs. 5-6: head dim 64 at 0.77 of
    head dim 128's forward speed, 0.84 backward); above the fitted head dimension it grows with
    it (costs.kernels.attention_pass_s). With it, ``sm_fraction`` is the main loop's fraction of
    the peak for the matmuls alone.
    """

    sm_fraction: Fraction
    prologue_kv: float = Field(ge=0.0)
    wave_quantization: float = Field(ge=0.0, le=1.0)
    q_passes: float = Field(default=0.0, ge=0.0)
    kv_passes: float = Field(default=0.0, ge=0.0)
    softmax_dims: SoftmaxDims = 0.0
    launch_s: Seconds
    isolated_floor_s: Seconds = 0.0  # see KernelModels
    isolated_overhead_s: Seconds = 0.0  # see KernelModels


class AttentionKernel(Spec):
    """Flash attention (Dao 2023, FlashAttention-2): one CTA per (batch, head, block of
    ``block_q`` queries), forward and backward fitted apart (backward is slower per flop)."""

    block_q: int = Field(default=128, ge=1)
    forward: AttentionPass
    backward: AttentionPass
    source: str


class AttentionSpeed(Spec):
    """How fast one flash-attention generation runs on a device family, as a fraction of the
    family's fitted kernel (``KernelModels.attention``) at the head dimension it is fitted at,
    forward and backward, from published kernel benchmarks (``source``).

    ``softmax_dims`` (forward, backward): the generation's own AttentionPass.softmax_dims where
    published kernel speeds at two head dimensions say it; unset, the family's exponentials at the
    generation's slower matmuls (costs.compute.slower_pass)."""

    forward: Fraction
    backward: Fraction
    softmax_dims: tuple[SoftmaxDims, SoftmaxDims] | None = None
    source: str


class MemoryClassKernel(Spec):
    """One class of memory-bound kernel: achieved fraction of HBM bandwidth on the bytes it reads
    once and writes once (above 1 only where the class re-reads from cache), and a fixed cost
    per call (its launch and the ramp of a small kernel; eager ops such as silu·mul run two)."""

    fraction: float = Field(gt=0.0, le=2.0)
    launch_s: Seconds


class MemoryKernels(Spec):
    """Memory-bound kernels per class (``copy`` required: it serves every class not listed)."""

    classes: dict[MemoryClass, MemoryClassKernel]
    isolated_floor_s: Seconds = 0.0  # see KernelModels
    isolated_overhead_s: Seconds = 0.0  # see KernelModels
    source: str

    @model_validator(mode="after")
    def _valid(self) -> "MemoryKernels":
        if "copy" not in self.classes:
            raise MeshplanError("classes", sorted(self.classes),
                                "classes that include copy (it serves every class not listed)")
        return self

    def of(self, kind: str) -> MemoryClassKernel:
        return self.classes.get(kind, self.classes["copy"])  # type: ignore[call-overload]


class HostDispatch(Spec):
    """What the host takes to issue one lowered op of a decoder layer (its kernels, through eager
    PyTorch and autograd), forward and backward. The GPU runs no faster than the host issues its
    work: a layer whose kernels take less than its ops' dispatch waits for the host
    (costs.host.host_bound). Fitted as the least time any measured layer took, forward and
    backward, over the ops meshplan lowers that layer to (calibrate.fit_kernels.fit_host)."""

    forward_s: Seconds
    backward_s: Seconds
    source: str


class UnalignedGemm(Spec):
    """16-bit GEMMs whose rows are not a multiple of ``alignment_bytes``: a feature dimension (the
    reduction's K or the output's N; tokens are the rows' count, never their length) such as
    GPT-2's vocabulary of 50257 that no framework padded. cuBLAS cannot run them on its
    TMA-fed kernels and falls back to element-wise loads (its align1 kernels), at a fraction of
    the dense peak that barely moves with the shape: one fraction per pass, the forward x·Wᵀ,
    the input gradient dy·W and the weight gradient dyᵀ·x."""

    forward: Fraction
    input_grad: Fraction
    weight_grad: Fraction
    alignment_bytes: int = Field(default=16, ge=1)
    source: str

    def aligned(self, k, n, element_bytes: float) -> bool:
        """Whether a GEMM of reduction ``k`` and output width ``n`` has rows cuBLAS can align."""
        return all(float(d) * element_bytes % self.alignment_bytes == 0 for d in (k, n))


class KernelModels(Spec):
    """The kernel models of one device family.

    An isolated, synchronised call in the calibration harness measures more than the kernel
    costs inside a stream: each kind's ``isolated_overhead_s`` more per call (host dispatch
    through eager PyTorch and event timing; estimated from the same kernel timed alone and back
    to back), and at least its ``isolated_floor_s`` (for the attention backward, autograd's). The kernel
    tests compare against max(floor, kernel time + overhead); estimates apply neither (in a
    training step the host runs ahead of the GPU), only ``host``'s floor on a whole layer where
    its kernels are shorter than their dispatch.
    """

    # bf16 serves precisions not listed; "fp8_block" is FP8 with a scale per block of values
    # (MXFP8 on Blackwell), where the family's block-scaled kernels run apart from per-tensor FP8's
    gemm: dict[Literal["fp32", "tf32", "bf16", "fp16", "fp8", "fp8_block", "fp4"], GemmKernel]
    attention: AttentionKernel
    memory: MemoryKernels
    host: HostDispatch | None = None  # None: the host always keeps ahead
    unaligned_gemm: UnalignedGemm | None = None  # None: not measured, such GEMMs timed as aligned ones
    source: str

    @model_validator(mode="after")
    def _bf16_gemm(self) -> "KernelModels":
        if "bf16" not in self.gemm:
            raise MeshplanError("gemm", sorted(self.gemm),
                                "precisions that include bf16 (it serves every precision not listed)")
        return self

    def gemm_of(self, precision: str, scaling: str | None = None) -> GemmKernel:
        """The GEMM kernel of ``precision``; with ``scaling`` "block", the family's block-scaled
        one where it has it."""
        if scaling == "block" and f"{precision}_block" in self.gemm:
            return self.gemm[f"{precision}_block"]  # type: ignore[index]
        return self.gemm.get(precision, self.gemm["bf16"])  # type: ignore[call-overload]
