"""MAD Max Fig. 15 breakdowns of a step: serialized time by op kind and by collective type, and
how much of each collective hides behind compute. All for the critical device, whole step."""

from __future__ import annotations

from collections import defaultdict

from meshplan.costs.costed import BACKWARD_OF, CostedProgram, comm_s, regathered
from meshplan.units import difference
from meshplan.workloads.ops import OP_KIND


def by_op_kind(costed: CostedProgram, role_index: int, micro_batches: int) -> dict[str, float]:
    """Serialized compute seconds per op kind (forward, recompute, backward) plus the optimizer."""
    program = costed.program
    role, times = program.roles[role_index], costed.roles[role_index]
    out: dict[str, float] = defaultdict(float)
    for kind_name, layers, frozen in role.layer_counts:
        kind, kind_times = program.kinds[kind_name], costed.kinds[kind_name]
        rerun = dict(kind.recompute_ops)
        for op in kind.ops:
            t = kind_times.ops[op.op.name]
            seconds = layers * t.forward_s + (layers - frozen) * t.backward_s
            seconds += (layers - frozen) * t.forward_s * rerun.get(op.op.name, 0.0)
            out[OP_KIND[op.op.kind]] += micro_batches * seconds
        if kind_times.offload_forward_s or kind_times.offload_backward_s:  # carried by the last op
            waits = micro_batches * (layers * kind_times.offload_forward_s + (layers - frozen) * kind_times.offload_backward_s)
            out[OP_KIND[kind.ops[-1].op.kind]] -= waits
            out["activation_offload"] += waits
    edge_backward = times.compute_backward_s - sum(
        (n - f) * (costed.kinds[k].backward_s + costed.kinds[k].recompute_s) for k, n, f in role.layer_counts
    )
    edge_full_backward = sum(t.backward_s for t in times.edge_ops.values())
    for op in (*role.head, *role.tail):
        t = times.edge_ops[op.op.name]
        share = t.backward_s / edge_full_backward if edge_full_backward else 0.0
        out[OP_KIND[op.op.kind]] += micro_batches * (t.forward_s + share * edge_backward)
    out["optimizer"] = costed.optimizer_s
    return dict(out)


def by_collective(costed: CostedProgram, role_index: int, micro_batches: int, exposed: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per collective type: serialized seconds, exposed seconds, and the hidden fraction."""
    program = costed.program
    s = program.scenario
    role, times = program.roles[role_index], costed.roles[role_index]
    total: dict[str, float] = defaultdict(float)
    per_axis: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def add(axis: str, kind: str, seconds: float) -> None:
        total[kind] += seconds
        per_axis[axis][kind] += seconds

    for kind_name, layers, frozen in role.layer_counts:
        kind = program.kinds[kind_name]
        for comm in (*kind.tp_comms, *kind.ep_comms, *kind.cp_comms):
            add(comm.axis, comm.kind, micro_batches * layers * comm_s(comm))
            backward = (layers - frozen) * comm_s(comm, backward=True)
            add(comm.axis, BACKWARD_OF[comm.kind], micro_batches * backward)
            if regathered(comm, s.plan):
                add(comm.axis, comm.kind, micro_batches * (layers - frozen) * comm_s(comm))
            if kind.recomputed and comm.axis in ("tp", "ep"):
                add(comm.axis, comm.kind, micro_batches * (layers - frozen) * comm_s(comm))
    for comm in (*role.head_comms, *role.tail_comms):
        add(comm.axis, comm.kind, micro_batches * comm_s(comm))
        add(comm.axis, BACKWARD_OF[comm.kind], micro_batches * comm_s(comm, backward=True))
    if times.pp_s:
        add("pp", "send_recv", micro_batches * times.pp_s)
    for comm in program.dp_comms:
        add("dp", comm.kind, comm_s(comm))
    for comm in program.zero3_comms:
        add("dp", comm.kind, micro_batches * comm_s(comm))

    # an axis's exposed time is shared among its collective types in proportion to their time
    hidden_exposed: dict[str, float] = defaultdict(float)
    for axis, kinds in per_axis.items():
        axis_total = sum(kinds.values())
        for kind, seconds in kinds.items():
            hidden_exposed[kind] += exposed.get(axis, 0.0) * seconds / axis_total if axis_total else 0.0
    out = {}
    for kind, seconds in total.items():
        if seconds > 0:
            exposed_s = min(max(hidden_exposed[kind], 0.0), seconds)
            out[kind] = {
                "serialized_s": seconds,
                "exposed_s": exposed_s,
                "hidden_fraction": difference(seconds, exposed_s, floor=0.0) / seconds,
            }
    return out
