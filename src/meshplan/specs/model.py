"""Model architectures. A model knows nothing about parallelism (torchtitan's seam)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from meshplan.errors import MeshplanError
from meshplan.specs.base import Count, Natural, Spec

FfnType = Literal["gelu", "relu", "squared_relu", "swiglu", "geglu"]

#: what a model holds: whole decoder layers, or only the attention or the MLP block of one layer
#: (the rack-scale energy/latency study's workloads: Llama-3-8B's FFN and attention blocks)
BlockKind = Literal["layer", "attention", "mlp"]
BLOCK_KINDS = ("layer", "attention", "mlp")

#: weight matrices in the FFN of each type: 2 (up, down) or 3 (gate, up, down)
FFN_MATRICES = {"gelu": 2, "relu": 2, "squared_relu": 2, "swiglu": 3, "geglu": 3}

#: FFN activations as Hugging Face configs name them (config.json activation_function or
#: hidden_act; transformers.activations.ACT2FN), with the FFN types each computes. Each is costed
#: as one kernel but gelu_new: GPT-2's tanh approximation written as eight tensor ops
#: (NewGELUActivation, from the original GPT-2 code; GPT-2, GPT-J, CodeGen and Phi-2 configs name
#: it). relu2 (ReLUSquaredActivation) is two, relu then square: left at one beside its GEMMs
ACTIVATION_FFN_TYPES = {"gelu": ("gelu", "geglu"), "gelu_pytorch_tanh": ("gelu", "geglu"), "gelu_new": ("gelu",),
                        "relu": ("relu",), "relu2": ("squared_relu",), "silu": ("swiglu",)}
ActivationFunction = Literal["gelu", "gelu_pytorch_tanh", "gelu_new", "relu", "relu2", "silu"]


def family_defaults(ffn_type) -> dict:
    """The norm and positions of the published decoders with this FFN (TransformerModel.norm):
    RMSNorm and rotary embeddings with a gated FFN (three matrices), LayerNorm and learned
    positions otherwise."""
    gated = isinstance(ffn_type, str) and FFN_MATRICES.get(ffn_type) == 3
    return {"norm": "rmsnorm" if gated else "layernorm", "rotary": gated}


class MoE(Spec):
    """Mixture-of-experts FFN (Shazeer et al. 2017; Switch, Fedus et al. 2021; DeepSeekMoE).

    Every layer after ``first_dense_layers`` replaces its FFN with ``num_experts`` routed
    experts of ``expert_ffn_hidden_size``, of which each token uses ``top_k``, plus
    ``shared_experts`` that every token uses. ``capacity_factor`` caps the tokens an expert
    takes at that multiple of the mean (None: no cap, no drops); ``load_imbalance`` is how far
    the busiest device's share exceeds the mean (1.0: perfectly balanced routing).
    """

    num_experts: Count
    top_k: Count
    expert_ffn_hidden_size: Count
    shared_experts: Natural = 0
    first_dense_layers: Natural = 0
    capacity_factor: float | None = Field(default=None, gt=0)
    load_imbalance: float = Field(default=1.0, ge=1.0)
    # node-limited routing: a token's routed experts lie on at most this many nodes (DeepSeek-V3's
    # M = 4, its technical report Sec. 2.1.2); None: no limit
    max_nodes: Count | None = None

    @model_validator(mode="after")
    def _top_k(self) -> "MoE":
        if self.top_k > self.num_experts:
            raise MeshplanError("top_k", self.top_k, f"at most num_experts ({self.num_experts})")
        return self

    @property
    def routed_factor(self) -> float:
        """Tokens the busiest expert group processes, relative to a perfectly even split."""
        if self.capacity_factor is None:
            return self.load_imbalance
        return min(self.load_imbalance, self.capacity_factor)


class MLA(Spec):
    """Multi-head latent attention (DeepSeek-V2, Liu et al. 2024, Sec. 2.1): queries and keys/values
    go through low-rank latents; the KV cache keeps only the kv latent and the decoupled RoPE key."""

    q_lora_rank: Natural = 0  # 0: queries projected directly from the hidden state
    kv_lora_rank: Count
    qk_nope_head_dim: Count
    qk_rope_head_dim: Count
    v_head_dim: Count


class TransformerModel(Spec):
    """A decoder-only transformer (GPT, Llama, Mistral, Qwen style), dense or mixture-of-experts."""

    arch: Literal["dense", "moe"] = "dense"
    id: str = "custom"
    name: str = ""
    num_layers: Count
    hidden_size: Count
    num_attention_heads: Count
    num_kv_heads: Count | None = None  # None: equal to heads (MHA)
    head_dim: Count | None = None  # None: hidden_size / heads
    ffn_hidden_size: Count | None = None  # the dense FFN; None only when every layer is MoE
    ffn_type: FfnType = "gelu"
    # the FFN's activation as the model's own code computes it (ACTIVATION_FFN_TYPES); None: one
    # kernel of the ffn_type's function. It matters where that code runs eager (fusion: eager):
    # gelu_new is then its eight tensor ops, under autocast two casts besides
    # (workloads.elementwise.activation_op)
    activation_function: ActivationFunction | None = None
    vocab_size: Count
    tied_embeddings: bool = False
    # None: as the published decoders with this FFN have it. Gated FFNs (SwiGLU, GeGLU: Llama,
    # Mistral, Qwen, Gemma, DeepSeek) come with RMSNorm and rotary position embeddings (Su et al.
    # 2021, RoFormer) on queries and keys; GPT-2/3-style GELU decoders with LayerNorm and learned
    # positions (GPT-3, Megatron's GPT), which add nothing to a layer
    norm: Literal["layernorm", "rmsnorm"] | None = None
    rotary: bool | None = None
    seq_len: Count = 2048  # default training sequence length
    # sliding-window attention (Child et al. 2019, "Generating Long Sequences with Sparse
    # Transformers"; Beltagy et al. 2020, Longformer): a query of a windowed layer attends to the
    # last ``sliding_window`` positions only, its own included, as Hugging Face's configs count
    # them (Mistral 7B v0.1: 4096, Gemma 2: 4096, Gemma 3: 1024, gpt-oss: 128). Which layers:
    # every layer, or with ``sliding_window_pattern`` p every layer but each p-th, which attends
    # to the whole sequence (Gemma 3's sliding_window_pattern 6: five windowed, then one global;
    # Gemma 2 and gpt-oss alternate, p 2). A windowed layer's flash kernel skips the key blocks
    # outside the window, and a server keeps its KV cache for the window only
    sliding_window: Count | None = None
    sliding_window_pattern: Count | None = None
    # "attention" or "mlp": the model is that block of one decoder layer, with no embedding,
    # output layer or loss, and a pipeline may cut it between its einsums (pipeline_layers)
    block: BlockKind = "layer"
    moe: MoE | None = None
    mla: MLA | None = None
    # multi-token-prediction modules trained with the model (DeepSeek-V3 technical report, arXiv
    # 2412.19437, Sec. 2.2 and Fig. 3; Megatron-Core mtp_num_layers, Hugging Face
    # num_nextn_predict_layers): each predicts one more token ahead from the previous depth's
    # hidden state and the next token's embedding, projected from 2h to h, through one more
    # decoder layer of the model's last kind and the shared output head and loss. They run after
    # the decoder layers, on the last pipeline stage, and are not in num_params (DeepSeek-V3's
    # 671B leave its 14B of them out)
    mtp_layers: Natural = 0
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _family_defaults(cls, data):
        """``norm`` and ``rotary`` left out: those of the published decoders with this FFN."""
        if isinstance(data, dict):
            defaults = family_defaults(data.get("ffn_type"))
            data = {**data, **{k: v for k, v in defaults.items() if data.get(k) is None}}
        return data

    @model_validator(mode="after")
    def _shapes(self) -> "TransformerModel":
        if self.arch == "moe" and self.moe is None:
            raise MeshplanError("moe", None, "a moe: block (num_experts, top_k, expert_ffn_hidden_size) with arch 'moe'")
        if self.arch != "moe" and self.moe is not None:
            raise MeshplanError("arch", self.arch, "'moe' for a model with a moe: block")
        if self.moe and self.moe.first_dense_layers > self.num_layers:
            raise MeshplanError("moe.first_dense_layers", self.moe.first_dense_layers,
                                f"at most num_layers ({self.num_layers})")
        if self.ffn_hidden_size is None and self.dense_layers:
            raise MeshplanError(
                "ffn_hidden_size", None,
                f"required: {self.dense_layers} layers have a dense FFN (it may be left out only when every "
                "layer is MoE: moe.first_dense_layers 0)",
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise MeshplanError(
                "hidden_size", self.hidden_size,
                f"a multiple of num_attention_heads ({self.num_attention_heads}), or give head_dim explicitly",
            )
        if self.block != "layer" and self.num_layers != 1:
            raise MeshplanError("num_layers", self.num_layers, f"1: block {self.block!r} is one block of one decoder layer")
        if self.block != "layer" and self.moe:
            raise MeshplanError("block", self.block, "'layer' for a mixture-of-experts model (blocks are dense)")
        if self.block != "layer" and self.mtp_layers:
            raise MeshplanError("mtp_layers", self.mtp_layers, f"0: block {self.block!r} has no output head to predict from")
        if self.num_attention_heads % self.kv_heads:
            raise MeshplanError("num_kv_heads", self.kv_heads, f"a divisor of num_attention_heads ({self.num_attention_heads})")
        if self.sliding_window_pattern is not None and self.sliding_window is None:
            raise MeshplanError("sliding_window_pattern", self.sliding_window_pattern,
                                "left out without a sliding_window (the window, in tokens, of the layers it windows)")
        ffn_types = ACTIVATION_FFN_TYPES.get(self.activation_function, (self.ffn_type,))
        if self.ffn_type not in ffn_types:
            raise MeshplanError("activation_function", self.activation_function,
                                f"the activation of ffn_type {self.ffn_type!r}, or leave it out "
                                f"({self.activation_function} is that of {' or '.join(ffn_types)})")
        return self

    @property
    def pipeline_layers(self) -> int:
        """What a pipeline splits: decoder layers, or the einsums of a block model (each matmul
        or attention core with the elementwise ops after it; meshplan.workloads.transformer)."""
        if self.block == "mlp":
            return 2  # up (gate and up fused) and down projections
        if self.block == "attention":
            if self.mla:  # q (or q_down, q_up), kv_down, kv_up, attention core, output projection
                return (3 if self.mla.q_lora_rank else 2) + 3
            return 3  # fused qkv projection, attention core, output projection
        return self.num_layers

    def windowed(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0 first) attends through the sliding window."""
        if self.sliding_window is None:
            return False
        return self.sliding_window_pattern is None or (layer + 1) % self.sliding_window_pattern != 0

    @property
    def windowed_layers(self) -> int:
        """Decoder layers that attend through the sliding window."""
        return sum(self.windowed(i) for i in range(self.num_layers))

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def ffn_matrices(self) -> int:
        return FFN_MATRICES[self.ffn_type]

    # parameter counts (weights only; biases and norms are counted, they are small but real)
    @property
    def attention_params(self) -> int:
        h, a = self.hidden_size, self.num_attention_heads
        if self.mla:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = (h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * a * qk) if m.q_lora_rank else h * a * qk
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank + m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv + a * m.v_head_dim * h
        d = self.dim_per_head
        q = a * d
        kv = 2 * self.kv_heads * d
        return h * (q + kv) + q * h + (q + kv) + h

    def ffn_params(self, ffn_hidden_size: int) -> int:
        h, f = self.hidden_size, ffn_hidden_size
        return self.ffn_matrices * h * f + (self.ffn_matrices - 1) * f + h

    @property
    def mlp_params(self) -> int:
        """The dense FFN (of every layer of a dense model, of the leading layers of an MoE)."""
        return self.ffn_params(self.ffn_hidden_size) if self.ffn_hidden_size else 0

    @property
    def ffn_widths(self) -> tuple[int, ...]:
        """The hidden widths of the FFNs a layer can run: dense, routed expert, shared experts."""
        widths = [self.ffn_hidden_size] if self.dense_layers else []
        if self.moe:
            widths.append(self.moe.expert_ffn_hidden_size)
            if self.moe.shared_experts:
                widths.append(self.moe.shared_experts * self.moe.expert_ffn_hidden_size)
        return tuple(widths)

    @property
    def expert_params(self) -> int:
        return self.ffn_params(self.moe.expert_ffn_hidden_size) if self.moe else 0

    @property
    def moe_mlp_params(self) -> int:
        """Router, routed experts and shared experts of one MoE layer."""
        m = self.moe
        if not m:
            return 0
        return self.hidden_size * m.num_experts + (m.num_experts + m.shared_experts) * self.expert_params

    @property
    def norm_params_per_layer(self) -> int:
        return (2 if self.norm == "layernorm" else 1) * 2 * self.hidden_size

    @property
    def params_per_layer(self) -> int:
        """Parameters of a dense layer."""
        return self.attention_params + self.mlp_params + self.norm_params_per_layer

    @property
    def dense_layers(self) -> int:
        return self.moe.first_dense_layers if self.moe else self.num_layers

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Total weights: layers, input embedding, output projection unless tied, final norm."""
        head = 0 if self.tied_embeddings else self.embedding_params
        final_norm = (2 if self.norm == "layernorm" else 1) * self.hidden_size
        moe_layer = self.attention_params + self.moe_mlp_params + self.norm_params_per_layer
        layers = self.dense_layers * self.params_per_layer + (self.num_layers - self.dense_layers) * moe_layer
        return layers + self.embedding_params + head + final_norm

    @property
    def mtp_params(self) -> int:
        """Weights of the multi-token-prediction modules as a pipeline's last stage holds them:
        each one's decoder layer (the model's last kind), its 2h-to-h projection and three norms,
        and a copy of the embedding table (unless tied to the output head, which is the model's
        own)."""
        if not self.mtp_layers:
            return 0
        norm = (2 if self.norm == "layernorm" else 1) * self.hidden_size
        layer = self.attention_params + self.norm_params_per_layer + (self.moe_mlp_params if self.moe else self.mlp_params)
        copy = 0 if self.tied_embeddings else self.embedding_params
        return self.mtp_layers * (layer + 2 * self.hidden_size ** 2 + 3 * norm + copy)

    @property
    def active_params(self) -> int:
        """Weights a token uses: only top_k routed experts of each MoE layer."""
        if not self.moe:
            return self.num_params
        m = self.moe
        unused = (m.num_experts - m.top_k) * self.expert_params * (self.num_layers - self.dense_layers)
        return self.num_params - unused
