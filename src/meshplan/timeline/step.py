"""From costed work to a step: each role's passes scheduled on streams, then the pipeline.

Every device role's forward and backward of one micro-batch is a task graph on a compute
stream and one stream per network axis (meshplan.timeline.passes, scheduled and composed by
meshplan.timeline.engine: MAD Max Sec. 4.3 generalized). The first micro-batch's forward (the
distributed optimizer's parameter all-gather runs ahead of it; interleaved, the stage waits for
it once before its first op instead) and the last one's backward (the gradient reduction runs
beside it) are scheduled apart. The stages' pass times then go through
the pipeline schedule (meshplan.timeline.pipeline_schedule); the optimizer step and whatever
data-parallel communication is not overlapped follow (interleaved, each model chunk's gradient
reduction runs beside the other chunks' backwards: reduce_tail).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.costs.costed import CostedProgram, comm_s
from meshplan.costs.energy import step_energy
from meshplan.costs.footprint import footprint
from meshplan.parallel.program import grad_bucket_params
from meshplan.specs.plan import interleave_group
from meshplan.specs.scenario import training_mtp
from meshplan.timeline.breakdown import by_collective, by_op_kind
from meshplan.timeline.engine import CATEGORIES, Pass, PassTime, schedule_pass
from meshplan.timeline.estimate import Estimate, RoleEstimate, StepBreakdown
from meshplan.timeline.halves import Overlap, edge_halves, layer_halves
from meshplan.timeline.passes import (
    Layer, backward_pass, data_parallel, first_forward_pass, forward_pass, step_reduce_gather_s,
)
from meshplan.timeline.paired import paired_pass
from meshplan.timeline.pipeline_orders import warm_up_forwards
from meshplan.timeline.pipeline_schedule import StageWork, pipeline_time
from meshplan.units import format_bytes
from meshplan.workloads.lora import trainable_params
from meshplan.workloads.ops import dense_flop

AXES = CATEGORIES[1:]


@dataclass(frozen=True)
class RolePasses:
    """One role's passes for one micro-batch, scheduled (all its chunks together)."""

    forward: PassTime
    first_forward: PassTime  # the first micro-batch's (parameter all-gather ahead of it)
    backward: PassTime  # input and weight gradients
    last_backward: PassTime  # the last micro-batch's (gradient reduction beside it)
    input_backward: PassTime | None  # zero-bubble schedules: without the weight gradients
    weight_s: float  # zero-bubble schedules: the weight gradients
    paired: PassTime | None  # a forward and a backward of two micro-batches together
    release_s: float = 0.0  # interleaved: the wait for the parameter all-gathers before the first op


def pass_plans(costed: CostedProgram, index: int, forward_only: bool = False) -> dict[str, Pass]:
    """Role ``index``'s passes as task graphs: forward and backward always; first_forward,
    last_backward, input_backward and paired where the plan makes them differ.
    ``forward_only``: the forward alone (a serving phase)."""
    program = costed.program
    s = program.scenario
    plan = s.plan
    role = program.roles[index]
    overlap = Overlap.of(costed)
    layers = [
        Layer(k, layer_halves(costed, k), n, f, program.kinds[k].trainable_params + program.kinds[k].expert_trainable_params,
              program.kinds[k].recomputed)
        for k, n, f in role.layer_counts
    ]
    head, tail = edge_halves(costed, index)
    dp = data_parallel(costed, role)
    trains = not (s.task.kind == "finetune" and s.task.freeze_embedding)
    out = {"forward": forward_pass("f", layers, head, tail, dp, overlap)}
    if forward_only:
        return out
    out["backward"] = backward_pass("b", layers, head, tail, dp, overlap, trains)
    if plan.virtual_pipeline_stages == 1 and _gather_ahead_s(costed):
        # without interleaving Megatron-Core does not align the gathers across stages: each
        # stage dispatches its first bucket from its first forward's pre-hook and waits for it
        # there, then gathers one bucket ahead (distributed_data_parallel.py,
        # _finish_param_sync_for_bucket_group; passes.first_forward_pass). Interleaved:
        # interleaved_param_wait
        bucket = grad_bucket_params(plan)
        out["first_forward"] = first_forward_pass("f0", layers, head, tail, dp, overlap, bucket,
                                                  min(bucket, role.trainable_params))
    if overlap.grad_reduce and dp.reduce_share_s > 0:
        out["last_backward"] = backward_pass("bl", layers, head, tail, dp, overlap, trains, last_micro_batch=True)
    if plan.schedule in ("zb-h1", "dualpipe"):
        out["input_backward"] = backward_pass("bi", layers, head, tail, dp, overlap, trains, weights=False)
    if plan.schedule == "dualpipe" or plan.ep_overlap == "paired":
        out["paired"] = paired_pass("fb", layers, head, tail, dp, overlap, trains)
    return out


def _gather_ahead_s(costed: CostedProgram) -> float:
    """Seconds of the distributed optimizer's parameter all-gather that runs ahead of the
    step's forward (0 when it does not overlap it)."""
    plan = costed.program.scenario.plan
    if plan.zero_memory_stage not in (1, 2) or not Overlap.of(costed).param_gather:
        return 0.0
    return step_reduce_gather_s(costed.program)[1]


def interleaved_param_wait(gather_s: float, forward_s: float, stages: int, virtual: int) -> float:
    """How long an interleaved stage waits for its parameters before its first forward, when the
    all-gather of its ``virtual`` model chunks (``gather_s`` in all) runs ahead of the forwards.

    Megatron-Core with an interleaved schedule (``align_param_gather``, on by default) dispatches
    the whole all-gather of chunks 0 and 1 when the schedule starts, and that of chunk c + 1 when
    chunk c's first micro-batch starts (offset by the stage's rank, so every stage dispatches at
    the same moment; megatron/core/pipeline_parallel/schedules.py,
    forward_step_helper_preprocess; distributed_data_parallel.py, start_param_sync). The
    gathers run one after another on one stream, G = gather_s / virtual each, and chunk c + 1 is
    needed p forwards of chunk c (F each) after chunk c: chunk c's gather ends at (c + 1)·G,
    needed at wait + c·p·F, so the stage waits G + (virtual - 1)·max(0, G - p·F) at the start
    and then never again. Every stage waits the same from the same moment, so the wait delays
    the pipeline once, not once per stage along the warm-up."""
    chunk = gather_s / virtual
    return chunk + (virtual - 1) * max(0.0, chunk - stages * forward_s / virtual)


def role_passes(costed: CostedProgram, index: int, compose: bool = True) -> RolePasses:
    """Schedule role ``index``'s passes; ``compose=False`` unrolls every layer (the reference)."""
    timed = {name: schedule_pass(p, compose) for name, p in pass_plans(costed, index).items()}
    input_backward = timed.get("input_backward")
    weight_s = max(timed["backward"].time_s - input_backward.time_s, 0.0) if input_backward else 0.0
    plan = costed.program.scenario.plan
    gather_s = _gather_ahead_s(costed) if plan.virtual_pipeline_stages > 1 else 0.0
    release_s = 0.0
    if gather_s:
        release_s = interleaved_param_wait(gather_s, timed["forward"].time_s, plan.pp, plan.virtual_pipeline_stages)
    return RolePasses(
        forward=timed["forward"],
        first_forward=timed.get("first_forward", timed["forward"]),
        backward=timed["backward"],
        last_backward=timed.get("last_backward", timed["backward"]),
        input_backward=input_backward,
        weight_s=weight_s,
        paired=timed.get("paired"),
        release_s=release_s,
    )


def _unpaired_share(plan, m: int) -> float:
    """Of a stage's forwards (and as many of its backwards), the share Megatron-Core's combined
    1F1B overlap runs alone: the warm-up forwards and the cool-down backwards, which have no pass
    of another micro-batch to run beside (pipeline_orders.warm_up_forwards), and at least one,
    the first forward; the mean over the stages."""
    if plan.ep_overlap != "paired" or plan.schedule == "dualpipe":
        return 0.0
    p, v = plan.pp, plan.virtual_pipeline_stages
    group = plan.microbatch_group_size or interleave_group(p, m)
    unpaired = sum(max(1, warm_up_forwards(p, m, v, s, group)) for s in range(p)) / p
    return min(1.0, unpaired / (m * v))


def _stage_work(r: RolePasses, stages: int, schedule: str, virtual: int, unpaired: float = 0.0) -> StageWork:
    """The pipeline's view of a role, per model chunk. With expert all-to-all paired outside
    DualPipe (Megatron-Core's combined 1F1B overlap), the steady forward+backward cycle is
    the paired time, and the ``unpaired`` share of forwards and backwards (_unpaired_share)
    takes its own time: F and B are scaled so a stage is as busy as both together. That the
    unpaired ones are spread over the schedule, not at its ends, is a deliberate approximation:
    the busy time is exact, the bubble's few percent of it may shift."""
    f, b = r.forward.time_s, r.backward.time_s
    scale = 1.0
    if r.paired is not None and schedule != "dualpipe" and f + b > 0:
        scale = r.paired.time_s / (f + b)
        scale += (1.0 - scale) * unpaired
    split = r.input_backward is not None and schedule in ("zb-h1", "dualpipe")
    forward = f * scale / virtual
    backward = (r.input_backward.time_s if split else b * scale) / virtual
    weight = r.weight_s / virtual if split else 0.0
    return StageWork(
        forward_s=forward,
        backward_s=backward,
        weight_s=weight,
        # never shorter than the ordinary pass (float rounding of the scaling aside)
        first_forward_s=max((r.first_forward.time_s + (scale - 1.0) * f) / virtual, forward),
        # the gradient goes on to the previous stage when it is ready; the reduction trailing it
        # delays only this stage's finish (added in step_estimate)
        last_backward_s=max((_handed_on(r) + (scale - 1.0) * b) / virtual, backward + weight),
        paired_s=r.paired.time_s / virtual if r.paired is not None and schedule == "dualpipe" else None,
        count=stages,
        release_s=r.release_s,
    )


def reduce_tail(trailing_s: float, backward_s: float, virtual: int, group: int, slowdown: float) -> float:
    """How long a stage's gradient reduction runs on after its last backward, and what it costs
    the backwards it runs beside: the step's delay. ``trailing_s``: what the last micro-batch's
    backward pass (all the stage's chunks together, the reduction beside it) leaves running after
    its compute; ``backward_s``: one micro-batch's backward of one chunk.

    Without interleaving all of it trails. Interleaved, Megatron-Core reduces each model chunk's
    gradients from that chunk's last micro-batch's backward on (schedules.py,
    backward_step_helper_preprocess and _postprocess: grad sync is enabled on
    is_last_microbatch_for_model_chunk) while the stage goes on with the other chunks: in the
    schedule's last round chunk c's last micro-batch is followed by ``group`` - 1 backwards
    before chunk c - 1's last one (``group`` micro-batches a chunk, highest chunk first). So each
    chunk leaves ``trailing_s / virtual``; the backwards between two chunks' last ones drain
    what is queued on the stream, each second of it hidden costing ``slowdown`` seconds of
    compute (the overlap_slowdown of passes); the last chunk's and what is still queued trail.
    The cool-down's waits would drain more: this is the least the stage hides."""
    leftover = trailing_s / virtual
    gap = (group - 1) * backward_s
    queued = delay = 0.0
    for _ in range(virtual - 1):
        hidden = min(queued + leftover, gap)
        queued += leftover - hidden
        delay += slowdown * hidden
    return queued + leftover + delay


def _handed_on(r: RolePasses) -> float:
    """When the last micro-batch's backward hands its gradient on: never before an ordinary
    backward ends (whatever trails that one trails every micro-batch)."""
    return max(r.last_backward.ready_s, r.backward.time_s)


def _exposed(r: RolePasses, m: int) -> dict[str, float]:
    """Exposed seconds per axis over the step's m micro-batches of one device of the role."""
    out = dict.fromkeys(AXES, 0.0)
    if r.paired is not None:
        passes = [(r.paired, m)]
    else:
        passes = [(r.forward, m - 1), (r.first_forward, 1), (r.backward, m - 1), (r.last_backward, 1)]
    for p, times in passes:
        for axis, seconds in p.exposed_s.items():
            out[axis] += times * seconds
    return out


def pipeline_inputs(costed: CostedProgram, passes: list[RolePasses]) -> tuple[list[StageWork], float, bool]:
    """The pipeline schedule's view of the roles: stage work per role, the send time, and
    whether sends overlap compute (None in the plan: as Megatron-Core, only when interleaved)."""
    program = costed.program
    plan = program.scenario.plan
    v = plan.virtual_pipeline_stages
    unpaired = _unpaired_share(plan, program.scenario.num_micro_batches)
    works = [_stage_work(r, role.stages, plan.schedule, v, unpaired) for r, role in zip(passes, program.roles)]
    p2p_s = comm_s(program.pp_comm) if program.pp_comm else 0.0
    overlap_p2p = plan.overlap_p2p if plan.overlap_p2p is not None else v > 1
    return works, p2p_s, overlap_p2p


def _critical_role(passes: list[RolePasses]) -> int:
    """The role with the longest forward + backward. Roles as long as it to rounding (waiting on
    the same collectives, say) are told apart by their compute, the most first, then by order:
    composed and unrolled passes round differently, and the breakdown must not follow the noise."""
    span = [r.forward.time_s + r.backward.time_s for r in passes]
    longest = max(span)
    tied = [i for i, t in enumerate(span) if t >= longest * (1.0 - 1e-9)]
    return max(tied, key=lambda i: (passes[i].forward.compute_s + passes[i].backward.compute_s, -i))


def step_estimate(costed: CostedProgram, compose: bool = True) -> Estimate:
    program = costed.program
    s = program.scenario
    plan = s.plan
    m = s.num_micro_batches
    v = plan.virtual_pipeline_stages

    passes = [role_passes(costed, i, compose) for i in range(len(program.roles))]
    works, p2p_s, overlap_p2p = pipeline_inputs(costed, passes)
    pipe = pipeline_time(works, m, plan.schedule, v, p2p_s, overlap_p2p, plan.microbatch_group_size)

    reduce_s, gather_s = step_reduce_gather_s(program)
    blocking = 0.0
    if not plan.overlap_grad_reduce:
        blocking += reduce_s
    if not plan.overlap_param_gather:
        blocking += gather_s
    group = min(plan.microbatch_group_size or interleave_group(plan.pp, m), m)
    slowdown = Overlap.of(costed).slowdown
    trailing = [max(r.last_backward.time_s - _handed_on(r), 0.0) for r in passes]
    tails = [reduce_tail(t, w.backward_s + w.weight_s, v, group, slowdown) for t, w in zip(trailing, works)]
    finishes = [end + tail for end, tail in zip(pipe.finish_s, tails)]
    finish = max(finishes)
    step_s = finish + blocking + costed.optimizer_s

    # the device that paces the pipeline (the longest forward + backward); its idle time in the
    # step is its bubble
    critical = _critical_role(passes)
    r, times = passes[critical], costed.roles[critical]
    compute_s = m * (r.forward.compute_s + r.backward.compute_s)
    exposed = _exposed(r, m)
    # the trailing reduction the last backward pass counts, as the chunks leave it (reduce_tail)
    exposed["dp"] += blocking + r.release_s + tails[critical] - trailing[critical]
    if p2p_s and not overlap_p2p:
        exposed["pp"] += 2.0 * m * program.pp_sends_per_micro_batch * p2p_s
    busy = compute_s + sum(exposed.values()) - blocking
    bubble_s = max(finish - busy, 0.0)
    exposed_comm = {axis: exposed[axis] for axis in ("tp", "cp", "ep", "pp", "dp")}
    breakdown = StepBreakdown(
        compute_s=compute_s,
        recompute_s=m * times.recompute_s,
        exposed_comm_s=exposed_comm,
        bubble_s=bubble_s,
        optimizer_s=costed.optimizer_s,
    )
    comm_total = {
        "tp": m * (times.tp_forward_s + times.tp_backward_s),
        "cp": m * times.cp_total_s,
        "ep": m * times.ep_s,
        "pp": m * times.pp_s,
        "dp": costed.dp_s + m * (costed.zero3_gather_s + costed.zero3_scatter_s),
    }
    # the step with nothing overlapped: all the work of the critical device one after another
    # (compute with recompute, every collective in full, the optimizer) plus the pipeline bubble
    serialized = compute_s + sum(comm_total.values()) + costed.optimizer_s + bubble_s
    op_kinds = by_op_kind(costed, critical, m)
    collectives = by_collective(costed, critical, m, exposed_comm)

    model_flop, hardware_flop = _flop_per_step(program)
    peak = s.cluster.device.peak(plan.precision)
    worst_memory = min((role.memory for role in program.roles), key=lambda mem: mem.headroom_bytes)
    fits = all(role.memory.fits for role in program.roles)
    warnings: tuple[str, ...] = ()
    if worst_memory.headroom_bytes < 0:
        warnings = (
            f"does not fit: {format_bytes(worst_memory.total_bytes, 'GiB')} needed per device, "
            f"{format_bytes(worst_memory.capacity_bytes, 'GiB')} available",
        )
    host_short = [role.memory for role in program.roles if not role.memory.host_fits]
    if host_short:
        worst_host = max(host_short, key=lambda mem: mem.host_total_bytes)
        warnings += (
            f"offloaded state does not fit host memory: {format_bytes(worst_host.host_total_bytes, 'GiB')} per device, "
            f"{format_bytes(worst_host.host_capacity_bytes, 'GiB')} available (the node's host memory over its "
            f"{min(s.cluster.devices_per_node, s.num_devices)} devices)",
        )
    energy = step_energy(costed, step_s)
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
        roles=tuple(RoleEstimate(role.name, role.devices, p.forward.time_s, p.backward.time_s, role.memory)
                    for role, p in zip(program.roles, passes)),
        fits=fits,
        warnings=warnings,
        train_tokens=s.task.train_tokens,
        stage_layers=s.stage_layers,
        pipeline_split=s.pipeline_split,
        mtp_layers=training_mtp(s.model, s.task),
        energy=energy,
        params=program.graph.params,
        trainable_params=trainable_params(program.graph, not (s.task.kind == "finetune" and s.task.freeze_embedding),
                                          s.task.frozen_layers if s.task.kind == "finetune" else 0),
        footprint=footprint(s.task, s.cluster, s.num_devices, energy is not None),
        offload_s=costed.offload.as_dict() if costed.offload is not None else {},
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

    def dense(ops, names=None, backward=False):
        return dense_flop(ops, names, expert_scale=scale, backward=backward)

    frozen = s.task.frozen_layers if s.task.kind == "finetune" else 0
    embedding_trains = not (s.task.kind == "finetune" and s.task.freeze_embedding)
    head, tail = dense(graph.head.ops), dense(graph.tail.ops)
    forward = head + tail
    backward = dense(graph.tail.ops, backward=True) + (dense(graph.head.ops, backward=True) if embedding_trains else 0.0)
    recompute = 0.0
    first = 0
    for block in graph.blocks:
        trained = block.count - min(max(frozen - first, 0), block.count)
        per_layer = dense(block.ops)
        forward += per_layer * block.count
        backward += dense(block.ops, backward=True) * trained
        recompute += sum(share * dense(block.ops, {name}) for name, share in program.kinds[block.name].recompute_ops) * trained
        first += block.count
    model = (forward + backward) * micro_batches_total
    hardware = model + recompute * micro_batches_total
    return model, hardware
