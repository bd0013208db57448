"""One device's share of an op: its flop, bytes, GEMM shape and saved activations under tensor,
context and sequence parallelism (Megatron-LM; Korthikanti et al. 2022), and the casts FP8
training adds around it."""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.parallel.memory import LORA_BASE_BYTES
from meshplan.parallel.quantize import FP8Scaling, gemm_cast_bytes
from meshplan.workloads.ops import AttentionShape, Op, Saved


@dataclass(frozen=True)
class ShardedOp:
    """An op's share on one device, for one micro-batch."""

    op: Op
    flop: float
    bytes: float
    m: float
    k: float
    n: float
    attention: AttentionShape | None = None  # attention ops: the shape of this device's call
    # FP8/FP4 GEMMs: HBM bytes of quantizing the input (forward) and the output gradient
    # (backward), meshplan.parallel.quantize
    cast_bytes: tuple[float, float] = (0.0, 0.0)
    # HBM bytes of adding this op's weight gradient into the step's after each micro-batch's
    # backward, outside the GEMM (Plan.grad_accumulation)
    grad_bytes: float = 0.0


def shard_op(op: Op, tp: int, cp: int, sp: bool, expert_tp: int | None = None, precision: str = "bf16",
             scaling: FP8Scaling = "delayed") -> ShardedOp:
    """One device's share of ``op``. Routed-expert matmuls split their weights ``expert_tp``
    ways and their tokens over the rest of tp (parallel.mesh.expert_mesh); in FP8/FP4 plans
    low-precision GEMMs carry their casts (meshplan.parallel.quantize)."""
    split = {"tp": tp, "sp": tp if sp else 1, "none": 1}[op.shard]
    if op.kind == "matmul":
        weight_split = expert_tp if op.expert and expert_tp else tp
        m, k, n = op.m / cp / (tp // weight_split), op.k, op.n
        if op.shard_dim == "n":
            n /= weight_split
        elif op.shard_dim == "k":
            k /= weight_split
        return ShardedOp(op, 2.0 * m * k * n, 0.0, m, k, n, cast_bytes=gemm_cast_bytes(op, m, k, n, precision, scaling))
    if op.kind == "lookup":  # vocab-parallel: every rank writes the full (masked) output
        return ShardedOp(op, 0.0, op.bytes / cp, 0, 0, 0)
    shape = _shard_attention(op.attention, tp, cp) if op.attention is not None else None
    return ShardedOp(op, op.flop / (split * cp), op.bytes / (split * cp), 0, 0, 0, shape)


#: DeepSpeed's BF16_Optimizer per parameter and micro-batch (runtime/pipe/engine.py,
#: _exec_backward_pass: clear_lp_grads before the backward, update_hp_grads after; runtime/
#: bf16_optimizer.py, _update_hp_grad): zeroing the bf16 gradient (2 B written), autograd adding
#: the new gradient into it (4 read, 2 written), its fp32 copy (2 read, 4 written) and the add
#: into the fp32 gradient (8 read, 4 written)
FP32_ADD_BYTES_PER_PARAM = 26.0


def with_grad_accumulation(ops: tuple[ShardedOp, ...], plan, tp: int, ep: int = 1,
                           expert_tp: int | None = None) -> tuple[ShardedOp, ...]:
    """``ops`` with the bytes of accumulating their weight gradients outside the GEMMs, where the
    plan does (Plan.grad_fp32_add); frozen weights take no gradient."""
    if not plan.grad_fp32_add:
        return ops
    return tuple(replace(o, grad_bytes=FP32_ADD_BYTES_PER_PARAM * param_share(o.op, tp, ep, expert_tp))
                 if o.op.kind in ("matmul", "lookup") and o.op.params and not o.op.frozen else o for o in ops)


#: HBM bytes per weight of dequantizing a QLoRA base weight for one GEMM (bitsandbytes'
#: MatMul4Bit: dequantize_4bit, then the 16-bit GEMM): its NF4 code and constants read
#: (memory.LORA_BASE_BYTES), the 16-bit weight written
NF4_DEQUANT_BYTES = LORA_BASE_BYTES["nf4"] + 2.0


def with_dequantized_base(ops: tuple[ShardedOp, ...], task, tp: int, ep: int = 1,
                          expert_tp: int | None = None) -> tuple[ShardedOp, ...]:
    """``ops`` with the dequantization of an NF4 LoRA base (Task.lora_base_dtype nf4: QLoRA,
    Dettmers et al. 2023) before each GEMM that reads the base weight: bitsandbytes' MatMul4Bit
    dequantizes it in the forward and again for the input gradient (bitsandbytes/autograd/
    _functions.py), so a frozen base matmul carries a weight's dequant in each pass. Its shard
    on this device, a memory-bound kernel like an FP8 cast (ShardedOp.cast_bytes)."""
    if task.kind != "finetune" or not task.lora_rank or task.lora_base_dtype != "nf4":
        return ops
    out = []
    for o in ops:
        if o.op.kind == "matmul" and o.op.frozen and o.op.params:
            weight = NF4_DEQUANT_BYTES * param_share(o.op, tp, ep, expert_tp)
            o = replace(o, cast_bytes=(o.cast_bytes[0] + weight, o.cast_bytes[1] + weight))
        out.append(o)
    return tuple(out)


#: bytes per weight of casting an fp32 weight to 16 bits for a GEMM under autocast (4 + 2), and
#: of its 16-bit gradient back to fp32 (2 + 4)
AUTOCAST_WEIGHT_BYTES = 6.0


def with_autocast_weights(ops: tuple[ShardedOp, ...], cast_frozen: bool, tp: int, ep: int = 1,
                          expert_tp: int | None = None) -> tuple[ShardedOp, ...]:
    """``ops`` under autocast over fp32 weights (the residual stream kept fp32, workloads.
    elementwise.autocast_casts_op): each GEMM casts its weight to 16 bits in every forward
    (autocast caches a cast for one forward only; a recomputed forward casts again) and the
    weight's 16-bit gradient back to fp32 in its backward, a memory-bound kernel each like an
    FP8 cast (ShardedOp.cast_bytes); tests/test_fusion.py counts 6 and 6 bytes a weight with
    PyTorch's dispatcher. A frozen weight (LoRA's base) takes no gradient, and none at all
    where it is stored in its own precision (not ``cast_frozen``: Task.lora_base_dtype). The
    output layer of tied embeddings casts the embedding's weight."""
    out = []
    for o in ops:
        if o.op.kind == "matmul" and (cast_frozen or not o.op.frozen):
            weights = param_share(o.op, tp, ep, expert_tp) if o.op.expert else o.k * o.n
            backward = 0.0 if o.op.frozen else AUTOCAST_WEIGHT_BYTES * weights
            o = replace(o, cast_bytes=(o.cast_bytes[0] + AUTOCAST_WEIGHT_BYTES * weights, o.cast_bytes[1] + backward))
        out.append(o)
    return tuple(out)


def _shard_attention(shape: AttentionShape, tp: int, cp: int) -> AttentionShape:
    """One device's attention call: heads split tp ways (key/value heads too, at least one per
    rank: Megatron replicates them when tp exceeds them); with context parallelism each rank
    holds seq/cp queries and, with Megatron's load-balanced causal split (two chunks per rank,
    Megatron-Core context parallelism), computes on 1/cp of the causal work: seq/cp queries that
    come last of (seq + seq/cp)/2 keys do exactly that (kernels.keys_per_query)."""
    seq, kv = shape.seq / cp, shape.kv
    if cp > 1:
        kv = (shape.kv + seq) / 2.0 if shape.causal else shape.kv
    return replace(shape, heads=shape.heads / tp, kv_heads=max(shape.kv_heads / tp, 1.0), seq=seq, kv=kv,
                   calls=shape.calls * cp)


def saved_bytes(saved: tuple[Saved, ...], tp: int, cp: int, sp: bool, drop_scores: bool, scale: float = 1.0) -> float:
    total = 0.0
    for s in saved:
        if drop_scores and s.attention_scores:
            continue
        total += s.bytes / ({"tp": tp, "sp": tp if sp else 1, "none": 1}[s.shard] * cp)
    return total * scale


def param_share(op: Op, tp: int, ep: int = 1, expert_tp: int | None = None) -> float:
    """Parameters of ``op`` on one device: matmuls and the embedding split over tp (routed
    experts over expert_tp, default tp, and ep); norms and the router replicate."""
    if op.expert:
        return op.params / (expert_tp or tp) / ep
    return op.params / tp if op.kind in ("matmul", "lookup") and op.shard == "tp" else op.params
