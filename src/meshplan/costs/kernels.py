"""Kernel times from their shapes: tiled GEMMs, flash attention, memory-bound kernels.

One form for every device family; the parameters are the family's (meshplan.specs.kernels,
catalog/efficiency.yaml, fitted by benchmarks/fit_kernels.py). Every function takes scalars or
numpy arrays (search evaluates arrays of candidate plans with the same code).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.specs.kernels import AttentionKernel, AttentionPass, GemmKernel, MemoryKernels
from meshplan.workloads.ops import AttentionShape

#: FlashAttention-2 (Dao 2023), Sec. 3.1-3.2: the backward runs five matmuls to the forward's
#: two (it recomputes the scores), 2.5x the forward's flop
BACKWARD_FLOP_RATIO = 2.5

#: d_qk + d_v of the head dimension the attention kernels are fitted at (attention.csv: 128)
FITTED_HEAD_DIMS = 256.0

#: a dropout mask element is one byte (Korthikanti et al. 2022, Sec. 4.1)
DROPOUT_MASK_BYTES = 1.0

#: bytes of one fp32 partial output element of a split-K GEMM
PARTIAL_BYTES = 4.0


def gemm_traffic_bytes(u_bytes, v_bytes, w_bytes, buffer_bytes):
    """HBM traffic of a GEMM with inputs of U and V bytes and an output of W bytes.

    COMET Sec. 3.3.2: one operand is tiled to fit the on-chip buffer of S bytes, the other is
    streamed once per tile; traffic = min(ceil(U/S)·V + U, ceil(V/S)·U + V) + W.
    """
    psi1 = np.ceil(u_bytes / buffer_bytes) * v_bytes + u_bytes
    psi2 = np.ceil(v_bytes / buffer_bytes) * u_bytes + v_bytes
    return np.minimum(psi1, psi2) + w_bytes


@dataclass(frozen=True)
class Chip:
    """What the kernel formulas need of a device for one precision."""

    peak_flop_per_s: float  # dense peak of the precision the kernel runs in
    sm_count: int  # streaming multiprocessors (compute units, matrix units) the tiles spread over
    hbm_bytes_per_s: float  # HBM peak
    buffer_bytes: float  # on-chip buffer of COMET's traffic model


def waves(tiles, sm_count: int, quantization: float):
    """Waves of ``tiles`` equal tiles over ``sm_count`` SMs: tiles/SMs, plus ``quantization`` of
    the idle part of the last wave (NVIDIA Deep Learning Performance guide, "Matrix
    Multiplication Background", wave quantization: ceil(tiles/SMs) full waves at 1)."""
    exact = tiles / sm_count
    return exact + quantization * (np.ceil(exact) - exact)


def gemm_s(m, k, n, element_bytes: float, g: GemmKernel, chip: Chip):
    """Time of one GEMM (m x k)·(k x n) on one device.

    For each K-split s the library may pick: ceil(m/tm)·ceil(n/tn)·s output tiles run in
    waves over the SMs (waves()); one tile's main loop does 2·tm·tn·(ceil(k/s) + prologue_k)
    flop at the kernel's fraction of the per-SM peak (NVIDIA "Matrix Multiplication Background": tiles,
    waves, the K loop; the prologue and epilogue of a tile are a fixed cost in K); the GEMM
    takes at least its HBM traffic over the bandwidth (COMET Sec. 3.3, Eq. (1)-(2), traffic by
    gemm_traffic_bytes), and a split writes and reduces fp32 partial outputs. The fastest split
    is taken (cuBLAS's heuristic picks among them), plus a launch cost.
    """
    tm, tn = g.tile
    per_sm = chip.peak_flop_per_s / chip.sm_count * g.sm_fraction
    traffic = gemm_traffic_bytes(m * k * element_bytes, k * n * element_bytes, m * n * element_bytes, chip.buffer_bytes)
    memory = traffic / chip.hbm_bytes_per_s
    output_tiles = np.ceil(m / tm) * np.ceil(n / tn)
    best = None
    for split in g.split_k:
        tile_s = 2.0 * tm * tn * (np.ceil(k / split) + g.prologue_k) / per_sm
        t = np.maximum(waves(output_tiles * split, chip.sm_count, g.wave_quantization) * tile_s, memory)
        if split > 1:
            t = t + g.split_reduce_passes * split * m * n * PARTIAL_BYTES / chip.hbm_bytes_per_s
        best = t if best is None else np.minimum(best, t)
    return best + g.launch_s


def keys_per_query(seq, kv, causal: bool, block_q: float, window: float | None = None):
    """Keys a query block computes on, on average: all ``kv`` keys, or with a causal mask over
    ``seq`` queries that come last of ``kv`` keys, kv - seq + (seq + block_q)/2 (the diagonal
    blocks are computed whole), at most kv.

    With a sliding ``window`` (FlashAttention-2's window_size, cuDNN's sliding window: the key
    blocks wholly outside every row's window are skipped), the i-th block of r = min(block_q,
    seq) queries computes on the keys from its first row's window start to its last row:
    min(kv - seq + (i+1)·r, window + r - 1), averaged over the seq/r blocks (a query's window
    holds itself and the window - 1 keys before it, as Hugging Face's sliding_window counts)."""
    if not causal:
        return kv
    full = np.minimum(kv, kv - seq + (seq + block_q) / 2.0)
    if window is None:
        return full
    rows = np.minimum(block_q, seq)
    blocks, before = seq / rows, kv - seq
    span = window + rows - 1.0  # the keys of a block past the window's ramp
    ramp = np.clip(np.floor((span - before) / rows), 0.0, blocks)  # blocks whose keys all fit in the window
    total = ramp * before + rows * ramp * (ramp + 1.0) / 2.0 + (blocks - ramp) * span
    return np.minimum(full, total / blocks)


def attention_pass_s(shape: AttentionShape, p: AttentionPass, block_q: int, flop_ratio: float, element_bytes: float,
                     traffic_bytes, chip: Chip):
    """Time of one flash-attention pass (forward: flop_ratio 1; backward: BACKWARD_FLOP_RATIO).

    FlashAttention-2 (Dao 2023), Sec. 3.2: one thread block per (batch, head, block of
    ``block_q`` queries), in waves over the SMs (waves()); a block's main loop does
    flop_ratio·2·rows·(d_qk + d_v) flop per key (rows: block_q, or the queries there are) (keys_per_query() keys, plus a fixed
    ``prologue_kv``) at the pass's fraction of the per-SM peak, and each score's exponential,
    which takes as long as ``softmax_dims`` more head dimensions: a narrower head than the fitted
    one (FITTED_HEAD_DIMS) runs at a lower fraction of peak. A wider one runs at the fitted
    fraction, not a higher one: its kernels take smaller tiles (FlashAttention-3's head dim 256
    causal runs 4% above 128's speed, cuDNN's 6% below; FlashAttention-3 paper, Fig. 5), so its
    exponentials are taken to grow with it. The pass takes at least its HBM
    traffic (``traffic_bytes``: Q, K, V, O once; the full score matrices when not flash-fused)
    over the bandwidth, plus the fitted extra passes over the Q/O and K/V bytes (a serving
    step's cache at its own element size), plus a launch.
    """
    b, h = shape.batch, shape.heads
    tiles = b * h * np.ceil(shape.seq / block_q)
    keys = keys_per_query(shape.seq, shape.kv, shape.causal, block_q, shape.window)
    per_sm = chip.peak_flop_per_s / chip.sm_count * p.sm_fraction
    rows = np.minimum(shape.seq, block_q)  # a decode step's block holds its few queries, not block_q
    dims = shape.qk_dim + shape.v_dim
    softmax = p.softmax_dims * np.maximum(1.0, dims / FITTED_HEAD_DIMS)
    tile_s = flop_ratio * 2.0 * rows * (dims + softmax) * (keys + p.prologue_kv) / per_sm
    compute = waves(tiles, chip.sm_count, p.wave_quantization) * tile_s
    q_bytes = b * shape.seq * h * dims * element_bytes
    kv_bytes = b * shape.kv * shape.kv_heads * dims * (shape.kv_element_bytes or element_bytes)
    extra = (p.q_passes * q_bytes + p.kv_passes * kv_bytes) / chip.hbm_bytes_per_s
    return np.maximum(compute, traffic_bytes / chip.hbm_bytes_per_s) + extra + p.launch_s * shape.calls


def attention_s(shape: AttentionShape, a: AttentionKernel, element_bytes: float, traffic_bytes, chip: Chip, backward: bool = False):
    """Forward or backward time of an attention call (attention_pass_s with the pass's fit)."""
    if backward:
        return attention_pass_s(shape, a.backward, a.block_q, BACKWARD_FLOP_RATIO, element_bytes, 2.0 * traffic_bytes, chip)
    return attention_pass_s(shape, a.forward, a.block_q, 1.0, element_bytes, traffic_bytes, chip)


def unfused_attention_s(shape: AttentionShape, g: GemmKernel, mem: MemoryKernels, element_bytes: float, chip: Chip,
                        backward: bool = False):
    """Attention without flash fusion, as Megatron-LM ran it before FlashAttention (its
    CoreAttention: baddbmm scores, fused scale-mask-softmax, dropout, bmm with V): batched GEMMs
    over the whole b·a·s·kv score square (the causal mask is applied to scores already
    computed), timed as GEMMs with the same tiles, and memory-bound passes over the scores.
    Forward: S = Q·Kᵀ, softmax (read, write), dropout (read, write, a byte of mask), O = P·V.
    Backward: dP = dO·Vᵀ, dV = Pᵀ·dO, dropout's and softmax's backward (read dP and the mask,
    write; read P and dP, write dS), dQ = dS·K, dK = dSᵀ·Q: twice the forward's GEMM flop."""
    rows = shape.batch * shape.heads * shape.seq  # query rows of every head
    kv_rows = shape.batch * shape.heads * shape.kv
    scores = rows * shape.kv

    def gemm(m, k, n):
        return gemm_s(m, k, n, element_bytes, g, chip)

    def stream(bytes_per_score, kind):
        return memory_op_s(scores * bytes_per_score, kind, mem, chip.hbm_bytes_per_s)

    read = 0.5 if shape.causal else 1.0  # of each score tensor the softmax reads: a causal row's own keys
    dropout = stream(2.0 * element_bytes + DROPOUT_MASK_BYTES, "copy")
    if not backward:
        softmax = stream((read + 1.0) * element_bytes, "copy")
        return gemm(rows, shape.qk_dim, shape.kv) + softmax + dropout + gemm(rows, shape.kv, shape.v_dim)
    softmax = stream((2.0 * read + 1.0) * element_bytes, "copy")
    return (gemm(rows, shape.v_dim, shape.kv) + gemm(kv_rows, shape.seq, shape.v_dim) + dropout + softmax
            + gemm(rows, shape.kv, shape.qk_dim) + gemm(kv_rows, shape.seq, shape.qk_dim))


def memory_op_s(traffic_bytes, kind: str, mem: MemoryKernels, hbm_bytes_per_s: float):
    """A memory-bound kernel: the bytes it reads once and writes once over the bandwidth its
    class achieves (measured: copy and activations near the HBM peak, norms and softmax slower,
    their reductions keep fewer bytes in flight), plus a launch (roofline memory side,
    Williams et al. 2009)."""
    c = mem.of(kind)
    return traffic_bytes / (hbm_bytes_per_s * c.fraction) + c.launch_s
