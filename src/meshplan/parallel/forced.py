"""A plan's forced collective algorithm and protocol (NCCL_ALGO / NCCL_PROTO) on every collective
of its Program (``Plan.collective_algorithm``, ``collective_protocol``; timed by
``meshplan.costs.collectives.plan_collective_s``)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from meshplan.costs.collectives import AUTO, NcclChoice

if TYPE_CHECKING:
    from meshplan.parallel.program import Program


def forced_collectives(program: Program, choice: NcclChoice) -> Program:
    """``program`` with every collective carrying the plan's forced algorithm and protocol."""
    if choice == AUTO:
        return program

    def force(comms):
        return tuple(replace(c, nccl=choice) for c in comms)

    kinds = {name: replace(k, tp_comms=force(k.tp_comms), cp_comms=force(k.cp_comms), ep_comms=force(k.ep_comms))
             for name, k in program.kinds.items()}
    roles = tuple(replace(r, head_comms=force(r.head_comms), tail_comms=force(r.tail_comms)) for r in program.roles)
    return replace(program, kinds=kinds, roles=roles, dp_comms=force(program.dp_comms),
                   zero3_comms=force(program.zero3_comms))
