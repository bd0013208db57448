"""What the run is for (the Task): pretraining, finetuning (frozen layers, LoRA), or inference;
and what its cost, energy and footprint are counted against."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from meshplan.errors import MeshplanError
from meshplan.specs.base import Count, Natural, Spec

#: which linear layers of each decoder layer get LoRA adapters: "attention" (the query/key/value
#: and output projections; NeMo's ``target_modules: [attention]``, as the MLPerf Training Llama 2
#: 70B LoRA reference sets it), "qkv" (the fused query/key/value projection), "mlp" (the MLP's
#: up/gate and down projections) or "all" (every linear layer; HF PEFT's "all-linear")
LoRATargets = Literal["attention", "qkv", "mlp", "all"]
#: how frozen base weights are stored: 16-bit, FP8 (one byte), or 4-bit NormalFloat (QLoRA)
LoRABaseDtype = Literal["bf16", "fp8", "nf4"]


class Task(Spec):
    """What the run is for.

    - pretrain: every layer trains.
    - finetune: the first ``frozen_layers`` decoder layers (and the embedding, if
      ``freeze_embedding``) keep their weights: no weight gradients or optimizer state for them,
      and backward stops at the lowest trainable layer. With ``lora_rank`` > 0 it is LoRA (Hu et
      al. 2021, arXiv:2106.09685): every base weight is frozen (no weight gradient, gradient
      reduction or optimizer state) but gradients flow back through every layer, and trainable
      adapters A (d_in x r) and B (r x d_out) sit beside the ``lora_targets`` linear layers
      (meshplan.workloads.lora); ``lora_base_dtype`` stores the frozen base weights in 16 bits,
      FP8, or NF4 as QLoRA does (Dettmers et al. 2023, arXiv:2305.14314), whose GEMMs each
      dequantize their weight first (meshplan.parallel.shard.with_dequantized_base).
    - inference: ``batch_size`` sequences, each a ``prompt_len`` prefill then ``output_len``
      decoded tokens with a KV cache.
    """

    kind: Literal["pretrain", "finetune", "inference"] = "pretrain"
    train_tokens: float | None = Field(default=None, gt=0)  # for time, GPU-hours, energy and cost to train
    # the footprint of training train_tokens: facility overhead on the IT energy (power usage
    # effectiveness), the grid's carbon intensity, and a price per device-hour
    pue: float = Field(default=1.0, ge=1.0)
    grid_kg_co2e_per_kwh: float | None = Field(default=None, ge=0)
    # or the grid of a region, read from codecarbon's data (meshplan.costs.grid, the carbon
    # extra): an ISO alpha-3 country code ("FRA") or a cloud region "provider:region"
    grid_region: str | None = Field(default=None, min_length=1, max_length=100)
    price_per_device_hour: float | None = Field(default=None, ge=0)
    # or price a device-hour by owning the cluster (meshplan.costs.tco, catalog/prices.yaml):
    # capital amortized over lifetime_years plus the energy at electricity_usd_per_kwh (both
    # default to the price book's cited figures)
    tco: bool = False
    lifetime_years: float | None = Field(default=None, gt=0, le=50)
    electricity_usd_per_kwh: float | None = Field(default=None, ge=0, le=10)
    frozen_layers: Natural = 0
    freeze_embedding: bool = True
    lora_rank: Natural = 0  # 0: no adapters (full or frozen-layer finetuning)
    lora_targets: LoRATargets = "attention"
    lora_base_dtype: LoRABaseDtype | None = None  # None: as the plan stores weights
    # the power of each node beyond its accelerators (CPUs, DRAM, NICs, switches, fans), counted
    # in the energy (EnergyBreakdown.host_j) only when given: watts, or "catalog" for the
    # cluster's cited figure (Cluster.host_w_per_node)
    host_w_per_node: float | Literal["catalog"] | None = None
    batch_size: Count = 1
    prompt_len: Count = 2048
    output_len: Count = 256
    # the KV cache's element: None keeps the activations' 16 bits; fp8 as TensorRT-LLM
    # (--fp8_kv_cache), vLLM and SGLang (--kv-cache-dtype fp8) store it, a byte a value
    kv_cache_dtype: Literal["bf16", "fp16", "fp8"] | None = None

    @field_validator("host_w_per_node", mode="before")
    @classmethod
    def _watts_or_catalog(cls, value):
        if value is None or value == "catalog":
            return value
        try:
            watts = float(value)
        except (TypeError, ValueError):
            watts = -1.0
        if not watts >= 0 or watts == float("inf"):
            raise MeshplanError("host_w_per_node", value, "watts per node (a number >= 0), or 'catalog' for the cluster's figure")
        return watts

    @model_validator(mode="after")
    def _fields_fit_the_kind(self) -> "Task":
        """A field the task kind does not read is an error, never silently ignored."""
        for field in sorted(self.model_fields_set):
            kinds = _TASK_FIELD_KINDS.get(field)
            if kinds and self.kind not in kinds:
                raise MeshplanError(
                    field, getattr(self, field),
                    f"is read only by task kind {' or '.join(kinds)}, not {self.kind} (set task.kind, or drop it)",
                )
        if self.grid_region is not None and self.grid_kg_co2e_per_kwh is not None:
            raise MeshplanError("grid_region", self.grid_region,
                                "give the grid as grid_kg_co2e_per_kwh or as grid_region, not both")
        if self.tco and self.price_per_device_hour is not None:
            raise MeshplanError("tco", self.tco, "price a device-hour by the TCO or by price_per_device_hour, not both")
        for field in ("lifetime_years", "electricity_usd_per_kwh"):
            if not self.tco and getattr(self, field) is not None:
                raise MeshplanError(field, getattr(self, field), "is read only with task.tco (the TCO price)")
        if not self.lora_rank:
            for field in ("lora_targets", "lora_base_dtype"):
                if field in self.model_fields_set:
                    raise MeshplanError(field, getattr(self, field), "is read only with task.lora_rank > 0 (LoRA finetuning)")
        elif self.frozen_layers:
            raise MeshplanError("frozen_layers", self.frozen_layers,
                                "must be 0 with task.lora_rank > 0: LoRA freezes every base weight and trains adapters in every layer")
        return self


#: task fields that only some kinds read
_TASK_FIELD_KINDS = {
    "train_tokens": ("pretrain", "finetune"),
    "pue": ("pretrain", "finetune"),
    "grid_kg_co2e_per_kwh": ("pretrain", "finetune"),
    "grid_region": ("pretrain", "finetune"),
    "price_per_device_hour": ("pretrain", "finetune"),
    "tco": ("pretrain", "finetune"),
    "lifetime_years": ("pretrain", "finetune"),
    "electricity_usd_per_kwh": ("pretrain", "finetune"),
    "host_w_per_node": ("pretrain", "finetune"),
    "frozen_layers": ("finetune",),
    "freeze_embedding": ("finetune",),
    "lora_rank": ("finetune",),
    "lora_targets": ("finetune",),
    "lora_base_dtype": ("finetune",),
    "batch_size": ("inference",),
    "prompt_len": ("inference",),
    "output_len": ("inference",),
    "kv_cache_dtype": ("inference",),
}
