"""From costed work to a step: streams, overlap and the pipeline schedule (MAD Max Sec. 4.3).

Each device has a compute stream and communication streams. Tensor- and context-parallel
collectives block the compute that needs their result, so they sit on the critical path (COMET
Sec. 3.3.3). Data-parallel gradient reduction runs on its own stream behind the last backward
pass; ZeRO-3/FSDP weight gathers are prefetched one layer ahead, so per pass the longer of
compute and communication counts, plus one layer of the shorter one that cannot hide.
"""

from __future__ import annotations

from meshplan.costs.costed import CostedProgram, RoleTimes
from meshplan.timeline.breakdown import by_collective, by_op_kind
from meshplan.timeline.estimate import Estimate, RoleEstimate, StepBreakdown
from meshplan.timeline.pipeline_schedule import pipeline_time_s
from meshplan.workloads.ops import dense_flop


def overlap_s(compute: float, comm: float, pieces: int, slowdown: float) -> float:
    """Two streams over ``pieces`` equal pieces (MAD Max Sec. 4.3): the longer one sets the pace,
    one piece of the shorter one cannot hide, and compute slows by ``slowdown`` while the
    collectives run beside it."""
    shared = min(compute, comm)
    return max(compute + slowdown * shared, comm) + shared / max(pieces, 1)


def _micro_batch_s(t: RoleTimes, costed: CostedProgram, layers: int) -> tuple[float, float, float, float]:
    """(forward, backward, zero3 exposed forward, zero3 exposed backward) for one micro-batch."""
    plan = costed.program.scenario.plan
    forward = t.compute_forward_s + t.tp_forward_s + t.ep_s / 2.0
    backward = t.compute_backward_s + t.tp_backward_s + t.ep_s / 2.0
    cp_half = t.cp_exposed_s / 2.0
    forward += cp_half + t.pp_s / 2.0
    backward += cp_half + t.pp_s / 2.0
    z3_fwd = z3_bwd = 0.0
    if costed.zero3_gather_s or costed.zero3_scatter_s:
        passes = 3.0 if plan.recompute == "full" else 2.0
        gather_one = costed.zero3_gather_s / passes
        bwd_comm = costed.zero3_gather_s - gather_one + costed.zero3_scatter_s
        if plan.overlap_param_gather:
            fwd_total = overlap_s(forward, gather_one, layers, costed.overlap_slowdown)
            bwd_total = overlap_s(backward, bwd_comm, layers, costed.overlap_slowdown)
        else:
            fwd_total, bwd_total = forward + gather_one, backward + bwd_comm
        z3_fwd, z3_bwd = fwd_total - forward, bwd_total - backward
    return forward, backward, z3_fwd, z3_bwd


def step_estimate(costed: CostedProgram) -> Estimate:
    program = costed.program
    s = program.scenario
    plan = s.plan
    m = s.num_micro_batches
    v = plan.virtual_pipeline_stages

    per_role = []
    for role, times in zip(program.roles, costed.roles):
        f, b, z3f, z3b = _micro_batch_s(times, costed, role.layers)
        per_role.append((role, times, f + z3f, b + z3b, z3f + z3b))
    cycles = [(f + b, role.stages) for role, _, f, b, _ in per_role]
    pipe_s, bubble_s = pipeline_time_s(cycles, m, v)

    # the first stage finishes its last backward at pipe_s; a later stage finishes earlier by
    # the backward passes of the stages before it, and has that much slack for its own tail
    ends = []
    offset = 0.0
    for role, times, f, b, _ in per_role:
        dp_exposed = costed.dp_s
        if plan.overlap_grad_reduce and costed.dp_s:
            # behind the last backward pass: what exceeds that pass shows
            dp_exposed = overlap_s(b, costed.dp_s, role.layers, costed.overlap_slowdown) - b
        ends.append(pipe_s - offset + dp_exposed + costed.optimizer_s)
        offset += b * role.stages
    step_s = max(max(ends), pipe_s + costed.optimizer_s)

    critical = max(range(len(per_role)), key=lambda i: per_role[i][2] + per_role[i][3])
    role, times, f, b, z3 = per_role[critical]
    exposed = {
        "tp": m * (times.tp_forward_s + times.tp_backward_s),
        "cp": m * times.cp_exposed_s,
        "ep": m * times.ep_s,
        "pp": m * times.pp_s,
        # >= 0 exactly (step_s >= pipe_s + optimizer); clamped against float cancellation
        "dp": max(step_s - pipe_s - costed.optimizer_s, 0.0) + m * z3,
    }
    compute_s = m * (times.compute_forward_s + times.compute_backward_s)
    breakdown = StepBreakdown(
        compute_s=compute_s,
        recompute_s=m * times.recompute_s,
        exposed_comm_s=exposed,
        bubble_s=bubble_s,
        optimizer_s=costed.optimizer_s,
    )
    comm_total = {
        "tp": exposed["tp"],
        "cp": m * times.cp_total_s,
        "ep": exposed["ep"],
        "pp": exposed["pp"],
        "dp": costed.dp_s + m * (costed.zero3_gather_s + costed.zero3_scatter_s),
    }
    serialized = compute_s + sum(comm_total.values()) + costed.optimizer_s
    op_kinds = by_op_kind(costed, critical, m)
    collectives = by_collective(costed, critical, m, exposed)

    model_flop, hardware_flop = _flop_per_step(program)
    peak = s.cluster.device.peak(plan.precision)
    worst_memory = min((r.memory for r in program.roles), key=lambda mem: mem.headroom_bytes)
    fits = all(r.memory.fits for r in program.roles)
    warnings = ()
    if not fits:
        warnings = (
            f"does not fit: {worst_memory.total_bytes / 1e9:.1f} GB needed per device, "
            f"{worst_memory.capacity_bytes / 1e9:.1f} GB available",
        )
    return Estimate(
        model_id=s.model.id,
        cluster_id=s.cluster.id,
        num_devices=s.num_devices,
        plan=plan.model_dump(),
        step_time_s=step_s,
        tokens_per_s=s.tokens_per_step / step_s,
        samples_per_s=s.global_batch_size / step_s,
        mfu=model_flop / (step_s * s.num_devices * peak),
        hfu=hardware_flop / (step_s * s.num_devices * peak),
        model_flop_per_step=model_flop,
        hardware_flop_per_step=hardware_flop,
        tflops_per_device=hardware_flop / (step_s * s.num_devices) / 1e12,
        breakdown=breakdown,
        serialized_s=serialized,
        overlapped_s=step_s,
        comm_total_s=comm_total,
        serialized_by_op_s=op_kinds,
        collectives=collectives,
        memory=worst_memory,
        roles=tuple(RoleEstimate(r.name, r.devices, f, b, r.memory) for r, _, f, b, _ in per_role),
        fits=fits,
        warnings=warnings,
        train_tokens=s.task.train_tokens,
    )


def _flop_per_step(program) -> tuple[float, float]:
    """(model flop, hardware flop) for the whole step, all devices.

    Model flop counts matmuls and attention once forward and twice backward (Narayanan et al.
    SC21, Eq. 3 without recompute); hardware flop adds what recompute re-runs (Eq. 3 itself for
    full recompute: 96·B·s·l·h²·(1 + s/6h + V/16lh) for GPT shapes).
    """
    s = program.scenario
    graph = program.graph
    micro_batches_total = s.global_batch_size / s.plan.micro_batch_size

    # routed experts counted at the balanced load: imbalance costs time, not model flop
    scale = 1.0 / s.model.moe.routed_factor if s.model.moe else 1.0

    def dense(ops, names=None):
        return dense_flop(ops, names, expert_scale=scale)

    frozen = s.task.frozen_layers if s.task.kind == "finetune" else 0
    embedding_trains = not (s.task.kind == "finetune" and s.task.freeze_embedding)
    head, tail = dense(graph.head.ops), dense(graph.tail.ops)
    forward = head + tail
    backward = 2.0 * (tail + (head if embedding_trains else 0.0))
    recompute = 0.0
    first = 0
    for block in graph.blocks:
        trained = block.count - min(max(frozen - first, 0), block.count)
        per_layer = dense(block.ops)
        forward += per_layer * block.count
        backward += 2.0 * per_layer * trained
        recompute += dense(block.ops, program.kinds[block.name].recompute_ops) * trained
        first += block.count
    model = (forward + backward) * micro_batches_total
    hardware = model + recompute * micro_batches_total
    return model, hardware
