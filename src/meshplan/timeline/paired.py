"""Paired passes: a forward and a backward of two micro-batches run together, so each expert
all-to-all hides behind the other micro-batch's compute (DeepSeek-V3 technical report,
arXiv 2412.19437, Sec. 3.2.1 and Fig. 4: DualPipe's overlapped forward-and-backward chunk;
Megatron-Core's combined 1F1B all-to-all overlap). Built from the same halves and builders as
every other pass (meshplan.timeline.passes).
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.timeline.engine import Pass, Segment, Task
from meshplan.timeline.halves import Half, Overlap, TaskBuilder, backward_half, forward_half, recompute_halves
from meshplan.timeline.passes import Layer


def _groups(tasks: list[Task]) -> list[list[Task]]:
    """``tasks`` cut after each expert all-to-all."""
    out: list[list[Task]] = [[]]
    for t in tasks:
        out[-1].append(t)
        if t.parts and t.parts[0][0] == "ep" and t.stream != "compute":
            out.append([])
    return [g for g in out if g]


def paired_segment(name: str, layer: Layer, overlap: Overlap, full_recompute: bool) -> Segment:
    """One layer's forward of one micro-batch and its backward of another, interleaved so each
    all-to-all runs beside the other micro-batch's compute (DeepSeek-V3 Sec. 3.2.1, Fig. 4:
    attention and MLP of one chunk overlap dispatch and combine of the other)."""
    f = TaskBuilder(f"{name}.f", overlap, chain="xf")
    for h in layer.halves:
        forward_half(f, h)
    bw = TaskBuilder(f"{name}.b", overlap, chain="xb")
    if full_recompute:
        recompute_halves(bw, layer.halves)
    for h in reversed(layer.halves):
        backward_half(bw, h)
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
    joint.hidden = {t.name for t in merged if t.stream != "compute" and t.parts[0][0] == "ep"}
    joint.chain, joint.last = "xf", f.last
    return joint.segment(layer.name, (("xb", bw.last),))


def paired_pass(name: str, layers: list[Layer], head: Half | None, tail: Half | None, overlap: Overlap,
                full_recompute: bool, embedding_trains: bool) -> Pass:
    """A forward and a backward of two micro-batches run together (DualPipe's "F&B"): layers
    with expert all-to-all are paired; the rest run one chain after the other."""
    parts: list[tuple[Segment, int]] = []

    def chain(label: str, chain_name: str, build) -> None:
        b = TaskBuilder(f"{name}.{label}", overlap, chain=chain_name)
        build(b)
        parts.append((b.segment(label), 1))

    if head:
        chain("head_f", "xf", lambda b: forward_half(b, head))
    if tail:
        chain("tail_b", "xb", lambda b: backward_half(b, tail))
    for layer in layers:
        moe = any(h.dispatch_s > 0 for h in layer.halves)
        trained = layer.count - layer.frozen
        pairs = min(layer.count, trained) if moe else 0
        if pairs:
            parts.append((paired_segment(f"{name}.{layer.name}", layer, overlap, full_recompute), pairs))
        for label, chain_name, count, build in (
            ("f", "xf", layer.count - pairs, lambda b, ly=layer: [forward_half(b, h) for h in ly.halves]),
            ("b", "xb", trained - pairs, lambda b, ly=layer: ([recompute_halves(b, ly.halves)] if full_recompute else [])
             + [backward_half(b, h) for h in reversed(ly.halves)]),
        ):
            if count > 0:
                b = TaskBuilder(f"{name}.{layer.name}.{label}", overlap, chain=chain_name)
                build(b)
                parts.append((b.segment(layer.name), count))
    if tail:
        chain("tail_f", "xf", lambda b: forward_half(b, tail))
    if head and embedding_trains:
        chain("head_b", "xb", lambda b: backward_half(b, head))
    return Pass(name, tuple(parts))
