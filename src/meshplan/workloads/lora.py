"""LoRA: a lowered graph with its base weights frozen and low-rank adapters beside chosen linears.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685,
Sec. 4.1) keeps every pretrained weight W (d_in x d_out) frozen and learns h = x·W + x·A·B with
A (d_in x r) and B (r x d_out), r small. So in a step:

- every base GEMM runs forward and, since gradients flow back to the adapters of the layers
  below, its input-gradient GEMM in backward, never its weight gradient (``Op.frozen``);
- each adapted linear adds two GEMMs, x·A (t x d_in x r) and (x·A)·B (t x r x d_out), each with
  its forward, input-gradient and weight-gradient GEMMs, plus the add of the two outputs;
- A's weight gradient reads x, which the base GEMM already keeps for backward; B's reads x·A
  (t x r), saved beside it.

Tensor parallelism splits the adapters as NeMo's ``ParallelLinearAdapter`` does (the MLPerf
Training Llama 2 70B LoRA reference): A's work over the tp ranks the way the base's input is
split (along d_in beside a row-parallel base, along r beside a column-parallel one), B's along
d_out (column-parallel). The adapters' own small collectives (an r-wide gather or reduce per
adapter) are not modelled. Adapters run in 16 bits (NeMo builds them from Megatron's parallel
linear layers, not Transformer Engine's FP8 modules); adapter dropout is not modelled. Routed
MoE experts get no adapters (``lora_targets`` names dense and shared-expert linears).
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.workloads.ops import Block, Graph, Op, Saved
from meshplan.workloads.transformer import _matmul, lower

#: the linear layers (op names) each ``Task.lora_targets`` value adapts; multi-head latent
#: attention's projections (q, q_down, q_up, kv_down, kv_up) count as query/key/value
_QKV = ("qkv", "q", "q_down", "q_up", "kv_down", "kv_up")
_MLP = ("mlp_up", "mlp_down", "shared_up", "shared_down")
TARGETS = {
    "qkv": _QKV,
    "attention": _QKV + ("proj",),
    "mlp": _MLP,
    "all": _QKV + ("proj",) + _MLP,
}


def adapter_ops(op: Op, rank: int, act_bytes: float) -> tuple[Op, ...]:
    """The adapter beside base matmul ``op``: x·A, (x·A)·B and the add into the base's output."""
    t, d_in, d_out = op.m, op.k, op.n
    row_parallel = op.shard_dim == "k"
    a_split = "k" if row_parallel else ("n" if op.shard_dim else "")
    a_out_shard = "tp" if a_split == "n" else "none"
    b_split = "n" if op.shard_dim else ""
    return (
        _matmul(f"{op.name}_lora_a", t, d_in, rank, a_split, d_in * rank, (), low_precision=False),
        _matmul(f"{op.name}_lora_b", t, rank, d_out, b_split, rank * d_out,
                (Saved(f"{op.name}_lora_b_in", t * rank * act_bytes, a_out_shard),), low_precision=False),
        Op(f"{op.name}_lora_add", "elementwise", "tp" if op.shard_dim == "n" else "sp", flop=t * d_out,
           bytes=3.0 * t * d_out * act_bytes, memory_class="add"),
    )


def with_adapters(graph: Graph, rank: int, targets: str, act_bytes: float) -> Graph:
    """``graph`` with every decoder-layer and output-layer weight frozen and an adapter of rank
    ``rank`` after each ``targets`` linear of every decoder layer. The embedding is left as it is
    (``Task.freeze_embedding`` decides whether it trains)."""
    names = TARGETS[targets]

    def adapt(block: Block) -> Block:
        ops: list[Op] = []
        for op in block.ops:
            ops.append(replace(op, frozen=True))
            if op.kind == "matmul" and op.name in names and not op.expert:
                ops += adapter_ops(op, rank, act_bytes)
        return replace(block, ops=tuple(ops))

    tail = replace(graph.tail, ops=tuple(replace(op, frozen=True) for op in graph.tail.ops))
    return replace(graph, blocks=tuple(adapt(b) for b in graph.blocks), tail=tail)


def lower_task(model, task, micro_batch: int, seq_len: int, act_bytes: float, flash_attention: bool,
               fused_loss: bool = False, eager: bool = False, autocast: bool = True, fp32_stream: bool = False) -> Graph:
    """The training graph of one micro-batch for ``task`` (a specs.task.Task): the model lowered
    (meshplan.workloads.transformer.lower), with adapters and frozen base weights for LoRA."""
    graph = lower(model, micro_batch, seq_len, act_bytes, flash_attention, fused_loss=fused_loss, eager=eager, autocast=autocast,
                  fp32_stream=fp32_stream)
    return with_adapters(graph, task.lora_rank, task.lora_targets, act_bytes) if task.lora_rank else graph


def trainable_params(graph: Graph, embedding_trains: bool, frozen_layers: int = 0) -> float:
    """Parameters of the whole model that get gradients and optimizer state: those of ops whose
    weights are not ``frozen``, except in the first ``frozen_layers`` decoder layers."""
    def live(block: Block) -> float:
        return sum(op.params for op in block.ops if not op.frozen)

    total = (live(graph.head) if embedding_trains else 0.0) + live(graph.tail)
    first = 0
    for block in graph.blocks:
        total += live(block) * (block.count - min(max(frozen_layers - first, 0), block.count))
        first += block.count
    return total
