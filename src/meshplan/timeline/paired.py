"""Paired passes: a forward and a backward of two micro-batches run together, so each expert
all-to-all hides behind the other micro-batch's compute (DeepSeek-V3 technical report,
arXiv 2412.19437, Sec. 3.2.1 and Fig. 4: DualPipe's overlapped forward-and-backward chunk;
Megatron-Core's combined 1F1B all-to-all overlap). Built from the same halves and builders as
every other pass (meshplan.timeline.passes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.timeline.engine import Pass, Segment, Task
from meshplan.timeline.halves import Half, Overlap, TaskBuilder, backward_half, forward_half, recompute_halves
from meshplan.timeline.passes import DataParallel, Layer, prefetched, prologue


def _groups(tasks: list[Task]) -> list[list[Task]]:
    """``tasks`` cut after each expert all-to-all."""
    out: list[list[Task]] = [[]]
    for t in tasks:
        out[-1].append(t)
        if t.parts and t.parts[0][0] == "ep" and t.stream != "compute":
            out.append([])
    return [g for g in out if g]


@dataclass(frozen=True)
class Gathers:
    """ZeRO-3 in a paired pass: each chain gathers its layer's weights ``depth`` layers ahead
    (one queue of signals a chain; a recomputed layer's backward gathers twice where the
    framework gathers for the recompute), and the backward reduce-scatters each layer's
    gradients."""

    gather_s: float = 0.0
    scatter_s: float = 0.0
    depth: int = 0
    recompute_gather: bool = True

    def backward_s(self, layer: Layer) -> float:
        return self.gather_s * (2 if layer.recompute and self.recompute_gather else 1)


def _weights(b: TaskBuilder, gather_s: float, depth: int, ahead: bool, slot: str) -> tuple[tuple[str, str], ...]:
    return prefetched(b, gather_s, depth, ahead, slot) if gather_s > 0 else ()


def _forward_chain(b: TaskBuilder, layer: Layer, g: Gathers, ahead: bool) -> tuple[tuple[str, str], ...]:
    signals = _weights(b, g.gather_s, g.depth, ahead, "wf")
    for h in layer.halves:
        forward_half(b, h)
    return signals


def _backward_chain(b: TaskBuilder, layer: Layer, g: Gathers, ahead: bool) -> tuple[tuple[str, str], ...]:
    signals = _weights(b, g.backward_s(layer), g.depth, ahead, "wb")
    if layer.recompute:
        recompute_halves(b, layer.halves)
    for h in reversed(layer.halves):
        backward_half(b, h)
    if g.scatter_s:
        b.beside("scatter", "dp", g.scatter_s, (b.last,), "reduce_scatter")
    return signals


def paired_segment(name: str, layer: Layer, overlap: Overlap, gathers: Gathers = Gathers(),
                   ahead: tuple[bool, bool] = (True, True)) -> Segment:
    """One layer's forward of one micro-batch and its backward of another, interleaved so each
    all-to-all runs beside the other micro-batch's compute (DeepSeek-V3 Sec. 3.2.1, Fig. 4:
    attention and MLP of one chunk overlap dispatch and combine of the other). ``ahead``: whether
    the forward's and the backward's chains gather a layer ahead (ZeRO-3; not the last ones)."""
    f = TaskBuilder(f"{name}.f", overlap, chain="xf")
    signals = _forward_chain(f, layer, gathers, ahead[0])
    bw = TaskBuilder(f"{name}.b", overlap, chain="xb")
    signals += _backward_chain(bw, layer, gathers, ahead[1])
    # issue order as Megatron-Core's combined 1F1B runs a layer (model_chunk_schedule_plan.py,
    # TransformerLayerSchedulePlan.run): the backward's combine before the forward's attention,
    # the backward's expert MLP before the forward's dispatch, so each stream's order is
    # comm: combine' | dispatch, dispatch' | combine  and  compute: attention | mlp', mlp | attention'
    # (DeepSeek-V3 Fig. 4 pairs the same pieces)
    merged: list[Task] = []
    fg, bg = _groups(f.tasks), _groups(bw.tasks)
    for i in range(max(len(fg), len(bg))):
        merged += bg[i] if i < len(bg) else []
        merged += fg[i] if i < len(fg) else []
    # only the dispatch and combine run on the communication stream (model_chunk_schedule_plan.py:
    # moe_dispatch and moe_combine nodes on comm_stream, attention and MLP nodes on comp_stream),
    # so a tensor- or context-parallel collective a chain waits for holds the compute stream
    # rather than running beside the other micro-batch's compute
    beside = f.hidden | bw.hidden
    merged = [replace(t, stream="compute") if t.stream != "compute" and t.parts[0][0] != "ep" and t.name not in beside else t
              for t in merged]
    joint = TaskBuilder(name, overlap)
    joint.tasks = merged
    # the collectives left beside compute (the all-to-alls, ZeRO-3's prefetched gathers and
    # reduce-scatters) slow it as in any pass
    joint.hidden = {t.name for t in merged if t.stream != "compute" and (t.parts[0][0] == "ep" or t.name in beside)}
    joint.chain, joint.last = "xf", f.last
    return joint.segment(layer.name, (("xb", bw.last), *signals))


def paired_pass(name: str, layers: list[Layer], head: Half | None, tail: Half | None, dp: DataParallel, overlap: Overlap,
                embedding_trains: bool) -> Pass:
    """A forward and a backward of two micro-batches run together (DualPipe's "F&B"): layers
    with expert all-to-all are paired; the rest run one chain after the other. Under ZeRO-3
    each chain gathers its layers' weights as an ordinary pass does (passes.forward_pass and
    backward_pass), from its own queue."""
    zero3 = dp.gather_s > 0
    gathers = Gathers(dp.gather_s, dp.scatter_s, overlap.prefetch, dp.recompute_gather) if zero3 else Gathers()
    parts: list[tuple[Segment, int]] = []

    def chain(label: str, chain_name: str, build) -> None:
        b = TaskBuilder(f"{name}.{label}", overlap, chain=chain_name)
        build(b)
        parts.append((b.segment(label), 1))

    if head:
        chain("head_f", "xf", lambda b: forward_half(b, head))
    if tail:
        chain("tail_b", "xb", lambda b: backward_half(b, tail))
    # runs of layers in pass order: "fb" paired, "f" or "b" one chain alone
    runs: list[tuple[str, Layer, int]] = []
    for layer in layers:
        moe = any(h.dispatch_s > 0 for h in layer.halves)
        trained = layer.count - layer.frozen
        pairs = min(layer.count, trained) if moe else 0
        runs += [(k, layer, n) for k, n in (("fb", pairs), ("f", layer.count - pairs), ("b", trained - pairs)) if n > 0]
    totals = {c: sum(n for k, _, n in runs if c in k) for c in "fb"}
    if zero3 and gathers.depth:
        stream = overlap.stream("dp")
        parts.append((prologue(f"{name}.f", gathers.gather_s, gathers.depth, totals["f"], stream, "wf"), 1))
        first = next((layer for k, layer, _ in runs if "b" in k), None)
        if first is not None:
            parts.append((prologue(f"{name}.b", gathers.backward_s(first), gathers.depth, totals["b"], stream, "wb"), 1))
    seen = dict.fromkeys("fb", 0)
    for kind, layer, n in runs:
        # each chain's last ``depth`` layers gather nothing ahead: cut the run where that starts
        ahead = {c: max(0, min(n, totals[c] - gathers.depth - seen[c])) for c in kind}
        bounds = sorted({0, n, *ahead.values()})
        for lo, hi in zip(bounds, bounds[1:]):
            flags = {c: lo < ahead[c] for c in kind}
            parts.append((_run_segment(f"{name}.{layer.name}", kind, layer, overlap, gathers, flags), hi - lo))
        for c in kind:
            seen[c] += n
    if tail:
        chain("tail_f", "xf", lambda b: forward_half(b, tail))
    if head and embedding_trains:
        chain("head_b", "xb", lambda b: backward_half(b, head))
    return Pass(name, tuple(parts))


def _run_segment(name: str, kind: str, layer: Layer, overlap: Overlap, gathers: Gathers,
                 ahead: dict[str, bool]) -> Segment:
    """One layer of a run: paired ("fb"), or the forward or the backward chain alone."""
    if kind == "fb":
        return paired_segment(name, layer, overlap, gathers, (ahead["f"], ahead["b"]))
    b = TaskBuilder(f"{name}.{kind}", overlap, chain=f"x{kind}")
    if kind == "f":
        signals = _forward_chain(b, layer, gathers, ahead["f"])
    else:
        signals = _backward_chain(b, layer, gathers, ahead["b"])
    return b.segment(layer.name, signals)
