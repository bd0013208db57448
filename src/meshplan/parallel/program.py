"""Apply a Plan to a Graph: shard ops, insert collectives, assign pipeline stages, size memory.

One device is modelled per distinct pipeline-stage role (first, middle, last; or the only stage),
never one per rank, so the cost does not grow with the device count or the layer count.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.costs.collectives import CollectiveKind, GroupSpan
from meshplan.errors import MeshplanError
from meshplan.parallel.memory import MemoryBreakdown, activations_in_flight, state_bytes_per_param
from meshplan.parallel.mesh import axis_span, pipeline_neighbour_span
from meshplan.specs.device import BYTES_PER_ELEMENT
from meshplan.specs.scenario import Scenario
from meshplan.workloads.ops import Graph, Op, Saved
from meshplan.workloads.transformer import lower

#: Megatron-LM's default DDP bucket (40M parameters), used for every data-parallel collective
#: (ZeRO-3 gathers too): collectives are issued per bucket, so each pays its latency per bucket
GRAD_BUCKET_PARAMS = 40e6


@dataclass(frozen=True)
class ShardedOp:
    """An op's share on one device, for one micro-batch."""

    op: Op
    flop: float
    bytes: float
    m: float
    k: float
    n: float


@dataclass(frozen=True)
class Comm:
    """``count`` collectives of ``bytes`` each, along ``axis``."""

    axis: str
    kind: CollectiveKind
    bytes: float
    count: float
    span: GroupSpan


@dataclass(frozen=True)
class Role:
    """A distinct kind of device: which pipeline stage, how many devices are like it."""

    name: str  # "only", "first", "middle", "last"
    stage: int  # representative stage index (0 = first)
    devices: int  # how many devices play this role
    stages: int  # how many pipeline stages play this role
    layers: int  # decoder layers on one device (all virtual chunks)
    frozen_layers: int  # of those, how many are frozen (finetuning): forward only
    head: tuple[ShardedOp, ...]  # embedding ops on this device
    tail: tuple[ShardedOp, ...]  # final norm, logits, loss on this device
    head_comms: tuple[Comm, ...]  # per micro-batch, forward (backward mirrors it)
    tail_comms: tuple[Comm, ...]
    params: float  # parameters held by one device before ZeRO sharding
    trainable_params: float  # of those, how many get gradients and optimizer states
    memory: MemoryBreakdown


@dataclass(frozen=True)
class Program:
    scenario: Scenario
    graph: Graph  # the lowered model, unsharded, one micro-batch
    layer: tuple[ShardedOp, ...]  # one decoder layer, one micro-batch, one device
    layer_tp_comms: tuple[Comm, ...]  # per layer per micro-batch, forward pass
    layer_cp_comms: tuple[Comm, ...]  # per layer per micro-batch, forward pass (backward mirrors)
    recompute_ops: tuple[str, ...]  # ops re-run in backward
    pp_comm: Comm | None  # one activation send to the next stage
    pp_sends_per_micro_batch: int  # per direction (virtual chunks add boundaries)
    dp_comms: tuple[Comm, ...]  # per step, gradient reduction and parameter gather
    zero3_comms: tuple[Comm, ...]  # per micro-batch, weights gathered and gradients scattered
    roles: tuple[Role, ...]
    element_bytes: float  # matmul operand bytes
    optimizer_params: float  # parameters one device updates (after ZeRO sharding), worst role


def shard_op(op: Op, tp: int, cp: int, sp: bool) -> ShardedOp:
    split = {"tp": tp, "sp": tp if sp else 1, "none": 1}[op.shard]
    if op.kind == "matmul":
        m, k, n = op.m / cp, op.k, op.n
        if op.shard_dim == "n":
            n /= tp
        elif op.shard_dim == "k":
            k /= tp
        return ShardedOp(op, 2.0 * m * k * n, 0.0, m, k, n)
    if op.kind == "lookup":  # vocab-parallel: every rank writes the full (masked) output
        return ShardedOp(op, 0.0, op.bytes / cp, 0, 0, 0)
    return ShardedOp(op, op.flop / (split * cp), op.bytes / (split * cp), 0, 0, 0)


def _saved_bytes(saved: tuple[Saved, ...], tp: int, cp: int, sp: bool, drop_scores: bool) -> float:
    total = 0.0
    for s in saved:
        if drop_scores and s.attention_scores:
            continue
        total += s.bytes / ({"tp": tp, "sp": tp if sp else 1, "none": 1}[s.shard] * cp)
    return total


def param_share(op: Op, tp: int) -> float:
    """Parameters of ``op`` on one tp rank (matmuls and the embedding split; norms replicate)."""
    return op.params / tp if op.kind in ("matmul", "lookup") and op.shard == "tp" else op.params


def _roles(pp: int, layers_per_stage: int, frozen_layers: int) -> list[tuple[str, int, int, int]]:
    """(name, representative stage, number of stages, frozen layers) for each distinct stage role.

    Stages group by (first, last, frozen layers on the stage); frozen layers are the leading
    ones, so at most one stage is partly frozen. O(pp), never per rank.
    """
    def frozen(stage: int) -> int:
        return min(max(frozen_layers - stage * layers_per_stage, 0), layers_per_stage)

    groups: list[list] = []
    for stage in range(pp):
        key = (stage == 0, stage == pp - 1, frozen(stage))
        if groups and groups[-1][0] == key:
            groups[-1][2] += 1
        else:
            groups.append([key, stage, 1])
    names = []
    for (first, last, frozen_count), stage, count in groups:
        name = "only" if first and last else "first" if first else "last" if last else "middle"
        if frozen_count == layers_per_stage and not (first or last):
            name = "frozen middle"
        elif 0 < frozen_count < layers_per_stage and not (first or last):
            name = "partly frozen middle"
        names.append((name, stage, count, frozen_count))
    return names


def build_program(scenario: Scenario) -> Program:
    s, plan, model, cluster = scenario, scenario.plan, scenario.model, scenario.cluster
    tp, cp, pp, dp, v = plan.tp, plan.cp, plan.pp, plan.dp or 1, plan.virtual_pipeline_stages
    sp = plan.sequence_parallel and tp > 1
    act_bytes = 4.0 if plan.precision == "fp32" else 2.0
    element_bytes = BYTES_PER_ELEMENT[plan.precision]
    graph = lower(model, plan.micro_batch_size, s.seq_len, act_bytes, plan.flash_attention)

    layer = tuple(shard_op(op, tp, cp, sp) for op in graph.layer.ops)
    x_bytes = graph.tokens / cp * model.hidden_size * act_bytes  # one residual-stream tensor

    tp_span = axis_span(cluster, plan, "tp")
    cp_span = axis_span(cluster, plan, "cp")
    dp_span = axis_span(cluster, plan, "dp")
    if sp:  # Korthikanti et al. 2022, Sec. 4.2.2: all-gather + reduce-scatter replace each all-reduce
        layer_tp = (Comm("tp", "all_gather", x_bytes, 2, tp_span), Comm("tp", "reduce_scatter", x_bytes, 2, tp_span))
    else:  # Shoeybi et al. 2019 (Megatron-LM), Fig. 4: two all-reduces (f, g) per layer forward
        layer_tp = (Comm("tp", "all_reduce", x_bytes, 2, tp_span),)
    layer_tp = tuple(c for c in layer_tp if tp > 1)

    # context parallelism (ring attention, Liu et al. 2023; Megatron CP): K and V of the other
    # cp ranks are gathered in forward, their gradients reduce-scattered in backward
    kv_bytes = 2.0 * graph.tokens * model.kv_heads * model.dim_per_head * act_bytes / max(tp, 1)
    layer_cp = (Comm("cp", "all_gather", kv_bytes, 1, cp_span),) if cp > 1 else ()

    if plan.recompute == "full":
        recompute = tuple(op.op.name for op in layer)
    elif plan.recompute == "selective" and not plan.flash_attention:
        recompute = ("attention",)
    else:
        recompute = ()

    # pipeline: one activation per micro-batch per chunk boundary; with tp the message is split
    # over the tp ranks (Narayanan et al. SC21, Sec. 4.1 scatter/gather)
    pp_comm = None
    if pp > 1:
        pp_comm = Comm("pp", "send_recv", x_bytes / tp, 1, pipeline_neighbour_span(cluster, plan))

    w_bytes, g_bytes, o_bytes = state_bytes_per_param(plan.precision, _grad_precision(plan))
    micro_batches = s.num_micro_batches
    layers_per_device = model.num_layers // pp
    layer_params = sum(param_share(op, tp) for op in graph.layer.ops)

    task = s.task
    frozen_total = 0
    if task.kind == "finetune":
        if task.frozen_layers > model.num_layers:
            raise MeshplanError("task.frozen_layers", task.frozen_layers, f"at most num_layers ({model.num_layers})")
        frozen_total = task.frozen_layers
    freeze_embedding = task.kind == "finetune" and task.freeze_embedding

    roles = []
    worst_params = 0.0
    worst_trainable = 0.0
    for name, stage, stages, frozen in _roles(pp, layers_per_device, frozen_total):
        has_head = stage == 0
        has_tail = stage == pp - 1
        head_ops = graph.head.ops if has_head else ()
        tail_ops = graph.tail.ops if has_tail else ()
        head = tuple(shard_op(op, tp, cp, sp) for op in head_ops)
        tail = tuple(shard_op(op, tp, cp, sp) for op in tail_ops)
        head_comms = (Comm("tp", "reduce_scatter" if sp else "all_reduce", x_bytes, 1, tp_span),) if has_head and tp > 1 else ()
        tail_comms = ()
        if has_tail and tp > 1:
            # logits input gathered (sp), and the three small all-reduces of the vocab-parallel
            # cross-entropy (max, sum of exp, target logit) over tokens in fp32
            small = graph.tokens / cp * 4.0
            tail_comms = (Comm("tp", "all_reduce", small, 3, tp_span),)
            if sp:
                tail_comms += (Comm("tp", "all_gather", x_bytes, 1, tp_span),)
        edge_params = sum(param_share(op, tp) for op in (*head_ops, *tail_ops))
        params = layers_per_device * layer_params + edge_params
        head_params = sum(param_share(op, tp) for op in head_ops)
        trainable = params - frozen * layer_params - (head_params if freeze_embedding else 0.0)
        worst_params = max(worst_params, params)
        worst_trainable = max(worst_trainable, trainable)
        roles.append(
            Role(
                name=name,
                stage=stage,
                devices=stages * tp * cp * dp,
                stages=stages,
                layers=layers_per_device,
                frozen_layers=frozen,
                head=head,
                tail=tail,
                head_comms=head_comms,
                tail_comms=tail_comms,
                params=params,
                trainable_params=trainable,
                memory=_memory(
                    scenario, graph.layer.ops, head_ops if not freeze_embedding else (), tail_ops, params, trainable,
                    layers_per_device - frozen, stage, micro_batches, (w_bytes, g_bytes, o_bytes), x_bytes,
                ),
            )
        )

    # data parallelism (and ZeRO): gradients of this device's parameters, once per step
    dp_comms: tuple[Comm, ...] = ()
    zero3: tuple[Comm, ...] = ()
    if dp > 1:
        grad_total = worst_trainable * g_bytes
        weight_total = worst_params * w_bytes
        updated_total = worst_trainable * w_bytes
        buckets = max(1.0, worst_trainable / GRAD_BUCKET_PARAMS)
        if plan.zero_stage == 0:
            dp_comms = (Comm("dp", "all_reduce", grad_total / buckets, buckets, dp_span),)
        elif plan.zero_stage in (1, 2):
            # distributed optimizer: reduce-scatter gradients, all-gather updated weights
            dp_comms = (
                Comm("dp", "reduce_scatter", grad_total / buckets, buckets, dp_span),
                Comm("dp", "all_gather", updated_total / buckets, buckets, dp_span),
            )
        else:
            # ZeRO-3 / FSDP: weights gathered before every forward that runs (recompute
            # included) and before backward, gradients reduce-scattered, per micro-batch
            # one unit per decoder layer (FSDP wraps each block; DeepSpeed gathers per module)
            gathers = 3 if plan.recompute == "full" else 2
            units = float(max(layers_per_device, 1))
            zero3 = (
                Comm("dp", "all_gather", weight_total / units, units * gathers, dp_span),
                Comm("dp", "reduce_scatter", grad_total / units, units, dp_span),
            )
    optimizer_params = worst_trainable / (dp if plan.zero_stage >= 1 else 1)

    return Program(
        scenario=scenario,
        graph=graph,
        layer=layer,
        layer_tp_comms=layer_tp,
        layer_cp_comms=layer_cp,
        recompute_ops=recompute,
        pp_comm=pp_comm,
        pp_sends_per_micro_batch=v if pp > 1 else 0,
        dp_comms=dp_comms,
        zero3_comms=zero3,
        roles=tuple(roles),
        element_bytes=element_bytes,
        optimizer_params=optimizer_params,
    )


def _grad_precision(plan) -> str:
    """Megatron-LM accumulates and reduces gradients in fp32 (main_grad); ZeRO-3/FSDP reduce in the
    16-bit training precision."""
    if plan.grad_reduce_precision:
        return plan.grad_reduce_precision
    if plan.precision == "fp32" or plan.zero_stage < 3:
        return "fp32"
    return "fp16" if plan.precision == "fp16" else "bf16"


def _memory(scenario, layer_ops, head_ops, tail_ops, params, trainable, trained_layers, stage, micro_batches, state_bytes, x_bytes) -> MemoryBreakdown:
    """Bytes per device of a stage. Only trainable parameters have gradients and optimizer
    states, and only trained layers keep activations (nothing runs backward through the frozen
    leading layers). ``head_ops`` are the embedding ops that keep activations (none if frozen)."""
    plan = scenario.plan
    tp, cp, pp, dp, v = plan.tp, plan.cp, plan.pp, plan.dp or 1, plan.virtual_pipeline_stages
    sp = plan.sequence_parallel and tp > 1
    w_bytes, g_bytes, o_bytes = state_bytes
    zero = plan.zero_stage

    if plan.recompute == "full":
        # only each layer's input is kept (Korthikanti et al. 2022, Eq. for full recompute: 2sbh)
        per_layer = x_bytes / (tp if sp else 1)
    else:
        per_layer = sum(
            _saved_bytes(op.saved, tp, cp, sp, drop_scores=plan.recompute == "selective") for op in layer_ops
        )
    layers = trained_layers
    in_flight = activations_in_flight(plan.schedule, pp, v, micro_batches, stage)
    edge = sum(_saved_bytes(op.saved, tp, cp, sp, drop_scores=False) for op in head_ops) * in_flight
    edge += sum(_saved_bytes(op.saved, tp, cp, sp, drop_scores=False) for op in tail_ops)  # one at a time
    if plan.recompute == "full" and trained_layers:  # the layer being recomputed holds its activations once
        edge += sum(_saved_bytes(op.saved, tp, cp, sp, drop_scores=False) for op in layer_ops)

    # ZeRO-3 / FSDP hold the layer in use and the one prefetched, unsharded (never more than
    # the device's own weights; nothing is gathered without data parallelism)
    layer_params = sum(param_share(op, tp) for op in layer_ops)
    gathered = min(2.0 * layer_params, params) * w_bytes if zero == 3 and dp > 1 else 0.0
    bucket = min(trainable, GRAD_BUCKET_PARAMS) * g_bytes if dp > 1 else 0.0
    return MemoryBreakdown(
        weights_bytes=params * w_bytes / (dp if zero >= 3 else 1),
        gradients_bytes=trainable * g_bytes / (dp if zero >= 2 else 1),
        optimizer_bytes=trainable * o_bytes / (dp if zero >= 1 else 1),
        activations_bytes=per_layer * layers * in_flight + edge,
        gathered_weights_bytes=gathered,
        comm_buffers_bytes=2.0 * bucket + (2.0 * x_bytes if tp > 1 else 0.0),
        capacity_bytes=scenario.cluster.device.hbm_bytes,
    )
