"""What FP8/FP4 training moves through memory around each low-precision GEMM.

A GEMM in FP8 reads quantized operands, and its weight gradient needs them in the other layout
(column-wise: a transpose on Hopper, a second quantization of the same read on Blackwell's
MXFP8). Transformer Engine therefore writes, for each GEMM input in forward and each output
gradient in backward, a row-wise and a column-wise low-precision copy of a 16-bit tensor
(``cast_transpose``; NVIDIA Transformer Engine, transformer_engine/pytorch/module/linear.py and
csrc/extensions/transpose.cpp). Per element, with ``b`` bytes per low-precision value:

- standalone cast (the input comes from attention, a residual or a permutation): read 2 bytes,
  write ``b`` row-wise and ``b`` column-wise: ``2 + 2b``;
- fused into the op before (LayerNormLinear's norm, LayerNormMLP's activation, the activation's
  backward ``dact_cast_transpose``): that op writes ``b`` instead of 2 bytes and the column-wise
  copy is a read of ``b`` and a write of ``b``: ``3b - 2`` more than the 16-bit graph (none where
  that is below zero);
- current scaling (TE ``Float8CurrentScaling``): the scale is the tensor's own amax, known only
  once the whole tensor is written, so the cast is its own pass over the 16-bit tensor; a norm or
  activation computes the amax as it writes its 16-bit output (``2 + 2b``), anything else needs
  an amax pass first (``4 + 2b``).
  Delayed scaling (an amax history, TE ``DelayedScaling``) and block scaling (MXFP8's 32-element
  and DeepSeek-V3's 1x128 tiles, scaled inside the cast kernel) need no extra pass; the block
  scales (one byte per 32 values) are left out.
- NVFP4 (TE ``NVFP4BlockScaling``; NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv
  2509.25149): 16-value blocks under a per-tensor FP32 scale from the tensor's amax, and the
  column-wise copy the weight gradient reads goes through a 16x16 random Hadamard transform.
  TE's NVFP4Quantizer first runs one pass for both amaxes (of the tensor and of its transform,
  ``nvte_hadamard_transform_amax``), then casts the row-wise copy and, fused with the transform,
  the column-wise one (``nvte_hadamard_transform_cast_fusion_columnwise``): three reads of the
  16-bit tensor and the two copies, ``6 + 2b``, whatever op came before (a norm cannot give the
  transform's amax). Without the transform (``nvfp4_plain``: Plan.fp4_hadamard off) the per-tensor
  scale is current scaling's, and so is the cost.

The weights' casts run once per step, not per micro-batch (TE caches them over gradient
accumulation, ``is_first_microbatch``; with FP8 primary weights only their transpose remains):
they are left out.
"""

from __future__ import annotations

from typing import Literal

from meshplan.specs.device import BYTES_PER_ELEMENT, activation_bytes

FP8Scaling = Literal["delayed", "current", "block", "nvfp4", "nvfp4_plain"]

#: bytes per value of the quantized copies
LOW_PRECISION_BYTES = {"fp8": 1.0, "fp4": 0.5}
WIDE_BYTES = 2.0  # the 16-bit tensors they are cast from


def cast_bytes_per_element(precision: str, scaling: FP8Scaling, fused: bool) -> float:
    """HBM bytes per element that quantizing one GEMM operand adds (module docstring)."""
    low = LOW_PRECISION_BYTES.get(precision)
    if low is None:
        return 0.0
    if scaling == "nvfp4":
        return 3.0 * WIDE_BYTES + 2.0 * low
    if scaling in ("current", "nvfp4_plain"):
        return (1.0 if fused else 2.0) * WIDE_BYTES + 2.0 * low
    if fused:
        return max(3.0 * low - WIDE_BYTES, 0.0)
    return WIDE_BYTES + 2.0 * low


def gemm_cast_bytes(op, m: float, k: float, n: float, precision: str, scaling: FP8Scaling) -> tuple[float, float]:
    """(forward, backward) cast bytes of one device's share of a GEMM ``op`` (``m x k`` input,
    ``m x n`` output): its input in forward, its output gradient in backward."""
    if not op.low_precision or precision not in LOW_PRECISION_BYTES:
        return 0.0, 0.0
    return (m * k * cast_bytes_per_element(precision, scaling, op.input_fused),
            m * n * cast_bytes_per_element(precision, scaling, op.grad_fused))


def quantized_scale(precision: str) -> float:
    """What a low-precision GEMM's saved input weighs against its 16-bit activation.

    FP8/FP4 training with Transformer Engine keeps the quantized copy of a linear layer's input
    for the weight gradient and drops the 16-bit one (transformer_engine/pytorch/module/linear.py,
    ``_Linear`` forward: ``saved_inputmat`` is the quantized input, its row-wise data discarded;
    NVIDIA/TransformerEngine at d0067d0, 2026-08)."""
    return BYTES_PER_ELEMENT[precision] / activation_bytes(precision) if precision in ("fp8", "fp4") else 1.0
