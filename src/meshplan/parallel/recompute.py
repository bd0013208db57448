"""Activation recompute: which ops a decoder layer re-runs in backward, and the activations it
keeps, under each policy (Plan.recompute, Plan.selective_recompute; layer_recompute).

torchtitan's per-op policy ("op") saves the outputs of matmuls, attention and reduce-scatters,
except every second matmul of a transformer block, and recomputes every other op
(parallelisms/parallelize_llama.py, _save_list and _apply_ac_to_transformer_block, commit
6b03ffa3, Dec 2024; today's torchtitan/distributed/activation_checkpoint.py SelectiveAC keeps the
rule). Megatron-Core's fine-grained policy ("modules") re-runs the modules it lists
(RECOMPUTE_MODULES). JAX's jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims ("dots",
MaxText's remat_policy "minimal", MaxText/layers/models.py) saves the outputs of the matmuls
whose operands have no batch dimension, the layer's projections, and re-runs every other op:
norms, activations, residual adds and attention, whose score and value products are batched.
"""

from __future__ import annotations

from meshplan.parallel.quantize import quantized_scale
from meshplan.parallel.shard import ShardedOp, saved_bytes


def _linears(op: ShardedOp, model) -> tuple[float, ...]:
    """Shares of a matmul op's output width in the separate linear layers torchtitan's Llama
    runs it as, in forward order (torchtitan models/llama/model.py: wq, wk, wv; w1, w3 of a
    gated FFN); any other matmul is one linear."""
    name = op.op.name
    if name == "qkv":
        q, kv = model.num_attention_heads * model.dim_per_head, model.kv_heads * model.dim_per_head
        return (q / (q + 2 * kv), kv / (q + 2 * kv), kv / (q + 2 * kv))
    if name.endswith("_up") and not op.op.expert and model.ffn_matrices == 3:
        return (0.5, 0.5)
    return (1.0,)


def _saved_linear_shares(ops: tuple[ShardedOp, ...], model) -> dict[str, float]:
    """torchtitan's per-op policy over one layer's matmuls: the n-th linear of the forward is
    saved when n is odd and recomputed when even (the mm counter of _apply_ac_to_transformer_block,
    torchtitan commit 6b03ffa3; torchtitan/distributed/activation_checkpoint.py SelectiveAC
    today); the share of each matmul op's output that is saved."""
    saved: dict[str, float] = {}
    n = 0
    for op in ops:
        if op.op.kind != "matmul":
            continue
        for share in _linears(op, model):
            n += 1
            saved[op.op.name] = saved.get(op.op.name, 0.0) + (share if n % 2 else 0.0)
    return saved


def op_recompute(ops: tuple[ShardedOp, ...], model) -> tuple[tuple[str, float], ...]:
    """What torchtitan's per-op selective checkpointing re-runs in backward: every op that is
    not a matmul or attention (norms, activations, residual adds; their outputs are not kept),
    and of the matmuls every second linear layer (_saved_linear_shares), (op, share) pairs.
    Attention (its output and log-sum-exp) and the embedding are kept."""
    saved = _saved_linear_shares(ops, model)
    out = []
    for op in ops:
        if op.op.kind == "matmul":
            if saved[op.op.name] < 1.0:
                out.append((op.op.name, 1.0 - saved[op.op.name]))
        elif op.op.kind not in ("attention", "lookup"):
            out.append((op.op.name, 1.0))
    return tuple(out)


def op_recompute_kept_bytes(ops: tuple[ShardedOp, ...], model, layer_input: float, act_bytes: float, sp_split: int) -> float:
    """Activations one layer keeps per micro-batch under the per-op policy: its input (the
    checkpoint's) and the outputs of what is saved, the saved linears' and attention's (output
    and fp32 log-sum-exp); row-parallel outputs after their reduce-scatter with sequence
    parallelism (torchtitan saves reduce_scatter_tensor outputs), whole otherwise."""
    saved = _saved_linear_shares(ops, model)
    kept = layer_input
    for op in ops:
        if op.op.kind == "matmul":
            split = sp_split if op.op.shard_dim == "k" else 1
            kept += saved[op.op.name] * op.m * op.n * act_bytes / split
        elif op.op.kind == "attention" and op.attention is not None:
            a = op.attention
            kept += a.batch * a.seq * a.heads * (a.v_dim * act_bytes + 4.0)
    return kept


def dots_recompute(ops: tuple[ShardedOp, ...]) -> tuple[tuple[str, float], ...]:
    """What JAX's checkpoint_dots_with_no_batch_dims re-runs in backward: every op but the
    projections (matmuls) and the embedding lookup, attention's forward included."""
    return tuple((op.op.name, 1.0) for op in ops if op.op.kind not in ("matmul", "lookup"))


def dots_kept_bytes(ops: tuple[ShardedOp, ...], layer_input: float, act_bytes: float, sp_split: int) -> float:
    """Activations one layer keeps per micro-batch under "dots": its input (the checkpoint's)
    and every projection's output, a row-parallel one split over the tensor-parallel ranks as
    its sequence-parallel consumer holds it. An MoE layer's expert GEMMs count as projections
    here; JAX implementations that batch them over the experts would re-run them (not modelled)."""
    kept = layer_input
    for op in ops:
        if op.op.kind == "matmul":
            kept += op.m * op.n * act_bytes / (sp_split if op.op.shard_dim == "k" else 1)
    return kept


#: Megatron-Core's fine-grained selective recompute (recompute_granularity "selective" with
#: recompute_modules, TransformerConfig; megatron/core/transformer/transformer_layer.py and
#: multi_latent_attention.py checkpoint each listed module and discard its output): per module,
#: the ops it re-runs in backward and the saved tensors it no longer keeps (the module's input is
#: its checkpoint and stays). core_attn: the attention core, keeping q, k, v; layernorm: the two
#: norms, whose outputs (their consumers' inputs) are discarded; mla_up_proj: multi-latent
#: attention's up-projections, whose outputs (the attention's q and k/v) are rebuilt from the
#: latents; mlp: a dense layer's MLP; moe_act: the experts' activation; shared_experts: the
#: shared experts' MLP. "moe" (the whole MoE layer, its all-to-alls re-run too) is not modelled.
RECOMPUTE_MODULES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "core_attn": (("attention",), ("softmax_lse", "softmax_out", "dropout_mask", "dropout_out")),
    "layernorm": (("norm_attn", "norm_mlp"), ("qkv_in", "q_in", "q_down_in", "kv_down_in", "mlp_up_in", "router_in", "shared_up_in")),
    "mla_up_proj": (("q_up", "kv_up"), ("q", "kv")),
    "mlp": (("mlp_up", "mlp_activation", "mlp_down"), ("mlp_activation_in", "mlp_down_in")),
    "moe_act": (("experts_activation",), ("experts_down_in",)),
    "shared_experts": (("shared_up", "shared_activation", "shared_down"), ("shared_activation_in", "shared_down_in")),
}


def module_recompute(ops: tuple[ShardedOp, ...], modules: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """The ops of ``modules`` (RECOMPUTE_MODULES) that a layer of ``ops`` has, each re-run whole
    in backward, in forward order."""
    names = {name for module in modules for name in RECOMPUTE_MODULES[module][0]}
    return tuple((op.op.name, 1.0) for op in ops if op.op.name in names)


def module_dropped(ops: tuple[ShardedOp, ...], modules: tuple[str, ...]) -> frozenset[str]:
    """The saved tensors (workloads.ops.Saved names) that ``modules`` no longer keep in a layer
    of ``ops``: only those of modules the layer has (mla_up_proj drops nothing from a layer
    without latent attention)."""
    present = {op.op.name for op in ops}
    return frozenset(name for module in modules if present & set(RECOMPUTE_MODULES[module][0])
                     for name in RECOMPUTE_MODULES[module][1])


#: the attention core's saved inputs (workloads.transformer) that FP8 attention keeps in FP8:
#: Transformer Engine's FP8 DotProductAttention saves the quantized Q, K and V for its backward
FP8_ATTENTION_SAVED = ("q", "k", "v", "kv")


def layer_recompute(plan, model, block, ops: tuple[ShardedOp, ...], x_bytes: float,
                    act_bytes: float) -> tuple[tuple[tuple[str, float], ...], float, float]:
    """(ops re-run in backward as (op, share of its forward), bytes one layer keeps per
    micro-batch, bytes it would keep without recompute) of a layer ``block`` sharded to ``ops``
    under ``plan``'s recompute policy: full keeps only the layer input (Korthikanti et al. 2022:
    2sbh); selective re-runs the attention core (nothing under flash attention, which keeps no
    scores), torchtitan's per-op policy, Megatron-Core's modules, or whole blocks as full does
    (fms-fsdp's selective_checkpointing at its default, every block)."""
    tp, cp = plan.tp, plan.cp
    sp = plan.sequence_parallel and tp > 1
    quantized = quantized_scale(plan.precision)
    # FP8 attention keeps the FP8 queries, keys and values it ran on for its backward
    fp8_qkv = frozenset(FP8_ATTENTION_SAVED) if plan.fp8_attention else frozenset()

    def kept_by(drop_scores: bool, dropped: frozenset[str] = frozenset()) -> float:
        def kept(op, in_fp8: bool) -> float:
            """The bytes ``op`` keeps of its saved tensors that FP8 attention holds in FP8 (a byte a
            value), or of the others."""
            scale = 1.0 / act_bytes if in_fp8 else quantized if op.low_precision else 1.0
            return saved_bytes(tuple(s for s in op.saved if s.name not in dropped and (s.name in fp8_qkv) == in_fp8),
                               tp, cp, sp, drop_scores, scale)
        return sum(kept(op, False) + (kept(op, True) if fp8_qkv else 0.0) for op in block.ops)

    full = kept_by(drop_scores=False)
    policy = "full" if plan.whole_layer_recompute else plan.selective_recompute if plan.recompute == "selective" else plan.recompute
    if policy == "full":
        return tuple((op.op.name, 1.0) for op in ops), x_bytes / (tp if sp else 1), full
    if policy == "op":
        kept = op_recompute_kept_bytes(ops, model, x_bytes / cp / (tp if sp else 1), act_bytes, tp if sp else 1)
        return op_recompute(ops, model), kept, full
    if policy == "dots":
        return dots_recompute(ops), dots_kept_bytes(ops, x_bytes / cp / (tp if sp else 1), act_bytes, tp if sp else 1), full
    if policy == "modules":
        return module_recompute(ops, plan.recompute_modules), kept_by(False, module_dropped(ops, plan.recompute_modules)), full
    selective = policy == "attention"
    return ((("attention", 1.0),) if selective and not plan.flash_attention else ()), kept_by(drop_scores=selective), full


def whole_recompute_share(plan, layers: int) -> float:
    """Of a device's ``layers``, the share that re-runs whole in backward: none, all under
    whole-layer recompute, or the first recompute_layers of each model chunk (Plan.recompute_layers)."""
    if not plan.whole_layer_recompute:
        return 0.0
    if plan.recompute_layers is None:
        return 1.0
    units = max(layers, 1)
    return min(plan.recompute_layers * plan.virtual_pipeline_stages, units) / units


def zero3_gathers_per_layer(plan, layers_per_device: int) -> float:
    """ZeRO-3 weight gathers a decoder layer takes per micro-batch, on average over the device's
    layers: before its forward and its backward, and again before the recompute of the layers
    that re-run where the framework gathers for it (Plan.zero3_recompute_gather)."""
    return 2.0 + (whole_recompute_share(plan, layers_per_device) if plan.zero3_recompute_gather else 0.0)
