"""A DLRM iteration on per-device compute and communication streams (MAD Max Sec. 4.3, Fig. 6).

The iteration's tasks go through the one scheduler (meshplan.timeline.engine) as one segment in
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

from dataclasses import asdict, dataclass, field

from meshplan import catalog
from meshplan.costs.compute import Roofline
from meshplan.costs.costed import comm_s, op_times
from meshplan.parallel.dlrm import DLRMProgram, build_dlrm_program
from meshplan.parallel.dlrm_memory import DLRMMemory
from meshplan.specs.device import BYTES_PER_ELEMENT
from meshplan.specs.dlrm_scenario import DLRMScenario
from meshplan.timeline.engine import Pass, Placed, Segment, Task, place_pass
from meshplan.timeline.trace import tasks_trace
from meshplan.workloads.dlrm import lower_dlrm
from meshplan.units import difference, format_bytes, format_devices, format_seconds

COMPUTE_KINDS = ("embedding_lookup", "gemm", "other")
COLLECTIVES = ("all_to_all", "all_reduce", "all_gather", "reduce_scatter")
#: MAD Max Fig. 15's compute kinds (attention is batched matmuls: GEMM)
COMPUTE_KIND = {"lookup": "embedding_lookup", "matmul": "gemm", "attention": "gemm", "elementwise": "other"}


@dataclass(frozen=True)
class CollectiveBreakdown:
    """One collective type over the iteration (MAD Max Fig. 15 b)."""

    total_s: float
    hidden_s: float  # time it runs while compute runs
    exposed_s: float  # total - hidden
    hidden_behind_s: dict[str, float]  # hidden time by the compute kind beside it


@dataclass(frozen=True)
class DLRMEstimate:
    model_id: str
    cluster_id: str
    num_devices: int
    strategy: str
    global_batch_size: int
    precision: str
    iteration_s: float  # overlapped, as scheduled
    serialized_s: float  # nothing overlapped: every task (compute and collective) one after another
    compute_s: float
    comm_s: float
    exposed_comm_s: float  # iteration with communication and no compute
    comm_exposed_fraction: float  # exposed / all communication (MAD Max Table 1)
    exposed_comm_per_iteration: float  # exposed / iteration
    samples_per_s: float  # QPS
    model_flop_per_step: float  # 3 x forward flop x samples (forward, input and weight gradients)
    tflops_per_device: float
    serialized_by_kind_s: dict[str, float]  # MAD Max Fig. 15 a: lookups, GEMM, other, each collective
    comm_by_collective: dict[str, CollectiveBreakdown]  # MAD Max Fig. 15 b
    memory: DLRMMemory
    fits: bool
    tasks: tuple[Placed, ...] = field(repr=False, default=())  # as scheduled; task.kind is the compute kind or collective
    warnings: tuple[str, ...] = ()

    @property
    def step_time_s(self) -> float:
        return self.iteration_s

    @property
    def mqps(self) -> float:
        """Throughput in million samples (queries) per second."""
        return self.samples_per_s / 1e6

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("tasks")
        out["step_time_s"] = self.iteration_s
        out["memory"] = self.memory.as_dict()
        out["memory"]["fits"] = self.fits
        return out

    def __repr__(self) -> str:
        status = "fits" if self.fits else "DOES NOT FIT"
        return (
            f"DLRMEstimate({self.model_id} on {format_devices(self.num_devices, self.cluster_id)}, {self.strategy}: "
            f"iteration {format_seconds(self.iteration_s)}, {self.mqps:.3g} MQPS, serialized "
            f"{format_seconds(self.serialized_s)}, comm exposed {self.comm_exposed_fraction:.1%}, memory "
            f"{format_bytes(self.memory.total_bytes)} of {format_bytes(self.memory.capacity_bytes)} ({status}))"
        )


def iteration_pass(program: DLRMProgram) -> Pass:
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


def dlrm_estimate(program: DLRMProgram) -> DLRMEstimate:
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
    )


def estimate_dlrm(s: DLRMScenario) -> DLRMEstimate:
    """Lower, apply the strategy, cost and schedule one iteration of ``s`` (a training step, or
    for inference one forward pass of the batch)."""
    graph = lower_dlrm(s.model, BYTES_PER_ELEMENT[s.precision])
    program = build_dlrm_program(s.model, graph, s.cluster, s.num_devices, s.strategy, s.global_batch_size, s.precision,
                                 training=s.task != "inference")
    return dlrm_estimate(program)


def dlrm_chrome_trace(e: DLRMEstimate) -> dict:
    """The iteration's scheduled tasks as a Chrome/Perfetto trace (meshplan.timeline.trace)."""
    return tasks_trace(f"{e.model_id} {e.strategy}", e.tasks, e.iteration_s)
