"""The halves of a decoder layer (attention, then FFN) and how each becomes tasks on the compute
stream and the network axes' streams: tensor-parallel collectives at the halves' edges, context
parallelism around the attention core, expert dispatch and combine around the experts, each
blocking, beside compute or pipelined with it as the plan's overlap options say (the options and
their sources: meshplan.timeline.passes)."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.costs.costed import CostedProgram, OpTimes, comm_s
from meshplan.parallel.program import Comm
from meshplan.parallel.shard import ShardedOp, param_share
from meshplan.timeline.engine import Placed, Segment, State, Task, chunked_s, collective, run
from meshplan.timeline.links import link_streams

X = "x"  # signal: the activation (or its gradient) the next task of the chain needs


@dataclass(frozen=True)
class Op:
    """One op on one device for one micro-batch: its times and what it is."""

    name: str
    kind: str  # matmul, attention, elementwise, lookup
    expert: bool
    times: OpTimes

    @property
    def is_matmul(self) -> bool:
        return self.kind == "matmul"


@dataclass(frozen=True)
class Half:
    """One half of a decoder layer (or the head, or the tail)."""

    name: str
    ops: tuple[Op, ...]
    open_s: float  # forward collective before the ops (sequence-parallel all-gather)
    close_s: float  # forward collective after them (reduce-scatter or all-reduce)
    open_back_s: float  # backward collective at the start of the backward (mirror of close)
    close_back_s: float  # backward collective at its end (mirror of open)
    tp_chunks: int  # chunks a pipelined tensor-parallel collective splits into
    dispatch_s: float = 0.0  # expert all-to-all before the first expert op (and after, combine)
    cp_s: float = 0.0  # K/V exchange of the attention core, forward
    cp_back_s: float = 0.0
    cp_chunks: int = 1
    recompute: tuple[tuple[str, float], ...] = ()  # (op, share of its forward) re-run in backward (selective recompute)
    params: float = 0.0  # trainable weights on this device (head and tail; layers carry theirs in Layer)
    reduce_kind: str = "reduce_scatter"  # the closing collective: reduce_scatter (sequence parallel) or all_reduce
    # backward all-gather of the sequence-parallel input the first GEMM's weight gradient needs
    # (Plan.sp_regather), beside that GEMM's backward
    regather_s: float = 0.0


@dataclass(frozen=True)
class Overlap:
    grad_reduce: bool
    param_gather: bool
    prefetch: int
    tp: str
    cp: bool
    ep: str
    slowdown: float
    streams: tuple[tuple[str, str], ...] = ()  # (axis, the stream its collectives run on)

    @classmethod
    def of(cls, costed: CostedProgram) -> "Overlap":
        p = costed.program.scenario.plan
        # a pipeline stage with FSDP2 kept gathered reduce-scatters after its last backward
        # (PipelineStage.backward_maybe_with_nosync runs FSDP's post-backward then), not beside it
        grad_reduce = p.overlap_grad_reduce and not p.zero3_per_step
        return cls(grad_reduce, p.overlap_param_gather, p.prefetch_layers,
                   p.tp_overlap, p.cp_overlap, p.ep_overlap, costed.overlap_slowdown, link_streams(costed.program))

    def stream(self, axis: str) -> str:
        return dict(self.streams).get(axis, axis)


def _ops(sharded: tuple[ShardedOp, ...], times: dict[str, OpTimes]) -> tuple[Op, ...]:
    return tuple(Op(s.op.name, s.op.kind, s.op.expert, times[s.op.name]) for s in sharded)


def _per(comms: tuple[Comm, ...], kind: str, backward: bool = False) -> float:
    """Seconds of one collective of ``kind`` among ``comms`` (a Comm carries a count)."""
    return sum(comm_s(c, backward) / c.count for c in comms if c.kind == kind)


def layer_halves(costed: CostedProgram, kind_name: str) -> tuple[Half, ...]:
    """The attention and FFN halves of one layer of ``kind_name`` on one device; one einsum of
    a block model (meshplan.workloads.transformer.block_einsums) is a single half."""
    program = costed.program
    plan = program.scenario.plan
    kind, times = program.kinds[kind_name], costed.kinds[kind_name]
    ops = _ops(kind.ops, times.ops)
    split = next((i for i, op in enumerate(ops) if op.name == "residual_attn"), None)
    sp = any(c.kind == "all_gather" for c in kind.tp_comms)
    regather = 0.0
    if sp:
        open_s, close_s = _per(kind.tp_comms, "all_gather"), _per(kind.tp_comms, "reduce_scatter")
        open_back, close_back = _per(kind.tp_comms, "reduce_scatter", True), _per(kind.tp_comms, "all_gather", True)
        regather = open_s if plan.sp_regather else 0.0
    else:  # all-reduce after each half, and its mirror at the end of the half's backward
        open_s = open_back = 0.0
        close_s, close_back = _per(kind.tp_comms, "all_reduce"), _per(kind.tp_comms, "all_reduce", True)
    tp = plan.tp
    selective = kind.recompute_ops if plan.recompute == "selective" and not plan.whole_layer_recompute else ()
    cp_fwd = _per(kind.cp_comms, "all_gather")
    cp_bwd = _per(kind.cp_comms, "all_gather", True)
    a2a = _per(kind.ep_comms, "all_to_all")
    reduce_kind = "reduce_scatter" if sp or not kind.tp_comms else "all_reduce"
    if split is None:
        return (Half(kind_name, ops, open_s, close_s, open_back, close_back, tp, cp_s=cp_fwd, cp_back_s=cp_bwd,
                     cp_chunks=plan.cp, recompute=selective, reduce_kind=reduce_kind, regather_s=regather),)
    split += 1
    attention = Half("attn", ops[:split], open_s, close_s, open_back, close_back, tp, cp_s=cp_fwd, cp_back_s=cp_bwd,
                     cp_chunks=plan.cp, recompute=selective, reduce_kind=reduce_kind, regather_s=regather)
    ffn = Half("ffn", ops[split:], open_s, close_s, open_back, close_back, tp, dispatch_s=a2a, recompute=selective,
               reduce_kind=reduce_kind, regather_s=regather)
    return attention, ffn


def edge_halves(costed: CostedProgram, role_index: int) -> tuple[Half | None, Half | None]:
    """The embedding (head) and the final norm, logits and loss (tail) of a role, if it has them."""
    role, times = costed.program.roles[role_index], costed.roles[role_index]
    tp = costed.program.scenario.plan.tp
    head = tail = None
    if role.head:
        ops = _ops(role.head, times.edge_ops)
        close = sum(comm_s(c) for c in role.head_comms)
        head = Half("embedding", ops, 0.0, close, 0.0, sum(comm_s(c, True) for c in role.head_comms), 1,
                    params=sum(param_share(s.op, tp) for s in role.head if not s.op.frozen),
                    reduce_kind=role.head_comms[0].kind if role.head_comms else "all_reduce")
    if role.tail:
        ops = _ops(role.tail, times.edge_ops)
        gathers = tuple(c for c in role.tail_comms if c.at == "open" or (not c.at and c.kind == "all_gather"))
        reduces = tuple(c for c in role.tail_comms if c not in gathers)
        tail = Half("head", ops, sum(comm_s(c) for c in gathers), sum(comm_s(c) for c in reduces),
                    sum(comm_s(c, True) for c in reduces), sum(comm_s(c, True) for c in gathers), 1,
                    params=sum(param_share(s.op, tp) for s in role.tail if not s.op.frozen), reduce_kind="all_reduce")
    return head, tail


class TaskBuilder:
    """Tasks of one segment, in issue order, with unique names."""

    def __init__(self, prefix: str, overlap: Overlap, chain: str = X):
        self.prefix, self.overlap, self.chain = prefix, overlap, chain
        self.tasks: list[Task] = []
        self.last = chain  # what the next task of the chain waits for
        self.hidden: set[str] = set()  # names of the collectives issued to run beside compute
        self.pipelined_comms: set[str] = set()  # names of the pipelined collectives' tasks
        self.charged = 0.0  # contention the pipelined collectives' compute tasks already carry

    def _name(self, label: str) -> str:
        return f"{self.prefix}.{label}.{len(self.tasks)}"

    def work(self, label: str, seconds: float, kind: str = "compute", extra: tuple[tuple[str, float], ...] = ()) -> None:
        """Compute on the chain (after what came before it)."""
        if seconds <= 0 and not extra:
            return
        previous = self.tasks[-1] if self.tasks else None
        if not extra and previous is not None and previous.name == self.last and previous.stream == "compute" \
                and len(previous.parts) == 1 and previous.parts[0][0] == "compute":
            # consecutive compute on the chain is one task: the schedule is the same, and fewer
            # tasks keep a pass cheap to schedule
            merged = Task(previous.name, "compute", (("compute", previous.duration_s + seconds),), previous.deps, previous.kind)
            self.tasks[-1] = merged
            return
        name = self._name(label)
        parts = (("compute", seconds), *extra)
        self.tasks.append(Task(name, "compute", parts, (self.last,), kind))
        self.last = name

    def blocking(self, label: str, axis: str, seconds: float, kind: str = "") -> None:
        """A collective the chain waits for."""
        if seconds <= 0:
            return
        name = self._name(label)
        self.tasks.append(collective(name, axis, seconds, (self.last,), kind, self.overlap.stream(axis)))
        self.last = name

    def beside(self, label: str, axis: str, seconds: float, deps: tuple[str, ...], kind: str = "") -> str:
        """A collective that runs beside compute (nothing on the chain waits for it here)."""
        name = self._name(label)
        self.tasks.append(collective(name, axis, seconds, deps, kind, self.overlap.stream(axis)))
        self.hidden.add(name)
        return name

    def join(self, task: str) -> None:
        """The chain goes on once ``task`` (a collective beside it) is done as well."""
        self.tasks.append(Task(self._name("join"), "compute", (), (task,), "join"))
        self.last = self.tasks[-1].name

    def pipelined(self, label: str, axis: str, comm: float, work: float, chunks: int, kind: str) -> None:
        """A collective pipelined with ``work`` seconds of compute in ``chunks`` steps: one
        compute task carrying the exposed part and the contention, and the collective on its
        stream beside it (for the stream's occupancy and the trace)."""
        if comm <= 0:
            self.work(label, work, kind)
            return
        total = chunked_s(comm, work, chunks)
        exposed = max(total - work, 0.0)
        contention = self.overlap.slowdown * min(comm - exposed, work)
        start = self.last
        name = self._name(f"{label}.comm")
        self.tasks.append(collective(name, axis, comm, (start,), "overlapped", self.overlap.stream(axis)))
        self.pipelined_comms.add(name)
        self.charged += contention
        self.work(label, work, kind, ((axis, exposed + contention),))

    def segment(self, name: str, signals: tuple[tuple[str, str], ...] = ()) -> Segment:
        """Close the segment: contention for what ran beside its compute, and the chain's end.

        How long the hidden collectives overlap compute is measured on the segment run twice
        from idle streams (a collective fired at the end of one layer runs beside the next
        layer's compute): the first run's collectives against both runs' compute. The compute
        stream pays ``slowdown`` for each second that any collective runs beside it, once however
        many do (the union of their intervals, pipelined ones included, whose compute tasks
        already carry their share): a static charge after the chain's last task (slowed compute
        ends later, so a blocking collective at the end of the segment cannot hide it), so the
        segment stays max-plus and composes exactly. Each hidden axis is charged in proportion
        to its own overlap."""
        signals = ((self.chain, self.last), *signals)
        if self.hidden and self.overlap.slowdown > 0:
            placed: list[Placed] = []
            draft = Segment(name, tuple(self.tasks), signals)
            run(run(State(), draft, placed), draft, placed)
            busy = [(p.start_s, p.end_s) for p in placed if p.task.stream == "compute" and p.end_s > p.start_s]
            beside: dict[str, float] = {}
            comms: list[tuple[float, float]] = []
            for p in placed[:len(self.tasks)]:
                if p.task.name in self.hidden:
                    axis = p.task.parts[0][0]
                    beside[axis] = beside.get(axis, 0.0) + _overlap_s([(p.start_s, p.end_s)], busy)
                if p.task.name in self.hidden or p.task.name in self.pipelined_comms:
                    comms.append((p.start_s, p.end_s))
            own = sum(beside.values())
            owed = max(0.0, self.overlap.slowdown * _overlap_s(_union(comms), busy) - self.charged)
            for axis, seconds in beside.items():
                if seconds > 0 and owed > 0:
                    charge = owed * seconds / own
                    self.tasks.append(Task(self._name(f"contention.{axis}"), "compute", ((axis, charge),), (self.last,), "contention"))
        return Segment(name, tuple(self.tasks), signals)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint intervals covering ``intervals``."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        elif end > start:
            out.append((start, end))
    return out


def _overlap_s(intervals: list[tuple[float, float]], busy: list[tuple[float, float]]) -> float:
    """Seconds of ``intervals`` (disjoint) that fall inside ``busy`` (disjoint: one stream's tasks)."""
    return sum(max(0.0, min(e1, e2) - max(b1, b2)) for b1, e1 in intervals for b2, e2 in busy)


def _matmul_run(ops: tuple[Op, ...], first: bool) -> int:
    """Index of the first (or last) matmul of ``ops``, or -1."""
    indices = [i for i, op in enumerate(ops) if op.is_matmul]
    if not indices:
        return -1
    return indices[0] if first else indices[-1]


def forward_half(b: TaskBuilder, h: Half) -> None:
    ops = h.ops
    first, last = _matmul_run(ops, True), _matmul_run(ops, False)
    pipelined = b.overlap.tp == "pipelined" and first >= 0
    close_pipelined = pipelined and last != first  # one GEMM pipelines one collective
    if not pipelined:
        b.blocking(f"{h.name}.open", "tp", h.open_s, "all_gather")
    experts = [i for i, op in enumerate(ops) if op.expert]
    for i, op in enumerate(ops):
        if experts and i == experts[0]:
            b.blocking(f"{h.name}.dispatch", "ep", h.dispatch_s, "all_to_all")
        if op.kind == "attention" and h.cp_s > 0:
            if b.overlap.cp:
                b.pipelined(op.name, "cp", h.cp_s, op.times.forward_s, h.cp_chunks, op.kind)
            else:
                b.blocking(f"{op.name}.kv", "cp", h.cp_s, "all_gather")
                b.work(op.name, op.times.forward_s, op.kind)
        elif pipelined and i == first:
            b.pipelined(op.name, "tp", h.open_s, op.times.forward_s, h.tp_chunks, op.kind)
        elif close_pipelined and i == last:
            b.pipelined(op.name, "tp", h.close_s, op.times.forward_s, h.tp_chunks, op.kind)
        else:
            b.work(op.name, op.times.forward_s, op.kind)
        if experts and i == experts[-1]:
            b.blocking(f"{h.name}.combine", "ep", h.dispatch_s, "all_to_all")
    if not close_pipelined:
        b.blocking(f"{h.name}.close", "tp", h.close_s, h.reduce_kind)


def backward_half(b: TaskBuilder, h: Half, weights: bool = True) -> None:
    """The backward of ``h`` (ops in reverse). ``weights=False`` leaves out the weight-gradient
    GEMMs (zero-bubble schedules run them apart)."""
    ops = h.ops
    mode = b.overlap.tp
    first, last = _matmul_run(ops, True), _matmul_run(ops, False)
    pipelined = mode == "pipelined" and last >= 0  # the opening collective with the last GEMM's gradient
    close_pipelined = pipelined and first != last
    if not pipelined:
        b.blocking(f"{h.name}.open_back", "tp", h.open_back_s, "all_gather")
    experts = [i for i, op in enumerate(ops) if op.expert]
    deferred = 0.0  # weight gradients run beside the closing collective (bulk overlap)
    rerun = dict(h.recompute)
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if experts and i == experts[-1]:
            b.blocking(f"{h.name}.combine_back", "ep", h.dispatch_s, "all_to_all")
        if rerun.get(op.name):
            b.work(f"{op.name}.recompute", rerun[op.name] * op.times.forward_s, op.kind)
        own_weight = op.times.weight_s if weights else 0.0
        if mode == "bulk" and h.close_back_s > 0:
            deferred += own_weight
            own_weight = 0.0
        seconds = op.times.input_s + own_weight
        gather = None
        if i == first and h.regather_s > 0 and weights and op.times.weight_s > 0:  # its weight gradient's input, gathered again
            gather = b.beside(f"{h.name}.regather", "tp", h.regather_s, (b.last,), "all_gather")
        if op.kind == "attention" and h.cp_back_s > 0:
            if b.overlap.cp:
                b.pipelined(f"{op.name}.back", "cp", h.cp_back_s, seconds, h.cp_chunks, op.kind)
            else:
                b.work(f"{op.name}.back", seconds, op.kind)
                b.blocking(f"{op.name}.kv_back", "cp", h.cp_back_s, "reduce_scatter")
        elif pipelined and i == last:
            b.pipelined(f"{op.name}.back", "tp", h.open_back_s, seconds, h.tp_chunks, op.kind)
        elif close_pipelined and i == first:
            b.pipelined(f"{op.name}.back", "tp", h.close_back_s, seconds, h.tp_chunks, op.kind)
        else:
            b.work(f"{op.name}.back", seconds, op.kind)
        if gather is not None:
            # the GEMM's backward needs the gathered input; where the gather runs longer than
            # the input gradient beside it, the weight gradient waits, and what follows with it
            # (taken here as waiting at the GEMM's end: the same wherever the gather is the
            # shorter, as it is beside the GEMMs of a layer)
            b.join(gather)
        if experts and i == experts[0]:
            b.blocking(f"{h.name}.dispatch_back", "ep", h.dispatch_s, "all_to_all")
    if close_pipelined:
        return
    if deferred > 0:
        gradient = b.last
        closing = b.beside(f"{h.name}.close_back", "tp", h.close_back_s, (gradient,), h.reduce_kind)
        b.work(f"{h.name}.weight_grads", deferred, "matmul")
        # the next half needs both the reduced input gradient and a free compute stream
        b.join(closing)
    else:
        b.blocking(f"{h.name}.close_back", "tp", h.close_back_s, h.reduce_kind)


def recompute_halves(b: TaskBuilder, halves: tuple[Half, ...]) -> None:
    """Full recompute: the layer's forward again, collectives included, before its backward."""
    for h in halves:
        forward_half(b, h)
