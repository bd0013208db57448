"""Collective communication time: the entry the rest of meshplan uses, delegating to ``network/``.

``group_span`` places a group in the network (``network.span``); ``collective_s`` times one
collective with the fastest algorithm x NCCL protocol for its size and span, as NCCL's tuner
picks it (``network.tuner``), or with a forced algorithm. The formulas and their sources are in
``network.algorithms`` (ring: Patarasuk & Yuan 2009; tree, NVLS, CollNet: NCCL's
``src/graph/tuning.cc``; halving-doubling: Thakur et al. 2005; torus bucket: Jouppi et al. 2023)
and ``network.topology`` (fat trees, rails, rings, tori, dragonflies, bisection bounds).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from meshplan.errors import MeshplanError
from meshplan.network.span import GroupSpan, LevelHop, group_span
from meshplan.network.tuner import collective_time_s, usable_algorithms
from meshplan.specs.plan import COLLECTIVE_ALGORITHMS

CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
Algorithm = Literal["auto", "ring", "tree", "hierarchical", "halving_doubling", "bucket", "nvls", "nvls_tree",
                    "collnet", "direct"]
Protocol = Literal["auto", "LL", "LL128", "Simple"]

__all__ = ["AUTO", "CURVE_KINDS", "Algorithm", "CollectiveKind", "CollectivePoint", "GroupSpan", "LevelHop", "NcclChoice",
           "Protocol", "bytes_sent_per_device", "collective_curve", "collective_s", "group_span", "plan_collective_s"]

#: kinds a forced protocol applies to (all-to-all sends pick theirs by NCCL_P2P_LL_THRESHOLD)
PROTOCOL_KINDS = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class NcclChoice:
    """A plan's NCCL_ALGO / NCCL_PROTO (``Plan.collective_algorithm``, ``collective_protocol``).

    ``algorithm`` is the plan's canonical text: "auto", one algorithm (forced on every kind it
    runs), or "kind:algorithm;..." pairs."""

    algorithm: str = "auto"
    protocol: str = "auto"

    @classmethod
    def of(cls, plan) -> "NcclChoice":
        return cls(plan.collective_algorithm, plan.collective_protocol)

    def for_kind(self, kind: str) -> tuple[str, str]:
        """(algorithm, protocol) forced on a collective of ``kind``; "auto" where nothing is."""
        if ":" in self.algorithm:
            algorithm = dict(pair.split(":") for pair in self.algorithm.split(";")).get(kind, "auto")
        else:
            algorithm = self.algorithm if kind in COLLECTIVE_ALGORITHMS.get(self.algorithm, ()) else "auto"
        return algorithm, self.protocol if kind in PROTOCOL_KINDS else "auto"


AUTO = NcclChoice()


def collective_s(kind: CollectiveKind, bytes_: float, span: GroupSpan, algorithm: Algorithm = "auto",
                 protocol: Protocol = "auto") -> float:
    """Time of one collective of ``bytes_`` over ``span``.

    ``bytes_`` is the full buffer for all-reduce, all-gather (the gathered result) and
    reduce-scatter (the input); the per-device send buffer for all-to-all; the message for
    send/recv (``span`` then holds the one level the two peers are joined by).
    """
    return collective_time_s(kind, bytes_, span, algorithm, protocol)


def bytes_sent_per_device(kind: CollectiveKind, bytes_: float, n: int) -> float:
    """Bytes each device sends in a bandwidth-optimal collective (for energy and for tests)."""
    if n <= 1:
        return 0.0
    factor = {"all_reduce": 2.0 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "all_to_all": (n - 1) / n, "send_recv": 1.0}[kind]
    return factor * bytes_


def plan_collective_s(kind: CollectiveKind, bytes_: float, span: GroupSpan, choice: NcclChoice, axis: str) -> float:
    """Time of one of a plan's collectives with the plan's forced algorithm and protocol.

    A forced algorithm or protocol that cannot run this collective where its group sits (NVLS
    off an NVSwitch, NVLS within a node for a group that crosses the network, LL on NVLS) is
    an error naming the plan field, as NCCL fails a call when NCCL_ALGO / NCCL_PROTO leave it no
    algorithm ("no algorithm/protocol available", src/enqueue.cc)."""
    if choice is AUTO:
        return collective_time_s(kind, bytes_, span)
    algorithm, protocol = choice.for_kind(kind)
    if (algorithm, protocol) != ("auto", "auto") and span.hops and bytes_ > 0:
        _check_forced(kind, span, algorithm, protocol, axis)
    return collective_time_s(kind, bytes_, span, algorithm, protocol)


@lru_cache(maxsize=4096)
def _check_forced(kind: str, span: GroupSpan, algorithm: str, protocol: str, axis: str) -> None:
    usable = usable_algorithms(kind, 1 << 20, span, protocol)
    if algorithm == "auto" and usable or algorithm in usable:
        return
    where = ", ".join(f"level {h.level} ({h.fabric.kind}, {h.fabric.link})" for h in span.hops)
    what = f"the {axis} {kind.replace('_', '-')} over {span.size} devices ({where})"
    if algorithm in usable_algorithms(kind, 1 << 20, span):
        raise MeshplanError("plan.collective_protocol", protocol,
                            f"{algorithm} cannot run {what} with it; it runs with auto or "
                            f"{', '.join(p for p in ('LL', 'LL128', 'Simple') if algorithm in usable_algorithms(kind, 1 << 20, span, p))}")
    raise MeshplanError("plan.collective_algorithm", algorithm,
                        f"cannot run {what}; valid there: auto, {', '.join(usable) or 'none'}")


#: the kinds a bus bandwidth curve is drawn for (nccl-tests' all_reduce, all_gather,
#: reduce_scatter and alltoall tests)
CURVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@dataclass(frozen=True)
class CollectivePoint:
    """One size of a collective's curve: the model's time and the algorithm x protocol it ran,
    beside a measured time where one was given. Bandwidths as nccl-tests prints them
    (doc/PERFORMANCE.md): algbw = size / time, busbw = algbw x bus_factor. ``launch_s``: the
    least time a call takes where one thread launches it on several GPUs (nccl-tests ``-g``,
    ``meshplan.io.nccl_tests.launch_floor_s``); ``timed_s`` is what such a run times."""

    kind: str
    ranks: int
    size_bytes: float
    time_s: float
    algorithm: str
    protocol: str
    measured_time_s: float | None = None
    launch_s: float = 0.0

    def busbw(self, time_s: float) -> float:
        return bytes_sent_per_device(self.kind, self.size_bytes, self.ranks) / time_s  # type: ignore[arg-type]

    @property
    def timed_s(self) -> float:
        """The collective's time, or its launches' where they take longer."""
        return max(self.time_s, self.launch_s)

    @property
    def error(self) -> float | None:
        """Model over measured bus bandwidth, less one (positive: the model is faster)."""
        return None if self.measured_time_s is None else self.measured_time_s / self.timed_s - 1.0

    def as_dict(self) -> dict:
        out = {"kind": self.kind, "ranks": self.ranks, "size_bytes": self.size_bytes, "time_s": self.time_s,
               "algbw_bytes_per_s": self.size_bytes / self.time_s, "busbw_bytes_per_s": self.busbw(self.time_s),
               "algorithm": self.algorithm, "protocol": self.protocol}
        if self.launch_s > 0:
            out.update(launch_floor_s=self.launch_s, timed_s=self.timed_s)
        if self.measured_time_s is not None:
            out.update(measured_time_s=self.measured_time_s, measured_busbw_bytes_per_s=self.busbw(self.measured_time_s),
                       error=self.error)
        return out


def collective_curve(kind: str, span: GroupSpan, sizes, algorithm: str = "auto", protocol: str = "auto",
                     measured=None, gpus_per_thread: int = 1) -> list[CollectivePoint]:
    """The model's time of ``kind`` at each of ``sizes`` over ``span``, with the algorithm and
    protocol NCCL's tuner (or the forced pair) runs; ``measured`` seconds beside them; each call
    at least its launches where one thread launched it on ``gpus_per_thread`` GPUs
    (``meshplan.io.nccl_tests.launch_floor_s``, on the channels the call runs on)."""
    from meshplan.io.nccl_tests import launch_floor_s
    from meshplan.network.algorithms import nccl_channels
    from meshplan.network.tuner import choose

    times = measured if measured is not None else [None] * len(sizes)
    points = []
    for size, seconds_measured in zip(sizes, times):
        name, chosen, seconds = choose(kind, float(size), span, algorithm, protocol)
        launch_s = launch_floor_s(gpus_per_thread, nccl_channels(float(size), span, name, chosen))
        points.append(CollectivePoint(kind, span.size, float(size), seconds, name, chosen, seconds_measured, launch_s))
    return points
