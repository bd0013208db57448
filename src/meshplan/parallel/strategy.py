"""Apply a per-layer-kind hierarchical strategy to a graph (MAD Max Sec. 2.2, 4.3).

A Plan (tp, pp, dp, ...) is applied by meshplan.parallel.program; a per-layer-kind strategy
(``embedding=(mp) dense=(tp,ddp)``: what a DLRM takes) is applied here, to the common Graph a
DLRM lowers to (meshplan.workloads.dlrm). The result is one device's work as ordered tasks (MAD
Max Fig. 5-6: forward embedding, bottom MLP, interaction, top MLP; backward reversed), each an
op's share on the device (a common ShardedOp and the pass it runs) or a collective (a common
Comm over the group it spans), with the tasks it waits for, plus the memory it needs
(meshplan.parallel.memory.DLRMMemory). Every device plays the same role (tables and samples are
spread evenly, MAD Max Sec. 4.2), so one device stands for all.

Each strategy entry takes one network level, innermost first, and the group of devices there
(meshplan.parallel.strategy_layout). Collectives per strategy:
- ``mp`` embeddings: all-to-all of the pooled embeddings forward and of their gradients backward,
  each device sending (samples of its group) x (its tables) x dim (MAD Max Sec. 4.3), blocking;
  with ``framework: hugectr`` across nodes, hierarchically and in fp16 under mixed precision
  (``_exchange``);
- ``ddp``: all-reduce of the weight gradients (the ``tp``-sharded part) as they are ready,
  non-blocking: PyTorch DDP's buckets (the first 1 MiB, then 25 MiB, each all-reduced once full)
  or, with the plan's ``framework: hugectr``, one all-reduce of them all after the backward;
- ``fsdp``: all-gather of each layer's weights before forward and backward (prefetched at most
  two layers ahead, as MAD Max's artifact) and a reduce-scatter of its gradients;
- ``tp``: all-reduce of activations after every row-parallel layer forward and of input
  gradients after every column-parallel layer backward, blocking;
- ``ep``: all-to-all of the routed samples to the experts and back, blocking.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.costs.collectives import GroupSpan, group_span
from meshplan.errors import MeshplanError
from meshplan.parallel.memory import (
    INDEX_BYTES, DLRMMemory, dense_state_bytes, embedding_state_bytes, optimizer_traffic_bytes,
)
from meshplan.parallel.program import Comm
from meshplan.parallel.shard import ShardedOp
from meshplan.parallel.strategy_layout import Group, Layout, layout, level_factors
from meshplan.specs.cluster import Cluster
from meshplan.specs.device import BYTES_PER_ELEMENT
from meshplan.specs.dlrm import DLRMModel
from meshplan.specs.dlrm_scenario import DLRMScenario
from meshplan.specs.strategy import Strategy
from meshplan.workloads.dlrm import BOTTOM, INTERACTION, TOP, lower_dlrm
from meshplan.workloads.ops import Block, Graph, Op

#: the mesh axis (the scheduler's category) each strategy entry's collectives run on
AXIS = {"mp": "mp", "ddp": "dp", "fsdp": "dp", "tp": "tp", "ep": "ep"}


@dataclass(frozen=True)
class Task:
    """One compute kernel or collective of one device, with the tasks it must wait for. A
    kernel is an op's share on the device and the pass it runs (costed by
    meshplan.costs.costed.op_times); a collective is a common Comm."""

    name: str
    layer: str  # embedding, bottom, interaction, transformer, top, moe, loss, optimizer
    deps: tuple[str, ...] = ()
    op: ShardedOp | None = None
    phase: str = "forward"  # forward, backward (input and weight gradients) or weight (weight gradient only)
    copies: int = 1  # the kernel runs this many times in a row (the expert towers a device holds)
    comm: Comm | None = None
    blocking: bool = False


@dataclass(frozen=True)
class StrategyProgram:
    """One device's iteration under a per-layer-kind strategy."""

    model: DLRMModel
    graph: Graph  # per sample (meshplan.workloads.dlrm)
    cluster: Cluster
    strategy: Strategy
    num_devices: int
    global_batch_size: int
    precision: str
    layouts: dict[str, Layout]
    tasks: tuple[Task, ...]  # in issue order
    memory: DLRMMemory


def _sharded(op: Op, nbytes: float = 0.0, flop: float = 0.0) -> ShardedOp:
    """A memory-bound or attention-like op's share on a device."""
    return ShardedOp(op, flop, nbytes, 0.0, 0.0, 0.0)


#: PyTorch DDP's gradient buckets: the first 1 MiB, then 25 MiB (DistributedDataParallel's
#: bucket_cap_mb=25 and dist._DEFAULT_FIRST_BUCKET_BYTES); a gradient larger than a bucket is one
FIRST_BUCKET_BYTES, BUCKET_BYTES = 1024.0**2, 25 * 1024.0**2


@dataclass
class _Bucket:
    """Gradients waiting for one all-reduce over one data-parallel group."""

    layout: Layout
    bytes: float = 0.0
    after: str = ""  # the last backward kernel whose gradients it holds
    kinds: list = field(default_factory=list)  # the _Dense kinds whose optimizer waits for it


class _Builder:
    """Collects tasks in issue order (the order MAD Max's per-device streams are filled in)."""

    def __init__(self, cluster: Cluster, bucket_bytes: float | None = BUCKET_BYTES) -> None:
        self.cluster = cluster
        self.tasks: list[Task] = []
        self.spans: dict[Group, GroupSpan] = {}
        self.bucket_bytes = bucket_bytes  # None: one grouped all-reduce for all gradients
        self.buckets: dict[Group, _Bucket] = {}
        self.reduced = 0  # buckets all-reduced so far

    def add(self, task: Task) -> str:
        self.tasks.append(task)
        return task.name

    def compute(self, name, layer, op: ShardedOp, deps=(), phase="forward", copies=1) -> str:
        return self.add(Task(name, layer, tuple(d for d in deps if d), op=op, phase=phase, copies=copies))

    def comm(self, name, kind, layer, nbytes, layout: Layout, axis: str, deps=(), blocking=True,
             group: Group | None = None) -> str | None:
        """A collective over ``layout``'s group of strategy entry ``axis`` (none if it has no
        group), or over ``group``, a part of it, on the same axis."""
        group = group or layout.group(axis)
        if group is None or group.size <= 1 or nbytes <= 0:
            return None
        span = self.spans.get(group) or self.spans.setdefault(group, group_span(self.cluster, group.size, group.stride))
        comm = Comm(AXIS[axis], kind, nbytes, 1, span)
        return self.add(Task(name, layer, tuple(d for d in deps if d), comm=comm, blocking=blocking))

    def reduce_gradients(self, name: str, d: "_Dense", nbytes: float, after: str) -> None:
        """Put a layer's gradients in its data-parallel group's bucket and all-reduce the bucket
        once it holds a bucket's bytes (PyTorch DDP; the first bucket smaller); without a cap
        they wait for one all-reduce of them all after the backward (HugeCTR's grouped_all_reduce)."""
        group = d.layout.group("ddp")
        if group is None or nbytes <= 0:
            return
        bucket = self.buckets.setdefault(group, _Bucket(d.layout))
        bucket.bytes += nbytes
        bucket.after = after
        if not any(k is d for k in bucket.kinds):
            bucket.kinds.append(d)
        cap = None if self.bucket_bytes is None else (FIRST_BUCKET_BYTES if self.reduced == 0 else self.bucket_bytes)
        if cap is not None and bucket.bytes >= cap:
            self.flush(name, group)

    def flush(self, name: str, group: Group | None = None) -> None:
        """All-reduce the waiting gradients (of one group, or of all at the end of backward)."""
        for g in [group] if group is not None else list(self.buckets):
            bucket = self.buckets.pop(g)
            synced = self.comm(f"{name}#{self.reduced}", "all_reduce", bucket.kinds[-1].name, bucket.bytes, bucket.layout,
                               "ddp", deps=(bucket.after,), blocking=False)
            self.reduced += 1
            for kind in bucket.kinds:
                kind.syncs.append(synced or "")


@dataclass
class _Dense:
    """How one dense layer kind (bottom/top MLP, transformer, experts) runs on a device."""

    name: str
    layout: Layout
    batch: float  # samples per TP group (the rows each GEMM sees before tp splits columns)
    weight_bytes: float
    grad_bytes: float
    act_bytes: float
    copies: float = 1.0  # expert towers per device
    towers: int = 1  # expert towers in the model (an op's rows and weights are over all of them)
    params: float = 0.0
    activations: float = 0.0
    gathered: float = 0.0
    syncs: list[str] = field(default_factory=list)


def _rows(op: Op, d: _Dense) -> float:
    """Rows of one of ``op``'s GEMMs on the device: its samples' rows for one tower."""
    return d.batch * (op.m / d.towers)


def _gemm(op: Op, d: _Dense, tp: int) -> ShardedOp:
    """A matmul's share: column-parallel splits n, row-parallel k (Shoeybi et al. 2019)."""
    m, k, n = _rows(op, d), op.k, op.n
    if op.shard_dim == "n":
        n = n / tp
    elif op.shard_dim == "k":
        k = k / tp
    return ShardedOp(op, 2.0 * m * k * n, 0.0, m, k, n)


def _split(op: Op, tp: int) -> int:
    """How many ways tensor parallelism splits ``op`` (its weights, or its heads)."""
    return tp if op.shard == "tp" else 1


def _stream(op: Op, d: _Dense, tp: int) -> ShardedOp:
    """A non-GEMM op's share: its flop and forward HBM bytes (backward moves twice as many)."""
    split = _split(op, tp)
    return _sharded(op, d.batch * op.bytes / split, d.batch * op.flop / split)


def _tower_params(op: Op, d: _Dense) -> float:
    return op.params / d.towers


def _fsdp_gather(b: _Builder, op: Op, d: _Dense, name: str, issued: list[str]) -> str | None:
    """FSDP: all-gather this op's weight shard, prefetched two ops ahead of its use; the device
    holds at most two gathered weights at a time."""
    if not (op.params and d.layout.group("fsdp")):
        return None
    shard = _split(op, d.layout.degree("tp"))
    gathered = d.copies * _tower_params(op, d) / shard * d.weight_bytes
    d.gathered = max(d.gathered, 2.0 * gathered)
    return b.comm(name, "all_gather", d.name, gathered, d.layout, "fsdp", deps=(issued[-2] if len(issued) >= 2 else "",))


def _layer_forward(b: _Builder, op: Op, d: _Dense, tag: str, deps: tuple[str, ...], prefetch: dict) -> tuple[str, ...]:
    """Forward of one op of a dense kind: FSDP gather, the kernel, TP activation all-reduce."""
    lay, tp = d.layout, d.layout.degree("tp")
    gather = _fsdp_gather(b, op, d, f"{tag}:ag_w", prefetch.setdefault("fwd", []))
    if op.kind == "matmul":
        work, copies = _gemm(op, d, tp), int(d.copies)
        d.activations += d.copies * work.m * work.k * d.act_bytes
    else:
        work, copies = _stream(op, d, tp), 1
        d.activations += work.bytes / 2.0
    done = b.compute(f"{tag}", d.name, work, (*deps, gather), copies=copies)
    if gather:
        prefetch["fwd"].append(done)
    if op.shard_dim == "k" and tp > 1:
        m = _rows(op, d)
        reduced = b.comm(f"{tag}:ar_act", "all_reduce", d.name, d.copies * m * op.n * d.act_bytes, lay, "tp", deps=(done,))
        return (done, reduced or "")
    return (done,)


def _layer_backward(b: _Builder, op: Op, d: _Dense, tag: str, deps: tuple[str, ...], prefetch: dict,
                    input_grad: bool = True) -> tuple[str, ...]:
    """Backward of one op: FSDP gather, input- and weight-gradient kernels, TP input-gradient
    all-reduce (blocking), gradient reduce-scatter / all-reduce (non-blocking)."""
    lay, tp = d.layout, d.layout.degree("tp")
    shard = _split(op, tp)
    gather = _fsdp_gather(b, op, d, f"{tag}:ag_w_b", prefetch.setdefault("bwd", []))
    if op.kind == "matmul":
        # input gradient and weight gradient GEMMs, or the weight gradient alone (first layer)
        work, copies = _gemm(op, d, tp), int(d.copies)
        phase = "backward" if input_grad else "weight"
    else:
        work, copies, phase = _stream(op, d, tp), 1, "backward"
    done = b.compute(f"{tag}:b", d.name, work, (*deps, gather), phase=phase, copies=copies)
    if gather:
        prefetch["bwd"].append(done)
    out = [done]
    if op.shard_dim == "n" and tp > 1 and input_grad:
        m = _rows(op, d)
        reduced = b.comm(f"{tag}:ar_grad_in", "all_reduce", d.name, d.copies * m * op.k * d.act_bytes, lay, "tp", deps=(done,))
        out.append(reduced or "")
    if op.params:
        grads = d.copies * _tower_params(op, d) / shard * d.grad_bytes
        scattered = b.comm(f"{tag}:rs_grad", "reduce_scatter", d.name, grads, lay, "fsdp", deps=(done,), blocking=False)
        d.syncs.extend(s for s in (scattered,) if s)
        b.reduce_gradients(f"{tag}:ar_grad", d, grads / lay.degree("fsdp"), scattered or done)
        d.params += d.copies * _tower_params(op, d) / shard / lay.degree("fsdp")
    return tuple(out)


def _unrolled(blocks: tuple[Block, ...]) -> list[tuple[str, Op]]:
    """(tag, op) in execution order: blocks kept as (block, count) in the graph, unrolled here so
    that each layer's collectives can overlap the next layer's compute (MAD Max Fig. 6)."""
    out, index = [], 0
    for block in blocks:
        for _ in range(block.count):
            for op in block.ops:
                out.append((f"{block.name}{index}:{op.name.split(':')[-1]}", op))
                index += 1
    return out


def _exchange_groups(emb: Layout, factors: tuple[int, ...]) -> tuple[Group, Group] | None:
    """(the same rail's GPU in every node, the GPUs of a node) of a model-parallel group that
    spans nodes, for a hierarchical exchange; None inside one node."""
    group = emb.group("mp")
    if group is None or len(factors) < 2 or group.stride != 1 or group.size <= factors[0]:
        return None
    return Group(group.size // factors[0], factors[0]), Group(factors[0], 1)


def _exchange(b: _Builder, name: str, pooled: float, emb: Layout, nodes: tuple[Group, Group] | None,
              deps: tuple[str, ...], backward: bool = False) -> str | None:
    """The pooled embeddings' all-to-all (gradients in backward): one over the whole group, or
    hierarchical (HugeCTR's CommunicationStrategy.Hierarchical when num_nodes > 1: MLPerf
    Training v4.0, NVIDIA/benchmarks/dlrm_dcnv2/implementations/merlin_hugectr/train.py):
    what a node's GPUs need goes to the same rail's GPU there, across the network to one peer
    per node, and is spread inside the node over its scale-up links (backward: the reverse)."""
    if nodes is None:
        return b.comm(name, "all_to_all", "embedding", pooled, emb, "mp", deps=deps)
    steps = ((":node", nodes[1]), (":rail", nodes[0])) if backward else ((":rail", nodes[0]), (":node", nodes[1]))
    for suffix, group in steps:
        deps = (b.comm(name + suffix, "all_to_all", "embedding", pooled, emb, "mp", deps=deps, group=group) or "",)
    return deps[0]


def _run(b: _Builder, d: _Dense, ops: list[tuple[str, Op]], deps: tuple[str, ...], backward: bool,
         first_input_grad: bool = True) -> tuple[str, ...]:
    prefetch: dict = {}
    seq = list(reversed(ops)) if backward else ops
    for i, (tag, op) in enumerate(seq):
        if backward:
            needs_input = first_input_grad or i < len(seq) - 1
            deps = _layer_backward(b, op, d, tag, deps, prefetch, input_grad=needs_input)
        else:
            deps = _layer_forward(b, op, d, tag, deps, prefetch)
    return deps


def build_strategy_program(s: DLRMScenario) -> StrategyProgram:
    """Lower ``s.model`` and apply ``s.strategy``: one device's tasks and memory (MAD Max Sec. 4.3).

    Inference runs the forward tasks only (MAD Max Fig. 11b): no loss, no backward, no optimizer,
    and no gradients or optimizer states in memory."""
    m, cluster, n, batch, precision = s.model, s.cluster, s.num_devices, s.global_batch_size, s.precision
    strategy, training = s.strategy, s.task != "inference"
    graph = lower_dlrm(m, BYTES_PER_ELEMENT[precision])
    if batch % n:
        raise MeshplanError("global_batch_size", batch, f"must be a multiple of the device count {n} (each device owns an equal share of the samples)")
    factors = level_factors(cluster, n)
    kinds = ["embedding", "dense", *(["transformer"] if m.interaction == "transformer" else []), *(["moe"] if m.moe else [])]
    entries = {k: strategy.of(k) or (("ep", "ddp") if len(factors) > 1 else ("ep",)) for k in kinds}
    layouts = {k: layout(k, e, factors, n, "(" + ",".join(e) + ")") for k, e in entries.items()}
    act, wb = BYTES_PER_ELEMENT[precision], m.bytes_per_dense_param
    local = batch / n
    hugectr = s.framework == "hugectr"
    b = _Builder(cluster, None if hugectr else BUCKET_BYTES)

    # embedding bags: each device looks its tables up for every sample of its mp group; HugeCTR's
    # mixed precision writes and exchanges the pooled vectors in fp16 (HugeCTR/src/pybind/model.cpp:
    # the embedding collection's emb_type and wgrad_type are Half under use_mixed_precision)
    emb = layouts["embedding"]
    mp, emb_batch = emb.degree("mp"), batch / emb.degree("ddp")
    embedding = graph.head.ops[0]
    lookup = emb_batch * embedding.bytes / mp
    pooled_bytes = min(m.bytes_per_emb_param, act) if hugectr else m.bytes_per_emb_param
    pooled = emb_batch * m.tables / mp * m.embedding_dim * pooled_bytes
    emb_f = b.compute("emb:f", "embedding", _sharded(embedding, lookup))
    nodes = _exchange_groups(emb, factors) if hugectr else None
    a2a_f = _exchange(b, "emb:a2a_f", pooled, emb, nodes, (emb_f,))

    dense = layouts["dense"]
    bottom = _Dense("bottom", dense, batch / dense.replicas, wb, wb, act)
    bottom_ops = _unrolled(tuple(k for k in graph.blocks if k.name == BOTTOM))
    bottom_end = _run(b, bottom, bottom_ops, (), backward=False)

    # interaction: on the device's own samples (replicated weights), or transformer layers with
    # their own strategy; its output is replicated over `shared` (a TP group) or not at all
    ready = (a2a_f or emb_f, *bottom_end)
    shared = None
    if m.interaction == "transformer":
        lay = layouts["transformer"]
        inter = _Dense("transformer", lay, batch / lay.replicas, wb, wb, act)
        t = m.transformer
        gather = b.comm("transformer:ag_in", "all_gather", "transformer", inter.batch * t.seq_len * t.hidden_size * act,
                        lay, "tp", deps=ready)
        ready = (*ready, gather or "")
        shared = lay.group("tp")
    else:
        inter = _Dense("interaction", layout("interaction", ("ddp",), factors, n, "(ddp)"), local, wb, wb, act)
    inter_ops = _unrolled(tuple(k for k in graph.blocks if k.name in INTERACTION))
    inter_end = _run(b, inter, inter_ops, ready, backward=False)

    # top MLP (or expert towers)
    top_out = m.top_layers[-1][1]
    if m.moe:
        lay = layouts["moe"]
        ep = lay.degree("ep")
        if m.moe.num_experts % ep:
            raise MeshplanError("strategy.moe", "(" + ",".join(lay.entries) + ")",
                                f"the ep degree {ep} must divide num_experts ({m.moe.num_experts})")
        top = _Dense("moe", lay, batch / lay.replicas, wb, wb, act, copies=m.moe.num_experts / ep, towers=m.moe.num_experts)
        dispatch_bytes = local * m.moe.top_k * m.interaction_out * act
        combine_bytes = local * m.moe.top_k * top_out * act
    else:
        top = _Dense("top", dense, batch / dense.replicas, wb, wb, act)
        dispatch_bytes = combine_bytes = 0.0
    gather_top = None
    if top.layout.group("tp") and top.layout.group("tp") != shared:
        gather_top = b.comm("top:ag_in", "all_gather", top.name, top.batch * m.interaction_out * act, top.layout, "tp", deps=inter_end)
    dispatch = b.comm("moe:a2a_dispatch", "all_to_all", "moe", dispatch_bytes, top.layout, "ep", deps=inter_end)
    top_ops = _unrolled(tuple(k for k in graph.blocks if k.name == TOP))
    top_end = _run(b, top, top_ops, (*inter_end, gather_top or "", dispatch or ""), backward=False)
    combine = b.comm("moe:a2a_combine", "all_to_all", "moe", combine_bytes, top.layout, "ep", deps=top_end)
    kinds_dense = (bottom, inter, top)
    if training:
        _backward(b, graph, m, kinds_dense, top_ops, inter_ops, bottom_ops, top_end, combine, combine_bytes,
                  dispatch_bytes, pooled, lookup, emb, act, local, wb, emb_batch, nodes)
    emb_weights, emb_state = embedding_state_bytes(m.total_rows, m.embedding_params, m.bytes_per_emb_param, m.embedding_optimizer, mp)
    weights, grads, states = dense_state_bytes(sum(d.params for d in kinds_dense), wb, m.dense_optimizer)
    if not training:
        emb_state = grads = states = 0.0
    buffers = pooled + local * m.tables * m.embedding_dim * m.bytes_per_emb_param
    indices = emb_batch * m.lookups_per_sample / mp * INDEX_BYTES
    memory = DLRMMemory(
        embedding_weights_bytes=emb_weights,
        embedding_optimizer_bytes=emb_state,
        dense_weights_bytes=weights,
        dense_gradients_bytes=grads,
        dense_optimizer_bytes=states,
        gathered_weights_bytes=max(d.gathered for d in kinds_dense),
        activations_bytes=sum(d.activations for d in kinds_dense) + buffers + indices,
        capacity_bytes=cluster.device.hbm_bytes,
    )
    return StrategyProgram(m, graph, cluster, strategy, n, batch, precision, layouts, tuple(b.tasks), memory)


def _backward(b, graph, m, kinds_dense, top_ops, inter_ops, bottom_ops, top_end, combine, combine_bytes,
              dispatch_bytes, pooled, lookup, emb, act, local, wb, emb_batch, nodes) -> None:
    """Loss, then backward reversed (MAD Max Sec. 4.3): top, interaction, embedding all-to-all,
    bottom, lookups; gradient reductions; the dense optimizer steps."""
    bottom, inter, top = kinds_dense
    loss = b.compute("loss", "loss", _sharded(graph.tail.ops[0], local * graph.tail.ops[0].bytes), (*top_end, combine or ""))

    # backward, reversed (MAD Max Sec. 4.3): top, interaction, embedding all-to-all, bottom, lookups
    combine_b = b.comm("moe:a2a_combine_b", "all_to_all", "moe", combine_bytes, top.layout, "ep", deps=(loss,))
    top_b = _run(b, top, top_ops, (loss, combine_b or ""), backward=True)
    dispatch_b = b.comm("moe:a2a_dispatch_b", "all_to_all", "moe", dispatch_bytes, top.layout, "ep", deps=top_b)
    inter_b = _run(b, inter, inter_ops, (*top_b, dispatch_b or ""), backward=True)
    a2a_b = _exchange(b, "emb:a2a_b", pooled, emb, nodes, inter_b, backward=True)
    _run(b, bottom, bottom_ops, inter_b, backward=True, first_input_grad=False)
    # the fused sparse update: rows and optimizer state of the distinct rows (DLRMModel.update_bytes)
    update = _sharded(Op("embedding_bags_update", "lookup", "none"), m.update_bytes(emb_batch, act) / emb.degree("mp"))
    emb_b = b.compute("emb:b", "embedding", update, (*inter_b, a2a_b or ""))
    # replicated tables: all-reduce the looked-up rows' gradients (MAD Max artifact: lookup bytes)
    b.comm("emb:ar_grad", "all_reduce", "embedding", lookup, emb, "ddp", deps=(emb_b,), blocking=False)
    b.flush("ar_grad")  # the gradients still waiting in buckets
    for d in kinds_dense:
        if d.params:
            traffic = optimizer_traffic_bytes(d.params, wb, m.dense_optimizer)
            step = _sharded(Op(f"{d.name}_optimizer", "elementwise", "none"), traffic)
            b.compute(f"{d.name}:optimizer", "optimizer", step, tuple(d.syncs))

