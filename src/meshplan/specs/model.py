"""Model architectures. A model knows nothing about parallelism (torchtitan's seam)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from meshplan.specs.base import Count, Spec

FfnType = Literal["gelu", "relu", "squared_relu", "swiglu", "geglu"]

#: weight matrices in the FFN of each type: 2 (up, down) or 3 (gate, up, down)
FFN_MATRICES = {"gelu": 2, "relu": 2, "squared_relu": 2, "swiglu": 3, "geglu": 3}


class TransformerModel(Spec):
    """A dense decoder-only transformer (GPT, Llama, Mistral, Qwen style)."""

    arch: Literal["dense"] = "dense"
    id: str = "custom"
    name: str = ""
    num_layers: Count
    hidden_size: Count
    num_attention_heads: Count
    num_kv_heads: Count | None = None  # None: equal to heads (MHA)
    head_dim: Count | None = None  # None: hidden_size / heads
    ffn_hidden_size: Count
    ffn_type: FfnType = "gelu"
    vocab_size: Count
    tied_embeddings: bool = False
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    seq_len: Count = 2048  # default training sequence length
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _shapes(self) -> "TransformerModel":
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}; give head_dim explicitly"
            )
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                f"num_kv_heads {self.kv_heads}"
            )
        return self

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
        h, d = self.hidden_size, self.dim_per_head
        q = self.num_attention_heads * d
        kv = 2 * self.kv_heads * d
        return h * (q + kv) + q * h + (q + kv) + h

    @property
    def mlp_params(self) -> int:
        h, f = self.hidden_size, self.ffn_hidden_size
        return self.ffn_matrices * h * f + (self.ffn_matrices - 1) * f + h

    @property
    def norm_params_per_layer(self) -> int:
        return (2 if self.norm == "layernorm" else 1) * 2 * self.hidden_size

    @property
    def params_per_layer(self) -> int:
        return self.attention_params + self.mlp_params + self.norm_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Total weights: layers, input embedding, output projection unless tied, final norm."""
        head = 0 if self.tied_embeddings else self.embedding_params
        final_norm = (2 if self.norm == "layernorm" else 1) * self.hidden_size
        return self.num_layers * self.params_per_layer + self.embedding_params + head + final_norm
