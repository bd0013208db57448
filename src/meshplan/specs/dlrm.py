"""DLRM recommenders (MAD Max Sec. 2.1): embedding tables, bottom/top MLPs, a feature interaction.

Two shapes are read (shared/validation/SCHEMA.md, DLRM cases):

- per-table lists (the MLPerf DLRM-DCNv2 style): ``table_rows``, ``multi_hot_sizes``,
  ``bottom_mlp`` and ``top_mlp`` widths, ``num_dense_features``, ``interaction``;
- uniform tables (MAD Max's DLRM-A/B): ``num_tables`` x ``rows_per_table``, ``pooling_factor``
  lookups per table, ``bottom_mlp_layers`` + ``top_mlp_layers`` square layers of ``mlp_width``.
  As in MAD Max's artifact (samhsia/MADMAX-AE, models/dlrm.py), the top MLP's input is
  ``mlp_width`` wide: Table 2's FLOPs per sample are exactly 2 x layers x width^2, so the
  interaction that feeds it adds memory traffic but no flop.

Variants (MAD Max Sec. 2.1, 5): DLRM-Transformer replaces the interaction with transformer encoder
layers over the sparse features (``interaction: transformer``); DLRM-MoE makes the top MLP
``moe.num_experts`` parallel towers of which ``moe.top_k`` run per sample.

A model knows nothing about parallelism; meshplan.parallel.strategy applies the strategy.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import Field, model_validator

from meshplan.errors import MeshplanError
from meshplan.specs.base import Count, Natural, Positive, Spec

InteractionKind = Literal["dot", "cat", "dcnv2", "transformer"]
EmbeddingOptimizer = Literal["rowwise_adagrad", "adagrad", "sgd"]
DenseOptimizer = Literal["adagrad", "adam", "sgd"]
KeyDistribution = Literal["uniform", "unknown"]

#: optimizer state bytes a table row keeps per element (adagrad: an fp32 accumulator per weight)
#: and per row (row-wise adagrad: one fp32 accumulator a row; FBGEMM's EXACT_ROWWISE_ADAGRAD)
_STATE_PER_ELEMENT = {"adagrad": 4.0, "rowwise_adagrad": 0.0, "sgd": 0.0}
_STATE_PER_ROW = {"adagrad": 0.0, "rowwise_adagrad": 4.0, "sgd": 0.0}

_PER_TABLE = ("table_rows", "multi_hot_sizes", "bottom_mlp", "top_mlp", "num_dense_features")
_UNIFORM = ("num_tables", "rows_per_table", "pooling_factor", "bottom_mlp_layers", "top_mlp_layers", "mlp_width")
INTERACTIONS = "dot, cat, dcnv2 [N layers] [low-rank R] or transformer [N layers]"

#: words that name an interaction kind in free text, most specific first
_INTERACTION_WORDS = (
    (re.compile(r"\bdcn[\s_-]?v2\b|\bdcn\b|\bcross[\s_-]?net"), "dcnv2"),
    (re.compile(r"\btransformer"), "transformer"),
    (re.compile(r"\bdot\b"), "dot"),
    (re.compile(r"\bcat\b|\bconcat"), "cat"),
)
_RANK = re.compile(r"\brank\D{0,24}?(\d+)")
_LAYERS = re.compile(r"(\d+)\s*(?:cross\s+)?layers?\b|\blayers?\s*[:=]?\s*(\d+)")
_NUMBER = re.compile(r"\b(\d+)\b")


def parse_interaction(text: str) -> dict:
    """{kind, and where given: layers, dcn_low_rank_dim} from a free-text interaction, as
    validation cases write it (SCHEMA.md: ``dot``, ``cat``, ``dcnv2 ...``). A bare number after
    the kind is its layer count ("dcnv2 3", "transformer 4")."""
    lowered = text.strip().lower()
    kind = next((name for pattern, name in _INTERACTION_WORDS if pattern.search(lowered)), None)
    if kind is None:
        raise MeshplanError("interaction", text, f"one of {INTERACTIONS}")
    out: dict = {"kind": kind}
    rest = lowered
    rank = _RANK.search(rest)
    if rank:
        out["dcn_low_rank_dim"] = int(rank.group(1))
        rest = rest[:rank.start(1)] + rest[rank.end(1):]
    layers = _LAYERS.search(rest)
    numbers = [int(n) for n in _NUMBER.findall(re.sub(r"dcn[\s_-]?v2", "", rest))]
    if layers:
        out["layers"] = int(layers.group(1) or layers.group(2))
    elif len(numbers) == 1:
        out["layers"] = numbers[0]
    elif numbers:
        raise MeshplanError("interaction", text, f"one number as the layer count, e.g. '{kind}, 3 layers'")
    if kind in ("dot", "cat") and ("layers" in out or rank):
        raise MeshplanError("interaction", text, f"{kind} alone: it takes no layers or rank")
    if kind == "transformer" and rank:
        raise MeshplanError("interaction", text, "transformer [N layers]: it takes no rank")
    if out.get("layers") == 0 or out.get("dcn_low_rank_dim") == 0:
        raise MeshplanError("interaction", text, "layers and rank of at least 1")
    if kind == "dcnv2" and "layers" in out:
        out["interaction_layers"] = out.pop("layers")
    return out


class TransformerInteraction(Spec):
    """Encoder layers over the sparse features. Defaults: MAD Max Sec. 5 (4 layers, sequence 80);
    width 512 / FFN 2048 reproduce Table 2's FLOPs per sample (see catalog/dlrm.yaml)."""

    layers: Count = 4
    seq_len: Count = 80
    hidden_size: Count = 512
    ffn_hidden_size: Count = 2048
    num_heads: Count = 8


class DLRMMoE(Spec):
    """The top MLP as ``num_experts`` towers, ``top_k`` active per sample (MAD Max Sec. 2.1, 5)."""

    num_experts: Count = 16
    top_k: Count = 2

    @model_validator(mode="after")
    def _k_le_experts(self) -> "DLRMMoE":
        if self.top_k > self.num_experts:
            raise MeshplanError("top_k", self.top_k, f"at most num_experts ({self.num_experts})")
        return self


class DLRMModel(Spec):
    """A deep learning recommendation model; see the module docstring for the two shapes."""

    arch: Literal["dlrm"] = "dlrm"
    id: str = "custom-dlrm"
    name: str = ""
    embedding_dim: Count
    # per-table lists
    table_rows: tuple[Count, ...] | None = None
    multi_hot_sizes: tuple[Positive, ...] | None = None
    bottom_mlp: tuple[Count, ...] | None = None
    top_mlp: tuple[Count, ...] | None = None
    num_dense_features: Count | None = None
    # uniform tables
    num_tables: Count | None = None
    rows_per_table: Count | None = None
    pooling_factor: Positive | None = None
    bottom_mlp_layers: Natural | None = None
    top_mlp_layers: Count | None = None
    mlp_width: Count | None = None
    # both
    interaction: InteractionKind = "cat"
    interaction_layers: Count | None = None  # dcnv2 cross layers
    dcn_low_rank_dim: Count | None = None  # None: full-rank cross layers
    transformer: TransformerInteraction | None = None
    moe: DLRMMoE | None = None
    bytes_per_emb_param: Positive = 4.0
    bytes_per_dense_param: Positive = 4.0
    embedding_optimizer: EmbeddingOptimizer = "rowwise_adagrad"
    dense_optimizer: DenseOptimizer = "adagrad"
    # how a batch's keys fall on the table rows (update_bytes): "uniform" as MLPerf DLRM v2's
    # synthetic multi-hot Criteo (the reference's materialize_synthetic_multihot_dataset.py,
    # --multi_hot_distribution_type uniform; the default for per-table lists with multi-hot
    # sizes, which only that dataset has among the public cases), "unknown" otherwise
    key_distribution: KeyDistribution | None = None
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _split_interaction(cls, data: object) -> object:
        """A free-text ``interaction`` ("dcnv2 3", "DCNv2 MultiCross, 3 layers, low-rank
        projection 512", "transformer 4") names the kind, its layer count and DCN's rank."""
        if not isinstance(data, dict) or not isinstance(data.get("interaction"), str):
            return data
        parsed = parse_interaction(data["interaction"])
        out = {**data, "interaction": parsed.pop("kind")}
        if out["interaction"] == "transformer":
            layers = parsed.pop("layers", None)
            out["transformer"] = {**(data.get("transformer") or {}), **({"layers": layers} if layers else {})}
        for key, value in parsed.items():
            if out.get(key) not in (None, value):
                raise MeshplanError(key, out[key], f"{value}, as interaction {data['interaction']!r} says, or leave it out")
            out[key] = value
        return out

    @model_validator(mode="after")
    def _one_shape(self) -> "DLRMModel":
        per_table = [f for f in _PER_TABLE if getattr(self, f) is not None]
        uniform = [f for f in _UNIFORM if getattr(self, f) is not None]
        if per_table and uniform:
            raise MeshplanError(uniform[0], getattr(self, uniform[0]),
                                f"left out beside per-table lists ({per_table[0]} is given): per-table lists "
                                f"({', '.join(_PER_TABLE)}) or uniform tables ({', '.join(_UNIFORM)}), not both")
        needed = _PER_TABLE if per_table else _UNIFORM
        missing = [f for f in needed if getattr(self, f) is None]
        if missing:
            raise MeshplanError(missing[0], None, f"required with {per_table[0] if per_table else 'uniform tables'}")
        if per_table:
            if len(self.multi_hot_sizes) != len(self.table_rows):
                raise MeshplanError("multi_hot_sizes", self.multi_hot_sizes,
                                    f"one entry per table: table_rows has {len(self.table_rows)}")
            for name in ("bottom_mlp", "top_mlp"):
                if not getattr(self, name):
                    raise MeshplanError(name, getattr(self, name), "at least one layer width")
            if self.interaction == "dot" and self.bottom_mlp[-1] != self.embedding_dim:
                raise MeshplanError("bottom_mlp", self.bottom_mlp,
                                    f"a last width of embedding_dim ({self.embedding_dim}): the dot interaction needs it")
        elif self.interaction in ("dot", "dcnv2"):
            raise MeshplanError("interaction", self.interaction, "cat or transformer with uniform tables; dot and dcnv2 "
                                "need per-table lists (their width follows the tables)")
        if self.interaction == "dcnv2" and self.interaction_layers is None:
            raise MeshplanError("interaction_layers", None,
                                "the number of cross layers dcnv2 needs, e.g. interaction 'dcnv2 3'")
        return self

    # --- tables ------------------------------------------------------------------------------

    @property
    def per_table(self) -> bool:
        return self.table_rows is not None

    @property
    def tables(self) -> int:
        return len(self.table_rows) if self.per_table else self.num_tables

    @property
    def total_rows(self) -> float:
        return float(sum(self.table_rows)) if self.per_table else float(self.num_tables * self.rows_per_table)

    @property
    def lookups_per_sample(self) -> float:
        """Rows read per sample over all tables (sum of pooling factors)."""
        return float(sum(self.multi_hot_sizes)) if self.per_table else self.num_tables * self.pooling_factor

    @property
    def embedding_params(self) -> float:
        return self.total_rows * self.embedding_dim

    @property
    def keys(self) -> KeyDistribution:
        if self.key_distribution is not None:
            return self.key_distribution
        return "uniform" if self.per_table and max(self.multi_hot_sizes) > 1 else "unknown"

    def distinct_rows(self, batch: float) -> float:
        """Rows a batch's lookups touch when each key is uniform over its table: a table of r rows
        looked up L times holds r (1 - e^(-L/r)) distinct rows (balls into bins, expected)."""
        if self.per_table:
            tables = zip(self.table_rows, self.multi_hot_sizes)
        else:
            tables = [(self.rows_per_table, self.pooling_factor)] * self.num_tables
        return sum(r * -math.expm1(-batch * hot / r) for r, hot in tables)

    def update_bytes(self, batch: float, grad_bytes: float) -> float:
        """HBM bytes of the backward's sparse update of a batch over all tables.

        Uniform keys: the fused backward (FBGEMM's TBE, HugeCTR's embedding collection) reads the
        pooled gradient once per lookup, then for each distinct row reads and writes the row and
        its optimizer state. Otherwise, as MAD Max's artifact, what the forward lookup reads:
        skewed production keys repeat rows, and how much is not known from the model."""
        if self.keys != "uniform":
            return batch * self.lookup_bytes_per_sample
        row = self.embedding_dim * (self.bytes_per_emb_param + _STATE_PER_ELEMENT[self.embedding_optimizer])
        row += _STATE_PER_ROW[self.embedding_optimizer]
        return 2.0 * row * self.distinct_rows(batch) + batch * self.lookups_per_sample * self.embedding_dim * grad_bytes

    @property
    def lookup_bytes_per_sample(self) -> float:
        """Bytes one sample's forward lookups read: tables x pooling x dim x bytes (MAD Max Sec. 4.2)."""
        return self.lookups_per_sample * self.embedding_dim * self.bytes_per_emb_param

    # --- dense layers: (in, out, repeat) ---------------------------------------------------------

    @property
    def bottom_layers(self) -> tuple[tuple[int, int, int], ...]:
        if self.per_table:
            widths = (self.num_dense_features, *self.bottom_mlp)
            return tuple((a, b, 1) for a, b in zip(widths, widths[1:]))
        return ((self.mlp_width, self.mlp_width, self.bottom_mlp_layers),) if self.bottom_mlp_layers else ()

    @property
    def bottom_out(self) -> int:
        return self.bottom_mlp[-1] if self.per_table else self.mlp_width

    @property
    def interaction_in(self) -> int:
        """Width of the concatenated features entering the interaction (bottom output + pooled tables)."""
        return self.bottom_out + self.tables * self.embedding_dim

    @property
    def interaction_out(self) -> int:
        if not self.per_table:
            return self.mlp_width
        f = self.tables + 1
        return {
            "dot": f * (f - 1) // 2 + self.bottom_out,  # upper triangle + the dense vector (Naumov et al. 2019)
            "cat": self.interaction_in,
            "dcnv2": self.interaction_in,
            "transformer": self.transformer.seq_len * self.transformer.hidden_size if self.transformer else 0,
        }[self.interaction]

    @property
    def top_layers(self) -> tuple[tuple[int, int, int], ...]:
        """One tower of the top MLP (an MoE model has ``moe.num_experts`` of them)."""
        if self.per_table:
            widths = (self.interaction_out, *self.top_mlp)
            return tuple((a, b, 1) for a, b in zip(widths, widths[1:]))
        return ((self.mlp_width, self.mlp_width, self.top_mlp_layers),)

    @property
    def interaction_params(self) -> float:
        if self.interaction == "dcnv2":
            d, r = self.interaction_in, self.dcn_low_rank_dim
            per_layer = (2 * d * r if r else d * d) + d
            return float(self.interaction_layers * per_layer)
        if self.interaction == "transformer":
            t = self.transformer
            return float(t.layers * (4 * t.hidden_size**2 + 2 * t.hidden_size * t.ffn_hidden_size))
        return 0.0

    @property
    def bottom_params(self) -> float:
        return float(sum(a * b * n for a, b, n in self.bottom_layers))

    @property
    def top_params_per_tower(self) -> float:
        return float(sum(a * b * n for a, b, n in self.top_layers))

    @property
    def experts(self) -> int:
        return self.moe.num_experts if self.moe else 1

    @property
    def active_experts(self) -> int:
        return self.moe.top_k if self.moe else 1

    @property
    def dense_params(self) -> float:
        """Weights outside the embedding tables (biases are left out, as in MAD Max's count)."""
        return self.bottom_params + self.interaction_params + self.experts * self.top_params_per_tower

    @property
    def num_params(self) -> float:
        return self.embedding_params + self.dense_params
