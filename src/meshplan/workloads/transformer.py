"""Lower a decoder-only transformer (dense or mixture-of-experts) to ops for one micro-batch.

Shapes follow Megatron-LM (Shoeybi et al. 2019; Narayanan et al. SC21) and COMET Table 2. Saved
tensors follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Section 4.1: per layer 34·s·b·h + 5·a·s²·b bytes for GPT shapes in 16-bit precision, of
which 10·s·b·h are outside the tensor-parallel region (norms, dropout masks, block inputs).
MoE layers follow Megatron-Core's MoE (router, token dispatch, grouped expert GEMMs, combine);
multi-head latent attention follows DeepSeek-V2 (Liu et al. 2024), Sec. 2.1.
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.specs.model import TransformerModel
from meshplan.workloads.elementwise import (
    MASK_BYTES, OPMATH_BYTES, activation_op, autocast_casts_op, cross_entropy_op, norm_op, residual_op, rotary_op, standalone_casts,
)
from meshplan.workloads.ops import AttentionShape, Block, Graph, Op, Saved

def _matmul(name: str, m: float, k: float, n: float, shard_dim: str, params: float, saved: tuple[Saved, ...], expert: bool = False,
            low_precision: bool = True, input_fused: bool = False, grad_fused: bool = False) -> Op:
    """A GEMM; ``saved`` is its input, kept for the weight gradient. ``input_fused``: its input
    comes out of a norm or an activation; ``grad_fused``: its output gradient out of an
    activation's backward (where FP8 training fuses the casts, ``Op.input_fused``)."""
    return Op(
        name=name,
        kind="matmul",
        shard="tp" if shard_dim else "none",
        flop=2.0 * m * k * n,
        m=m,
        k=k,
        n=n,
        shard_dim=shard_dim,  # type: ignore[arg-type]
        params=params,
        saved=saved,
        expert=expert,
        low_precision=low_precision,
        input_fused=input_fused,
        grad_fused=grad_fused,
    )


def _attention_core(model, micro_batch, seq_len, kv_len, qk_width, v_width, kv_read_width, act_bytes, flash_attention,
                    kv_heads: int | None = None, window: int | None = None, cache_bytes: float | None = None) -> Op:
    """Scores and context of all heads: 2·b·s·kv·a·(d_qk + d_v) flop (4·b·s²·a·d for plain MHA;
    Megatron Eq. 3 counts the full square, no causal halving; a sliding ``window`` narrower than
    the keys counts its keys for each query instead). The op carries its shape (causal, as every
    decoder-only model), from which kernel models time it. Flash kernels read the keys of the
    queries' windows, a decoding step's last ``window``; an unfused kernel computes and masks
    the whole square. A serving step reads the cached keys and values at ``cache_bytes`` an
    element (Task.kv_cache_dtype), its own new ones at the activations'."""
    t = float(micro_batch * seq_len)
    a = model.num_attention_heads
    window = window if window is not None and window < kv_len else None
    keys = kv_len if window is None else window
    flop = 2.0 * micro_batch * seq_len * keys * (qk_width + v_width)
    scores = micro_batch * a * float(seq_len) * kv_len
    q_bytes, o_bytes = t * qk_width * act_bytes, t * v_width * act_bytes
    read = kv_len if window is None or not flash_attention else min(kv_len, seq_len + window - 1)
    cached = max(0.0, read - seq_len) if cache_bytes is not None else 0.0
    kv_bytes = micro_batch * kv_read_width * ((read - cached) * act_bytes + cached * (cache_bytes or 0.0))
    if flash_attention:
        # FlashAttention (Dao et al. 2022): reads Q, K, V and writes O once; keeps the softmax
        # log-sum-exp (fp32 per row) instead of the s² probabilities
        traffic = q_bytes + kv_bytes + o_bytes
        extra = (Saved("softmax_lse", t * a * 4.0, "tp"),)
    else:
        # unfused: scores written, softmax read+written, dropout read+written with its mask,
        # probabilities read by the context matmul (about 6 passes over a·s²·b 16-bit values)
        traffic = q_bytes + kv_bytes + o_bytes + 6.0 * scores * act_bytes
        extra = (
            Saved("softmax_out", scores * act_bytes, "tp", attention_scores=True),
            Saved("dropout_mask", scores * MASK_BYTES, "tp", attention_scores=True),
            Saved("dropout_out", scores * act_bytes, "tp", attention_scores=True),
        )
    shape = AttentionShape(
        batch=micro_batch, heads=a, kv_heads=kv_heads or a, seq=seq_len, kv=kv_len,
        qk_dim=qk_width / a, v_dim=v_width / a, causal=True, flash=flash_attention, window=window,
        kv_element_bytes=cache_bytes if cached else None,
    )
    return Op("attention", "attention", "tp", flop=flop, bytes=traffic, saved=extra, attention=shape)


def attention_ops(model: TransformerModel, micro_batch: int, seq_len: int, act_bytes: float, flash_attention: bool, kv_len: int,
                  eager: bool = False, window: int | None = None, fp32_stream: bool = False,
                  cache_bytes: float | None = None) -> tuple[Op, ...]:
    """Norm, projections, rotary embeddings and attention core; MHA/GQA/MQA or multi-head latent
    attention, over the whole prefix or a sliding ``window``. ``eager``: the norms and rotary
    embeddings run as PyTorch eager runs the reference Llama code (norm_op, rotary_op);
    ``fp32_stream``: the residual stream and the norm are fp32 under autocast, and the
    projections cast its output (autocast_casts_op: Hugging Face's q, k and v projections each,
    GPT-2's fused c_attn once; latent attention's query and latent projections)."""
    t = float(micro_batch * seq_len)
    h = float(model.hidden_size)
    a = model.num_attention_heads
    x = t * h * act_bytes
    ops = [norm_op("norm_attn", t, h, OPMATH_BYTES if fp32_stream else act_bytes, model, eager)]
    if fp32_stream:
        ops.append(autocast_casts_op("norm_attn_casts", t, h, 2 if model.mla else 3 if model.rotary else 1))
    if model.mla:
        m = model.mla
        qk, v = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
        if m.q_lora_rank:
            ops += [
                _matmul("q_down", t, h, m.q_lora_rank, "", h * m.q_lora_rank, (Saved("q_down_in", x, "sp"),), input_fused=True),
                norm_op("q_norm", t, m.q_lora_rank, act_bytes, model, eager, shard="none", keep=False),
                _matmul("q_up", t, m.q_lora_rank, a * qk, "n", m.q_lora_rank * a * qk, (Saved("q_up_in", t * m.q_lora_rank * act_bytes, "none"),),
                        input_fused=True),
            ]
        else:
            ops.append(_matmul("q", t, h, a * qk, "n", h * a * qk, (Saved("q_in", x, "sp"),), input_fused=True))
        latent = m.kv_lora_rank + m.qk_rope_head_dim
        ops += [
            _matmul("kv_down", t, h, latent, "", h * latent, (Saved("kv_down_in", x, "sp"),), input_fused=True),
            norm_op("kv_norm", t, m.kv_lora_rank, act_bytes, model, eager, shard="none", keep=False),
            _matmul("kv_up", t, m.kv_lora_rank, a * (m.qk_nope_head_dim + v), "n", m.kv_lora_rank * a * (m.qk_nope_head_dim + v),
                    (Saved("kv_up_in", t * m.kv_lora_rank * act_bytes, "none"),), input_fused=True),
        ]
        if model.rotary:  # the decoupled rotary part of each query head and the one shared key
            ops.append(rotary_op(t, (a + 1) * m.qk_rope_head_dim, act_bytes, eager))
        # training and prefill read the per-head keys and values; decoding reads the cached latent
        kv_read = a * (qk + v) if kv_len == seq_len else latent
        core = _attention_core(model, micro_batch, seq_len, kv_len, a * qk, a * v, kv_read, act_bytes, flash_attention,
                               window=window, cache_bytes=cache_bytes)
        saved = (Saved("q", t * a * qk * act_bytes, "tp"), Saved("kv", t * a * (qk + v) * act_bytes, "tp"))
        ops.append(replace(core, saved=saved + core.saved))
        ops.append(_matmul("proj", t, a * v, h, "k", a * v * h, (Saved("proj_in", t * a * v * act_bytes, "tp"),)))
    else:
        d, kv = model.dim_per_head, model.kv_heads
        q_width, kv_width = float(a * d), float(kv * d)
        ops.append(_matmul("qkv", t, h, q_width + 2 * kv_width, "n", h * (q_width + 2 * kv_width) + q_width + 2 * kv_width, (Saved("qkv_in", x, "sp"),),
                           input_fused=True))
        if model.rotary:
            ops.append(rotary_op(t, q_width + kv_width, act_bytes, eager))
        core = _attention_core(model, micro_batch, seq_len, kv_len, q_width, q_width, 2 * kv_width, act_bytes, flash_attention, kv,
                               window, cache_bytes)
        saved = (
            Saved("q", t * q_width * act_bytes, "tp"),
            Saved("k", t * kv_width * act_bytes, "tp"),
            Saved("v", t * kv_width * act_bytes, "tp"),
        )
        ops.append(replace(core, saved=saved + core.saved))
        ops.append(_matmul("proj", t, q_width, h, "k", q_width * h + h, (Saved("proj_in", t * q_width * act_bytes, "tp"),)))
    ops.append(residual_op("residual_attn", t, h, act_bytes, fp32_stream))
    return standalone_casts(tuple(ops)) if eager else tuple(ops)


def _ffn_ops(model: TransformerModel, prefix: str, tokens: float, ffn: int, act_bytes: float, experts: int = 0,
             eager: bool = False, autocast: bool = True) -> tuple[Op, ...]:
    """Up (and gate) projection, activation, down projection over ``tokens`` tokens; with
    ``experts`` > 0, the grouped GEMMs of that many routed experts (their weights, one token
    stream)."""
    copies = max(experts, 1)
    h, f = float(model.hidden_size), float(ffn)
    up_width = (model.ffn_matrices - 1) * f  # gate and up projections are fused (SwiGLU: 2f)
    x = tokens * h * act_bytes
    return (
        _matmul(f"{prefix}_up", tokens, h, up_width, "n", copies * (h * up_width + up_width), (Saved(f"{prefix}_up_in", x, "sp"),), experts > 0,
                input_fused=experts == 0, grad_fused=True),
        activation_op(model, prefix, tokens, f, act_bytes, eager, autocast),
        _matmul(f"{prefix}_down", tokens, f, h, "k", copies * (f * h + h), (Saved(f"{prefix}_down_in", tokens * f * act_bytes, "tp"),), experts > 0,
                input_fused=True),
    )


def ffn_ops(model: TransformerModel, micro_batch: int, seq_len: int, act_bytes: float, moe: bool, eager: bool = False,
            autocast: bool = True, fp32_stream: bool = False) -> tuple[Op, ...]:
    """Norm, the FFN (dense, or router + routed and shared experts), residual. ``autocast``: 16-bit
    activations from fp32 weights under autocast (activation_op); ``fp32_stream``: the residual
    stream and the norm stay fp32 there, and the FFN's input projections cast the norm's output
    (a gated FFN's gate and up projections each; an MoE layer's router, and its experts' input
    projections each routed copy, as Hugging Face's experts read the tokens routed to them)."""
    t = float(micro_batch * seq_len)
    h = float(model.hidden_size)
    x = t * h * act_bytes
    ops = [norm_op("norm_mlp", t, h, OPMATH_BYTES if fp32_stream else act_bytes, model, eager)]
    if fp32_stream:
        gated = model.ffn_matrices == 3
        projections = 2 if gated else 1
        consumers = 1 + round(model.moe.top_k * model.moe.routed_factor) * projections if moe else projections
        ops.append(autocast_casts_op("norm_mlp_casts", t, h, consumers))
    if not moe:
        ops += _ffn_ops(model, "mlp", t, model.ffn_hidden_size, act_bytes, eager=eager, autocast=autocast)
    else:
        m = model.moe
        routed = t * m.top_k * m.routed_factor  # token copies the busiest device's experts take
        ops += [
            _matmul("router", t, h, m.num_experts, "", h * m.num_experts, (Saved("router_in", x, "sp"),), low_precision=False),
            Op("router_topk", "elementwise", "sp", flop=5.0 * t * m.num_experts, bytes=2.0 * t * m.num_experts * 4.0, memory_class="softmax"),
            # permute token copies into expert order before dispatch, and back after combine
            Op("dispatch_permute", "elementwise", "sp", bytes=2.0 * t * m.top_k * h * act_bytes),
            *_ffn_ops(model, "experts", routed, m.expert_ffn_hidden_size, act_bytes, experts=m.num_experts, eager=eager, autocast=autocast),
            Op("combine_unpermute", "elementwise", "sp", flop=2.0 * t * m.top_k * h, bytes=2.0 * t * m.top_k * h * act_bytes,
               saved=(Saved("combine_weights", t * m.top_k * 4.0, "sp"),)),
        ]
        if m.shared_experts:
            ops += _ffn_ops(model, "shared", t, m.shared_experts * m.expert_ffn_hidden_size, act_bytes, eager=eager, autocast=autocast)
    ops.append(residual_op("residual_mlp", t, h, act_bytes, fp32_stream))
    return standalone_casts(tuple(ops)) if eager else tuple(ops)


def decoder_layer(
    model: TransformerModel, micro_batch: int, seq_len: int, act_bytes: float, flash_attention: bool,
    kv_len: int | None = None, moe: bool = False, eager: bool = False, autocast: bool = True, windowed: bool = False,
    fp32_stream: bool = False, cache_bytes: float | None = None,
) -> tuple[Op, ...]:
    """The ops of one decoder layer: attention block (through the model's sliding window if
    ``windowed``), then FFN block (MoE if ``moe``).

    ``seq_len`` tokens per sequence go through the layer; each attends to ``kv_len`` keys
    (default ``seq_len``; in decoding one new token attends to the whole KV cache).
    """
    kv_len = kv_len or seq_len
    window = model.sliding_window if windowed else None
    return (attention_ops(model, micro_batch, seq_len, act_bytes, flash_attention, kv_len, eager, window, fp32_stream, cache_bytes)
            + ffn_ops(model, micro_batch, seq_len, act_bytes, moe, eager, autocast, fp32_stream))


def layer_kinds(model: TransformerModel, kv_len: int) -> tuple[tuple[bool, bool, int], ...]:
    """(MoE, windowed, layers) of each run of like decoder layers, in model order: the leading
    dense layers, then MoE; layers whose sliding window is narrower than ``kv_len`` keys apart
    from those that attend to all of them (a window as wide as the keys changes nothing)."""
    if model.sliding_window is None or model.sliding_window >= kv_len:
        dense = model.dense_layers
        return tuple(run for run in ((False, False, dense), (True, False, model.num_layers - dense)) if run[2])
    runs: list[list] = []
    for layer in range(model.num_layers):
        kind = [bool(model.moe) and layer >= model.dense_layers,
                model.windowed(layer) and model.sliding_window < kv_len, 1]
        if runs and runs[-1][:2] == kind[:2]:
            runs[-1][2] += 1
        else:
            runs.append(kind)
    return tuple(tuple(run) for run in runs)


def layer_blocks(model: TransformerModel, micro_batch: int, seq_len: int, act_bytes: float, flash_attention: bool, kv_len: int | None = None,
                 eager: bool = False, mtp: bool = False, autocast: bool = True, fp32_stream: bool = False,
                 cache_bytes: float | None = None) -> tuple[Block, ...]:
    """The decoder layer kinds in model order, a block for each run of like layers with its count
    (dense first, then MoE; windowed and global layers apart: layer_kinds); with ``mtp`` the last
    kind counts the multi-token-prediction modules' layers too, which follow the
    decoder's (DeepSeek-V3 report Sec. 2.2: each module's transformer block is one more layer of
    the model's)."""
    ops: dict[tuple[bool, bool], tuple[Op, ...]] = {}
    blocks = []
    for moe, windowed, layers in layer_kinds(model, kv_len or seq_len):
        if (moe, windowed) not in ops:
            ops[moe, windowed] = decoder_layer(model, micro_batch, seq_len, act_bytes, flash_attention, kv_len, moe=moe, eager=eager,
                                               autocast=autocast, windowed=windowed, fp32_stream=fp32_stream, cache_bytes=cache_bytes)
        name = ("moe_layer" if moe else "dense_layer") + ("_windowed" if windowed else "")
        blocks.append(Block(name, ops[moe, windowed], layers))
    if mtp and model.mtp_layers:
        blocks[-1] = replace(blocks[-1], count=blocks[-1].count + model.mtp_layers)
    return tuple(blocks)


#: op kinds a pipeline may cut a block model before (the rack-scale study's "einsums")
EINSUM_KINDS = ("matmul", "attention")


def block_einsums(name: str, ops: tuple[Op, ...]) -> tuple[Block, ...]:
    """One attention or MLP block as pipeline units, once each: every einsum (a matmul or the
    attention core) with the elementwise ops after it; the ops before the first einsum (the
    norm) join it. The rack-scale energy/latency study's PP+TP puts each einsum on its own
    pipeline stage, tensor parallel within it (its Sec. III and Fig. 1c). The unit with the
    block's first column-parallel matmul opens its one tensor-parallel region, the unit with its
    row-parallel matmul closes it."""
    units: list[list[Op]] = []
    for op in ops:
        if op.kind in EINSUM_KINDS or not units:
            units.append([])
        units[-1].append(op)
    if len(units) > 1 and not any(op.kind in EINSUM_KINDS for op in units[0]):
        units[1] = units[0] + units[1]
        del units[0]
    first_parallel = next(i for i, unit in enumerate(units) if any(op.shard == "tp" for op in unit))
    return tuple(
        Block(f"{name}_{next(op.name for op in unit if op.kind in EINSUM_KINDS)}", tuple(unit), 1,
              tp_opens=int(i == first_parallel), tp_closes=int(any(op.kind == "matmul" and op.shard_dim == "k" for op in unit)))
        for i, unit in enumerate(units)
    )


def _mtp_ops(model: TransformerModel, depth: int, tokens: float, act_bytes: float, fused_loss: bool, eager: bool) -> tuple[Op, ...]:
    """A multi-token-prediction module's ops besides its decoder layer (layer_blocks counts that):
    the next tokens' embeddings (the shared table, which the last pipeline stage holds a copy of,
    as Megatron-Core's GPTModel builds its embedding where the MTP runs; tied, the stage's output
    weight is that table), RMSNorm of them and of the previous depth's hidden state, their
    concatenation projected from 2h to h, and after the layer the final norm and the shared
    output head and its loss (DeepSeek-V3 report Sec. 2.2, Eqs. 21-25)."""
    h, v = float(model.hidden_size), float(model.vocab_size)
    x = tokens * h * act_bytes
    name = f"mtp{depth}"
    return (
        Op(f"{name}_embedding", "lookup", "tp", bytes=2.0 * x, params=0.0 if model.tied_embeddings else v * h),
        norm_op(f"{name}_norm_embedding", tokens, h, act_bytes, model, eager),
        norm_op(f"{name}_norm_hidden", tokens, h, act_bytes, model, eager),
        _matmul(f"{name}_proj", tokens, 2.0 * h, h, "n", 2.0 * h * h, (Saved(f"{name}_proj_in", 2.0 * x, "sp"),)),
        norm_op(f"{name}_norm_final", tokens, h, act_bytes, model, eager),
        _matmul(f"{name}_logits", tokens, h, v, "n", 0.0, (Saved(f"{name}_logits_in", x, "sp"),), low_precision=False),
        replace(cross_entropy_op(tokens, v, act_bytes, fused_loss, eager), name=f"{name}_cross_entropy"),
    )


def padded_vocabulary(model: TransformerModel, multiple: int) -> TransformerModel:
    """The model as a framework that pads its vocabulary runs it: the embedding's and the output
    layer's rows rounded up to a multiple of ``multiple`` (Megatron-LM pads to
    make_vocab_size_divisible_by, 128, times the tensor-parallel size: megatron/training/
    vocab_utils.py and arguments.py)."""
    if multiple <= 1 or model.vocab_size % multiple == 0:
        return model
    return model.model_copy(update={"vocab_size": -(-model.vocab_size // multiple) * multiple})


def lower(model: TransformerModel, micro_batch: int, seq_len: int, act_bytes: float = 2.0, flash_attention: bool = True,
          kv_len: int | None = None, logits_per_sequence: int | None = None, fused_loss: bool = False, eager: bool = False,
          autocast: bool = True, fp32_stream: bool = False, kv_element_bytes: float | None = None) -> Graph:
    """The graph of one micro-batch: embedding, the decoder layers by kind, head and loss; of a
    block model (``model.block``), that block's einsums only (block_einsums).

    Serving lowers a prefill or a decode step: ``seq_len`` new tokens per sequence attend to
    ``kv_len`` keys (layer_blocks), and only the last ``logits_per_sequence`` positions of each
    sequence go through the final norm, logits and sampling (default: every position, as in
    training). ``fused_loss``: the cross-entropy is one fused kernel (cross_entropy_op);
    ``eager``: norms, rotary embeddings and a composite activation run op by op (norm_op,
    rotary_op, activation_op), the activation ``autocast`` from fp32 weights or not, and with
    ``fp32_stream`` (autocast over unsharded fp32 weights) the embedding, the residual stream and
    the norms in fp32 (autocast_casts_op, residual_op). Serving reads its KV cache at
    ``kv_element_bytes`` an element (default the activations'). Training (every position's
    logits) runs the model's multi-token-prediction modules after the decoder (_mtp_ops; serving
    leaves them out).
    """
    if model.block != "layer":  # one block, no embedding, output layer or loss
        kv = kv_len or seq_len
        window = model.sliding_window if model.windowed(0) else None
        ops = (attention_ops(model, micro_batch, seq_len, act_bytes, flash_attention, kv, eager, window) if model.block == "attention"
               else ffn_ops(model, micro_batch, seq_len, act_bytes, moe=False, eager=eager, autocast=autocast))
        return Graph(head=Block("embedding", (), 1), blocks=block_einsums(model.block, ops), tail=Block("head", (), 1),
                     tokens=micro_batch * seq_len, seq_len=seq_len, activation_bytes=act_bytes)
    t = float(micro_batch * seq_len)
    h, v = float(model.hidden_size), float(model.vocab_size)
    x = t * h * act_bytes
    head = Block(
        "embedding",
        (
            # vocab-parallel lookup: reads the selected rows, writes the activations (fp32 rows
            # and activations in an fp32 stream)
            Op("embedding", "lookup", "tp", bytes=2.0 * (t * h * OPMATH_BYTES if fp32_stream else x), params=v * h,
               saved=(Saved("embedding_mask", t * h * MASK_BYTES, "sp"),)),
        ),
        1,
    )
    training = logits_per_sequence is None
    t = float(micro_batch * (logits_per_sequence or seq_len))  # positions the output layer runs on
    x = t * h * act_bytes
    tail = Block(
        "head",
        (
            norm_op("norm_final", t, h, OPMATH_BYTES if fp32_stream else act_bytes, model, eager),
            *((autocast_casts_op("norm_final_casts", t, h, 1),) if fp32_stream else ()),
            _matmul("logits", t, h, v, "n", 0.0 if model.tied_embeddings else v * h, (Saved("logits_in", x, "sp"),), low_precision=False),
            cross_entropy_op(t, v, act_bytes, fused_loss, eager),
            *(op for depth in range(model.mtp_layers if training else 0) for op in _mtp_ops(model, depth, t, act_bytes, fused_loss, eager)),
        ),
        1,
    )
    blocks = layer_blocks(model, micro_batch, seq_len, act_bytes, flash_attention, kv_len, eager, mtp=training, autocast=autocast,
                          fp32_stream=fp32_stream, cache_bytes=kv_element_bytes)
    return Graph(head=head, blocks=blocks, tail=tail, tokens=micro_batch * seq_len, seq_len=seq_len, activation_bytes=act_bytes)
