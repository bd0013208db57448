"""The network: topology of each level, collective algorithms, NCCL's protocols and its tuner."""

from meshplan.network.span import GroupSpan, LevelHop, group_span
from meshplan.network.tuner import choose, collective_time_s

__all__ = ["GroupSpan", "LevelHop", "choose", "collective_time_s", "group_span"]
