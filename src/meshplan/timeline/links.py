"""Which stream each axis's collectives run on: axes that cross the same network level share it.

Collectives of axes whose groups cross the same outermost network level share its links, so they
run on one stream and take turns; where each axis lands follows the plan's mesh ``order``
(meshplan.parallel.mesh). Tensor parallelism inside NVLink and data parallelism across the
scale-out network keep separate streams; expert all-to-all and gradient reduction that both cross
InfiniBand queue on one. Taking turns gives the later collective the finish time fair sharing
would (the same bytes through the same links); the earlier one finishes sooner than it would
under fair sharing.
"""

from __future__ import annotations

from meshplan.timeline.engine import CATEGORIES


def link_streams(program) -> tuple[tuple[str, str], ...]:
    """Each communicating axis of ``program`` (meshplan.parallel.program.Program) and the stream
    of the outermost network level its groups cross: axes on the same level share one stream,
    named by those axes ("ep+dp"); an axis alone on its level keeps its own name."""
    spans: dict[str, list] = {}
    for kind in program.kinds.values():
        for c in (*kind.tp_comms, *kind.cp_comms, *kind.ep_comms):
            spans.setdefault(c.axis, []).append(c.span)
    for c in (*program.dp_comms, *program.zero3_comms):
        spans.setdefault(c.axis, []).append(c.span)
    level = {axis: max(h.level for span in group for h in span.hops) for axis, group in spans.items()
             if any(span.hops for span in group)}
    return tuple(sorted((axis, "+".join(a for a in CATEGORIES if level.get(a) == lvl)) for axis, lvl in level.items()))
