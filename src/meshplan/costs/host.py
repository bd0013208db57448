"""The host's dispatch of a layer's ops (specs.kernels.HostDispatch): in training the host runs
ahead of the GPU while kernels take longer than issuing them, and where they take less the GPU
waits for it (host_bound); an op may cost several dispatches or none, a GEMM per local expert,
and a sync that stops the host running ahead (Issue). costs.costed times layers with it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from meshplan.specs.kernels import HostDispatch

if TYPE_CHECKING:
    from meshplan.costs.costed import OpTimes


@dataclass(frozen=True)
class Issue:
    """How a layer's ops reach the GPU beyond one dispatch each (Plan.expert_gemms,
    Plan.moe_host_sync): ``launches``, the dispatches an op costs the host where it is more than
    one (a GEMM per local expert); ``experts``, the first and last expert op, between which the
    blocking collectives ``comm_forward_s`` and ``comm_backward_s`` run on the compute stream
    (the expert all-to-alls: half before the first, the dispatch; half after the last, the
    combine), which the host runs ahead of as it does of kernels; ``sync``, whether every
    forward waits, before the first expert op, until the GPU has run all before it."""

    launches: dict[str, int] = field(default_factory=dict)
    experts: tuple[str, str] | None = None
    sync: bool = False
    comm_forward_s: float = 0.0
    comm_backward_s: float = 0.0


def issue_bound_s(units: list[tuple[float, float]]) -> float:
    """The time ``units`` (host dispatch, GPU time) take when the GPU runs each only after the
    host has issued it, both in order and neither ever idle by choice: the two-machine flow
    shop's makespan for a fixed order (Johnson 1954, "Optimal two- and three-stage production
    schedules with setup times included"), the longest of host up to a unit plus GPU from it."""
    best = host = 0.0
    gpu_after = sum(g for _, g in units)
    for h, g in units:
        host += h
        best = max(best, host + gpu_after)
        gpu_after -= g
    return best


def _waits(units: list[tuple[str | None, float, float]], synced: bool) -> dict[str, float]:
    """The GPU's idle time on each op of ``units`` (op name or None for a collective, host
    dispatch, GPU time): a kernel starts once the one before it has run and the host has issued
    it, and an op holds the stream until the next op starts (a collective's idle time is its op's
    before it). After a sync the host starts level with the GPU and the segment takes the flow
    shop's makespan. Otherwise, over a run of such layers, the host keeps ahead where the GPU is
    the slower (no waits); where the host is, a layer takes its dispatch, and the host's lead
    settles where the flow shop agrees (its makespan less the dispatch): each kernel then starts
    when the host issues it wherever the host is the slower, so faster kernels leave the
    timeline as it was instead of moving what follows earlier."""
    host = sum(h for _, h, _ in units)
    makespan = issue_bound_s([(h, g) for _, h, g in units])
    if synced:
        lead, period = 0.0, makespan
    elif host <= sum(g for _, _, g in units):
        return {}
    else:
        lead, period = makespan - host, host
    starts = []
    gpu_free = issued = 0.0
    for _, h, g in units:
        issued += h
        starts.append(max(gpu_free, issued - lead))
        gpu_free = starts[-1] + g
    nexts = starts[1:] + [starts[0] + period]
    named = [name for name, _, _ in units if name is not None]
    waits: dict[str, float] = {}
    owner = named[0] if named else None
    for (name, _, g), start, nxt in zip(units, starts, nexts):
        owner = name if name is not None else owner
        if owner is not None and nxt - start - g > 0.0:
            waits[owner] = waits.get(owner, 0.0) + nxt - start - g
    return waits


def host_bound(times: dict[str, OpTimes], host: HostDispatch | None, issue: Issue | None = None,
               paired: bool = False) -> dict[str, OpTimes]:
    """A layer's (or the embedding's, or the head's) ``times`` (in forward order) held to the
    host's dispatch of its ops (specs.kernels.HostDispatch): in training the host runs ahead of
    the GPU while the kernels take longer than issuing them; where they take less (small layers,
    many tensor-parallel ranks) the GPU waits, and the pass takes what its dispatch takes,
    forward and backward apart. Each op's time grows by the GPU's wait for the host before it
    (``_waits``), so a collective after an op starts when the host has issued what comes before.

    ``issue`` (Issue) counts an op's dispatches beyond one, adds the blocking collectives to the
    GPU's side, and with a sync makes the forward what one layer's segment between syncs takes,
    from the first expert op to the next layer's: the host cannot run ahead across layers, and
    where it is the slower part of some ops and the GPU of others, their times add
    (``issue_bound_s``; a layer kind followed by its own kind, one segment per layer).

    ``paired``: a forward and another micro-batch's backward run together (timeline.paired), so
    the host issues both in one stream of dispatches and the GPU runs both: one timeline, the
    backward's long kernels letting the host get ahead for the forward's short ones (without a
    sync; with one, each pass as alone). The layer's forward or backward alone (a warm-up forward,
    say) is then held a little short of its own dispatch."""
    if host is None or not times:
        return times
    issue = issue or Issue()
    names = list(times)
    count = {name: issue.launches.get(name, 1) for name in names}
    first, last = issue.experts or (None, None)

    def units(order: list[str], per_op: float, pass_s, comm_s: float, before: str | None, after: str | None):
        out: list[tuple[str | None, float, float]] = []
        for name in order:
            if name == before:
                out.append((None, 0.0, comm_s / 2.0))
            n = count[name]  # 0: issued within another op's dispatch (autocast's casts, within a linear's call)
            out += [(name, per_op, pass_s(times[name]) / n)] * n if n else [(name, 0.0, pass_s(times[name]))]
            if name == after:
                out.append((None, 0.0, comm_s / 2.0))
        if before is None and after is None and comm_s:  # no expert ops named: after the pass
            out.append((None, 0.0, comm_s))
        return out

    forward_order = names
    if issue.sync and first is not None:  # the segment from the sync to the next layer's
        forward_order = names[names.index(first):] + names[:names.index(first)]
    forward = units(forward_order, host.forward_s, lambda t: t.forward_s, issue.comm_forward_s, first, last)
    if issue.sync and first is not None:  # the dispatch all-to-all ends the segment, before the sync
        forward = forward[1:] + forward[:1]
    backward = units(names[::-1], host.backward_s, lambda t: t.backward_s, issue.comm_backward_s, last, first)
    if paired and not (issue.sync and first is not None):
        def tagged(units, tag):
            return [((name, tag) if name is not None else None, h, g) for name, h, g in units]
        waits = _waits(tagged(forward, "f") + tagged(backward, "b"), False)
        wait_forward = {name: w for (name, tag), w in waits.items() if tag == "f"}
        wait_backward = {name: w for (name, tag), w in waits.items() if tag == "b"}
    else:
        wait_forward = _waits(forward, issue.sync and first is not None)
        wait_backward = _waits(backward, False)
    if not wait_forward and not wait_backward:
        return times
    return {name: replace(t, forward_s=t.forward_s + wait_forward.get(name, 0.0), backward_s=t.backward_s + wait_backward.get(name, 0.0))
            for name, t in times.items()}


def launch_counts(ops) -> dict[str, int]:
    """The ops issued in several calls or none (Op.launches), by name: the rest are one each."""
    return {op.op.name: op.op.launches for op in ops if op.op.launches != 1}


def edge_issue(ops) -> Issue | None:
    """The embedding's or the head's Issue: its ops issued in several calls or none."""
    launches = launch_counts(ops)
    return Issue(launches=launches) if launches else None


def layer_issue(kind, plan, model, blocking_ep: tuple[float, float]) -> Issue | None:
    """A layer kind's Issue under ``plan``: the ops PyTorch issues in several calls (Op.launches:
    eager norms and rotary embeddings), a GEMM per local expert (Plan.expert_gemms), the
    dispatcher's sync before the first expert GEMM (Plan.moe_host_sync), and the expert
    all-to-alls ``blocking_ep`` (forward, backward seconds) where they block the compute stream.
    None for a layer issued one dispatch an op, without routed experts."""
    launches = launch_counts(kind.ops)
    experts = [op.op.name for op in kind.ops if op.op.expert and op.op.kind == "matmul"]
    if not experts:
        return Issue(launches=launches) if launches else None
    local = max(1, model.moe.num_experts // plan.ep) if plan.expert_gemms == "per_expert" else 1
    return Issue(
        launches={**launches, **({name: local for name in experts} if local > 1 else {})},
        experts=(experts[0], experts[-1]),
        sync=plan.moe_host_sync,
        comm_forward_s=blocking_ep[0],
        comm_backward_s=blocking_ep[1],
    )


def recompute_s(recompute_ops, gpu: dict[str, OpTimes], host: HostDispatch | None, issue: Issue | None) -> float:
    """What re-running ``recompute_ops`` ((op, share) pairs) takes in backward: their kernels, or
    the host's issue of them where that is longer (its own segment: the waits the forward's host
    timeline put before each op are the forward's, not the re-run's)."""
    kernels = sum(share * gpu[name].forward_s for name, share in recompute_ops)
    if host is None:
        return kernels
    launches = issue.launches if issue is not None else {}
    return max(kernels, host.forward_s * sum(share * launches.get(name, 1) for name, share in recompute_ops))
