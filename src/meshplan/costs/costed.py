"""Attach times to a Program: every op through the roofline, every collective through its
algorithm over the levels its group spans."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan import catalog
from meshplan.costs.collectives import plan_collective_s
from meshplan.costs.compute import Roofline
from meshplan.costs.host import edge_issue, host_bound, layer_issue, recompute_s
from meshplan.costs.offload import OffloadTimes, offload_times
from meshplan.costs.power import WorkTally, backward_energy_work, capped_scale
from meshplan.errors import MeshplanError
from meshplan.parallel.program import Comm, Program, host_devices
from meshplan.parallel.shard import ShardedOp
from meshplan.specs.device import BYTES_PER_ELEMENT
from meshplan.specs.kernels import HostDispatch
from meshplan.workloads.ops import backward_work

#: the reverse of each collective in backward (all-gather's gradient is a reduce-scatter)
BACKWARD_OF = {"all_reduce": "all_reduce", "all_gather": "reduce_scatter", "reduce_scatter": "all_gather", "send_recv": "send_recv", "all_to_all": "all_to_all"}

#: bytes an Adam step moves per parameter: read fp32 master, m, v, gradient; write master, m, v
#: and the 16-bit copy (4·4 + 3·4 + 2 = 30)
ADAM_BYTES_PER_PARAM = 30.0


@dataclass(frozen=True)
class OpTimes:
    forward_s: float
    backward_s: float  # input and weight gradients
    weight_s: float = 0.0  # of backward_s, the weight gradient (zero-bubble schedules run it apart)

    @property
    def input_s(self) -> float:
        """The input-gradient part of the backward."""
        return self.backward_s - self.weight_s


@dataclass(frozen=True)
class RoleTimes:
    """Per micro-batch times of one device of a role."""

    compute_forward_s: float
    compute_backward_s: float  # includes recompute
    recompute_s: float
    tp_forward_s: float
    tp_backward_s: float  # includes the re-run forward collectives of full recompute
    ep_s: float  # both passes: expert dispatch and combine, blocking
    cp_exposed_s: float  # both passes
    cp_total_s: float  # both passes, hidden or not
    pp_s: float  # both passes
    edge_ops: dict[str, OpTimes]  # embedding, head and loss ops on this device


@dataclass(frozen=True)
class CostedProgram:
    program: Program
    kinds: dict[str, KindTimes]
    roles: tuple[RoleTimes, ...]
    dp_s: float  # per step
    zero3_gather_s: float  # per micro-batch, all gathers
    zero3_scatter_s: float  # per micro-batch
    optimizer_s: float
    overlap_slowdown: float  # of the device's efficiency profile
    offload: OffloadTimes | None = None  # the optimizer phase's parts with Plan.optimizer_offload


def op_times(op: ShardedOp, roof: Roofline, element_bytes: float, wide: Roofline | None = None) -> OpTimes:
    """Forward and backward times of one op. ``wide``: the 16-bit roofline for the GEMMs an
    FP8/FP4 plan keeps in 16 bits (``Op.low_precision`` false: output layer, MoE router)."""
    kind = op.op.kind
    if kind == "matmul" and wide is not None and not op.op.low_precision:
        roof, element_bytes = wide, BYTES_PER_ELEMENT[wide.precision]
    if kind == "matmul":
        # forward (m x k)·(k x n), input gradient (m x n)·(n x k) and weight gradient
        # (k x m)·(m x n): COMET Table 1; a frozen weight (LoRA's base) gets no weight gradient
        passes = roof.matmul_passes_s(op.m, op.k, op.n, element_bytes)
        fwd = passes[0]
        weight = 0.0 if op.op.frozen else float(passes[2])
        if op.grad_bytes:  # then added into the step's gradient (Plan.grad_accumulation)
            weight += float(roof.memory_s(op.grad_bytes, "copy"))
        bwd = float(passes[1]) + weight
        cast_fwd, cast_bwd = op.cast_bytes  # FP8/FP4: quantize the input, then the output gradient
        if cast_fwd:
            fwd += roof.memory_s(cast_fwd, "copy")
        if cast_bwd:
            bwd += float(roof.memory_s(cast_bwd, "copy"))
        return OpTimes(float(fwd), bwd, weight)
    if kind == "attention":
        fwd = roof.attention_op_s(op.attention, op.flop, op.bytes, backward=False)
        bwd = roof.attention_op_s(op.attention, op.flop, op.bytes, backward=True)
        return OpTimes(float(fwd), float(bwd))
    if kind == "lookup":  # rows gathered: the lookup bandwidth; backward moves twice the bytes
        grad = float(roof.memory_s(op.grad_bytes, "copy")) if op.grad_bytes else 0.0
        return OpTimes(float(roof.lookup_s(op.bytes)), float(roof.lookup_s(2.0 * op.bytes)) + grad)
    memory_class = op.op.memory_class
    fwd = roof.memory_s(op.bytes, memory_class)
    return OpTimes(float(fwd), float(roof.memory_s(backward_work(op.op) * op.bytes, memory_class)))


def regathered(comm: Comm, plan) -> bool:
    """Whether backward gathers ``comm``'s input again (Plan.sp_regather: a tensor-parallel
    all-gather of a sequence-parallel input)."""
    return plan.sp_regather and comm.axis == "tp" and comm.kind == "all_gather"


def comm_s(comm: Comm, backward: bool = False) -> float:
    """Seconds of ``comm`` (of its backward with ``backward``), with the plan's forced algorithm."""
    kind = BACKWARD_OF[comm.kind] if backward else comm.kind
    return comm.count * plan_collective_s(kind, comm.bytes, comm.span, comm.nccl, comm.axis)  # type: ignore[arg-type]


@dataclass(frozen=True)
class KindTimes:
    """One layer of a kind, one micro-batch, one device."""

    ops: dict[str, OpTimes]
    forward_s: float
    backward_s: float
    recompute_s: float
    tp_forward_s: float
    tp_backward_s: float  # includes the re-run forward collectives of full recompute
    ep_forward_s: float  # token dispatch and combine: blocking (MAD Max Sec. 4.2)
    ep_backward_s: float
    cp_forward_s: float
    cp_backward_s: float
    cp_exposed_forward_s: float  # ring attention hides the K/V exchange behind local attention
    cp_exposed_backward_s: float
    # of forward_s and backward_s, the waits for its activations' copies to and from host memory
    # (offload_waits), carried by its last op
    offload_forward_s: float = 0.0
    offload_backward_s: float = 0.0
    # of forward_s, the GPU's waits for the host to issue the ops (host_bound)
    host_wait_forward_s: float = 0.0


def _work_j(op: ShardedOp, power, precision: str, element_bytes: float, times: float) -> float:
    """Dynamic energy of ``times`` forwards' worth of ``op`` (costs.power.backward_energy_work)."""
    tally = WorkTally(precision, element_bytes)
    tally.add(op, times)
    return tally.energy_j(power)


def power_capped(times: dict[str, OpTimes], ops: tuple[ShardedOp, ...], roof: Roofline, power, tdp_w: float,
                 precision: str, element_bytes: float) -> dict[str, OpTimes]:
    """``times`` stretched as the power cap stretches them (meshplan.costs.power): each op's
    forward (run again by recompute the same way) and its backward draw their dynamic energy
    over their own time. Per op and pass, so every capped time is max(time, energy / headroom):
    never longer on a faster device (a cap shared by forward and backward would move time
    between them as their uncapped times change unevenly)."""
    if power is None or not power.cap_clocks:
        return times
    out = {}
    for op in ops:
        t = times[op.op.name]
        forward_j = _work_j(op, power, precision, element_bytes, 1.0)
        f = capped_scale(power, tdp_w, forward_j, t.forward_s)
        b = capped_scale(power, tdp_w, forward_j * backward_energy_work(op), t.backward_s)
        out[op.op.name] = t if f == b == 1.0 else OpTimes(t.forward_s * f, t.backward_s * b, t.weight_s * b)
    return out


def _kind_times(kind, roof: Roofline, element_bytes: float, cap=None, wide: Roofline | None = None,
                host: HostDispatch | None = None, plan=None, model=None, host_link: float | None = None) -> KindTimes:
    ops = {op.op.name: op_times(op, roof, element_bytes, wide) for op in kind.ops}
    if cap is not None:
        ops = cap(ops, kind.ops)
    tp_fwd = sum(comm_s(c) for c in kind.tp_comms)
    tp_bwd = sum(comm_s(c, backward=True) for c in kind.tp_comms)
    if plan is not None:
        tp_bwd += sum(comm_s(c) for c in kind.tp_comms if regathered(c, plan))
    ep_fwd = sum(comm_s(c) for c in kind.ep_comms)
    ep_bwd = sum(comm_s(c, backward=True) for c in kind.ep_comms)
    blocking = (ep_fwd, ep_bwd) if plan is not None and plan.ep_overlap == "none" else (0.0, 0.0)
    gpu_forward_s = sum(t.forward_s for t in ops.values())
    issue = layer_issue(kind, plan, model, blocking) if host is not None and plan is not None else None
    rerun_s = recompute_s(kind.recompute_ops, ops, host, issue)
    # the layers whose forward and backward timeline.paired runs together
    paired = bool(kind.ep_comms) and plan is not None and (plan.ep_overlap == "paired" or plan.schedule == "dualpipe")
    ops = host_bound(ops, host, issue, paired)
    host_wait_s = sum(t.forward_s for t in ops.values()) - gpu_forward_s
    cp_fwd = sum(comm_s(c) for c in kind.cp_comms)
    cp_bwd = sum(comm_s(c, backward=True) for c in kind.cp_comms)
    attention = ops.get("attention", OpTimes(0.0, 0.0, 0.0))  # a block model's unit may have none
    offload = (0.0, 0.0)
    if kind.offloaded and host_link:  # the layer's pass: its ops and the collectives that block them
        tp_blocks, ep_blocks = plan.tp_overlap == "none", plan.ep_overlap == "none"
        blocking = (tp_fwd if tp_blocks else 0.0) + (ep_fwd if ep_blocks else 0.0)
        blocking_back = (tp_bwd if tp_blocks else 0.0) + (ep_bwd if ep_blocks else 0.0)
        offload = offload_waits(kind.saved_bytes / host_link, sum(t.forward_s for t in ops.values()) + blocking,
                                sum(t.backward_s for t in ops.values()) + blocking_back)
        last = list(ops)[-1]
        t = ops[last]
        ops = {**ops, last: OpTimes(t.forward_s + offload[0], t.backward_s + offload[1], t.weight_s)}
    return KindTimes(
        ops=ops,
        forward_s=sum(t.forward_s for t in ops.values()),
        backward_s=sum(t.backward_s for t in ops.values()),
        recompute_s=rerun_s,
        tp_forward_s=tp_fwd,
        tp_backward_s=tp_bwd + (tp_fwd if kind.recomputed else 0.0),
        ep_forward_s=ep_fwd,
        ep_backward_s=ep_bwd + (ep_fwd if kind.recomputed else 0.0),
        cp_forward_s=cp_fwd,
        cp_backward_s=cp_bwd,
        cp_exposed_forward_s=max(0.0, cp_fwd - attention.forward_s),
        cp_exposed_backward_s=max(0.0, cp_bwd - attention.backward_s),
        offload_forward_s=offload[0],
        offload_backward_s=offload[1],
        host_wait_forward_s=host_wait_s,
    )


def offload_waits(copy_s: float, forward_s: float, backward_s: float) -> tuple[float, float]:
    """How long the compute stream waits, forward and backward, for one offloaded layer's
    activations (Plan.activation_offload_layers): each copy takes ``copy_s`` over the host link.
    Transformer Engine's offload handler copies a layer's saved tensors out on a side stream as
    the next layer's forward runs, and that layer's end waits for the copy; in backward it reloads
    a layer while the layer after it runs its backward, and the layer's backward waits for it
    (transformer_engine/pytorch/cpu_offload.py, AsyncDoubleBufferGroupOffloadHandler). Each copy
    so hides behind one layer's pass (``forward_s``, ``backward_s``: this layer's, its neighbours
    being of the same kind); the rest stalls the stream."""
    return max(0.0, copy_s - forward_s), max(0.0, copy_s - backward_s)


def cost_program(program: Program) -> CostedProgram:
    s = program.scenario
    device = s.cluster.device
    efficiency = catalog.efficiency(device.efficiency)
    roof = Roofline.of(device, efficiency, s.plan.precision, s.plan.attention_kernel, s.plan.quant_scaling, s.plan.fp8_attention)
    wide = Roofline.of(device, efficiency, "bf16", s.plan.attention_kernel) if s.plan.precision in ("fp8", "fp4") else None
    eb = program.element_bytes
    power = efficiency.power
    if power is not None and device.tdp_w <= power.idle_w:
        raise MeshplanError("device.tdp_w", device.tdp_w, f"more than the {device.efficiency} profile's idle power ({power.idle_w} W)")

    def cap(times: dict[str, OpTimes], ops: tuple[ShardedOp, ...]) -> dict[str, OpTimes]:
        return power_capped(times, ops, roof, power, device.tdp_w, s.plan.precision, eb)

    # decoder layers issued op by op: in training, and in serving where the model's own code runs
    # eager (fusion "eager": Hugging Face generate, a kernel at a time); serving engines' CUDA
    # graphs issue a whole step at once (as Plan.cuda_graphs "full" does in training), and a
    # block model (the rack-scale study's, DFModel's einsums) is timed as its analytical mappings
    # time it, with no host
    issued = s.task.kind != "inference" or s.plan.fusion == "eager"
    dispatched = issued and getattr(s.model, "block", "layer") == "layer" and s.plan.cuda_graphs == "none"
    host = efficiency.kernels.host if efficiency.kernels is not None and dispatched else None
    link = s.cluster.host.link_bytes_per_s if s.cluster.host is not None else None  # activation offload's copies
    kinds = {name: _kind_times(kind, roof, eb, cap, wide, host, s.plan, s.model, link) for name, kind in program.kinds.items()}
    pp_s = 2.0 * program.pp_sends_per_micro_batch * comm_s(program.pp_comm) if program.pp_comm else 0.0
    embedding_trains = not (s.task.kind == "finetune" and s.task.freeze_embedding)

    roles = []
    for role in program.roles:
        edge_ops = cap({op.op.name: op_times(op, roof, eb, wide) for op in (*role.head, *role.tail)}, (*role.head, *role.tail))
        # the embedding, and the head and loss, are issued like a layer's ops
        edge_ops = {**host_bound({op.op.name: edge_ops[op.op.name] for op in role.head}, host, edge_issue(role.head)),
                    **host_bound({op.op.name: edge_ops[op.op.name] for op in role.tail}, host, edge_issue(role.tail))}
        edge = list(edge_ops.values())
        edge_comm = sum(comm_s(c) for c in (*role.head_comms, *role.tail_comms))
        edge_comm_bwd = sum(comm_s(c, backward=True) for c in (*role.head_comms, *role.tail_comms))
        edge_bwd = sum(t.backward_s for t in edge[len(role.head):])  # head and loss always
        edge_bwd += sum(t.backward_s for t in edge[:len(role.head)]) if embedding_trains else 0.0
        # frozen leading layers (finetuning) run forward only: nothing flows back through them
        trained = role.layers - role.frozen_layers

        def total(field: str, counted: str) -> float:
            return sum(getattr(kinds[k], field) * (n if counted == "all" else n - f) for k, n, f in role.layer_counts)

        roles.append(
            RoleTimes(
                compute_forward_s=total("forward_s", "all") + sum(t.forward_s for t in edge),
                compute_backward_s=total("backward_s", "trained") + total("recompute_s", "trained") + edge_bwd,
                recompute_s=total("recompute_s", "trained"),
                tp_forward_s=total("tp_forward_s", "all") + edge_comm,
                tp_backward_s=total("tp_backward_s", "trained") + (edge_comm_bwd if trained else 0.0),
                ep_s=total("ep_forward_s", "all") + total("ep_backward_s", "trained"),
                cp_exposed_s=total("cp_exposed_forward_s", "all") + total("cp_exposed_backward_s", "trained"),
                cp_total_s=total("cp_forward_s", "all") + total("cp_backward_s", "trained"),
                pp_s=pp_s if trained else pp_s / 2.0,
                edge_ops=edge_ops,
            )
        )

    dp_s = sum(comm_s(c) for c in program.dp_comms)
    gathers = [c for c in program.zero3_comms if c.kind == "all_gather"]
    scatters = [c for c in program.zero3_comms if c.kind == "reduce_scatter"]
    optimizer_s = float(roof.memory_s(program.optimizer_params * adam_step_bytes(program), "optimizer"))
    offload = optimizer_offload_times(program, roof)
    if offload is not None:
        optimizer_s = offload.total_s
    return CostedProgram(
        program=program,
        kinds=kinds,
        roles=tuple(roles),
        dp_s=dp_s,
        zero3_gather_s=sum(comm_s(c) for c in gathers),
        zero3_scatter_s=sum(comm_s(c) for c in scatters),
        optimizer_s=optimizer_s,
        overlap_slowdown=efficiency.overlap_slowdown,
        offload=offload,
    )


def adam_step_bytes(program: Program) -> float:
    """HBM bytes an Adam step moves per parameter, as the plan keeps its state (parallel.memory.StateBytes)."""
    return program.state.step if program.state is not None else ADAM_BYTES_PER_PARAM


def optimizer_offload_times(program: Program, roof: Roofline) -> OffloadTimes | None:
    """The optimizer phase split between GPU and host (meshplan.costs.offload); None without offload."""
    s = program.scenario
    fraction = s.plan.optimizer_offload
    if not fraction or program.state is None or s.cluster.host is None:
        return None
    kept = program.optimizer_params * (1.0 - fraction)
    gpu_s = float(roof.memory_s(kept * adam_step_bytes(program), "optimizer")) if kept > 0 else 0.0
    return offload_times(program.optimizer_params, fraction, gpu_s, program.state.gradient, program.state.weight,
                         s.cluster.host, host_devices(s.cluster, s.num_devices))


def experts_touched(num_experts: int, top_k: int, tokens: float) -> float:
    """Fraction of the routed experts some of ``tokens`` tokens picks, in expectation under
    uniform routing: each token misses a given expert with probability 1 - k/E, so
    E·(1 - (1 - k/E)^tokens) experts are read (all of them in a prefill, few in a small decode)."""
    return 1.0 - (1.0 - top_k / num_experts) ** tokens


@dataclass(frozen=True)
class ForwardBound:
    """The decoder layers of one forward pass through every pipeline stage, on one device of
    each stage: their flop, the bytes they must move through HBM at least (weights read once,
    the KV cache) and the roofline time max(flop / peak, bytes / peak bandwidth) summed over
    the layers, a lower bound on the pass (Williams et al. 2009, "Roofline")."""

    flop: float
    hbm_bytes: float
    roofline_s: float
    ridge: float  # the device's flop per byte at which compute and bandwidth balance

    @property
    def arithmetic_intensity(self) -> float:
        return self.flop / self.hbm_bytes if self.hbm_bytes > 0 else 0.0


def forward_bound(program: Program) -> ForwardBound:
    s = program.scenario
    device, moe = s.cluster.device, s.model.moe
    peak, bandwidth = device.peak(s.plan.precision), device.hbm_bytes_per_s
    flop = hbm = roofline = 0.0
    for role in program.roles:
        for name, count, _ in role.layer_counts:
            kind = program.kinds[name]
            layer_flop = sum(op.flop for op in kind.ops)
            touched = experts_touched(moe.num_experts, moe.top_k, program.graph.tokens) if moe and kind.expert_params else 1.0
            layer_bytes = (kind.params + touched * kind.expert_params) * program.element_bytes + kind.kv_cache_bytes
            layers = count * role.stages
            flop += layers * layer_flop
            hbm += layers * layer_bytes
            roofline += layers * max(layer_flop / peak, layer_bytes / bandwidth)
    return ForwardBound(flop, hbm, roofline, peak / bandwidth)
