"""A device role's forward and backward passes as task segments, the way frameworks run them.

Each decoder layer is two halves (attention, then FFN). Tensor-parallel collectives sit at the
halves' edges (Shoeybi et al. 2019, Fig. 4: an all-reduce after each half, and its mirror in
backward; with sequence parallelism, Korthikanti et al. 2022 Sec. 4.2.2, an all-gather before
and a reduce-scatter after). Context parallelism exchanges K and V around the attention core;
expert parallelism dispatches tokens before the experts and combines them after (GShard). What
overlaps with what is the plan's overlap options (meshplan.catalog frameworks set them):

- ``tp_overlap``: "none" blocks; "bulk" runs each backward half's closing collective beside its
  weight-gradient GEMMs (Megatron-LM's async tensor-parallel all-reduce, Transformer Engine's
  bulk userbuffers); "pipelined" splits the collective into tp chunks pipelined with the GEMM
  next to it in both passes (TE ring-exchange userbuffers, PyTorch async TP).
- ``cp_overlap``: ring attention sends the next K/V block while the current one is computed.
- ``ep_overlap``: "paired" runs one micro-batch's all-to-all beside another's compute
  (DeepSeek-V3 DualPipe Sec. 3.2.1; Megatron-Core's combined 1F1B all-to-all overlap).
- ZeRO-3/FSDP gathers each layer's weights ``prefetch_layers`` layers ahead and reduce-scatters
  its gradients after its backward; the gradient reduction of ZeRO 0-2 runs per layer (bucket)
  during the last micro-batch's backward when ``overlap_grad_reduce``; the distributed
  optimizer's parameter all-gather runs ahead of the first micro-batch's forward, each layer
  waiting for its own, when ``overlap_param_gather`` (with an interleaved schedule it runs a
  whole model chunk ahead instead: timeline.step.interleaved_param_wait); otherwise it blocks
  after the optimizer step, as DeepSpeed's ZeRO 1-2 run it.

Collectives of axes whose groups cross the same outermost network level share its links: they
run on one stream and take turns (meshplan.timeline.links).

Compute slows while a collective runs beside it (they share SMs and HBM): each second a hidden
collective overlaps compute costs ``overlap_slowdown`` seconds of compute, charged to the
collective's axis. The overlap is measured when the segment is built (``TaskBuilder.segment``), so
segments stay max-plus and compose exactly; a pipelined collective's is in closed form
(``engine.chunked_s``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from meshplan.costs.costed import CostedProgram, comm_s
from meshplan.parallel.program import Role
from meshplan.parallel.recompute import zero3_gathers_per_layer
from meshplan.timeline.engine import Pass, Segment, Task, collective
from meshplan.timeline.halves import Half, Overlap, TaskBuilder, backward_half, forward_half, recompute_halves


@dataclass(frozen=True)
class DataParallel:
    """Per-layer data-parallel work of one role (seconds of one collective each)."""

    gather_s: float  # ZeRO-3: one gather of one layer's weights
    scatter_s: float  # ZeRO-3: one layer's gradient reduce-scatter
    reduce_share_s: float  # ZeRO 0-2: the step's gradient reduction per trainable parameter
    param_share_s: float  # distributed optimizer: the step's parameter all-gather per parameter
    recompute_gather: bool = True  # ZeRO-3: a recomputed layer's backward gathers twice (Plan.zero3_recompute_gather)


def step_reduce_gather_s(program) -> tuple[float, float]:
    """Seconds of the step's data-parallel gradient reduction (all-reduce or reduce-scatter) and
    of the distributed optimizer's parameter all-gather (ZeRO 0-2)."""
    reduce_s = sum(comm_s(c) for c in program.dp_comms if c.kind != "all_gather")
    gather_s = sum(comm_s(c) for c in program.dp_comms if c.kind == "all_gather")
    return reduce_s, gather_s


def data_parallel(costed: CostedProgram, role: Role) -> DataParallel:
    program = costed.program
    plan = program.scenario.plan
    layers = max(program.scenario.stage_layers)
    gathers = zero3_gathers_per_layer(plan, layers)
    units = float(max(layers, 1))
    reduce_s, gather_s = step_reduce_gather_s(program)
    trainable = role.trainable_params or 1.0
    return DataParallel(
        gather_s=costed.zero3_gather_s / (units * gathers) if costed.zero3_gather_s else 0.0,
        scatter_s=costed.zero3_scatter_s / units if costed.zero3_scatter_s else 0.0,
        reduce_share_s=reduce_s / trainable,
        param_share_s=gather_s / trainable,
        recompute_gather=plan.zero3_recompute_gather,
    )


def _wait_weights(b: TaskBuilder, signal: str) -> None:
    """The chain waits for ``signal`` (this layer's weights) before computing."""
    name = b._name("weights")
    b.tasks.append(Task(name, "compute", (), (b.last, signal), "join"))
    b.last = name


def prefetched(b: TaskBuilder, gather_s: float, depth: int, ahead: bool, slot: str = "w") -> tuple[tuple[str, str], ...]:
    """Weights gathered ``depth`` layers ahead: wait for this layer's (signal w0), issue the
    gather of the layer ``depth`` ahead (unless ``ahead`` is False: the last layers), shift the
    queue of signals w0..w{depth-1} (``slot`` names the queue: a paired pass keeps one a chain)."""
    if depth == 0:
        b.blocking("gather", "dp", gather_s, "all_gather")
        return ()
    issued = b.beside("gather_ahead", "dp", gather_s, (b.last,), "all_gather") if ahead else f"{slot}{depth - 1}"
    _wait_weights(b, f"{slot}0")
    return tuple((f"{slot}{i}", f"{slot}{i + 1}") for i in range(depth - 1)) + ((f"{slot}{depth - 1}", issued),)


def prologue(name: str, gather_s: float, depth: int, count: int, stream: str, slot: str = "w") -> Segment:
    """The first ``depth`` gathers of a prefetching pass, issued at its start on ``stream``."""
    tasks = tuple(collective(f"{name}.gather.{i}", "dp", gather_s, (), "all_gather", stream) for i in range(min(depth, count)))
    return Segment(f"{name}.prologue", tasks, tuple((f"{slot}{i}", t.name) for i, t in enumerate(tasks)))


@dataclass(frozen=True)
class Layer:
    """One layer kind on a role: its halves and how many layers (trained, frozen)."""

    name: str
    halves: tuple[Half, ...]
    count: int
    frozen: int
    params: float  # trainable weights per layer, for the data-parallel shares
    recompute: bool = False  # re-runs its whole forward in backward (LayerKind.recomputed)


def _gathers(layers: list[tuple[Layer, int]], depth: int):
    """Split ``layers`` (layer, count) so the last ``depth`` of the pass issue no gather ahead."""
    total = sum(n for _, n in layers)
    out = []
    seen = 0
    for layer, n in layers:
        ahead = max(0, min(n, total - depth - seen))
        out += [(layer, ahead, True), (layer, n - ahead, False)]
        seen += n
    return [(layer, n, ahead) for layer, n, ahead in out if n > 0]


def forward_pass(name: str, layers: list[Layer], head: Half | None, tail: Half | None, dp: DataParallel,
                 overlap: Overlap, first_micro_batch: bool = False) -> Pass:
    """One micro-batch forward. ``first_micro_batch``: the distributed optimizer's parameter
    all-gather runs ahead of it, one layer ahead (Megatron-Core dispatches bucket i+1's
    all-gather from bucket i's forward pre-hook)."""
    parts: list[tuple[Segment, int]] = []
    zero3 = dp.gather_s > 0
    gather = dp.gather_s if zero3 else 0.0
    depth = overlap.prefetch if zero3 else 0
    if first_micro_batch and not zero3 and dp.param_share_s > 0:
        depth = 1
    counts = [(layer, layer.count) for layer in layers]
    total = sum(n for _, n in counts)
    if head:
        b = TaskBuilder(f"{name}.head", overlap)
        forward_half(b, head)
        parts.append((b.segment("head"), 1))
    if depth and (zero3 or first_micro_batch):
        size = gather if zero3 else dp.param_share_s * layers[0].params if layers else 0.0
        parts.append((prologue(name, size, depth, total, overlap.stream("dp")), 1))
    for layer, n, ahead in _gathers(counts, depth):
        piece = dp.param_share_s * layer.params if first_micro_batch and not zero3 and dp.param_share_s > 0 else 0.0
        parts.append((_forward_layer(name, layer, overlap, gather if zero3 else piece, depth, ahead), n))
    if tail:
        b = TaskBuilder(f"{name}.tail", overlap)
        forward_half(b, tail)
        parts.append((b.segment("tail"), 1))
    return Pass(name, tuple(parts))


def first_forward_pass(name: str, layers: list[Layer], head: Half | None, tail: Half | None, dp: DataParallel,
                       overlap: Overlap, prestart_params: float, waited_params: float) -> Pass:
    """The first micro-batch's forward under the distributed optimizer (ZeRO 1-2). Megatron-Core
    dispatches the first bucket of the parameter all-gather from the first forward pre-hook and
    each later bucket from the pre-hook of the one before, one ahead
    (megatron/core/distributed/param_and_grad_buffer.py, finish_param_sync): the layers holding
    the first ``prestart_params`` of the role's parameters run as in any forward, after the role
    waits for ``waited_params`` of them, and the rest gather one layer ahead."""
    share = dp.param_share_s
    prefetched, chained, covered = [], [], 0.0
    for layer in layers:
        whole = int(max(0.0, prestart_params - covered) // layer.params) if layer.params > 0 else layer.count
        early = min(layer.count, whole)
        covered += early * layer.params
        if early:
            prefetched.append(replace(layer, count=early, frozen=min(layer.frozen, early)))
        if layer.count - early:
            chained.append(replace(layer, count=layer.count - early, frozen=max(0, layer.frozen - early)))
    if not prefetched:
        return forward_pass(name, layers, head, tail, dp, overlap, first_micro_batch=True)
    b = TaskBuilder(f"{name}.first_bucket", overlap)
    b.blocking("gather", "dp", min(waited_params, covered) * share, "all_gather")
    parts = [(b.segment("first_bucket"), 1)] if b.tasks else []
    parts += forward_pass(f"{name}.early", prefetched, head, None if chained else tail, dp, overlap).parts
    if chained:
        parts += forward_pass(f"{name}.chained", chained, None, tail, dp, overlap, first_micro_batch=True).parts
    return Pass(name, tuple(parts))


@lru_cache(maxsize=512)
def _forward_layer(name: str, layer: Layer, overlap: Overlap, gather_s: float, depth: int, ahead: bool) -> Segment:
    """One layer's forward; ``gather_s`` > 0: its weights are gathered ``depth`` layers ahead
    (or in place, depth 0). Cached: roles share their layer kinds."""
    b = TaskBuilder(f"{name}.{layer.name}", overlap)
    signals = prefetched(b, gather_s, depth, ahead) if gather_s > 0 else ()
    for h in layer.halves:
        forward_half(b, h)
    return b.segment(layer.name, signals)


@lru_cache(maxsize=512)
def _backward_layer(name: str, layer: Layer, overlap: Overlap, gather_s: float, depth: int, ahead: bool, scatter_s: float,
                    reduce_s: float, weights: bool) -> Segment:
    """One layer's backward: weights gathered ahead (ZeRO-3), the recompute (a layer that re-runs
    whole), the halves in reverse, then its gradients reduce-scattered (ZeRO-3) or reduced
    (``reduce_s``)."""
    b = TaskBuilder(f"{name}.{layer.name}", overlap)
    signals = prefetched(b, gather_s, depth, ahead) if gather_s > 0 else ()
    if layer.recompute:
        recompute_halves(b, layer.halves)
    for h in reversed(layer.halves):
        backward_half(b, h, weights)
    if scatter_s:
        b.beside("scatter", "dp", scatter_s, (b.last,), "reduce_scatter")
    if reduce_s:
        b.beside("reduce", "dp", reduce_s, (b.last,), "reduce_scatter")
    return b.segment(layer.name, signals)


def backward_pass(name: str, layers: list[Layer], head: Half | None, tail: Half | None, dp: DataParallel, overlap: Overlap,
                  embedding_trains: bool, last_micro_batch: bool = False, weights: bool = True) -> Pass:
    """One micro-batch backward through the trained layers (frozen ones take no backward),
    last layer first. ``last_micro_batch``: each layer's gradients are reduced beside the
    backward of the layers before it (bucketed, Megatron-Core and PyTorch DDP; only the last
    micro-batch of a step under gradient accumulation). ``weights=False``: without the
    weight-gradient GEMMs (zero-bubble B)."""
    parts: list[tuple[Segment, int]] = []
    zero3 = dp.gather_s > 0
    depth = overlap.prefetch if zero3 else 0
    reduce = last_micro_batch and overlap.grad_reduce and dp.reduce_share_s > 0
    trained = [(layer, layer.count - layer.frozen) for layer in reversed(layers) if layer.count > layer.frozen]
    total = sum(n for _, n in trained)
    if tail:
        b = TaskBuilder(f"{name}.tail", overlap)
        backward_half(b, tail, weights)
        if reduce:
            b.beside("reduce", "dp", dp.reduce_share_s * _edge_params(tail), (b.last,), "reduce_scatter")
        parts.append((b.segment("tail"), 1))
    if depth and total:  # the first layers' gathers, a recomputed layer's for its re-run too
        parts.append((prologue(name, backward_gathers_s(dp, trained[0][0]), depth, total, overlap.stream("dp")), 1))
    for layer, n, ahead in _gathers(trained, depth):
        piece = dp.reduce_share_s * layer.params if reduce else 0.0
        segment = _backward_layer(name, layer, overlap, backward_gathers_s(dp, layer) if zero3 else 0.0, depth, ahead,
                                  dp.scatter_s if zero3 else 0.0, piece, weights)
        parts.append((segment, n))
    if head and embedding_trains:
        b = TaskBuilder(f"{name}.head", overlap)
        backward_half(b, head, weights)
        if reduce:
            b.beside("reduce", "dp", dp.reduce_share_s * _edge_params(head), (b.last,), "reduce_scatter")
        parts.append((b.segment("head"), 1))
    return Pass(name, tuple(parts))


def backward_gathers_s(dp: DataParallel, layer: Layer) -> float:
    """ZeRO-3: what gathering a layer's weights for its backward takes, twice for a layer that
    re-runs its forward first where the framework gathers again for the recompute."""
    return dp.gather_s * (2 if layer.recompute and dp.recompute_gather else 1)


def _edge_params(h: Half) -> float:
    return h.params
