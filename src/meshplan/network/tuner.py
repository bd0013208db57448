"""Choose the fastest algorithm x protocol for each collective, as NCCL's tuner does.

NCCL times every enabled (algorithm, protocol) pair with its model and runs the fastest
(``ncclTopoGetAlgoTime`` and the selection in ``src/enqueue.cc`` of NVIDIA/nccl); meshplan does the
same over the algorithms that exist on the span: NCCL's (ring, tree, NVLS, NVLS tree, CollNet /
SHARP) where every level is NVLink, PCIe or a network NCCL drives, and the torus and MPI ones
(bucket, halving-doubling) where a level is a torus of chip links. The hierarchical algorithm
(each level in turn on its share of the buffer) is a candidate only off NCCL: NCCL has no such
algorithm, and offering it made 1 KiB all-gathers over two 8-GPU nodes 2.5x faster than
nccl-tests measure (1.4x without it, tests/data/nccl_tests_busbw.csv). A caller may force an
algorithm (one that runs where the group sits), a protocol, or both.
"""

from __future__ import annotations

from functools import lru_cache

from meshplan.network.algorithms import ALGORITHMS, send_recv_s
from meshplan.network.protocols import PROTOCOLS
from meshplan.network.span import GroupSpan

NCCL_CANDIDATES = {
    "all_reduce": ("ring", "tree", "nvls", "nvls_tree", "collnet"),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "all_to_all": ("direct",),
}
TORUS_CANDIDATES = {
    "all_reduce": ("ring", "bucket", "halving_doubling", "hierarchical"),
    "all_gather": ("ring", "bucket", "halving_doubling", "hierarchical"),
    "reduce_scatter": ("ring", "bucket", "halving_doubling", "hierarchical"),
    "all_to_all": ("direct",),
}


def _candidates(kind: str, span: GroupSpan, algorithm: str, protocol: str):
    if algorithm == "auto":
        nccl = all(h.fabric.link in ("nvlink", "pcie", "network") for h in span.hops)
        names = (NCCL_CANDIDATES if nccl else TORUS_CANDIDATES)[kind]
        if len(span.hops) == 1:  # one level: hierarchical is the ring
            names = tuple(a for a in names if a != "hierarchical")
    else:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unknown collective algorithm {algorithm!r}; valid: auto, {', '.join(ALGORITHMS)}")
        names = (algorithm,)
    protocols = PROTOCOLS if protocol == "auto" else (protocol,)
    return names, protocols


@lru_cache(maxsize=1 << 16)
def choose(kind: str, bytes_: float, span: GroupSpan, algorithm: str = "auto",
           protocol: str = "auto") -> tuple[str, str, float]:
    """(algorithm, protocol, seconds) of the fastest way to run the collective.

    A forced algorithm that cannot run on the span (NVLS without an NVSwitch that reduces, a tree
    for an all-gather) falls back to the ring, as NCCL falls back when NCCL_ALGO names one it
    cannot use.
    """
    if kind == "send_recv":
        return "p2p", "Simple", send_recv_s(bytes_, span)
    names, protocols = _candidates(kind, span, algorithm, protocol)
    best = ("", "", float("inf"))
    for name in names:
        formula = ALGORITHMS[name]
        for proto in protocols:
            seconds = formula(kind, bytes_, span, proto)
            if seconds is not None and seconds < best[2]:
                best = (name, proto, seconds)
    if best[0] == "":
        if kind == "all_to_all":
            return choose(kind, bytes_, span, "direct", "auto")
        if algorithm != "ring" or protocol != "auto":
            return choose(kind, bytes_, span, "ring", "auto")
    return best


def usable_algorithms(kind: str, bytes_: float, span: GroupSpan, protocol: str = "auto") -> tuple[str, ...]:
    """The algorithms NCCL (or, on a torus of chip links, the torus library) can run for this
    collective on ``span`` with ``protocol``: the ones a plan may force there. Forcing one of them
    is never faster than the tuner's pick, which takes the fastest of the same candidates."""
    nccl = all(h.fabric.link in ("nvlink", "pcie", "network") for h in span.hops)
    names = (NCCL_CANDIDATES if nccl else TORUS_CANDIDATES).get(kind, ())
    protocols = PROTOCOLS if protocol == "auto" else (protocol,)
    return tuple(n for n in names if any(ALGORITHMS[n](kind, float(bytes_), span, p) is not None for p in protocols))


def collective_time_s(kind: str, bytes_: float, span: GroupSpan, algorithm: str = "auto",
                      protocol: str = "auto") -> float:
    """Seconds of the fastest (or the forced) algorithm x protocol."""
    if not span.hops or bytes_ <= 0:
        return 0.0
    return choose(kind, float(bytes_), span, algorithm, protocol)[2]
