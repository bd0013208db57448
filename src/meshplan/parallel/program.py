"""Apply a Plan to a Graph: shard ops, insert collectives, assign pipeline stages, size memory.

One device is modelled per distinct pipeline-stage role (first, middle, last; frozen or MoE
stages when they differ), never one per rank, so the cost does not grow with the device count
or the layer count. Each decoder layer kind (dense, MoE) is sharded and costed once.

Serving builds one Program per phase (a prefill, a decode step; ``Phase``) with the same
sharding, collectives and roles: forward only, the batch of one replica as its micro-batch, no
gradients or optimizer state, memory as weights, KV cache and the prefill's working set.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.costs.collectives import AUTO, CollectiveKind, GroupSpan, NcclChoice, group_span
from meshplan.errors import MeshplanError
from meshplan.network.span import capped_rails
from meshplan.parallel.activation_layers import kept_counts, offloaded_counts
from meshplan.parallel.dispatch import dispatch_buffers, dispatch_spans
from meshplan.parallel.forced import forced_collectives
from meshplan.parallel.memory import (
    InferenceMemory, MemoryBreakdown, StateBytes, kv_cache_bytes_per_token, kv_element_bytes, lora_base_bytes, serving_memory,
    stage_memory, state_bytes_per_param,
)
from meshplan.parallel.mesh import axis_span, expert_mesh, pipeline_neighbour_span, weight_replicas
from meshplan.parallel.recompute import layer_recompute, zero3_gathers_per_layer
from meshplan.parallel.roles import stage_roles
from meshplan.parallel.shard import (ShardedOp, param_share, saved_bytes, shard_op, with_autocast_weights, with_dequantized_base,
                                     with_grad_accumulation)
from meshplan.specs.device import BYTES_PER_ELEMENT, activation_bytes
from meshplan.specs.scenario import Scenario
from meshplan.workloads.ops import Block, Graph
from meshplan.workloads.lora import lower_task
from meshplan.workloads.transformer import lower, padded_vocabulary

def grad_bucket_params(plan) -> float:
    """Parameters per data-parallel bucket: the plan's (Plan.grad_bucket_size), else Megatron-Core's
    default ``bucket_size``, max(40M, 1M x the data-parallel (x context-parallel) size), "larger
    DP sizes need larger buckets to ensure collectives do not become latency-bound"
    (megatron/core/distributed/distributed_data_parallel_config.py). ZeRO stages 0-2 issue their
    collectives per bucket."""
    if plan.grad_bucket_size is not None:
        return float(plan.grad_bucket_size)
    return max(40e6, 1e6 * weight_replicas(plan)[0])


def host_devices(cluster, num_devices: int) -> int:
    """Devices of the job sharing one node's host: the node's, or all of a smaller job."""
    return min(cluster.devices_per_node, num_devices)


def host_share_bytes(cluster, num_devices: int) -> float:
    """One device's even share of its node's host memory (0 where the cluster states none)."""
    return cluster.host.memory_bytes / host_devices(cluster, num_devices) if cluster.host is not None else 0.0


@dataclass(frozen=True)
class Comm:
    """``count`` collectives of ``bytes`` each, along ``axis``."""

    axis: str
    kind: CollectiveKind
    bytes: float
    count: float
    span: GroupSpan
    # where an edge (embedding, output layer) collective sits: before its ops ("open") or after
    # them ("close"); "" by kind, gathers before and the rest after
    at: str = ""
    nccl: NcclChoice = AUTO  # the plan's forced algorithm and protocol (NCCL_ALGO / NCCL_PROTO)


@dataclass(frozen=True)
class LayerKind:
    """One decoder layer kind on one device, for one micro-batch."""

    name: str  # "dense_layer" or "moe_layer"
    ops: tuple[ShardedOp, ...]
    tp_comms: tuple[Comm, ...]  # forward; backward mirrors them
    cp_comms: tuple[Comm, ...]
    ep_comms: tuple[Comm, ...]  # token dispatch and combine (all-to-all)
    recompute_ops: tuple[tuple[str, float], ...]  # (op, share of its forward) re-run in backward
    params: float  # weights of one layer on one device, except routed experts
    expert_params: float  # routed-expert weights of one layer on one device
    saved_bytes: float  # activations one layer keeps per micro-batch, given the recompute policy
    full_saved_bytes: float  # what it keeps without recompute (the layer being recomputed)
    low_precision_params: float = 0.0  # of params + expert_params, those of FP8/FP4 GEMMs
    expert_low_precision_params: float = 0.0  # of low_precision_params, the routed experts'
    trainable_params: float = 0.0  # of params, those that get gradients (LoRA freezes the base weights)
    expert_trainable_params: float = 0.0  # of expert_params, likewise
    kv_cache_bytes: float = 0.0  # serving: the cached keys and values one layer reads per pass
    offloaded: bool = False  # its saved activations wait in host memory (Plan.activation_offload_layers)
    recomputed: bool = False  # it re-runs its whole forward in backward (Plan.whole_layer_recompute)


@dataclass(frozen=True)
class Phase:
    """One forward pass of serving: ``seq_len`` new tokens of each sequence attend to ``kv_len``
    keys (a prefill: the prompt attending to itself; a decode step: one token and its cache)."""

    name: str
    seq_len: int
    kv_len: int


@dataclass(frozen=True)
class Role:
    """A distinct kind of device: which pipeline stage, how many devices are like it."""

    name: str  # "only", "first", "middle", "last", "frozen middle", ...
    stage: int  # representative stage index (0 = first)
    devices: int  # how many devices play this role
    stages: int  # how many pipeline stages play this role
    layer_counts: tuple[tuple[str, int, int], ...]  # (layer kind, layers, of which frozen)
    head: tuple[ShardedOp, ...]  # embedding ops on this device
    tail: tuple[ShardedOp, ...]  # final norm, logits, loss on this device
    head_comms: tuple[Comm, ...]  # per micro-batch, forward (backward mirrors it)
    tail_comms: tuple[Comm, ...]
    params: float  # parameters held by one device before ZeRO sharding
    trainable_params: float  # of those, how many get gradients and optimizer states
    expert_params: float  # of ``params``, routed-expert weights (ZeRO shards them over dp/ep)
    memory: MemoryBreakdown | InferenceMemory

    @property
    def layers(self) -> int:
        return sum(count for _, count, _ in self.layer_counts)

    @property
    def frozen_layers(self) -> int:
        return sum(frozen for _, _, frozen in self.layer_counts)


@dataclass(frozen=True)
class Program:
    scenario: Scenario
    graph: Graph  # the lowered model, unsharded, one micro-batch
    kinds: dict[str, LayerKind]
    pp_comm: Comm | None  # one activation send to the next stage
    pp_sends_per_micro_batch: int  # per direction (virtual chunks add boundaries)
    dp_comms: tuple[Comm, ...]  # per step, gradient reduction and parameter gather
    zero3_comms: tuple[Comm, ...]  # per micro-batch, weights gathered and gradients scattered
    roles: tuple[Role, ...]
    element_bytes: float  # matmul operand bytes
    optimizer_params: float  # parameters one device updates (after ZeRO sharding), worst role
    phase: Phase | None = None  # serving: the pass this program is
    state: StateBytes | None = None  # training: weight, gradient and optimizer bytes per parameter


def fp32_weights_under_autocast(plan, phase: Phase | None = None) -> bool:
    """Whether a training step runs 16-bit GEMMs under PyTorch autocast over unsharded fp32
    weights, as a Hugging Face Trainer (bf16=True) or Lightning (bf16-mixed) run without FSDP or
    ZeRO does (Plan.autocast, a 16-bit plan keeping an fp32 optimizer state, nothing sharded).
    Sharding frameworks gather 16-bit copies (FSDP's param_dtype) and Megatron-style ones keep
    16-bit weights beside their fp32 master, so their residual stream is 16-bit."""
    return (phase is None and plan.autocast and plan.zero_stage == 0 and plan.precision in ("bf16", "fp16")
            and plan.optimizer_state != "bf16")


def _kind(scenario: Scenario, block: Block, x_bytes: float, spans: dict[str, GroupSpan], cast_weights: bool = False) -> LayerKind:
    """One layer kind on a device; ``cast_weights``: its GEMMs cast their fp32 weights
    (fp32_weights_under_autocast)."""
    plan, model = scenario.plan, scenario.model
    tp, cp, ep, etp = plan.tp, plan.cp, plan.ep, plan.expert_tp
    sp = plan.sequence_parallel and tp > 1
    act_bytes = activation_bytes(plan.precision)
    ops = with_grad_accumulation(tuple(shard_op(op, tp, cp, sp, etp, plan.precision, plan.quant_scaling) for op in block.ops),
                                 plan, tp, ep, etp)
    ops = with_dequantized_base(ops, scenario.task, tp, ep, etp)
    if cast_weights:
        ops = with_autocast_weights(ops, scenario.task.lora_base_dtype is None, tp, ep, etp)
    # two regions per decoder layer (attention, MLP); an einsum of a block model opens or closes one
    if sp:  # Korthikanti et al. 2022, Sec. 4.2.2: all-gather + reduce-scatter replace each all-reduce
        tp_comms = (Comm("tp", "all_gather", x_bytes, block.tp_opens, spans["tp"]),
                    Comm("tp", "reduce_scatter", x_bytes, block.tp_closes, spans["tp"]))
    else:  # Shoeybi et al. 2019 (Megatron-LM), Fig. 4: two all-reduces (f, g) per layer forward
        tp_comms = (Comm("tp", "all_reduce", x_bytes, block.tp_closes, spans["tp"]),)
    tp_comms = tuple(c for c in tp_comms if c.count)
    tokens = scenario.plan.micro_batch_size * scenario.seq_len
    # context parallelism (ring attention, Liu et al. 2023; Megatron CP): K and V of the other
    # cp ranks are gathered in forward, their gradients reduce-scattered in backward
    kv_bytes = 2.0 * tokens * model.kv_heads * model.dim_per_head * act_bytes / tp
    has_attention = any(op.kind == "attention" for op in block.ops)  # every layer; one unit of a block model
    cp_comms = (Comm("cp", "all_gather", kv_bytes, 1, spans["cp"]),) if cp > 1 and has_attention else ()
    ep_comms: tuple[Comm, ...] = ()
    is_moe = any(op.expert for op in block.ops)
    if is_moe and ep > 1:
        # token copies leave for their experts and come back (Lepikhin et al. 2020, GShard;
        # MAD Max Sec. 4.2: blocking all-to-all): top_k copies of each local token
        # (hierarchical: once per node and GPU, meshplan.parallel.dispatch)
        buffers = dispatch_buffers(x_bytes / (tp if sp else 1), model.moe, ep, spans, plan.ep_dispatch)
        ep_comms = tuple(Comm("ep", "all_to_all", size, 2, spans[name]) for name, size in buffers)
    recompute, kept, full = layer_recompute(plan, model, block, ops, x_bytes, act_bytes)
    return LayerKind(
        name=block.name,
        ops=ops,
        tp_comms=tp_comms if tp > 1 else (),
        cp_comms=cp_comms,
        ep_comms=ep_comms,
        recompute_ops=recompute,
        params=sum(param_share(op, tp) for op in block.ops if not op.expert),
        expert_params=sum(param_share(op, tp, ep, etp) for op in block.ops if op.expert),
        saved_bytes=kept,
        full_saved_bytes=full,
        low_precision_params=sum(param_share(op, tp, ep, etp) if op.expert else param_share(op, tp) for op in block.ops if op.low_precision),
        expert_low_precision_params=sum(param_share(op, tp, ep, etp) for op in block.ops if op.low_precision and op.expert),
        trainable_params=sum(param_share(op, tp) for op in block.ops if not op.expert and not op.frozen),
        expert_trainable_params=sum(param_share(op, tp, ep, etp) for op in block.ops if op.expert and not op.frozen),
        recomputed=plan.whole_layer_recompute,
    )


def build_program(scenario: Scenario, phase: Phase | None = None) -> Program:
    """One training micro-batch on each device role, or (an inference task) one serving
    ``phase``: the batch of one replica, forward only, logits for the last position only."""
    s, plan = scenario, scenario.plan
    model = padded_vocabulary(scenario.model, plan.vocab_padding * plan.tp)
    cluster = capped_rails(scenario.cluster, plan.network_rails)
    tp, cp, pp, v, ep = plan.tp, plan.cp, plan.pp, plan.virtual_pipeline_stages, plan.ep
    act_bytes = activation_bytes(plan.precision)
    if (s.task.kind == "inference") != (phase is not None):
        raise ValueError("an inference task is built per serving phase, a training task without one")
    cast_weights = fp32_weights_under_autocast(plan, phase)
    if phase is None:
        # a 16-bit model trains under autocast from fp32 weights unless its Adam keeps no fp32
        # master (bf16-true); serving runs the 16-bit weights as they are
        graph = lower_task(model, s.task, plan.micro_batch_size, s.seq_len, act_bytes, plan.flash_attention, plan.fused_loss,
                           plan.fusion == "eager", autocast=plan.optimizer_state != "bf16",
                           fp32_stream=cast_weights)
    else:
        _check_serving(s)
        graph = lower(model, s.task.batch_size // (plan.dp or 1), phase.seq_len, act_bytes, plan.flash_attention,
                      kv_len=phase.kv_len, logits_per_sequence=1, eager=plan.fusion == "eager", autocast=False,
                      kv_element_bytes=kv_element_bytes(s.task, act_bytes))
    x_bytes = graph.tokens / cp * model.hidden_size * act_bytes  # one residual-stream tensor

    # expert parallelism is carved out of data parallelism, or folded over tp x cp x dp
    # (parallel.mesh.expert_mesh); expert weights are data-parallel over what remains
    _, ep_stride, edp, edp_stride = expert_mesh(plan)
    replicas, replica_stride, shard = weight_replicas(plan)
    spans = {
        "tp": axis_span(cluster, plan, "tp"),
        "cp": axis_span(cluster, plan, "cp"),
        "dp": group_span(cluster, replicas, replica_stride),
        "ep": group_span(cluster, ep, ep_stride),
        "edp": group_span(cluster, edp, edp_stride),
        "dp_shard": group_span(cluster, shard, replica_stride),
        "dp_replica": group_span(cluster, replicas // shard, replica_stride * shard),
    }
    zero3_cluster = capped_rails(cluster, plan.zero3_network_rails)
    spans["dp_shard_zero3"], spans["edp_zero3"] = (
        (spans["dp_shard"], spans["edp"]) if zero3_cluster is cluster
        else (group_span(zero3_cluster, shard, replica_stride), group_span(zero3_cluster, edp, edp_stride)))
    if plan.ep_dispatch == "hierarchical" and ep > 1:
        spans.update(dispatch_spans(cluster, ep, ep_stride))
    kinds = {}
    for block in graph.blocks:  # a kind's runs share its ops (a windowed model's alternate)
        if block.name not in kinds:
            kinds[block.name] = _kind(s, block, x_bytes, spans, cast_weights)
    if phase is not None:  # each sequence's cached keys and values, read by every layer (a windowed one's window)
        per_token = graph.tokens / graph.seq_len * kv_cache_bytes_per_token(model, tp, kv_element_bytes(s.task, act_bytes))
        windowed = {block.name for block in graph.blocks if any(op.attention and op.attention.window for op in block.ops)}
        kinds = {name: replace(kind, kv_cache_bytes=per_token * (min(phase.kv_len, model.sliding_window) if name in windowed else phase.kv_len))
                 for name, kind in kinds.items()}

    pp_comm = None
    if pp > 1:  # one activation per micro-batch per chunk boundary, split over the tp ranks
        pp_comm = Comm("pp", "send_recv", x_bytes / tp, 1, pipeline_neighbour_span(cluster, plan))  # SC21 Sec. 4.1

    state = state_bytes_per_param(plan.precision, _grad_precision(plan), plan.optimizer_state, plan.optimizer_impl,
                                  cast_in_forward=cast_weights)
    task = s.task
    frozen_total = 0
    if task.kind == "finetune":
        if task.frozen_layers > model.num_layers:
            raise MeshplanError("task.frozen_layers", task.frozen_layers, f"at most num_layers ({model.num_layers})")
        frozen_total = task.frozen_layers
    freeze_embedding = task.kind == "finetune" and task.freeze_embedding

    roles = []
    worst = {"params": 0.0, "trainable": 0.0, "expert": 0.0, "expert_trainable": 0.0, "stored": 0.0, "expert_stored": 0.0}
    for name, stage, stages, counts in stage_roles(s, graph.blocks, frozen_total):
        if plan.activation_offload_layers and phase is None:
            counts = offloaded_counts(counts, plan.activation_offload_layers, kinds)
        if plan.whole_layer_recompute and plan.recompute_layers is not None and phase is None:
            counts = kept_counts(counts, plan.recompute_layers * v, kinds)
        role = _role(s, graph, kinds, name, stage, stages, counts, x_bytes, spans, freeze_embedding, state, phase, cast_weights)
        roles.append(role)
        expert_trainable = sum(kinds[k].expert_trainable_params * (n - f) for k, n, f in counts)
        worst["params"] = max(worst["params"], role.params - role.expert_params)
        worst["trainable"] = max(worst["trainable"], role.trainable_params - expert_trainable)
        worst["expert"] = max(worst["expert"], role.expert_params)
        worst["expert_trainable"] = max(worst["expert_trainable"], expert_trainable)
        expert_low = sum(kinds[k].expert_low_precision_params * n for k, n, _ in counts)
        worst["stored"] = max(worst["stored"], sum(kinds[k].low_precision_params * n for k, n, _ in counts) - expert_low)
        worst["expert_stored"] = max(worst["expert_stored"], expert_low)

    dp_comms, zero3 = _data_parallel_comms(plan, state, worst, spans, max(s.stage_layers)) if phase is None else ((), ())
    optimizer_params = worst["trainable"] / (shard if plan.zero_memory_stage >= 1 else 1)
    optimizer_params += worst["expert_trainable"] / (edp if plan.zero_memory_stage >= 1 else 1)
    return forced_collectives(Program(
        scenario=scenario,
        graph=graph,
        kinds=kinds,
        pp_comm=pp_comm,
        pp_sends_per_micro_batch=v if pp > 1 else 0,
        dp_comms=dp_comms,
        zero3_comms=zero3,
        roles=tuple(roles),
        element_bytes=BYTES_PER_ELEMENT[plan.precision],
        optimizer_params=optimizer_params,
        phase=phase,
        state=state if phase is None else None,
    ), NcclChoice.of(plan))


def _check_serving(s: Scenario) -> None:
    """What serving models: replicas with equal shares of the batch, no cp, experts split by tp."""
    plan, task = s.plan, s.task
    dp = plan.dp or 1
    if task.batch_size % dp:
        raise MeshplanError("task.batch_size", task.batch_size, f"must be a multiple of dp ({dp}): each replica serves an equal share")
    if plan.cp != 1:
        raise MeshplanError("plan.cp", plan.cp, "context parallelism is modelled for training only; use cp=1 for inference")
    if plan.ep != 1:
        raise MeshplanError("plan.ep", plan.ep, "expert parallelism is modelled for training only; use ep=1 (experts split by tp) for inference")


def _role(s, graph, kinds, name, stage, stages, counts, x_bytes, spans, freeze_embedding, state, phase=None,
          cast_weights: bool = False) -> Role:
    plan = s.plan
    tp, cp, pp, dp = plan.tp, plan.cp, plan.pp, plan.dp or 1
    sp = plan.sequence_parallel and tp > 1
    has_head, has_tail = stage == 0, stage == pp - 1
    head_ops = graph.head.ops if has_head else ()
    tail_ops = graph.tail.ops if has_tail else ()
    if has_head:  # the multi-token-prediction modules look up the stage's own embedding table
        tail_ops = tuple(replace(op, params=0.0) if op.kind == "lookup" else op for op in tail_ops)
    mtp = sum(op.kind == "lookup" for op in tail_ops)  # multi-token-prediction modules in the tail (training only)
    head_comms = (Comm("tp", "reduce_scatter" if sp else "all_reduce", x_bytes, 1, spans["tp"]),) if head_ops and tp > 1 else ()
    tail_comms: tuple[Comm, ...] = ()
    if not tail_ops:  # a block model has no output layer
        pass
    elif has_tail and tp > 1 and phase is not None:
        # the last position of each sequence: its hidden state gathered (sp), and the
        # vocab-parallel logits gathered for sampling after the logits GEMM
        sequences = graph.tokens / graph.seq_len
        act = activation_bytes(plan.precision)
        vocab = next(op.n for op in tail_ops if op.name == "logits")  # as the framework padded it
        tail_comms = (Comm("tp", "all_gather", sequences * vocab * act, 1, spans["tp"], at="close"),)
        if sp:
            tail_comms += (Comm("tp", "all_gather", sequences * s.model.hidden_size * act, 1, spans["tp"], at="open"),)
    elif has_tail and tp > 1:
        # logits input gathered (sp), and the three small all-reduces of the vocab-parallel
        # cross-entropy (max, sum of exp, target logit) over tokens in fp32
        # (each multi-token-prediction module repeats them, and reduces its embedding lookup
        # as the first stage does)
        tail_comms = (Comm("tp", "all_reduce", graph.tokens / cp * 4.0, 3 * (1 + mtp), spans["tp"]),)
        if sp:
            tail_comms += (Comm("tp", "all_gather", x_bytes, 1 + mtp, spans["tp"]),)
        if mtp:
            tail_comms += (Comm("tp", "reduce_scatter" if sp else "all_reduce", x_bytes, mtp, spans["tp"]),)
    edge_params = sum(param_share(op, tp) for op in (*head_ops, *tail_ops))
    params = edge_params + sum((kinds[k].params + kinds[k].expert_params) * n for k, n, _ in counts)
    expert = sum(kinds[k].expert_params * n for k, n, _ in counts)
    expert_trainable = sum(kinds[k].expert_trainable_params * (n - f) for k, n, f in counts)
    trainable = expert_trainable + sum(kinds[k].trainable_params * (n - f) for k, n, f in counts)
    tail_trainable = sum(param_share(op, tp) for op in tail_ops if not op.frozen)
    head_trainable = 0.0 if freeze_embedding else sum(param_share(op, tp) for op in head_ops if not op.frozen)
    trainable += tail_trainable + head_trainable
    if any(op.name == "logits" and not op.params for op in tail_ops):  # tied: the output layer is the embedding
        tail_trainable += head_trainable
    if phase is not None:
        trainable = 0.0
        windowed = sum(s.model.windowed(layer) for start, end in s.rank_layer_ranges(stage) for layer in range(start, end))
        memory = serving_memory(s, params, sum(n for _, n, _ in counts), windowed)
    else:
        memory = stage_memory(
            plan=plan,
            capacity_bytes=s.cluster.device.hbm_bytes,
            state=state,
            params=params,
            trainable=trainable,
            expert_params=expert,
            expert_trainable=expert_trainable,
            layer_activations=[(kinds[k].saved_bytes, n - f) for k, n, f in counts if not kinds[k].offloaded],
            offloaded_activations=[(kinds[k].saved_bytes, n - f) for k, n, f in counts if kinds[k].offloaded],
            recompute_buffer=max((kinds[k].full_saved_bytes for k, n, f in counts if n > f and kinds[k].recomputed), default=0.0),
            head_activations=0.0 if freeze_embedding else sum(saved_bytes(op.saved, tp, cp, sp, False) for op in head_ops),
            # and the largest backward transient of its ops (one loss's gradients at a time)
            tail_activations=sum(saved_bytes(op.saved, tp, cp, sp, False) for op in tail_ops)
            + max((saved_bytes(op.transient, tp, cp, sp, False) for op in tail_ops), default=0.0),
            gathered_layer_params=max((kinds[k].params + kinds[k].expert_params for k, _, _ in counts), default=0.0),
            gathered_module_params=max((param_share(o.op, tp) for k, _, _ in counts for o in kinds[k].ops if not o.op.expert), default=0.0),
            low_precision_params=sum(kinds[k].low_precision_params * n for k, n, _ in counts),
            gathered_low_precision_params=max((kinds[k].low_precision_params for k, _, _ in counts), default=0.0),
            stage=stage,
            micro_batches=s.num_micro_batches,
            x_bytes=x_bytes,
            bucket_params=grad_bucket_params(plan),
            frozen_weight_bytes=lora_base_bytes(s.task, plan),
            host_capacity_bytes=host_share_bytes(s.cluster, s.num_devices),
            tail_trainable=tail_trainable,
            cast_weights=cast_weights,
        )
    tail = with_grad_accumulation(tuple(shard_op(op, tp, cp, sp, precision=plan.precision, scaling=plan.quant_scaling)
                                        for op in tail_ops), plan, tp)
    if cast_weights:  # the output layer's weight too (tied: the embedding's)
        tail = with_autocast_weights(tail, s.task.lora_base_dtype is None, tp)
    return Role(
        name=name,
        stage=stage,
        devices=stages * tp * cp * dp,
        stages=stages,
        layer_counts=counts,
        head=with_grad_accumulation(tuple(shard_op(op, tp, cp, sp, precision=plan.precision, scaling=plan.quant_scaling)
                                          for op in head_ops), plan, tp),
        tail=tail,
        head_comms=head_comms,
        tail_comms=tail_comms,
        params=params,
        trainable_params=trainable,
        expert_params=expert,
        memory=memory,
    )


def _data_parallel_comms(plan, state: StateBytes, worst: dict, spans: dict, layers_per_device: int):
    """Gradient reduction (and ZeRO's weight gathers) once per step, or per micro-batch for
    ZeRO-3 (unless it keeps its weights gathered through the step, Plan.zero3_per_step: then
    as ZeRO-1); expert weights over their own data-parallel group (parallel.mesh.expert_mesh)."""
    dp, _, shard = weight_replicas(plan)  # dp x cp ranks reduce gradients together
    zero = plan.zero_memory_stage
    edp = expert_mesh(plan)[2]
    dp_comms: list[Comm] = []
    zero3: list[Comm] = []
    bucket = grad_bucket_params(plan)
    # with FP8/FP4 primary weights (Megatron-Core's fp8_param_gather, fp4_param_gather) the
    # all-gathers move the FP8/FP4 GEMM weights at their stored size, as memory holds them
    # (parallel.memory.stage_memory)
    stored = BYTES_PER_ELEMENT[plan.precision] if plan.fp8_params and plan.precision in ("fp8", "fp4") else state.weight
    for axis, span, zero3_span, size, params, trainable, low in (
        ("dp", spans["dp_shard"] if plan.zero_stage else spans["dp"], spans["dp_shard_zero3"], shard if plan.zero_stage else dp,
         worst["params"], worst["trainable"], worst["stored"]),
        ("dp", spans["edp"], spans["edp_zero3"], edp, worst["expert"], worst["expert_trainable"], worst["expert_stored"]),
    ):
        if size <= 1 or params <= 0:
            continue
        saved = min(low, trainable) * (state.weight - stored)  # bytes the stored FP8/FP4 weights save
        grads, weights, updated = trainable * state.gradient, params * state.weight - saved, trainable * state.weight - saved
        buckets = max(1.0, trainable / bucket)
        if zero == 0:
            dp_comms.append(Comm(axis, "all_reduce", grads / buckets, buckets, span))
        elif zero in (1, 2):
            # distributed optimizer: reduce-scatter gradients, all-gather updated weights
            dp_comms += [Comm(axis, "reduce_scatter", grads / buckets, buckets, span),
                         Comm(axis, "all_gather", updated / buckets, buckets, span)]
        else:
            # ZeRO-3 / FSDP: weights gathered before every forward that runs (recompute
            # included) and before backward, gradients reduce-scattered, per micro-batch, one
            # unit per decoder layer (FSDP wraps each block; DeepSpeed gathers per module)
            gathers = zero3_gathers_per_layer(plan, layers_per_device)
            units = float(max(layers_per_device, 1))
            zero3 += [Comm(axis, "all_gather", weights / units, units * gathers, zero3_span)]
            if trainable > 0:
                zero3 += [Comm(axis, "reduce_scatter", grads / units, units, zero3_span)]
    if plan.zero_stage and shard < dp and worst["trainable"] > 0:
        # hybrid sharding: each shard's gradients are all-reduced across the replica groups
        grads = worst["trainable"] * state.gradient / shard
        buckets = max(1.0, worst["trainable"] / shard / bucket)
        dp_comms.append(Comm("dp", "all_reduce", grads / buckets, buckets, spans["dp_replica"]))
    return tuple(dp_comms), tuple(zero3)


def _grad_precision(plan) -> str:
    """Megatron-LM accumulates and reduces gradients in fp32 (main_grad); ZeRO-3/FSDP reduce in the
    16-bit training precision."""
    if plan.grad_reduce_precision:
        return plan.grad_reduce_precision
    if plan.precision == "fp32" or plan.zero_stage < 3:
        return "fp32"
    return "fp16" if plan.precision == "fp16" else "bf16"
