"""Lower a dense decoder-only transformer to ops for one micro-batch.

Shapes follow Megatron-LM (Shoeybi et al. 2019; Narayanan et al. SC21) and COMET Table 2. Saved
tensors follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Section 4.1: per layer 34·s·b·h + 5·a·s²·b bytes for GPT shapes in 16-bit precision, of
which 10·s·b·h are outside the tensor-parallel region (norms, dropout masks, block inputs).
"""

from __future__ import annotations

from meshplan.specs.model import TransformerModel
from meshplan.workloads.ops import Block, Graph, Op, Saved

MASK_BYTES = 1.0  # dropout masks are stored as bytes (Korthikanti et al. 2022, Sec. 4.1)


def _matmul(name: str, m: float, k: float, n: float, shard_dim: str, params: float, saved: tuple[Saved, ...]) -> Op:
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
    )


def decoder_layer(
    model: TransformerModel, micro_batch: int, seq_len: int, act_bytes: float, flash_attention: bool, kv_len: int | None = None
) -> tuple[Op, ...]:
    """The ops of one decoder layer: norm, QKV, attention, projection, residual, norm, MLP, residual.

    ``seq_len`` tokens per sequence go through the layer; each attends to ``kv_len`` keys
    (default ``seq_len``; in decoding one new token attends to the whole KV cache).
    """
    kv_len = kv_len or seq_len
    t = float(micro_batch * seq_len)  # tokens
    h = float(model.hidden_size)
    a, kv, d = model.num_attention_heads, model.kv_heads, model.dim_per_head
    q_width, kv_width = float(a * d), float(kv * d)
    f = float(model.ffn_hidden_size)
    up_width = (model.ffn_matrices - 1) * f  # gate and up projections are fused (SwiGLU: 2f)
    norm_params = (2.0 if model.norm == "layernorm" else 1.0) * h
    x = t * h * act_bytes  # one activation tensor of the residual stream
    mask = t * h * MASK_BYTES

    # attention scores: QK^T and softmax(.)V over all heads; 4·b·s²·a·d flop (Megatron Eq. 3
    # counts the full square, no causal halving)
    score_flop = 4.0 * micro_batch * seq_len * kv_len * a * d
    scores = micro_batch * a * float(seq_len) * kv_len
    qkv_bytes = (t * q_width + micro_batch * kv_len * 2 * kv_width) * act_bytes
    if flash_attention:
        # FlashAttention (Dao et al. 2022): reads Q, K, V and writes O once; keeps the softmax
        # log-sum-exp (fp32 per row) instead of the s² probabilities
        attn_bytes = qkv_bytes + t * q_width * act_bytes
        attn_saved = (Saved("softmax_lse", t * a * 4.0, "tp"),)
    else:
        # unfused: scores written, softmax read+written, dropout read+written with its mask,
        # probabilities read by the context matmul (about 6 passes over a·s²·b 16-bit values)
        attn_bytes = qkv_bytes + t * q_width * act_bytes + 6.0 * scores * act_bytes
        attn_saved = (
            Saved("softmax_out", scores * act_bytes, "tp", attention_scores=True),
            Saved("dropout_mask", scores * MASK_BYTES, "tp", attention_scores=True),
            Saved("dropout_out", scores * act_bytes, "tp", attention_scores=True),
        )

    return (
        Op("norm_attn", "elementwise", "sp", flop=5.0 * t * h, bytes=2.0 * x, params=norm_params, saved=(Saved("norm_attn_in", x, "sp"),)),
        _matmul("qkv", t, h, q_width + 2 * kv_width, "n", h * (q_width + 2 * kv_width) + q_width + 2 * kv_width, (Saved("qkv_in", x, "sp"),)),
        Op(
            "attention",
            "attention",
            "tp",
            flop=score_flop,
            bytes=attn_bytes,
            saved=(
                Saved("q", t * q_width * act_bytes, "tp"),
                Saved("k", t * kv_width * act_bytes, "tp"),
                Saved("v", t * kv_width * act_bytes, "tp"),
                *attn_saved,
            ),
        ),
        _matmul("proj", t, q_width, h, "k", q_width * h + h, (Saved("proj_in", t * q_width * act_bytes, "tp"),)),
        Op("residual_attn", "elementwise", "sp", flop=2.0 * t * h, bytes=3.0 * x + mask, saved=(Saved("dropout_mask_attn", mask, "sp"),)),
        Op("norm_mlp", "elementwise", "sp", flop=5.0 * t * h, bytes=2.0 * x, params=norm_params, saved=(Saved("norm_mlp_in", x, "sp"),)),
        _matmul("mlp_up", t, h, up_width, "n", h * up_width + up_width, (Saved("mlp_up_in", x, "sp"),)),
        Op(
            "activation",
            "elementwise",
            "tp",
            flop=8.0 * t * f,
            bytes=(up_width + f) * t * act_bytes,
            saved=(Saved("activation_in", up_width * t * act_bytes, "tp"),),
        ),
        _matmul("mlp_down", t, f, h, "k", f * h + h, (Saved("mlp_down_in", t * f * act_bytes, "tp"),)),
        Op("residual_mlp", "elementwise", "sp", flop=2.0 * t * h, bytes=3.0 * x + mask, saved=(Saved("dropout_mask_mlp", mask, "sp"),)),
    )


def lower(model: TransformerModel, micro_batch: int, seq_len: int, act_bytes: float = 2.0, flash_attention: bool = True) -> Graph:
    """The graph of one micro-batch: embedding, ``num_layers`` identical layers, head and loss."""
    t = float(micro_batch * seq_len)
    h, v = float(model.hidden_size), float(model.vocab_size)
    x = t * h * act_bytes
    norm_params = (2.0 if model.norm == "layernorm" else 1.0) * h
    head = Block(
        "embedding",
        (
            # vocab-parallel lookup: reads the selected rows, writes the activations
            Op("embedding", "lookup", "tp", bytes=2.0 * x, params=v * h, saved=(Saved("embedding_mask", t * h * MASK_BYTES, "sp"),)),
        ),
        1,
    )
    tail = Block(
        "head",
        (
            Op("norm_final", "elementwise", "sp", flop=5.0 * t * h, bytes=2.0 * x, params=norm_params, saved=(Saved("norm_final_in", x, "sp"),)),
            _matmul("logits", t, h, v, "n", 0.0 if model.tied_embeddings else v * h, (Saved("logits_in", x, "sp"),)),
            # cross-entropy in fp32 over the vocabulary shard (Korthikanti: 4·s·b·v/t bytes)
            Op("cross_entropy", "elementwise", "tp", flop=5.0 * t * v, bytes=3.0 * t * v * 4.0, saved=(Saved("logits_fp32", 4.0 * t * v, "tp"),)),
        ),
        1,
    )
    layer = Block("decoder_layer", decoder_layer(model, micro_batch, seq_len, act_bytes, flash_attention), model.num_layers)
    return Graph(head=head, layer=layer, tail=tail, tokens=int(t), seq_len=seq_len, activation_bytes=act_bytes)
