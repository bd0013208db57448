"""Energy of a training step, by component (the rack-scale energy/latency study's accounting).

- compute: each op's flop times the device's energy per flop in the op's precision;
- memory: each op's HBM traffic (meshplan.costs.power.op_work) times the energy per HBM byte.
  On-chip traffic (L2 and shared memory) is inside the energy per flop: that figure is fitted on
  sustained GEMMs, which move their tiles through L2 as any GEMM of the step does (H100:
  power.csv; its L2-resident copy row fits joules_per_l2_byte, which prices a kernel that runs
  out of L2 rather than HBM);
- links: each collective's bytes per device on each network level it crosses, times 8 times the
  level's energy per bit (the study's Energy = 8·M·(cost_NV·n_NV + cost_IB·n_IB));
- static: every device's idle power over the whole step, bubbles and waits included;
- host (only where the task gives ``host_w_per_node``): each node's power beyond its
  accelerators (CPUs, DRAM, NICs, switches, fans) over the whole step, a flat figure per node;
- offload (only with Plan.optimizer_offload or Plan.activation_offload_layers): the offloaded
  optimizer's bytes, and the offloaded activations copied out and back, over the host link and
  through host DRAM times their energy per bit (meshplan.costs.offload); the CPU cores that step
  the optimizer are in the host's watts, counted only where the task gives them.

Backward does twice the forward's work (COMET Table 1), a frozen weight's GEMM (LoRA's base) once
(workloads.ops.backward_work), flash attention 2.5 times its forward, the causal half of the
score square it computes (costs.power.backward_energy_work, executed_attention_fraction);
recomputed ops run their forward again; frozen layers run forward
only. Power capping stretches time, not energy: the energy per unit
of work is fixed (meshplan.costs.power), so energy and time stay consistent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from meshplan.costs.collectives import GroupSpan
from meshplan.costs.costed import BACKWARD_OF, CostedProgram, adam_step_bytes
from meshplan.costs.offload import OffloadTraffic, offload_energy_j, offload_traffic
from meshplan.costs.power import WorkTally, backward_energy_work, dynamic_energy_j
from meshplan.errors import MeshplanError
from meshplan.network.algorithms import PASSES
from meshplan.network.tuner import choose
from meshplan.parallel.program import Comm
from meshplan.parallel.shard import ShardedOp
from meshplan.specs.device import BYTES_PER_ELEMENT, PowerModel

BITS_PER_BYTE = 8.0


@dataclass(frozen=True)
class EnergyBreakdown:
    """Joules of one step over all devices. The components sum to ``total_j``."""

    compute_j: float
    memory_j: float
    links_j: dict[str, float]  # per network level name
    static_j: float
    step_s: float
    num_devices: int
    peak_device_w: float  # the most loaded role's average power over the step
    tdp_w: float
    by_role_j: dict[str, float] = field(default_factory=dict)  # dynamic energy of one device of each role
    # compute and HBM energy of all devices per op kind (workloads.ops.OP_KIND, and the optimizer):
    # they sum to compute_j + memory_j; link energy per collective type: they sum to links_j
    by_op_kind_j: dict[str, float] = field(default_factory=dict)
    by_collective_j: dict[str, float] = field(default_factory=dict)
    host_j: float = 0.0  # the nodes beyond their accelerators (Task.host_w_per_node); 0 unless asked
    devices_per_node: int = 1
    # optimizer offload: bytes over the host link (PCIe / NVLink-C2C) and through host DRAM
    offload_j: float = 0.0

    @property
    def total_j(self) -> float:
        return self.compute_j + self.memory_j + sum(self.links_j.values()) + self.static_j + self.host_j + self.offload_j

    @property
    def average_device_w(self) -> float:
        """Average power of a device over the step, links left out (they are the NICs' and
        switches' power, not the accelerator's)."""
        return (self.compute_j + self.memory_j + self.static_j) / (self.step_s * self.num_devices)

    @property
    def nodes(self) -> int:
        return math.ceil(self.num_devices / self.devices_per_node)

    @property
    def average_node_w(self) -> float:
        """Average power of a node over the step: its accelerators, and the rest of the node where
        the task counts it (host_j), and the offloaded optimizer's host traffic (offload_j); links
        left out (NICs and switches, reported per level)."""
        return (self.compute_j + self.memory_j + self.static_j + self.host_j + self.offload_j) / (self.step_s * self.nodes)

    @property
    def peak_node_w(self) -> float:
        """The busiest node's average power: a node full of the most loaded role's devices, plus
        its share of the host power and offload traffic."""
        host_w = (self.host_j + self.offload_j) / (self.step_s * self.nodes)
        return min(self.devices_per_node, self.num_devices) * self.peak_device_w + host_w

    def as_dict(self) -> dict:
        return {"compute_j": self.compute_j, "memory_j": self.memory_j, "links_j": dict(self.links_j),
                "static_j": self.static_j, "host_j": self.host_j, "offload_j": self.offload_j, "total_j": self.total_j, "average_device_w": self.average_device_w,
                "peak_device_w": self.peak_device_w, "tdp_w": self.tdp_w, "average_node_w": self.average_node_w,
                "peak_node_w": self.peak_node_w, "by_op_kind_j": dict(self.by_op_kind_j),
                "by_collective_j": dict(self.by_collective_j)}


def level_bytes(kind: str, bytes_: float, span: GroupSpan, algorithm: str = "hierarchical") -> dict[int, float]:
    """Bytes one device puts on each network level (by index) in one collective, on average
    over the group, moved as ``algorithm`` moves them.

    A flat ring (``ring``) sends passes·(n-1)/n·B from every device to its successor, and of the
    ring's n edges, D_t - D_(t+1) cross level t and no higher (D_t: the group's domains at that
    level; the ring closes, so the outermost level is crossed D times). Other reductions and
    gathers as the hierarchical algorithm moves them (each level works on its share of the
    buffer: passes·(k-1)/k·B/c, Thakur et al. 2005; trees and in-switch reductions also move each
    level's share about once). All-to-all: the share of a device's buffer bound for peers inside
    each level's domain but outside the one below it; send/recv: the message over the level that
    joins the two peers.
    """
    if not span.hops or bytes_ <= 0:
        return {}
    if kind == "send_recv":
        return {span.hops[-1].level: bytes_}
    n = span.size
    if kind == "all_to_all":
        return {h.level: h.inside * (h.members - 1) / n * bytes_ for h in span.hops}
    passes = 2.0 if kind == "all_reduce" else 1.0
    if algorithm == "ring":
        domains = [math.prod(h.members for h in span.hops[t:]) for t in range(len(span.hops))] + [0]
        sent = passes * (n - 1) / n * bytes_
        return {h.level: sent * (domains[t] - domains[t + 1]) / n for t, h in enumerate(span.hops)}
    return {h.level: passes * (h.members - 1) / h.members * bytes_ / h.inside for h in span.hops}


class _Tally(WorkTally):
    """Work of one device of a role over a step: its ops, and the bytes it puts on each link."""

    def __init__(self, precision: str, element_bytes: float):
        super().__init__(precision, element_bytes)
        self.link: dict[int, float] = {}  # bytes per level index
        self.kind_link: dict[str, dict[int, float]] = {}  # collective type -> bytes per level index

    def ops(self, ops: tuple[ShardedOp, ...] | list[ShardedOp], times: float, backward: float = 0.0) -> None:
        """``times`` forwards of each op and ``backward`` backwards (each backward_energy_work
        forwards' worth)."""
        for op in ops:
            self.add(op, times + backward * backward_energy_work(op))

    def comms(self, comms: tuple[Comm, ...], times: float, backward: bool = False) -> None:
        for c in comms:
            kind = BACKWARD_OF[c.kind] if backward else c.kind
            algorithm = "hierarchical"
            if kind in PASSES and c.span.hops:  # the algorithm the collective is timed with
                algorithm = choose(kind, c.bytes, c.span, *c.nccl.for_kind(kind))[0]
            per_level = self.kind_link.setdefault(kind, {})
            for level, moved in level_bytes(kind, c.bytes, c.span, algorithm).items():
                self.link[level] = self.link.get(level, 0.0) + times * c.count * moved
                per_level[level] = per_level.get(level, 0.0) + times * c.count * moved


def _role_work(program, role, micro_batches: int, forward_only: bool, embedding_trains: bool) -> _Tally:
    """What one device of ``role`` does over ``micro_batches`` micro-batches: forward, and
    unless ``forward_only`` the backward, recompute and the step's data-parallel traffic."""
    s = program.scenario
    plan, m = s.plan, micro_batches
    t = _Tally(plan.precision, program.element_bytes)
    back = 0 if forward_only else 1
    trained_any = back and role.layers > role.frozen_layers
    for name, count, frozen in role.layer_counts:
        kind = program.kinds[name]
        trained = (count - frozen) * back
        t.ops(kind.ops, m * count, backward=m * trained)
        shares = dict(kind.recompute_ops)
        for op in kind.ops:
            if op.op.name in shares:
                t.ops((op,), m * trained * shares[op.op.name])
        for comms in (kind.tp_comms, kind.cp_comms, kind.ep_comms):
            t.comms(comms, m * count)
            t.comms(comms, m * trained, backward=True)
            if kind.recomputed:
                t.comms(comms, m * trained)
    t.ops(role.tail, m, backward=m * back)
    t.ops(role.head, m, backward=m * back * embedding_trains)
    t.comms((*role.head_comms, *role.tail_comms), m)
    t.comms((*role.head_comms, *role.tail_comms), m * trained_any, backward=True)
    if program.pp_comm is not None:
        t.comms((program.pp_comm,), m * program.pp_sends_per_micro_batch * (1 + trained_any))
    if not forward_only:
        t.comms(program.dp_comms, 1)
        t.comms(program.zero3_comms, m)
        t.add_hbm("optimizer", optimizer_hbm_bytes(program))
    return t


def optimizer_hbm_bytes(program) -> float:
    """HBM bytes of one device's optimizer step: the Adam kernel's over the parameters it steps,
    and with optimizer offload the offloaded gradients read and updated weights written by the
    copies (meshplan.costs.offload)."""
    fraction = program.scenario.plan.optimizer_offload
    if not fraction or program.state is None:
        return program.optimizer_params * adam_step_bytes(program)
    copied = offload_traffic(program.optimizer_params, fraction, program.state.gradient, program.state.weight).link_bytes
    return program.optimizer_params * (1.0 - fraction) * adam_step_bytes(program) + copied


def _power(program) -> PowerModel | None:
    from meshplan import catalog

    return catalog.efficiency(program.scenario.cluster.device.efficiency).power


def _energy(program, power: PowerModel, seconds: float, micro_batches: int, forward_only: bool) -> EnergyBreakdown:
    """Every device's work over ``seconds`` (its idle power included)."""
    s = program.scenario
    embedding_trains = not (s.task.kind == "finetune" and s.task.freeze_embedding)
    devices = [(role.name, role.devices, _role_work(program, role, micro_batches, forward_only, embedding_trains))
               for role in program.roles]
    return _breakdown(power, s.cluster, devices, seconds)


def _breakdown(power: PowerModel, cluster, devices: list[tuple[str, int, _Tally]], seconds: float) -> EnergyBreakdown:
    """The energy of ``devices`` ((role, how many devices play it, one device's work)) over
    ``seconds``, by component."""
    compute = memory = peak = 0.0
    links: dict[str, float] = {}
    by_role: dict[str, float] = {}
    by_op_kind: dict[str, float] = {}
    by_collective: dict[str, float] = {}

    def link_j(level: int, moved: float) -> float:
        return count * moved * BITS_PER_BYTE * cluster.levels[level].energy_per_bit_j

    for name, count, t in devices:
        flop_j = dynamic_energy_j(power, t.flop, 0.0)
        hbm_j = t.hbm * power.joules_per_hbm_byte
        compute += count * flop_j
        memory += count * hbm_j
        for level, moved in t.link.items():
            name_of_level = cluster.levels[level].name
            links[name_of_level] = links.get(name_of_level, 0.0) + link_j(level, moved)
        for kind, joules in t.kind_energy_j(power).items():
            by_op_kind[kind] = by_op_kind.get(kind, 0.0) + count * joules
        for kind, per_level in t.kind_link.items():
            by_collective[kind] = by_collective.get(kind, 0.0) + sum(link_j(level, moved) for level, moved in per_level.items())
        by_role[name] = flop_j + hbm_j
        peak = max(peak, power.idle_w + (flop_j + hbm_j) / seconds)
    num_devices = sum(count for _, count, _ in devices)
    return EnergyBreakdown(
        compute_j=compute,
        memory_j=memory,
        links_j=links,
        static_j=power.idle_w * num_devices * seconds,
        step_s=seconds,
        num_devices=num_devices,
        peak_device_w=peak,
        tdp_w=cluster.device.tdp_w,
        by_role_j=by_role,
        devices_per_node=cluster.devices_per_node,
        by_op_kind_j=by_op_kind,
        by_collective_j=by_collective,
    )


def step_energy(costed: CostedProgram, step_s: float) -> EnergyBreakdown | None:
    """Energy of one training step, or None where the device's profile has no power model."""
    program = costed.program
    power = _power(program)
    if power is None:
        return None
    energy = _energy(program, power, step_s, program.scenario.num_micro_batches, forward_only=False)
    return replace(energy, host_j=host_j(program.scenario, step_s), offload_j=offload_j(program))


def offload_j(program) -> float:
    """Every device's offloaded optimizer traffic and offloaded activations (each copied out to
    host DRAM and back once a micro-batch) over the host link and through host DRAM
    (meshplan.costs.offload.offload_energy_j); 0 without offload."""
    s = program.scenario
    if program.state is None or s.cluster.host is None:
        return 0.0
    joules = 0.0
    if s.plan.optimizer_offload:
        traffic = offload_traffic(program.optimizer_params, s.plan.optimizer_offload, program.state.gradient, program.state.weight)
        joules += s.num_devices * offload_energy_j(traffic, s.cluster.host)
    for role in program.roles:
        copied = 2.0 * s.num_micro_batches * sum(program.kinds[k].saved_bytes * (n - f) for k, n, f in role.layer_counts
                                                 if program.kinds[k].offloaded)
        if copied:
            joules += role.devices * offload_energy_j(OffloadTraffic(copied, copied), s.cluster.host)
    return joules


def host_j(s, seconds: float) -> float:
    """Energy of the nodes beyond their accelerators over ``seconds``: the task's watts per node
    (or the cluster's catalog figure) times the nodes the job spans; 0 where the task gives none."""
    host_w = s.task.host_w_per_node
    if host_w is None:
        return 0.0
    if host_w == "catalog":
        host_w = s.cluster.host_w_per_node
        if host_w is None:
            raise MeshplanError("task.host_w_per_node", "catalog", f"cluster {s.cluster.id} has no host_w_per_node; give watts per node")
    return host_w * math.ceil(s.num_devices / s.cluster.devices_per_node) * seconds


def pass_energy(costed: CostedProgram, pass_s: float) -> EnergyBreakdown | None:
    """Energy of one serving pass (a prefill or a decode step) of every replica."""
    program = costed.program
    power = _power(program)
    if power is None:
        return None
    return _energy(program, power, pass_s, 1, forward_only=True)


#: forward work each phase of a strategy task runs (COMET Table 1: backward is two GEMMs)
PHASE_WORK = {"forward": 1.0, "backward": 2.0, "weight": 1.0}


def iteration_energy(program, iteration_s: float) -> EnergyBreakdown | None:
    """Energy of one iteration of a strategy program (a DLRM): every device runs the same tasks
    (meshplan.parallel.strategy), each kernel ``copies`` times in its phase, each collective
    over the levels its group spans."""
    from meshplan import catalog

    cluster = program.cluster
    power: PowerModel | None = catalog.efficiency(cluster.device.efficiency).power
    if power is None:
        return None
    t = _Tally(program.precision, BYTES_PER_ELEMENT[program.precision])
    for task in program.tasks:
        if task.comm is not None:
            t.comms((task.comm,), 1)
        else:
            t.ops((task.op,), task.copies * PHASE_WORK[task.phase])
    return _breakdown(power, cluster, [("device", program.num_devices, t)], iteration_s)
