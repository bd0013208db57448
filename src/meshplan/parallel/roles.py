"""Which decoder layers each pipeline stage holds, by layer kind, and the distinct roles the
stages fall into (first, last, middle, frozen or mixed), so that a program is built once per role,
never per rank (meshplan.parallel.program)."""

from __future__ import annotations

from meshplan.specs.scenario import Scenario
from meshplan.workloads.ops import Block


def stage_layers(ranges: tuple[tuple[int, int], ...], blocks: tuple[Block, ...], frozen: int) -> tuple[tuple[str, int, int], ...]:
    """(kind, layers, frozen) of the decoder layers in ``ranges`` ([start, end) in model order;
    one per virtual chunk of the stage), kinds in the order their first block comes."""
    out: dict[str, list[int]] = {}
    first = 0
    for block in blocks:
        layers = frozen_here = 0
        for start, end in ranges:
            lo, hi = max(start, first), min(end, first + block.count)
            if hi > lo:
                layers += hi - lo
                frozen_here += max(0, min(hi, frozen) - lo)
        if layers:
            counts = out.setdefault(block.name, [0, 0])
            counts[0] += layers
            counts[1] += frozen_here
        first += block.count
    return tuple((name, layers, frozen_here) for name, (layers, frozen_here) in out.items())


def stage_roles(s: Scenario, blocks: tuple[Block, ...], frozen: int) -> list[tuple[str, int, int, tuple]]:
    """(name, representative stage, number of stages, layer counts) for each distinct stage role.

    Stages group by (first, last, layer kinds and frozen layers on the stage). O(pp·vpp), never
    per rank of the other axes.
    """
    pp = s.plan.pp
    groups: list[list] = []
    for stage in range(pp):
        key = (stage == 0, stage == pp - 1, stage_layers(s.rank_layer_ranges(stage), blocks, frozen))
        if groups and groups[-1][0] == key:
            groups[-1][2] += 1
        else:
            groups.append([key, stage, 1])
    roles = []
    for (first, last, counts), stage, count in groups:
        name = "only" if first and last else "first" if first else "last" if last else "middle"
        frozen_here = sum(f for _, _, f in counts)
        if name == "middle" and frozen_here:
            name = "frozen middle" if frozen_here == sum(n for _, n, _ in counts) else "partly frozen middle"
        if name == "middle" and len([c for c in counts if c[1]]) > 1:
            name = "mixed middle"
        roles.append((name, stage, count, counts))
    return roles
