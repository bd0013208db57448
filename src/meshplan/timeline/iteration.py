"""One iteration of a strategy program (a DLRM) on a device's compute and communication streams
(MAD Max Sec. 4.3, Fig. 6).

The iteration's tasks (meshplan.parallel.strategy) go through the one scheduler (meshplan.timeline.engine) as one segment in
issue order: each starts when its stream is free and every task it depends on has finished
("GPU kernels are launched whenever data dependencies are resolved"). There is one compute
stream and one communication stream per network level a collective crosses (collectives on
disjoint links run side by side; MAD Max's single stream is the one-level case). Blocking
collectives (all-to-all, tensor-parallel all-reduces, FSDP gathers) hold back the compute that
needs them; DDP gradient all-reduces depend on nothing but their layer's backward, so they overlap
the backward compute that follows. Compute is not slowed while collectives run beside it (MAD
Max's assumption; the training passes' overlap_slowdown is not applied here).

Metrics follow MAD Max's artifact (samhsia/MADMAX-AE, tasks/tasks.py): exposed communication is
the iteration minus the compute time, and "% communication exposed" (Table 1) is exposed / all
communication; ``exposed_comm_per_iteration`` gives exposed / iteration as well.
"""

from __future__ import annotations

from meshplan import catalog
from meshplan.costs.compute import Roofline
from meshplan.costs.costed import comm_s, op_times
from meshplan.costs.energy import iteration_energy
from meshplan.parallel.strategy import StrategyProgram
from meshplan.specs.device import BYTES_PER_ELEMENT
from meshplan.timeline.engine import Pass, Placed, Segment, Task, place_pass
from meshplan.timeline.estimate import COLLECTIVES, COMPUTE_KINDS, CollectiveBreakdown, DLRMEstimate
from meshplan.timeline.trace import tasks_trace
from meshplan.units import difference, format_bytes

#: MAD Max Fig. 15's compute kinds (attention is batched matmuls: GEMM)
COMPUTE_KIND = {"lookup": "embedding_lookup", "matmul": "gemm", "attention": "gemm", "elementwise": "other"}


def iteration_pass(program: StrategyProgram) -> Pass:
    """The iteration as one engine segment, tasks in issue order. Kernels are timed by the common
    roofline (meshplan.costs.costed.op_times) and run on the compute stream; a collective
    (meshplan.costs.collectives over the levels its group spans) runs on the stream of the
    outermost network level it crosses, charged to its axis."""
    device = program.cluster.device
    roof = Roofline.of(device, catalog.efficiency(device.efficiency), program.precision)
    element_bytes = BYTES_PER_ELEMENT[program.precision]
    levels = program.cluster.levels
    tasks = []
    for t in program.tasks:
        if t.comm is not None:
            stream = levels[max(t.comm.span.levels)].name
            tasks.append(Task(t.name, stream, ((t.comm.axis, comm_s(t.comm)),), t.deps, t.comm.kind))
        else:
            seconds = t.copies * getattr(op_times(t.op, roof, element_bytes), f"{t.phase}_s")
            tasks.append(Task(t.name, "compute", (("compute", seconds),), t.deps, COMPUTE_KIND[t.op.op.kind]))
    return Pass("iteration", ((Segment("iteration", tuple(tasks)), 1),))


def hidden_behind(comm: Placed, compute: list[Placed]) -> dict[str, float]:
    """How long ``comm`` runs beside each kind of compute (compute tasks never overlap each other)."""
    out = dict.fromkeys(COMPUTE_KINDS, 0.0)
    for c in compute:
        overlap = min(comm.end_s, c.end_s) - max(comm.start_s, c.start_s)
        if overlap > 0:
            out[c.task.kind] += overlap
    return out


def iteration_estimate(program: StrategyProgram) -> DLRMEstimate:
    """Schedule ``program`` (a training iteration, or for inference one forward pass of the
    batch) and read MAD Max's metrics off the placed tasks."""
    tasks = tuple(place_pass(iteration_pass(program)))
    compute = [t for t in tasks if t.task.stream == "compute"]
    comms = [t for t in tasks if t.task.stream != "compute"]
    iteration = max(t.end_s for t in tasks)
    by_kind = dict.fromkeys((*COMPUTE_KINDS, *COLLECTIVES), 0.0)
    for t in tasks:
        by_kind[t.task.kind] += t.end_s - t.start_s
    compute_s = sum(by_kind[k] for k in COMPUTE_KINDS)
    comm_s = sum(by_kind[k] for k in COLLECTIVES)
    breakdown = {}
    for kind in COLLECTIVES:
        behind = dict.fromkeys(COMPUTE_KINDS, 0.0)
        for t in (c for c in comms if c.task.kind == kind):
            for k, v in hidden_behind(t, compute).items():
                behind[k] += v
        hidden = min(sum(behind.values()), by_kind[kind])
        breakdown[kind] = CollectiveBreakdown(by_kind[kind], hidden, difference(by_kind[kind], hidden, floor=0.0), behind)
    exposed = difference(iteration, compute_s, floor=0.0)
    graph, batch = program.graph, program.global_batch_size
    model_flop = 3.0 * graph.forward_flop_per_sample * batch
    memory = program.memory
    warnings = () if memory.fits else (
        f"does not fit: {format_bytes(memory.total_bytes, 'GiB')} per device of {format_bytes(memory.capacity_bytes, 'GiB')}",
    )
    return DLRMEstimate(
        model_id=program.model.id,
        cluster_id=program.cluster.id,
        num_devices=program.num_devices,
        strategy=program.strategy.label,
        global_batch_size=batch,
        precision=program.precision,
        iteration_s=iteration,
        serialized_s=compute_s + comm_s,
        compute_s=compute_s,
        comm_s=comm_s,
        exposed_comm_s=exposed,
        comm_exposed_fraction=exposed / comm_s if comm_s > 0 else 0.0,
        exposed_comm_per_iteration=exposed / iteration,
        samples_per_s=batch / iteration,
        model_flop_per_step=model_flop,
        tflops_per_device=model_flop / iteration / program.num_devices / 1e12,
        serialized_by_kind_s=by_kind,
        comm_by_collective=breakdown,
        memory=memory,
        fits=memory.fits,
        tasks=tasks,
        warnings=warnings,
        energy=iteration_energy(program, iteration),
    )


def iteration_trace(e: DLRMEstimate) -> dict:
    """The iteration's scheduled tasks as a Chrome/Perfetto trace (meshplan.timeline.trace)."""
    return tasks_trace(f"{e.model_id} {e.strategy}", e.tasks, e.iteration_s)
