"""Ops: the unit of work a model is lowered to, with flop, bytes moved, weights and saved tensors.

An op describes its full (unsharded) size for one micro-batch. How it shards is declared as data
(``shard``), and applied by ``meshplan.parallel``: the workload never knows the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OpKind = Literal["matmul", "attention", "elementwise", "lookup"]

#: how an op divides over tensor parallelism:
#:   "tp" - always split tp ways (column/row-parallel matmuls, the FFN activation, attention heads)
#:   "sp" - split tp ways only with sequence parallelism (norms, dropout, residual)
#:   "none" - replicated
Shard = Literal["tp", "sp", "none"]


#: op kinds as MAD Max reports them (its Fig. 15 breakdowns)
OP_KIND = {"matmul": "gemm", "attention": "attention", "elementwise": "memory_bound", "lookup": "embedding_lookup"}

@dataclass(frozen=True)
class Saved:
    """A tensor kept from forward for backward: bytes for one micro-batch, and how it shards."""

    name: str
    bytes: float
    shard: Shard
    attention_scores: bool = False  # the s^2 terms that selective recompute drops


#: memory-bound kernel classes (meshplan.specs.kernels.MemoryClass): how fast an op streams
MemoryClass = Literal["copy", "add", "activation", "gated_activation", "norm", "softmax", "optimizer"]


@dataclass(frozen=True)
class AttentionShape:
    """The shape of an attention call: ``batch`` sequences of ``seq`` queries over ``kv`` keys,
    ``heads`` query heads sharing ``kv_heads`` key/value heads, head widths ``qk_dim`` (scores)
    and ``v_dim`` (values), with a causal mask or not, over the whole prefix or a sliding
    ``window`` of it, flash-fused (FlashAttention, Dao et al. 2022) or not. Kernel models time attention from it (meshplan.costs.kernels)."""

    batch: float
    heads: float
    kv_heads: float
    seq: float
    kv: float
    qk_dim: float
    v_dim: float
    causal: bool = True
    flash: bool = True
    window: float | None = None  # a causal sliding window: each query sees its last ``window`` keys
    # a serving step's cached keys and values, bytes an element (Task.kv_cache_dtype); None: the call's own
    kv_element_bytes: float | None = None
    calls: float = 1.0  # kernel calls the work runs as (context parallelism's ring: one a step)


@dataclass(frozen=True)
class Op:
    """One kernel of the forward pass for one micro-batch (all tokens, all heads).

    matmul: ``m x k`` times ``k x n`` (COMET Table 1); ``flop = 2 m k n``.
    attention: the scores and context of all heads (flash-style: Q, K, V in, O out).
    elementwise / lookup: memory bound; ``bytes`` is what one forward moves through HBM.
    Backward costs follow COMET Table 1: a matmul runs two matmuls of the same flop
    (input gradient, weight gradient); attention runs twice its forward flop; elementwise ops
    move ``backward_scale`` times their forward bytes (twice, unless the op counts its own).
    """

    name: str
    kind: OpKind
    shard: Shard
    flop: float = 0.0
    bytes: float = 0.0  # HBM traffic of the forward (for matmuls: computed from m, k, n)
    m: float = 0.0
    k: float = 0.0
    n: float = 0.0
    shard_dim: Literal["m", "k", "n", ""] = ""  # which matmul dim tp splits
    params: float = 0.0
    expert: bool = False  # routed-expert weights: split over expert parallelism
    saved: tuple[Saved, ...] = ()
    # what its backward allocates beside what the forward saved, held together at the peak it
    # sets (PyTorch's cross-entropy: the logits' gradients, cross_entropy_op)
    transient: tuple[Saved, ...] = ()
    attention: AttentionShape | None = None  # attention ops: the call's full (unsharded) shape
    memory_class: MemoryClass = "copy"  # elementwise ops: which kind of streaming kernel
    # elementwise ops: the backward's bytes over the forward's (COMET Table 1's 2, or the op's
    # own count: a rotary embedding's backward moves what its forward does)
    backward_scale: float = 2.0
    # what the host takes to issue it, each way, in lowered ops' dispatches (an eager composite
    # op: several; one issued within another op's call: 0; costs.host.host_bound holds the GPU
    # to them)
    launches: int = 1
    # a GEMM that FP8/FP4 training runs in low precision, keeping its saved input quantized:
    # every linear layer of the decoder; the embedding, output layer and MoE router stay 16-bit
    # (DeepSeek-V3 report, Sec. 3.3; Megatron-Core builds the output layer outside Transformer
    # Engine)
    low_precision: bool = False
    # FP8/FP4 GEMMs: the op before writes this GEMM's input already quantized (a norm or an
    # activation fused with the cast, Transformer Engine LayerNormLinear / LayerNormMLP), and the
    # activation's backward writes its output gradient quantized (TE dact_cast_transpose)
    input_fused: bool = False
    grad_fused: bool = False
    # a weight that gets no gradient (LoRA's frozen base weights, meshplan.workloads.lora):
    # backward still runs the input gradient through it, never the weight gradient
    frozen: bool = False


def backward_work(op: Op) -> float:
    """Forwards' worth of work in ``op``'s backward (COMET Table 1): a matmul runs an
    input-gradient and a weight-gradient GEMM of the forward's flop each, one whose weight is
    ``frozen`` only the input gradient; attention does twice its forward; memory-bound ops move
    ``backward_scale`` times their bytes."""
    if op.kind == "elementwise":
        return op.backward_scale
    return 1.0 if op.kind == "matmul" and op.frozen else 2.0


def dense_flop(ops, names: set[str] | tuple[str, ...] | None = None, expert_scale: float = 1.0, backward: bool = False) -> float:
    """Flop of the matmul and attention ops (the count Megatron's Eq. 3 makes), optionally only
    those named, with routed-expert ops scaled by ``expert_scale``; ``backward``: of their
    backward (backward_work)."""
    return sum(
        op.flop * (expert_scale if op.expert else 1.0) * (backward_work(op) if backward else 1.0)
        for op in ops
        if op.kind in ("matmul", "attention") and (names is None or op.name in names)
    )


@dataclass(frozen=True)
class Block:
    """A repeated group of ops (a decoder layer) and how many times it repeats.

    Tensor-parallel regions (a column-parallel matmul up to the row-parallel one after it;
    Megatron-LM Fig. 4) that open and close in the block: each opens with a sequence-parallel
    all-gather and closes with a reduce-scatter, or an all-reduce without sequence parallelism.
    A decoder layer holds two whole regions (attention, MLP); one einsum of a block model
    (meshplan.workloads.transformer.block_einsums) may only open or only close one.
    """

    name: str
    ops: tuple[Op, ...]
    count: int
    tp_opens: int = 2
    tp_closes: int = 2

    @property
    def params(self) -> float:
        return sum(op.params for op in self.ops)

    @property
    def flop(self) -> float:
        return sum(op.flop for op in self.ops)


@dataclass(frozen=True)
class Graph:
    """A lowered model for one micro-batch: blocks kept as (block, count), never unrolled.

    ``head`` runs once before the layers (embedding), ``tail`` once after (final norm, logits,
    loss). ``blocks`` are the decoder layers in order, a block per run of one kind (a dense model has one; an
    MoE model its leading dense layers, then its MoE layers; a model with a sliding window its
    windowed and global layers as they alternate), a kind's blocks all of the same name and ops.
    """

    head: Block
    blocks: tuple[Block, ...]
    tail: Block
    tokens: int  # tokens in one micro-batch
    seq_len: int
    activation_bytes: float  # bytes per activation element (2 for bf16/fp16)

    @property
    def layer(self) -> Block:
        """The one layer kind of a model that has a single kind."""
        kinds = [b for b in self.blocks if b.count]
        if len(kinds) != 1:
            raise ValueError(f"this graph has {len(kinds)} layer kinds; use .blocks")
        return kinds[0]

    @property
    def params(self) -> float:
        return self.head.params + sum(b.params * b.count for b in self.blocks) + self.tail.params

    @property
    def forward_flop(self) -> float:
        return self.head.flop + sum(b.flop * b.count for b in self.blocks) + self.tail.flop

    @property
    def forward_flop_per_sample(self) -> float:
        """MAD Max Table 2's "FLOPs per sample": the forward flop over the graph's samples
        (``tokens / seq_len``; a DLRM graph is one sample)."""
        return self.forward_flop * self.seq_len / self.tokens
