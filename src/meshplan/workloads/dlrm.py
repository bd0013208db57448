"""Lower a DLRM to per-sample ops (MAD Max Sec. 4.2: layers processed by their main requirement).

Every op is described for one sample and knows nothing about the strategy; meshplan.parallel.dlrm
scales it by the batch each device runs and splits it over the devices.

- embedding bags: memory bound, ``lookups x dim x bytes_per_emb_param`` read per sample
  (MAD Max Sec. 4.2, "Embedding Bags"); backward moves the same bytes (the fused sparse update of
  the looked-up rows; MAD Max's artifact, tasks/dlrm_tasks.py, costs both passes alike);
- MLP layers and transformer projections: GEMMs ``rows x k`` times ``k x n`` with
  ``rows`` = 1 per sample (``seq_len`` tokens per sample in a transformer); backward runs an
  input-gradient and a weight-gradient GEMM of the same flop (COMET Table 1);
- interaction: dot (pairwise dot products as a batched GEMM, Naumov et al. 2019), cat (a copy),
  DCNv2 cross layers (Wang et al. 2021: x_{l+1} = x0 * (U V x_l + b) + x_l, low rank r), or
  transformer encoder layers (attention scores as flop and bytes);
- loss: binary cross-entropy on the last output, elementwise.

Element counts (``elements``) are in activation elements; the precision turns them into bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from meshplan.specs.dlrm import DLRMModel

OpKind = Literal["lookup", "gemm", "attention", "elementwise"]
#: how tensor parallelism splits a GEMM: column (n), row (k), or not at all (replicated)
TpSplit = Literal["column", "row", "none"]


@dataclass(frozen=True)
class DLRMOp:
    """One kernel of the forward pass, for one sample."""

    name: str
    kind: OpKind
    k: int = 0  # GEMM: input width
    n: int = 0  # GEMM: output width
    rows: int = 1  # GEMM rows per sample (tokens per sample)
    tp: TpSplit = "none"
    flop: float = 0.0  # non-GEMM flop per sample (attention scores, elementwise)
    elements: float = 0.0  # activation elements one forward reads and writes per sample
    pooled_elements: float = 0.0  # pooled-embedding elements it reads (in the tables' precision)
    lookup_bytes: float = 0.0  # embedding rows read per sample
    params: float = 0.0

    @property
    def forward_flop(self) -> float:
        return 2.0 * self.rows * self.k * self.n + self.flop


@dataclass(frozen=True)
class DLRMBlock:
    """Ops that run in order, the group repeated ``count`` times (never unrolled here)."""

    name: str
    ops: tuple[DLRMOp, ...]
    count: int = 1

    @property
    def forward_flop(self) -> float:
        return self.count * sum(op.forward_flop for op in self.ops)

    @property
    def params(self) -> float:
        return self.count * sum(op.params for op in self.ops)


@dataclass(frozen=True)
class DLRMGraph:
    """A lowered DLRM: op groups in execution order (MAD Max Sec. 4.3: embedding, bottom MLP,
    interaction, top MLP). ``top`` is one tower; an MoE model runs ``active_experts`` of
    ``experts`` towers per sample."""

    model: DLRMModel
    embedding: DLRMOp
    bottom: tuple[DLRMBlock, ...]
    interaction: tuple[DLRMBlock, ...]  # dot/cat/dcnv2 ops, or the transformer layers
    top: tuple[DLRMBlock, ...]
    loss: DLRMOp
    experts: int
    active_experts: int

    @property
    def forward_flop_per_sample(self) -> float:
        """MAD Max Table 2's "FLOPs per sample": 2 x weights of every GEMM a sample runs, plus
        the interaction's and the loss's flop."""
        dense = sum(b.forward_flop for b in (*self.bottom, *self.interaction))
        return dense + self.active_experts * sum(b.forward_flop for b in self.top) + self.loss.forward_flop

    @property
    def dense_params(self) -> float:
        tower = sum(b.params for b in self.top)
        return sum(b.params for b in (*self.bottom, *self.interaction)) + self.experts * tower


def _layer(name: str, k: int, n: int, tp: TpSplit) -> DLRMOp:
    return DLRMOp(name, "gemm", k=k, n=n, tp=tp, params=k * n)


def mlp_blocks(prefix: str, layers: tuple[tuple[int, int, int], ...]) -> tuple[DLRMBlock, ...]:
    """MLP layers as GEMMs. Tensor parallelism pairs them Megatron-style, a column-parallel layer
    then a row-parallel one (Shoeybi et al. 2019, Sec. 3; MAD Max's artifact all-reduces the
    activations once per two layers), so a repeated square layer becomes a (column, row) block."""
    blocks: list[DLRMBlock] = []
    index = 0
    listed: list[DLRMOp] = []
    for k, n, count in layers:
        if count == 1:
            listed.append(_layer(f"{prefix}{index}", k, n, "column" if index % 2 == 0 else "row"))
            index += 1
            continue
        if listed:
            blocks.append(DLRMBlock(prefix, tuple(listed)))
            listed = []
        first = "column" if index % 2 == 0 else "row"
        second = "row" if first == "column" else "column"
        pair = (_layer(f"{prefix}:{first}", k, n, first), _layer(f"{prefix}:{second}", k, n, second))
        blocks.append(DLRMBlock(prefix, pair, count // 2))
        if count % 2:
            listed.append(_layer(f"{prefix}:{first}", k, n, first))
        index += count
    if listed:
        blocks.append(DLRMBlock(prefix, tuple(listed)))
    return tuple(blocks)


def interaction_blocks(m: DLRMModel) -> tuple[DLRMBlock, ...]:
    """The feature interaction's ops for one sample."""
    width_in, width_out = m.interaction_in, m.interaction_out
    pooled = m.tables * m.embedding_dim
    if m.interaction == "cat":
        # read every pooled vector and the bottom output, write the top MLP's input
        op = DLRMOp("interaction_cat", "elementwise", elements=m.bottom_out + width_out, pooled_elements=pooled)
        return (DLRMBlock("interaction", (op,)),)
    if m.interaction == "dot":
        f, d = m.tables + 1, m.embedding_dim
        # (f x d)(d x f) per sample, the upper triangle gathered and concatenated (Naumov et al. 2019)
        op = DLRMOp("interaction_dot", "attention", flop=2.0 * f * f * d, elements=d + f * f + width_out, pooled_elements=pooled)
        return (DLRMBlock("interaction", (op,)),)
    if m.interaction == "dcnv2":
        d, r = width_in, m.dcn_low_rank_dim
        gemms = (_layer("dcn_down", d, r, "none"), _layer("dcn_up", r, d, "none")) if r else (_layer("dcn_cross", d, d, "none"),)
        # x0 * (.) + x_l: read x0, the GEMM output and x_l, write x_{l+1}
        combine = DLRMOp("dcn_combine", "elementwise", elements=4.0 * d, flop=2.0 * d, params=d)
        concat = DLRMOp("interaction_concat", "elementwise", elements=m.bottom_out + d, pooled_elements=pooled)
        return (DLRMBlock("interaction", (concat,)), DLRMBlock("dcn", (*gemms, combine), m.interaction_layers))
    t = m.transformer
    s, h, f = t.seq_len, t.hidden_size, t.ffn_hidden_size
    ops = (
        DLRMOp("attn_qkv", "gemm", k=h, n=3 * h, rows=s, tp="column", params=3 * h * h),
        # scores QK^T and context PV: 2 x 2 s^2 h flop; Q, K, V in and the context out
        DLRMOp("attn_core", "attention", flop=4.0 * s * s * h, elements=4.0 * s * h),
        DLRMOp("attn_proj", "gemm", k=h, n=h, rows=s, tp="row", params=h * h),
        DLRMOp("ffn_up", "gemm", k=h, n=f, rows=s, tp="column", params=h * f),
        DLRMOp("ffn_down", "gemm", k=f, n=h, rows=s, tp="row", params=f * h),
    )
    return (DLRMBlock("transformer", ops, t.layers),)


def lower_dlrm(m: DLRMModel) -> DLRMGraph:
    """The per-sample op graph of ``m``."""
    embedding = DLRMOp("embedding_bags", "lookup", lookup_bytes=m.lookup_bytes_per_sample, params=m.embedding_params)
    out_width = m.top_layers[-1][1]
    # binary cross-entropy with logits: read the output and the label, write the loss and its gradient
    loss = DLRMOp("loss_bce", "elementwise", elements=4.0 * out_width, flop=8.0 * out_width)
    return DLRMGraph(
        model=m,
        embedding=embedding,
        bottom=mlp_blocks("bottom", m.bottom_layers),
        interaction=interaction_blocks(m),
        top=mlp_blocks("top", m.top_layers),
        loss=loss,
        experts=m.experts,
        active_experts=m.active_experts,
    )
