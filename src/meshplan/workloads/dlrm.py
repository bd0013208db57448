"""Lower a DLRM to the common Graph, one sample (MAD Max Sec. 4.2: layers processed by their main
requirement).

Every op is described for one sample and knows nothing about the strategy; meshplan.parallel
scales it by the batch each device runs and splits it over the devices. The graph is the one
every family lowers to (meshplan.workloads.ops): the embedding bags are its head, the loss its
tail, and its blocks run in MAD Max's order (Sec. 4.3: bottom MLP, interaction, top MLP), each a
layer kind kept as (block, count), never unrolled.

- embedding bags: a "lookup" op, memory bound, ``lookups x dim x bytes_per_emb_param`` read per
  sample (MAD Max Sec. 4.2, "Embedding Bags");
- MLP layers and transformer projections: "matmul" ops ``m x k`` times ``k x n`` with ``m`` = 1
  row per sample (``seq_len`` tokens per sample in a transformer); backward runs an
  input-gradient and a weight-gradient GEMM of the same flop (COMET Table 1);
- interaction: dot (pairwise dot products as a batched GEMM, Naumov et al. 2019, an "attention"
  op: flop and bytes), cat (an elementwise copy), DCNv2 cross layers (Wang et al. 2021:
  x_{l+1} = x0 * (U V x_l + b) + x_l, low rank r), or transformer encoder layers;
- MoE (DLRM-MoE): the top MLP is ``experts`` towers of which ``top_k`` run per sample: its ops
  are expert ops with ``m`` = top_k rows per sample and every tower's weights;
- loss: binary cross-entropy on the last output, elementwise.

Bytes are forward HBM traffic: activation elements in the activation precision, pooled
embeddings in the tables' precision.
"""

from __future__ import annotations

from meshplan.specs.dlrm import DLRMModel
from meshplan.workloads.ops import Block, Graph, Op

#: block names by the part of the model they are (meshplan.parallel applies a strategy per part)
BOTTOM, TOP = "bottom", "top"
INTERACTION = ("interaction", "dcn", "transformer")

#: how tensor parallelism splits a GEMM: column-parallel splits n, row-parallel k
_SHARD_DIM = {"column": "n", "row": "k", "none": ""}


def _layer(name: str, k: int, n: int, tp: str, rows: float = 1.0, towers: int = 1, active: int = 1) -> Op:
    """A GEMM of ``rows`` x ``active`` rows per sample; ``towers`` copies of its weights."""
    m = rows * active
    return Op(name, "matmul", "tp" if tp != "none" else "none", flop=2.0 * m * k * n, m=m, k=k, n=n,
              shard_dim=_SHARD_DIM[tp], params=towers * k * n, expert=towers > 1)  # type: ignore[arg-type]


def mlp_blocks(prefix: str, layers: tuple[tuple[int, int, int], ...], towers: int = 1, active: int = 1) -> tuple[Block, ...]:
    """MLP layers as GEMMs. Tensor parallelism pairs them Megatron-style, a column-parallel layer
    then a row-parallel one (Shoeybi et al. 2019, Sec. 3; MAD Max's artifact all-reduces the
    activations once per two layers), so a repeated square layer becomes a (column, row) block."""
    blocks: list[Block] = []
    index = 0
    listed: list[Op] = []

    def layer(name: str, k: int, n: int, tp: str) -> Op:
        return _layer(name, k, n, tp, towers=towers, active=active)

    for k, n, count in layers:
        if count == 1:
            listed.append(layer(f"{prefix}{index}", k, n, "column" if index % 2 == 0 else "row"))
            index += 1
            continue
        if listed:
            blocks.append(Block(prefix, tuple(listed), 1))
            listed = []
        first = "column" if index % 2 == 0 else "row"
        second = "row" if first == "column" else "column"
        pair = (layer(f"{prefix}:{first}", k, n, first), layer(f"{prefix}:{second}", k, n, second))
        blocks.append(Block(prefix, pair, count // 2))
        if count % 2:
            listed.append(layer(f"{prefix}:{first}", k, n, first))
        index += count
    if listed:
        blocks.append(Block(prefix, tuple(listed), 1))
    return tuple(blocks)


def interaction_blocks(m: DLRMModel, act_bytes: float) -> tuple[Block, ...]:
    """The feature interaction's ops for one sample."""
    width_in, width_out = m.interaction_in, m.interaction_out
    pooled = m.tables * m.embedding_dim * m.bytes_per_emb_param  # pooled embeddings read

    def moved(elements: float) -> float:
        return elements * act_bytes

    if m.interaction == "cat":
        # read every pooled vector and the bottom output, write the top MLP's input
        op = Op("interaction_cat", "elementwise", "none", bytes=moved(m.bottom_out + width_out) + pooled)
        return (Block("interaction", (op,), 1),)
    if m.interaction == "dot":
        f, d = m.tables + 1, m.embedding_dim
        # (f x d)(d x f) per sample, the upper triangle gathered and concatenated (Naumov et al. 2019)
        op = Op("interaction_dot", "attention", "none", flop=2.0 * f * f * d, bytes=moved(d + f * f + width_out) + pooled)
        return (Block("interaction", (op,), 1),)
    if m.interaction == "dcnv2":
        d, r = width_in, m.dcn_low_rank_dim
        gemms = (_layer("dcn_down", d, r, "none"), _layer("dcn_up", r, d, "none")) if r else (_layer("dcn_cross", d, d, "none"),)
        # x0 * (.) + x_l: read x0, the GEMM output and x_l, write x_{l+1}
        combine = Op("dcn_combine", "elementwise", "none", flop=2.0 * d, bytes=moved(4.0 * d), params=d)
        concat = Op("interaction_concat", "elementwise", "none", bytes=moved(m.bottom_out + d) + pooled)
        return (Block("interaction", (concat,), 1), Block("dcn", (*gemms, combine), m.interaction_layers))
    t = m.transformer
    s, h, f = t.seq_len, t.hidden_size, t.ffn_hidden_size
    ops = (
        _layer("attn_qkv", h, 3 * h, "column", rows=s),
        # scores QK^T and context PV: 2 x 2 s^2 h flop; Q, K, V in and the context out (heads split over tp)
        Op("attn_core", "attention", "tp", flop=4.0 * s * s * h, bytes=moved(4.0 * s * h)),
        _layer("attn_proj", h, h, "row", rows=s),
        _layer("ffn_up", h, f, "column", rows=s),
        _layer("ffn_down", f, h, "row", rows=s),
    )
    return (Block("transformer", ops, t.layers),)


def lower_dlrm(m: DLRMModel, act_bytes: float = 2.0) -> Graph:
    """The per-sample graph of ``m`` with activations of ``act_bytes`` bytes per element."""
    embedding = Op("embedding_bags", "lookup", "none", bytes=m.lookup_bytes_per_sample, params=m.embedding_params)
    out_width = m.top_layers[-1][1]
    # binary cross-entropy with logits: read the output and the label, write the loss and its gradient
    loss = Op("loss_bce", "elementwise", "none", flop=8.0 * out_width, bytes=4.0 * out_width * act_bytes)
    blocks = (
        *mlp_blocks(BOTTOM, m.bottom_layers),
        *interaction_blocks(m, act_bytes),
        *mlp_blocks(TOP, m.top_layers, towers=m.experts, active=m.active_experts),
    )
    return Graph(head=Block("embedding", (embedding,), 1), blocks=blocks, tail=Block("loss", (loss,), 1),
                 tokens=1, seq_len=1, activation_bytes=act_bytes)
