"""Memory per device: weights, gradients, optimizer states, activations, buffers.

- Mixed-precision Adam: 16-bit weights, fp32 master weights, momentum and variance (12 bytes per
  parameter), gradients in the reduce precision (Rajbhandari et al. 2020, "ZeRO", Sec. 3.1).
- ZeRO stage 1 shards the optimizer states over dp, stage 2 also the gradients, stage 3 (FSDP
  full shard) also the weights (ZeRO, Sec. 5).
- Optimizer offload (Megatron-Core --optimizer-cpu-offload, DeepSpeed ZeRO-Offload): the
  offloaded share of the optimizer state lives in host memory with an fp32 gradient copy per
  offloaded parameter; the node's devices share its host memory evenly.
- Activations: the tensors each op saves (meshplan.workloads.transformer, Korthikanti et al. 2022)
  times the micro-batches in flight: 1F1B keeps up to pp micro-batches on the first stage,
  interleaving adds a factor 1 + (pp-1)/(pp·v) (Korthikanti et al. 2022, Sec. 4.2.3); GPipe keeps
  all of them.

Under a per-layer-kind strategy (MAD Max Sec. 2.2, Insight 1; ``DLRMMemory``):
- embedding tables are split evenly over the ``mp`` devices (MAD Max Sec. 4.2) and replicated
  over ``ddp``; their optimizer is fused into the backward (FBGEMM/TorchRec table-batched
  embeddings), so no dense gradient of a table is ever stored. Row-wise Adagrad keeps one fp32
  per row, element-wise Adagrad one fp32 per weight, SGD nothing;
- dense weights are split by ``tp`` and ``fsdp`` (and experts by ``ep``), replicated by ``ddp``;
  gradients are kept like the weights (FSDP shards them after the reduce-scatter); Adagrad keeps
  one fp32 state per weight, Adam two, SGD none, and 16-bit weights add an fp32 master copy
  (ZeRO Sec. 3.1);
- FSDP holds two gathered layers at a time (the one computing and the one prefetched);
- activations are the tensors saved for backward plus the embedding lookups' indices (int64) and
  the all-to-all send and receive buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from meshplan.parallel.mesh import expert_mesh, weight_replicas
from meshplan.specs.device import BYTES_PER_ELEMENT, activation_bytes


class ByteBreakdown:
    """Bytes per device by category (the dataclass fields ending in ``_bytes``, except the
    capacity and the ``host_`` fields, which are host memory); ``total_bytes`` is their sum."""

    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self) if f.name != "capacity_bytes" and not f.name.startswith("host_"))

    @property
    def host_fits(self) -> bool:
        """The device's share of its node's host memory holds what it offloads there."""
        return True

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes and self.host_fits

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.total_bytes

    def as_dict(self) -> dict[str, float]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["total_bytes"] = self.total_bytes
        return out


@dataclass(frozen=True)
class MemoryBreakdown(ByteBreakdown):
    """Bytes per device of a transformer stage, by category."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    gathered_weights_bytes: float  # ZeRO-3 / FSDP: layers gathered ahead of use
    comm_buffers_bytes: float
    low_precision_weights_bytes: float  # FP8/FP4 training: the GEMM weights' quantized copies
    capacity_bytes: float
    # optimizer offload (Plan.optimizer_offload): host memory this device uses, not in total_bytes
    host_optimizer_bytes: float = 0.0  # the offloaded optimizer state
    host_gradients_bytes: float = 0.0  # the fp32 gradient copies the CPU step reads
    host_capacity_bytes: float = 0.0  # this device's share of its node's host memory
    host_activations_bytes: float = 0.0  # activation offload (Plan.activation_offload_layers)
    # what the optimizer step holds beyond the backward's peak: every gradient, the weights and
    # PyTorch's foreach temporaries (stage_memory); 0 where the backward holds more
    optimizer_step_bytes: float = 0.0

    @property
    def host_total_bytes(self) -> float:
        return self.host_optimizer_bytes + self.host_gradients_bytes + self.host_activations_bytes

    @property
    def host_fits(self) -> bool:
        return self.host_total_bytes <= self.host_capacity_bytes or self.host_total_bytes == 0.0


#: bytes per offloaded parameter of the pinned fp32 gradient copy the CPU optimizer steps from:
#: Megatron-Core's HybridDeviceOptimizer keeps one per offloaded parameter (cpu_copy_map_grad,
#: megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py); DeepSpeed ZeRO-Offload the fp32
#: partition's .grad (deepspeed/runtime/zero/stage_1_and_2.py, async_inplace_copy_grad_to_fp32_buffer_from_gpu)
HOST_GRADIENT_BYTES_PER_PARAM = 4.0


def offloaded_optimizer_split(optimizer_bytes: float, optimizer_params: float, fraction: float) -> tuple[float, float, float]:
    """(device, host optimizer, host gradient) bytes when ``fraction`` of a device's optimizer
    state moves to host memory: the state's bytes split by parameter count (Megatron-Core
    HybridDeviceOptimizer offloads parameters in order until ``offload_fraction`` of their
    elements are on the host), plus the host's fp32 gradient copy of each offloaded parameter."""
    host = optimizer_bytes * fraction
    return optimizer_bytes - host, host, optimizer_params * fraction * HOST_GRADIENT_BYTES_PER_PARAM


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of its weight, gradient and optimizer state, and the HBM bytes one
    Adam step moves for it."""

    weight: float
    gradient: float
    optimizer: float
    step: float = 30.0


#: Adam's state per parameter of 16-bit training and the HBM bytes its step moves (reading the
#: fp32 gradient), by Plan.optimizer_state:
#: - fp32: fp32 master, m and v (12); read master, m, v, gradient, write master, m, v and the
#:   16-bit weight (16 + 12 + 2 = 30);
#: - fp32_remainders: the 16-bit weight with a 16-bit remainder is the fp32 master, beside fp32 m
#:   and v (10); read and write weight, remainder, m, v, read the gradient (28). Apex
#:   DistributedFusedAdam store_param_remainders, which NeMo 1.x sets for an fp32 optimizer on a
#:   bf16 model (nemo/collections/nlp/models/language_modeling/megatron_base_model.py,
#:   setup_optimization, at NVIDIA/NeMo 4c73f77, the 24.07 perf summary's commit);
#: - bf16_moments: fp32 master, bf16 m and v (8); read master, m, v, gradient, write master, m,
#:   v and the weight (22). Megatron-Core's precision-aware optimizer with exp_avg_dtype and
#:   exp_avg_sq_dtype bfloat16 (Megatron-Bridge perf_recipes/deepseek/common.py
#:   _enable_deepseek_precision_aware_optimizer);
#: - bf16: bf16 m and v stepping the bf16 weights, no master (4); read weight, m, v, gradient,
#:   write weight, m, v (16). Apex DistributedFusedAdam with dtype bf16 on a bf16 model
#:   (store_params False in the same NeMo code; NeMo Framework Launcher 24.07
#:   conf/training/nemotron/nemotron_340b.yaml optim.dtype bf16).
#: fp32 training keeps fp32 weights as the master: its state is the moments alone.
OPTIMIZER_STATES = {"fp32": (12.0, 30.0), "fp32_remainders": (10.0, 28.0), "bf16_moments": (8.0, 22.0), "bf16": (4.0, 16.0)}
FP32_TRAINING_STATES = {"fp32": 8.0, "fp32_remainders": 8.0, "bf16_moments": 4.0, "bf16": 4.0}

#: element passes of PyTorch's default AdamW on CUDA (foreach: torch/optim/adam.py
#: _multi_tensor_adam with decoupled weight decay), one multi-tensor kernel per line: the weight
#: scaled by 1 - lr·wd (read, write: 2), m lerped toward the gradient (3), v scaled by beta2 (2),
#: v += (1 - beta2)·g² (3), sqrt(v) into a temporary (2), divided by the bias correction (2), eps
#: added (2), the weight stepped by m over it (4): 20 passes over tensors of the state's element
#: (fp32 weights, gradients and moments under autocast; all bf16 on a bf16 model). The fused
#: kernels (Apex, Transformer Engine, torch fused=True) read weight, gradient, m and v once and
#: write weight, m and v once: 7. Measured (tests/data/h200-sxm-eager/adam_step.csv): foreach over
#: fused 2.6x on fp32 state, 2.4x on bf16
FOREACH_ADAM_PASSES = 20.0
#: the optimizer states PyTorch's AdamW keeps, by the bytes of their element
FOREACH_ELEMENT_BYTES = {"fp32": 4.0, "bf16": 2.0}


def state_bytes_per_param(precision: str, grad_precision: str, optimizer_state: str = "fp32",
                          implementation: str = "fused", cast_in_forward: bool = False) -> StateBytes:
    """Weight, gradient and optimizer bytes per parameter for Adam (OPTIMIZER_STATES), and the
    bytes its step moves: one fused kernel, or PyTorch's foreach passes (FOREACH_ADAM_PASSES).

    fp32 training keeps fp32 weights and two moments; mixed precision keeps 16-bit weights plus
    the state ``optimizer_state`` names. fp8/fp4 training keeps 16-bit weights too; their
    quantized copies are counted apart (``low_precision_weight_bytes``). A fused step of fp32
    training writes no 16-bit copy (2 bytes fewer); a foreach step of 16-bit training with an
    fp32 state writes one (the fp32 weight read and the 16-bit one written: 6 bytes, whether the
    optimizer or FSDP's cast before its gather writes it), except where autocast casts the fp32
    weights in every forward instead (``cast_in_forward``: parallel.shard.with_autocast_weights).
    """
    state, step = OPTIMIZER_STATES[optimizer_state]
    if implementation == "foreach":
        element = FOREACH_ELEMENT_BYTES[optimizer_state]
        step = FOREACH_ADAM_PASSES * element + (6.0 if precision != "fp32" and element == 4.0 and not cast_in_forward else 0.0)
    elif precision == "fp32":
        step -= 2.0
    if precision == "fp32":
        return StateBytes(4.0, 4.0, FP32_TRAINING_STATES[optimizer_state], step)
    return StateBytes(2.0, BYTES_PER_ELEMENT[grad_precision], state, step)


#: bytes per frozen base weight as LoRA finetuning may store it. NF4 (QLoRA: Dettmers et al. 2023,
#: arXiv:2305.14314, Sec. 3) is 4 bits per weight plus its quantization constants, 0.127 bits per
#: weight after double quantization (blocks of 64 weights, constants quantized in blocks of 256)
LORA_BASE_BYTES = {"bf16": 2.0, "fp8": 1.0, "nf4": (4.0 + 0.127) / 8.0}


def lora_base_bytes(task, plan) -> float | None:
    """Bytes per frozen base weight of a LoRA task (specs.task.Task) whose ``lora_base_dtype`` is
    set; None where the base weights are stored as the plan stores weights."""
    if task.kind != "finetune" or not task.lora_rank or task.lora_base_dtype is None:
        return None
    return LORA_BASE_BYTES[task.lora_base_dtype]


def low_precision_weight_bytes(precision: str, params: float, gathered_params: float, sharded_weights: bool,
                               fp8_params: bool) -> float:
    """The quantized copies of the GEMM weights that FP8/FP4 training keeps.

    Transformer Engine quantizes each weight on a step's first micro-batch and caches the copies
    for the others (``_fp8_workspaces``, refreshed when ``is_first_microbatch``; Megatron-Core
    passes it): a row-wise copy for the forward and dgrad GEMMs and a column-wise one (on Hopper
    the transpose) for the wgrad, one element each (NVIDIA/TransformerEngine at d0067d0,
    module/base.py and module/linear.py). With ZeRO-3/FSDP only the gathered layers have them.
    With ``fp8_params`` the row-wise copy is the weight itself (counted with the weights) and
    only the column-wise one is extra.
    """
    if precision not in ("fp8", "fp4"):
        return 0.0
    held = min(2.0 * gathered_params, params) if sharded_weights else params
    copies = 1.0 if fp8_params else 2.0
    return copies * BYTES_PER_ELEMENT[precision] * held


def activations_in_flight(schedule: str, pp: int, virtual: int, micro_batches: int, stage: int) -> float:
    """How many micro-batches' activations stage ``stage`` (0 = first) holds at its peak."""
    if schedule == "gpipe":
        return float(micro_batches)
    in_flight = min(micro_batches, pp - stage)
    if virtual > 1:
        return min(float(micro_batches), in_flight * (1.0 + (pp - 1) / (pp * virtual)))
    return float(in_flight)


def stage_memory(
    *,
    plan,
    capacity_bytes: float,
    state: StateBytes,
    params: float,
    trainable: float,
    expert_params: float,
    expert_trainable: float,
    layer_activations: list[tuple[float, int]],
    recompute_buffer: float,
    head_activations: float,
    tail_activations: float,
    gathered_layer_params: float,
    gathered_module_params: float,
    stage: int,
    micro_batches: int,
    x_bytes: float,
    bucket_params: float,
    low_precision_params: float = 0.0,
    gathered_low_precision_params: float = 0.0,
    frozen_weight_bytes: float | None = None,
    host_capacity_bytes: float = 0.0,
    offloaded_activations: list[tuple[float, int]] = (),
    tail_trainable: float = 0.0,
    cast_weights: bool = False,
) -> MemoryBreakdown:
    """Bytes per device of one pipeline stage.

    Only trainable parameters have gradients and optimizer states, and only trained layers keep
    activations (nothing runs backward through frozen leading layers). ZeRO shards dense
    weights over dp x cp (or the hybrid-sharding group; parallel.mesh.weight_replicas) and
    routed-expert weights over their own data-parallel group (parallel.mesh.expert_mesh).
    ``layer_activations`` is [(bytes one layer keeps per micro-batch, trained layers of that kind)];
    ``offloaded_activations`` the same for layers whose activations wait in host memory
    (Plan.activation_offload_layers): Transformer Engine's offload handler frees a layer's
    tensors once they are copied out and reloads them a layer ahead of its backward, so when the
    stage holds the most, as its forward ends, one such layer at most is still on the device
    (the last copy in flight); the reloads return while the resident layers' backward frees them.
    ``frozen_weight_bytes``: bytes of each frozen base weight of LoRA's decoder GEMMs (stored in
    16 bits, FP8 or NF4; lora_base_bytes); the embedding, norms and output layer stay 16-bit, as
    QLoRA keeps them (Dettmers et al. 2023, Sec. 3).

    The peak is the larger of two moments. As the last backward starts: the weights, the
    optimizer state, the activations, and the gradients. Where the loop frees the gradients
    between steps (Plan.free_grads) and nothing else holds them (no DDP buckets: one data-parallel
    rank, or FSDP's sharded ones; one micro-batch, or the first one's backward allocates them for
    the rest), those are only the output layer's (``tail_trainable`` parameters), which its
    backward allocates first; the rest come as the layers' backward frees their activations, so
    they peak at the optimizer step instead. There: the optimizer state, the gradients, the
    weights (not autocast's 16-bit copies, freed with the activations that kept them), and
    PyTorch's foreach AdamW's one temporary of every parameter in the state's precision
    (torch/optim/adamw.py _multi_tensor_adamw: exp_avg_sq_sqrt = torch._foreach_sqrt(...)).
    ``optimizer_step_bytes`` is what that moment holds beyond the first. ``cast_weights``: the
    weights counted are autocast's 16-bit copies of fp32 ones (program.fp32_weights_under_autocast).
    """
    tp, pp, v, zero = plan.tp, plan.pp, plan.virtual_pipeline_stages, plan.zero_memory_stage
    edp = expert_mesh(plan)[2]
    dp, _, shard = weight_replicas(plan)  # dp x cp ranks hold the same weights; ZeRO shards over them

    def sharded(total: float, expert: float, stage_min: int) -> float:
        if zero < stage_min:
            return total
        return (total - expert) / shard + expert / edp

    in_flight = activations_in_flight(plan.schedule, pp, v, micro_batches, stage)
    activations = sum(per_layer * layers for per_layer, layers in layer_activations) * in_flight
    activations += head_activations * in_flight + tail_activations + recompute_buffer
    activations += max((per_layer for per_layer, layers in offloaded_activations if layers), default=0.0)
    host_activations = sum(per_layer * layers for per_layer, layers in offloaded_activations) * in_flight
    # ZeRO-3 / FSDP hold the layer in use and the one prefetched, unsharded (never more than the
    # device's own weights; nothing is gathered without data parallelism), or with a live limit
    # (DeepSpeed) the limit's worth of modules, at least the largest whole
    live = min(2.0 * gathered_layer_params, params)
    if plan.zero3_live_params is not None:
        live = min(live, max(plan.zero3_live_params, gathered_module_params))
    gathered = live * state.weight if zero == 3 and dp > 1 else 0.0
    sharded_weights = zero == 3 and dp > 1
    fp8_stored = plan.fp8_params or frozen_weight_bytes == LORA_BASE_BYTES["fp8"]
    quantized = low_precision_weight_bytes(plan.precision, low_precision_params, gathered_low_precision_params, sharded_weights,
                                           fp8_stored)
    weights = sharded(params, expert_params, 3) * state.weight
    stored = frozen_weight_bytes
    if stored is None and plan.fp8_params and plan.precision in ("fp8", "fp4"):
        stored = BYTES_PER_ELEMENT[plan.precision]
    if stored is not None:  # the decoder's GEMM weights are stored quantized
        held = low_precision_params / shard if sharded_weights else low_precision_params
        weights -= held * (state.weight - stored)
    # ZeRO-3 / FSDP reduce-scatter a gathered layer's gradients once its backward ends (FSDP's
    # per-unit reduce-scatter), so their buffers hold at most a layer's, where the default bucket
    # grows with the data-parallel width (grad_bucket_params: 8192 ranks, 8.2G parameters)
    if zero == 3 and plan.grad_bucket_size is None:
        bucket_params = min(bucket_params, gathered_layer_params)
    bucket = min(trainable, bucket_params) * state.gradient if dp > 1 else 0.0
    optimizer_params = sharded(trainable, expert_trainable, 1)
    optimizer, host_optimizer, host_gradients = optimizer_params * state.optimizer, 0.0, 0.0
    if plan.optimizer_offload > 0:
        optimizer, host_optimizer, host_gradients = offloaded_optimizer_split(optimizer, optimizer_params, plan.optimizer_offload)
    # with Plan.grad_fp32_add the 16-bit gradients stay beside the fp32 ones (BF16_Optimizer)
    lp_gradients = trainable * 2.0 if plan.grad_fp32_add else 0.0
    gradients = sharded(trainable, expert_trainable, 2) * state.gradient + lp_gradients
    comm_buffers = 2.0 * bucket + (2.0 * x_bytes if tp > 1 else 0.0)
    held = gradients
    if plan.free_grads and micro_batches == 1 and (dp == 1 or zero == 3):
        held = sharded(tail_trainable, 0.0, 2) * state.gradient
    foreach = optimizer_params * FOREACH_ELEMENT_BYTES[plan.optimizer_state] if plan.optimizer_impl == "foreach" else 0.0
    backward_peak = weights + held + activations + gathered
    step_peak = (0.0 if cast_weights else weights) + gradients + foreach
    return MemoryBreakdown(
        weights_bytes=weights,
        gradients_bytes=held,
        optimizer_bytes=optimizer,
        activations_bytes=activations,
        gathered_weights_bytes=gathered,
        comm_buffers_bytes=comm_buffers,
        low_precision_weights_bytes=quantized,
        optimizer_step_bytes=max(0.0, step_peak - backward_peak),
        capacity_bytes=capacity_bytes,
        host_optimizer_bytes=host_optimizer,
        host_gradients_bytes=host_gradients,
        host_capacity_bytes=host_capacity_bytes,
        host_activations_bytes=host_activations,
    )


@dataclass(frozen=True)
class InferenceMemory(ByteBreakdown):
    """Bytes per device of a serving stage, by category."""

    weights_bytes: float
    kv_cache_bytes: float
    activations_bytes: float  # the working set of prefill, one layer at a time
    capacity_bytes: float


def kv_element_bytes(task, act_bytes: float) -> float:
    """Bytes of one cached key or value element: Task.kv_cache_dtype's, else the activations'."""
    return BYTES_PER_ELEMENT[task.kv_cache_dtype] if task.kv_cache_dtype else act_bytes


def kv_cache_bytes_per_token(model, tp: int, element_bytes: float) -> float:
    """Bytes one layer caches per token on one device: K and V of the device's key-value heads
    (replicated below one head per device), or with multi-head latent attention the compressed
    latent and the RoPE key, the same on every tp rank (DeepSeek-V2, Liu et al. 2024, Sec. 2.1.2)."""
    if model.mla:
        return (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * element_bytes
    kv_heads_per_device = model.kv_heads / tp if model.kv_heads % tp == 0 else 1.0
    return 2.0 * kv_heads_per_device * model.dim_per_head * element_bytes


def prefill_working_bytes(model, tokens: float, tp: int, element_bytes: float) -> float:
    """Prefill frees each layer's tensors as it goes: the residual stream in and out, plus the
    MLP's widest intermediates (up/gate projection and activation output) on this tp shard."""
    widest = max(model.ffn_widths)
    up_width = (model.ffn_matrices - 1) * widest
    return tokens * (2.0 * model.hidden_size + (up_width + widest) / tp) * element_bytes


#: fp32 optimizer-state bytes per weight (dense layers under a per-layer-kind strategy)
DENSE_STATE_BYTES = {"adagrad": 4.0, "adam": 8.0, "sgd": 0.0}
INDEX_BYTES = 8.0  # int64 lookup indices


@dataclass(frozen=True)
class DLRMMemory(ByteBreakdown):
    """Bytes per device of a model under a per-layer-kind strategy, by category."""

    embedding_weights_bytes: float
    embedding_optimizer_bytes: float
    dense_weights_bytes: float
    dense_gradients_bytes: float
    dense_optimizer_bytes: float
    gathered_weights_bytes: float
    activations_bytes: float
    capacity_bytes: float


def embedding_state_bytes(rows: float, params: float, bytes_per_param: float, optimizer: str, mp: int) -> tuple[float, float]:
    """(weights, optimizer state) bytes per device for tables split ``mp`` ways."""
    state = {"rowwise_adagrad": 4.0 * rows, "adagrad": 4.0 * params, "sgd": 0.0}[optimizer]
    return params * bytes_per_param / mp, state / mp


def dense_state_bytes(params_per_device: float, bytes_per_param: float, optimizer: str) -> tuple[float, float, float]:
    """(weights, gradients, optimizer incl. master copy) bytes for the dense weights a device holds."""
    master = 4.0 if bytes_per_param < 4.0 else 0.0
    return (
        params_per_device * bytes_per_param,
        params_per_device * bytes_per_param,
        params_per_device * (DENSE_STATE_BYTES[optimizer] + master),
    )


def optimizer_traffic_bytes(params_per_device: float, bytes_per_param: float, optimizer: str) -> float:
    """HBM bytes of one dense optimizer step: read weights, gradients and states, write weights
    and states (a streaming kernel)."""
    weights, grads, states = dense_state_bytes(params_per_device, bytes_per_param, optimizer)
    return 2.0 * weights + grads + 2.0 * states


def serving_memory(s, params: float, layers: int, windowed: int = 0) -> InferenceMemory:
    """Weights of the device, the KV cache of its layers for every sequence's prompt and output
    (of its ``windowed`` layers, the last sliding_window tokens only: vLLM's and SGLang's
    sliding-window caches free what a window has passed), and the prefill's working set."""
    plan, task = s.plan, s.task
    act = activation_bytes(plan.precision)
    batch = task.batch_size // (plan.dp or 1)
    context = task.prompt_len + task.output_len
    cached = (layers - windowed) * context + windowed * min(context, s.model.sliding_window or context)
    return InferenceMemory(
        weights_bytes=params * BYTES_PER_ELEMENT[plan.precision],
        kv_cache_bytes=batch * cached * kv_cache_bytes_per_token(s.model, plan.tp, kv_element_bytes(task, act)),
        activations_bytes=prefill_working_bytes(s.model, batch * task.prompt_len, plan.tp, act),
        capacity_bytes=s.cluster.device.hbm_bytes,
    )
