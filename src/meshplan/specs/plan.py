"""How the work is split over devices (the Plan; what the run is for is specs.task.Task)."""

from __future__ import annotations

import numbers
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from meshplan.errors import MeshplanError
from meshplan.specs.base import Count, Natural, Spec
from meshplan.specs.kernels import AttentionGeneration

Recompute = Literal["none", "selective", "full"]
RecomputeModule = Literal["core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "shared_experts"]
Schedule = Literal["1f1b", "gpipe", "zb-h1", "dualpipe"]
TPOverlap = Literal["none", "bulk", "pipelined"]
EPOverlap = Literal["none", "paired"]
Framework = Literal["megatron-lm", "megatron-core", "nemo", "nemo-launcher", "torchtitan", "deepspeed", "llm-foundry", "pytorch-fsdp",
                    "fms-fsdp"]
TrainPrecision = Literal["fp32", "bf16", "fp16", "fp8", "fp4"]
AXES = ("tp", "cp", "dp", "pp")
#: collective algorithms a plan may force (meshplan.network.algorithms), and the kinds each runs
COLLECTIVE_ALGORITHMS: dict[str, tuple[str, ...]] = {
    "ring": ("all_reduce", "all_gather", "reduce_scatter"),
    "tree": ("all_reduce",),
    "nvls": ("all_reduce",),
    "nvls_tree": ("all_reduce",),
    "collnet": ("all_reduce",),
    "hierarchical": ("all_reduce", "all_gather", "reduce_scatter"),
    "halving_doubling": ("all_reduce", "all_gather", "reduce_scatter"),
    "bucket": ("all_reduce", "all_gather", "reduce_scatter"),
    "direct": ("all_to_all",),
}
#: NCCL_ALGO's spellings of the same algorithms (NCCL docs, Environment Variables, NCCL_ALGO)
NCCL_ALGO_NAMES = {"nvlstree": "nvls_tree", "collnetdirect": "collnet", "collnetchain": "collnet"}
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
COLLECTIVE_PROTOCOLS = ("auto", "LL", "LL128", "Simple")


class Plan(Spec):
    """Parallel degrees and the knobs that change time and memory.

    ``dp`` may be left unset and is then inferred from the device count. ``order`` lists the mesh
    axes innermost first (Megatron's default tp-cp-dp-pp): the innermost axes get the fastest
    network level, so TP stays inside the node by default.
    """

    tp: Count = 1
    pp: Count = 1
    dp: Count | None = None
    cp: Count = 1
    ep: Count = 1
    # tensor parallelism inside each routed expert (Megatron-Core expert_tensor_parallel_size);
    # None: tp when ep divides cp*dp, else 1 (MoE parallel folding: ep spans the tp ranks too)
    expert_tp: Count | None = None
    sequence_parallel: bool = False
    micro_batch_size: Count = 1
    global_batch_size: Count | None = None  # sequences per step; None: micro_batch_size * dp
    seq_len: Count | None = None  # None: the model's seq_len
    virtual_pipeline_stages: Count = 1  # interleaved 1F1B model chunks per device
    # interleaved 1F1B: micro-batches that go through one model chunk in a row before the next
    # (Megatron-Core --microbatch-group-size-per-virtual-pipeline-stage); None: pp, or where the
    # micro-batch count is not a multiple of pp the smallest group Megatron-Core accepts
    # (interleave_group)
    microbatch_group_size: Count | None = None
    # uneven pipelines (Megatron-LM --decoder-first/last-pipeline-num-layers): the first and last
    # stages take these many layers and the rest split the remainder evenly
    first_stage_layers: Count | None = None
    last_stage_layers: Count | None = None
    # every model chunk's layers, in Megatron-Core's --pipeline-model-parallel-layout syntax
    # ("Et*2|(t*2|)*38,tL": E the embedding, t a decoder layer, L the loss; parse_pipeline_layout)
    pipeline_layout: str | None = None
    schedule: Schedule = "1f1b"
    zero_stage: Natural = Field(default=0, le=3)  # 3 is FSDP full shard
    # ZeRO/FSDP shard over groups of this many data-parallel ranks and replicate across the
    # groups (hybrid sharding, PyTorch FSDP HYBRID_SHARD / HSDP); None: over all dp ranks
    zero_shard_size: Count | None = None
    # ZeRO-3/FSDP weight gathers: before every forward and backward of each micro-batch, or once
    # per step with the weights kept gathered and gradients reduce-scattered once after the last
    # backward (PyTorch pipelining with FSDP2: ZeRO-1's memory and traffic);
    # "per_step_if_pipelined": per step only where pp > 1 (torchtitan); see zero3_per_step
    zero3_gather: Literal["per_micro_batch", "per_step", "per_step_if_pipelined"] = "per_micro_batch"
    recompute: Recompute = "none"
    # what "selective" re-runs: the attention core (Korthikanti et al. 2022, Megatron's
    # --recompute-granularity selective; nothing under flash attention, which keeps no scores),
    # or torchtitan's per-op policy ("op": every op but matmuls, attention and reduce-scatters,
    # and every second matmul of a layer; parallel.recompute.op_recompute), or Megatron-Core's
    # fine-grained modules ("modules": the recompute_modules below), or whole blocks ("blocks":
    # fms-fsdp's selective_checkpointing, a share of the blocks checkpointed whole: every block,
    # its default, as full does, or recompute_layers of them), or JAX's policy that keeps the
    # outputs of the dots without batch dimensions ("dots": the projections kept, everything else
    # re-run, attention included; MaxText's remat_policy "minimal")
    selective_recompute: Literal["attention", "op", "modules", "blocks", "dots"] = "attention"
    # Megatron-Core's recompute_modules: the modules "modules" re-runs in backward (its default is
    # the attention core; parallel.recompute.RECOMPUTE_MODULES)
    recompute_modules: tuple[RecomputeModule, ...] = ("core_attn",)
    # with whole-layer recompute (full, or selective blocks): how many decoder layers of each
    # model chunk re-run in backward, the first ones; the rest keep their activations
    # (Megatron-Core's --recompute-method block --recompute-num-layers; torchtitan's layer
    # checkpointing every k-th block and fms-fsdp's share of blocks read as a count). None: all
    recompute_layers: Natural | None = None
    precision: TrainPrecision = "bf16"
    flash_attention: bool = True
    # which flash-attention generation runs (None: the newest the device family runs, the one its
    # kernel model was fitted on); an older one runs at the published fraction of its speed that
    # the family's profile gives (catalog/efficiency.yaml attention_kernels): "flash3" for
    # FlashAttention-3 class kernels (FA3, cuDNN's fused attention), "flash2", and "flash1" for
    # FlashAttention and its Triton port
    attention_kernel: AttentionGeneration | None = None
    # the cross-entropy as one fused kernel over the 16-bit logits (flash-attn's xentropy,
    # Megatron-Core's cross-entropy fusion), or PyTorch's fp32 passes (workloads.elementwise.cross_entropy_op)
    fused_loss: bool = False
    # the norms and rotary embeddings: "fused" kernels (Transformer Engine, Apex, Megatron's fused
    # kernels, torch.compile), or "eager", op by op as PyTorch runs the reference Llama code
    # without torch.compile (workloads.elementwise.norm_op and rotary_op say what each moves)
    fusion: Literal["fused", "eager"] = "fused"
    # 16-bit GEMMs under PyTorch's autocast over fp32 weights (Hugging Face Trainer's bf16=True,
    # Lightning's bf16-mixed, Composer's amp_bf16), not 16-bit weights beside an fp32 master
    # (Megatron, NeMo, DeepSpeed). With nothing sharded (zero_stage 0: one GPU, DDP) the weights
    # are cast in every forward and the residual stream stays fp32 (parallel.program.
    # fp32_weights_under_autocast); FSDP and ZeRO gather 16-bit copies
    autocast: bool = False
    # the loop frees the gradients after each optimizer step (torch.optim's zero_grad(set_to_none=True),
    # its default since PyTorch 2.0; Hugging Face's Trainer, FSDP and torchtitan loops): a step's
    # forward runs without them, and they are allocated as its backward frees activations
    # (parallel.memory.stage_memory); DDP's buckets and Megatron's and DeepSpeed's gradient
    # buffers keep them whatever the loop does
    free_grads: bool = False
    # what runs beside compute (meshplan.timeline.passes); a ``framework`` sets its defaults
    framework: Framework | None = None
    overlap_grad_reduce: bool = True  # gradient buckets reduced during the last micro-batch's backward
    # parameters per data-parallel gradient bucket (Megatron-Core's --ddp-bucket-size, MLPerf's
    # BUCKET_SIZE); None: Megatron-Core's default, max(40M, 1M x the data-parallel size)
    grad_bucket_size: Count | None = None
    # the distributed optimizer's (ZeRO 1-2) parameter all-gather runs ahead of the next forward
    # (Megatron-Core --overlap-param-gather), or blocks after the optimizer step (DeepSpeed)
    overlap_param_gather: bool = True
    prefetch_layers: Natural = 1  # how many layers ahead ZeRO-3/FSDP gathers run (0: each waits for its own)
    # ZeRO-3 keeps at most this many gathered parameters live, gathering module by module
    # (DeepSpeed's stage3_max_live_parameters; a module larger than it is still gathered whole);
    # None: whole layers, the one in use and the one prefetched (FSDP wraps each block)
    zero3_live_params: float | None = Field(default=None, gt=0)
    # ZeRO-3 gathers a recomputed layer's weights again for its re-run, a third gather a layer
    # (DeepSpeed: its pre-forward hooks fetch them in the recompute, its post-forward ones
    # release them before the backward fetches them); PyTorch FSDP and Megatron-FSDP gather
    # twice, their recompute running on the weights the pre-backward hook gathered (framework
    # presets say which)
    zero3_recompute_gather: bool = True
    tp_overlap: TPOverlap = "none"  # tensor-parallel collectives: blocking, bulk (backward), pipelined
    # sequence parallelism keeps each half's first GEMM input as its shard and all-gathers it
    # again in backward for the weight gradient, beside the input gradient (Korthikanti et al.
    # 2022, Sec. 4.2.2; Megatron's LinearWithGradAccumulationAndAsyncCommunication, Transformer
    # Engine's LayerNormLinear, whose userbuffers run it as the bulk qkv_dgrad / fc1_dgrad
    # overlap); False: autograd keeps the gathered input (PyTorch DTensor's SequenceParallel)
    sp_regather: bool = True
    cp_overlap: bool = True  # ring attention: the next K/V block arrives while this one is computed
    ep_overlap: EPOverlap = "none"  # expert all-to-all blocking, or beside another micro-batch's compute
    # tokens to experts: one copy per (token, expert) pair, or once per node and GPU with NVLink
    # forwarding (DeepEP / HybridEP, DeepSeek-V3); meshplan.parallel.dispatch
    ep_dispatch: Literal["all_to_all", "hierarchical"] = "all_to_all"
    # how a device's local experts run their GEMMs: one grouped kernel for all of them
    # (torch._grouped_mm, CUTLASS or cuBLASLt grouped GEMM), or one GEMM per local expert, as
    # Transformer Engine's GroupedLinear issues them over several streams; each is a dispatch the
    # host pays (meshplan.costs.host.host_bound)
    expert_gemms: Literal["grouped", "per_expert"] = "grouped"
    # a dropless dispatcher copies the token counts to the host and waits for them in every MoE
    # layer's forward (the all-to-all's split sizes, the grouped GEMM's): the host cannot run
    # ahead of the GPU past it (meshplan.costs.host.host_bound)
    moe_host_sync: bool = False
    # "full": the whole training iteration captured in CUDA graphs and replayed (Megatron-Core
    # --cuda-graph-impl full_iteration with paged stashing and device-initiated grouped GEMMs):
    # the host issues no op by op, so neither its dispatch nor a sync holds the GPU back
    cuda_graphs: Literal["none", "full"] = "none"
    # pipeline sends on their own stream; None: as Megatron-Core does, overlapped in interleaved
    # schedules (overlap_p2p_comm) and batched and waited on in the others
    overlap_p2p: bool | None = None
    grad_reduce_precision: Literal["fp32", "bf16", "fp16"] | None = None  # None: fp32 unless ZeRO-3
    # FP8/FP4 training keeps its GEMM weights in that precision, with no 16-bit copy (Transformer
    # Engine fp8_model_init; Megatron --fp8-param-gather, NeMo fp8_params)
    fp8_params: bool = False
    # dot-product attention in FP8 as well (Transformer Engine's fp8_dpa, NeMo's and MLPerf's
    # FP8_DPA, Megatron-Bridge's fp8_dot_product_attention): cuDNN's fused attention takes FP8 Q,
    # K and V; otherwise it stays in 16 bits beside FP8 or FP4 GEMMs (costs.compute.attention_precision)
    fp8_attention: bool = False
    # how Adam keeps its state (meshplan.parallel.memory.OPTIMIZER_STATES): an fp32 master and fp32
    # moments; the master as the 16-bit weight plus a 16-bit remainder (Apex's distributed Adam,
    # store_param_remainders); bf16 moments (Megatron-Core's precision-aware optimizer); or bf16
    # moments and no master (Apex's distributed Adam with dtype bf16 on a bf16 model)
    optimizer_state: Literal["fp32", "fp32_remainders", "bf16_moments", "bf16"] = "fp32"
    # how its step runs: one fused kernel (Apex's and Transformer Engine's Adam, DeepSpeed's
    # FusedAdam, torch.optim.AdamW(fused=True)), or PyTorch's default on CUDA, a multi-tensor
    # kernel per arithmetic step (foreach; meshplan.parallel.memory.FOREACH_ADAM_PASSES), which
    # keeps an fp32 or a bf16 state
    optimizer_impl: Literal["fused", "foreach"] = "fused"
    # the framework pads the vocabulary to a multiple of this times tp (Megatron-LM's and NeMo's
    # make_vocab_size_divisible_by, 128); 1: the model's vocabulary as given (Hugging Face,
    # torchtitan), whose output-layer GEMMs may then be unaligned (KernelModels.unaligned_gemm)
    vocab_padding: Count = 1
    # how each micro-batch's weight gradients join the step's: "fused", the weight-gradient GEMM
    # adds into the gradient buffer (Megatron's gradient_accumulation_fusion into the fp32
    # main_grad; nothing more moves); "fp32_add", the 16-bit gradients are added into fp32 ones
    # after every backward (DeepSpeed's BF16_Optimizer; grad_fp32_add says when it runs)
    grad_accumulation: Literal["fused", "fp32_add"] = "fused"
    # how FP8/FP4 GEMM operands get their scales: an amax history (delayed), the tensor's own
    # amax (current: one more pass over it), or per block inside the cast (block: MXFP8,
    # DeepSeek-V3 tiles); meshplan.parallel.quantize says what each moves
    fp8_scaling: Literal["delayed", "current", "block"] = "delayed"
    # and FP4's: NVFP4 (16-value blocks under a per-tensor scale from the tensor's amax, the
    # weight-gradient copies through a random Hadamard transform: Transformer Engine's
    # NVFP4BlockScaling, its only FP4 training recipe) or plain block scales (MXFP4)
    fp4_scaling: Literal["nvfp4", "block"] = "nvfp4"
    # whether NVFP4 puts the weight gradient's operands through its random Hadamard transform
    # (Transformer Engine's default; NVTE_NVFP4_DISABLE_RHT=1 turns it off, as NVIDIA's MLPerf
    # Training v5.1 Llama 3.1 405B configs do)
    fp4_hadamard: bool = True
    # at most this many NICs of a node (links of a lower-level domain) carry one collective; None:
    # the cluster's rails, every NIC, as NCCL stripes its channels (meshplan.network.span)
    network_rails: Count | None = None
    # the same cap for ZeRO-3/FSDP's per-layer weight gathers and gradient reduce-scatters alone
    # (a framework whose sharded collectives reach fewer NICs than its other collectives)
    zero3_network_rails: Count | None = None
    # NCCL_ALGO / NCCL_PROTO for the plan's collectives; "auto" lets NCCL's tuner pick per call
    # (meshplan.network.tuner). An algorithm applies to every collective kind it runs ("tree":
    # all-reduces only); "all_reduce:tree;all_gather:ring" (or a mapping) forces one per kind,
    # as NCCL_ALGO's per-collective form does. A protocol applies to all-reduce, all-gather and
    # reduce-scatter (all-to-all sends follow NCCL_P2P_LL_THRESHOLD).
    collective_algorithm: str = "auto"
    collective_protocol: str = "auto"
    # fraction of this device's optimizer state (fp32 master weights, Adam moments) kept in host
    # memory and stepped by the CPU (Megatron-Core --optimizer-cpu-offload with
    # --optimizer-offload-fraction; DeepSpeed ZeRO-Offload at 1.0); meshplan.costs.offload
    optimizer_offload: float = 0.0
    # the first this many decoder layers keep their saved activations in host memory between
    # forward and backward: copied out one layer behind the forward and back one layer ahead of
    # the backward (Megatron-Core cpu_offloading_num_layers, Transformer Engine's CPU offload;
    # pp 1, no recompute, no CUDA graphs, as Megatron-Core requires); meshplan.costs.costed
    activation_offload_layers: Natural = 0
    order: str = "tp-cp-dp-pp"

    @property
    def quant_scaling(self) -> str:
        """How the plan's low-precision GEMM operands are scaled: fp4_scaling in FP4 ("nvfp4_plain":
        NVFP4 without its Hadamard transform), else fp8_scaling."""
        if self.precision != "fp4":
            return self.fp8_scaling
        return "nvfp4_plain" if self.fp4_scaling == "nvfp4" and not self.fp4_hadamard else self.fp4_scaling

    @model_validator(mode="before")
    @classmethod
    def _framework_defaults(cls, data):
        """A framework fills the overlap options its users get by default; fields given win. It
        may be named another way (catalog.FRAMEWORK_ALIASES: huggingface, fsdp2, mcore...)."""
        if isinstance(data, dict) and isinstance(data.get("framework"), str):
            from meshplan import catalog

            name = catalog.framework_id(data["framework"]) or data["framework"]
            preset = catalog.frameworks().get(name)
            if preset:
                data = {**preset, **data, "framework": name}
        return data

    @field_validator("pipeline_layout", mode="before")
    @classmethod
    def _layout_parses(cls, value):
        if value is not None:
            parse_pipeline_layout(value)
        return value

    @field_validator("recompute_modules", mode="before")
    @classmethod
    def _modules_listed(cls, value):
        """A list of module names, or one name or several joined by commas, as Megatron-Core's
        --recompute-modules takes them; at least one."""
        if isinstance(value, str):
            value = tuple(part.strip() for part in value.split(",") if part.strip())
        if isinstance(value, (list, tuple)) and not value:
            raise MeshplanError("recompute_modules", value, "at least one of " + ", ".join(RecomputeModule.__args__))
        return value

    @field_validator("collective_algorithm", mode="before")
    @classmethod
    def _known_algorithms(cls, value):
        return forced_algorithms_text(value)

    @field_validator("collective_protocol", mode="before")
    @classmethod
    def _known_protocol(cls, value):
        by_name = {p.lower(): p for p in COLLECTIVE_PROTOCOLS}
        if not isinstance(value, str) or value.lower() not in by_name:
            raise MeshplanError("collective_protocol", value, f"one of {', '.join(COLLECTIVE_PROTOCOLS)} (NCCL_PROTO)")
        return by_name[value.lower()]

    @field_validator("optimizer_offload", mode="before")
    @classmethod
    def _offload_fraction(cls, value):
        valid = "a fraction from 0 to 1 of the optimizer state kept in host memory (0: none, 1: all)"
        if isinstance(value, bool):
            raise MeshplanError("optimizer_offload", value, valid)
        try:
            fraction = float(value)
        except (TypeError, ValueError):
            raise MeshplanError("optimizer_offload", value, valid) from None
        if not 0.0 <= fraction <= 1.0:
            raise MeshplanError("optimizer_offload", value, valid)
        return fraction

    @model_validator(mode="after")
    def _fp8_attention_in_low_precision(self):
        """FP8 attention runs inside FP8 or FP4 training, in a flash-fused kernel."""
        if self.fp8_attention and self.precision not in ("fp8", "fp4"):
            raise MeshplanError("fp8_attention", True, f"FP8 or FP4 training (precision fp8 or fp4), not {self.precision}")
        if self.fp8_attention and not self.flash_attention:
            raise MeshplanError("fp8_attention", True, "a flash-fused attention kernel (flash_attention true): "
                                "FP8 attention is cuDNN's fused kernel")
        return self

    @model_validator(mode="after")
    def _foreach_keeps_its_own_state(self):
        """PyTorch's foreach AdamW steps fp32 or bf16 tensors; the other states are fused optimizers'."""
        if self.optimizer_impl == "foreach" and self.optimizer_state not in ("fp32", "bf16"):
            raise MeshplanError("optimizer_state", self.optimizer_state,
                                "fp32 or bf16 with optimizer_impl foreach (PyTorch's AdamW); "
                                "fp32_remainders and bf16_moments are fused optimizers' (Apex, Megatron-Core)")
        return self

    @field_validator("order")
    @classmethod
    def _order_is_a_permutation(cls, order: str) -> str:
        axes = order.split("-")
        if sorted(axes) != sorted(AXES):
            raise ValueError(f"order must list each of {', '.join(AXES)} once, joined by '-'")
        return order

    @property
    def model_parallel(self) -> int:
        return self.tp * self.cp * self.pp

    @property
    def whole_layer_recompute(self) -> bool:
        """Whether decoder layers re-run their whole forward in backward, keeping only their input:
        full recompute, or selective recompute of whole blocks (selective_recompute); every layer,
        or the first ``recompute_layers`` of each model chunk."""
        return self.recompute == "full" or (self.recompute == "selective" and self.selective_recompute == "blocks")

    @property
    def zero3_per_step(self) -> bool:
        """ZeRO-3 whose weights stay gathered through the step (zero3_gather): each pipeline stage
        gathers its weights at its first forward and reduce-scatters its gradients after its last
        backward (torch.distributed.pipelining's PipelineStage with an FSDP2 module: no
        reshard and no gradient sync between micro-batches; torchtitan sets
        reshard_after_forward = not pp_enabled)."""
        if self.zero_stage != 3 or self.zero3_gather == "per_micro_batch":
            return False
        return self.zero3_gather == "per_step" or self.pp > 1

    @property
    def grad_fp32_add(self) -> bool:
        """Whether each micro-batch's 16-bit weight gradients are added into fp32 ones after its
        backward. DeepSpeed runs its BF16_Optimizer for bf16 weights (FP8 training keeps them
        too) under ZeRO 0-1 (runtime/engine.py, _do_optimizer_sanity_check); fp16 weights
        accumulate in place and ZeRO 2-3 partition the gradients instead."""
        return self.grad_accumulation == "fp32_add" and self.precision not in ("fp16", "fp32") and self.zero_stage <= 1

    @property
    def zero_memory_stage(self) -> int:
        """The ZeRO stage whose memory and traffic the plan has: 1 for ZeRO-3 kept gathered
        through the step (full weights and gradients, sharded optimizer states), else zero_stage."""
        return 1 if self.zero3_per_step else self.zero_stage


#: the layout's letters (Megatron-Core PipelineParallelLayerLayout): E embedding, t decoder layer,
#: m multi-token-prediction layer, L loss
LAYOUT_LETTERS = "EtmL"
LAYOUT_MAX_LETTERS = 100_000  # far more layers and chunks than any model has; bounds what a typo expands to
_LAYOUT_GROUP = re.compile(r"\(([^()]+)\)\*(\d+)")
_LAYOUT_REPEAT = re.compile(r"(.)\*(\d+)")


def parse_pipeline_layout(text: object) -> tuple[str, ...]:
    """The model chunks of a layout string, in pipeline order, each as its letters.

    Megatron-Core's syntax (megatron/core/transformer/pipeline_parallel_layer_layout.py,
    parse_str_to_list): "|" ends a chunk, "(...)*n" repeats a group n times, "x*n" a letter,
    commas are only for reading. "Et*2|(t*2|)*38,tL" is 40 chunks: the embedding and two layers,
    38 chunks of two layers, one layer and the loss.
    """
    valid = ("a pipeline layout in Megatron-Core's syntax: E (embedding), t (decoder layer), L (loss), "
             "'|' between model chunks, '(...)*n' and 't*n' to repeat; e.g. 'Et*2|(t*2|)*38,tL'")
    too_long = f"at most {LAYOUT_MAX_LETTERS} letters once repeats are expanded"
    if not isinstance(text, str) or not text.strip():
        raise MeshplanError("plan.pipeline_layout", text, valid)

    def repeat(group: re.Match) -> str:
        if len(group.group(1)) * int(group.group(2)) > LAYOUT_MAX_LETTERS:
            raise MeshplanError("plan.pipeline_layout", text, too_long)
        return group.group(1) * int(group.group(2))

    flat = text.replace(",", "").replace(" ", "")
    flat = _LAYOUT_REPEAT.sub(repeat, _LAYOUT_GROUP.sub(repeat, flat))
    if len(flat) > LAYOUT_MAX_LETTERS:
        raise MeshplanError("plan.pipeline_layout", text, too_long)
    chunks = tuple(flat.split("|"))
    if any(c not in LAYOUT_LETTERS for c in flat.replace("|", "")):
        raise MeshplanError("plan.pipeline_layout", text, valid)
    return chunks


def _algorithm_name(name: object) -> str | None:
    if not isinstance(name, str):
        return None
    key = name.lower().replace("-", "_")
    key = NCCL_ALGO_NAMES.get(key.replace("_", ""), key)
    return key if key in COLLECTIVE_ALGORITHMS or key == "auto" else None


def forced_algorithms_text(value: object) -> str:
    """``collective_algorithm`` as one canonical string: "auto", an algorithm, or
    "kind:algorithm;kind:algorithm" for a mapping (kept a string, so a Plan stays hashable)."""
    valid = (f"auto, one of {', '.join(COLLECTIVE_ALGORITHMS)}, or kind:algorithm pairs joined by ';' "
             f"(kinds {', '.join(COLLECTIVE_KINDS)})")
    if isinstance(value, str) and ":" not in value:
        name = _algorithm_name(value.strip())
        if name is None:
            raise MeshplanError("collective_algorithm", value, valid)
        return name
    if isinstance(value, str):
        value = dict(part.split(":", 1) if ":" in part else (part, "") for part in value.split(";") if part.strip())
    if not isinstance(value, dict) or not value:
        raise MeshplanError("collective_algorithm", value, valid)
    pairs = []
    for kind, name in value.items():
        kind_key = str(kind).strip().lower().replace("-", "_")
        kind_key = {k.replace("_", ""): k for k in COLLECTIVE_KINDS}.get(kind_key.replace("_", ""), kind_key)
        algorithm = _algorithm_name(str(name).strip())
        if kind_key not in COLLECTIVE_KINDS or algorithm is None:
            raise MeshplanError("collective_algorithm", value, valid)
        if algorithm != "auto" and kind_key not in COLLECTIVE_ALGORITHMS[algorithm]:
            raise MeshplanError("collective_algorithm", value,
                                f"{algorithm} runs {', '.join(COLLECTIVE_ALGORITHMS[algorithm])}, not {kind_key}")
        pairs.append(f"{kind_key}:{algorithm}")
    return ";".join(sorted(pairs))


def group_problem(p: int, m: int, group: object) -> tuple[str, object, str] | None:
    """(field, value, what is valid) when interleaved 1F1B cannot run m micro-batches over p stages
    in groups of ``group``, as Megatron-Core checks it (forward_backward_pipelining_with_interleaving):
    p <= group <= m, and the last group (m mod group) empty or at least p, or the pipeline stalls."""
    if isinstance(group, bool) or not isinstance(group, numbers.Integral) or group < p:
        return "plan.microbatch_group_size", group, f"a whole number >= pp ({p})"
    if m < p:
        return "pipeline.micro_batches", m, f"interleaved 1F1B needs at least pp = {p} micro-batches"
    if group > m:
        return "plan.microbatch_group_size", group, f"at most the {m} micro-batches"
    if 0 < m % group < p:
        return ("plan.microbatch_group_size", group, f"{m} micro-batches in groups of {group} leave {m % group}; "
                f"the last group must be empty or hold at least pp = {p} (as Megatron-Core requires)")
    return None


def interleave_group(p: int, m: int) -> int:
    """Megatron-Core's default group, pp (microbatch_group_size_per_vp_stage = None), when it can
    run m micro-batches; else the smallest one it accepts. PyTorch's ScheduleInterleaved1F1B
    (torch/distributed/pipelining/schedules.py) runs rounds of m // (m // p) micro-batches and
    accepts m only when they divide it: that is this same group (tests)."""
    return next((g for g in range(p, max(m, p) + 1) if group_problem(p, m, g) is None), p)
