"""NCCL's three wire protocols and its cost model of them.

NCCL moves data with one of three protocols (Jeaugey, "NCCL 2.x", GTC 2019; NCCL docs, NCCL_PROTO):

- **LL** (low latency): 8-byte stores of 4 data + 4 flag bytes: half the bandwidth, the lowest
  per-step latency;
- **LL128**: 128-byte lines with 8 flag bytes: 120/128 of the bandwidth at a latency between;
- **Simple**: bulk copies with a memory fence per chunk: full bandwidth, the highest latency.

The numbers are NCCL's own tuning model, ``src/graph/tuning.cc`` (NVIDIA/nccl, read at commit
5067397c2676, June 2026): a collective costs ``base + steps x per-step latency + bytes / bandwidth``
where the base latency depends on algorithm x protocol (``baseLatencies``), the per-step latency on
the link (NVLink, PCIe, network: ``hwLatencies``), and the bandwidth is the Simple bus bandwidth
scaled per protocol (LL: half, capped by ``llMaxBws``; LL128: x0.92 on rings; trees pay their own
factors). The values are transcribed here as data, in seconds.
"""

from __future__ import annotations

from typing import Literal

Protocol = Literal["LL", "LL128", "Simple"]
PROTOCOLS: tuple[str, ...] = ("LL", "LL128", "Simple")

US = 1e-6

#: tuning.cc baseLatencies (us): fixed cost per call, by algorithm family, for LL / LL128 / Simple
BASE_LATENCY_S: dict[str, tuple[float, float, float]] = {
    "tree": (6.8 * US, 14.0 * US, 8.4 * US),
    "ring": (6.6 * US, 14.0 * US, 8.4 * US),
    "collnet": (0.0, 0.0, 0.0),
    "nvls": (0.0, 0.0, 0.0),
}

#: tuning.cc hwLatencies (us): latency of one step over each kind of link, LL / LL128 / Simple
#: (0 where NCCL does not run that protocol)
STEP_LATENCY_S: dict[str, dict[str, tuple[float, float, float]]] = {
    "nvlink": {
        "tree": (0.6 * US, 1.25 * US, 4.0 * US),
        "ring": (0.6 * US, 1.9 * US, 3.4 * US),
        "collnet": (0.0, 0.0, 3.7 * US),
        "nvls": (0.0, 0.0, 25.0 * US),
    },
    "pcie": {
        "tree": (1.0 * US, 1.9 * US, 4.0 * US),
        "ring": (1.0 * US, 2.5 * US, 5.7 * US),
        "collnet": (0.0, 0.0, 3.7 * US),
        "nvls": (0.0, 0.0, 0.0),
    },
    "network": {
        "tree": (5.0 * US, 8.5 * US, 14.0 * US),
        "ring": (2.7 * US, 4.0 * US, 14.0 * US),
        "collnet": (0.0, 0.0, 31.0 * US),
        "nvls": (0.0, 0.0, 18.0 * US),
        "nvls_tree": (0.0, 0.0, 20.9 * US),
    },
}

#: tuning.cc: bandwidth of each protocol over Simple's, on rings (LL128 is 120/128 of a line less
#: flags, rounded by NCCL to 0.92) and trees (LL 1/3.8, LL128 7/9 in a node, 120/128 across nodes)
RING_BANDWIDTH_FRACTION = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
TREE_BANDWIDTH_FRACTION = {"LL": 1.0 / 3.8, "Simple": 1.0}
TREE_LL128_FRACTION_IN_NODE = 7.0 / 9.0
TREE_LL128_FRACTION_ACROSS_NODES = 120.0 / 128.0
#: tuning.cc: a tree all-reduce reaches 0.92 of the link; NVLS reaches 0.85 of it on Hopper (nvlsEfficiency)
TREE_ALL_REDUCE_FRACTION = 0.92
#: tuning.cc: CollNet (SHARP) serializes 0.4 us per local rank (arity serialization latency)
COLLNET_ARITY_S = 0.4 * US
#: tuning.cc ncclTopoGetAlgoTime: ring Simple all-reduce across nodes pays 1.4x its latency
#: once the message fills the pipeline (plateau effect, compute capability >= 8.0)
RING_PLATEAU_FACTOR = 1.4

#: tuning.cc treeCorrectionFactor: trees fall short of the model at medium sizes; factor on the
#: bandwidth by log2(bytes / 64), LL / LL128 / Simple, 64 B to 256 MB
TREE_CORRECTION: dict[str, tuple[float, ...]] = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}

#: enqueue.cc channel tuning (topoGetAlgoInfo): the threads of a channel per protocol
#: (device.h NCCL_LL_MAX_NTHREADS 512, NCCL_LL128_MAX_NTHREADS 640, NCCL_SIMPLE_MAX_NTHREADS 512)
#: and the bytes each thread must have (NCCL_LL/LL128/SIMPLE_THREAD_THRESHOLD 8, 8, 64; a ring's LL
#: threshold is times its ranks, tuning.cc), else the call runs on fewer channels
CHANNEL_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
THREAD_THRESHOLD_BYTES = {"LL": 8, "LL128": 8, "Simple": 64}

_INDEX = {"LL": 0, "LL128": 1, "Simple": 2}


def base_latency_s(family: str, protocol: str) -> float:
    """Fixed cost of one call of ``family`` (ring, tree, collnet, nvls) with ``protocol``."""
    return BASE_LATENCY_S[family][_INDEX[protocol]]


def step_latency_s(link: str, family: str, protocol: str, level_latency_s: float) -> float:
    """Latency of one step of ``family`` with ``protocol`` over ``link``.

    NVLink, PCIe and network links take NCCL's numbers; other links (a TPU's ICI) run no NCCL
    protocol and take the level's own ``latency_s``.
    """
    table = STEP_LATENCY_S.get(link)
    if table is None:
        return level_latency_s
    values = table.get(family) or table["ring"]
    return values[_INDEX[protocol]]


def runs(link: str, family: str, protocol: str) -> bool:
    """Whether NCCL runs ``family`` with ``protocol`` (NVLS and CollNet are Simple only); links
    without NCCL run one protocol, counted as Simple."""
    if link not in STEP_LATENCY_S:
        return protocol == "Simple"
    if family in ("nvls", "nvls_tree", "collnet"):
        return protocol == "Simple"
    return True


def ring_bandwidth(simple_bytes_per_s: float, protocol: str, ll_cap: float | None) -> float:
    """A ring's bus bandwidth with ``protocol``, given Simple's (tuning.cc, 'Various model refinements')."""
    bandwidth = simple_bytes_per_s * RING_BANDWIDTH_FRACTION[protocol]
    if protocol == "LL" and ll_cap is not None:
        bandwidth = min(bandwidth, ll_cap)
    return bandwidth


def tree_bandwidth(simple_bytes_per_s: float, protocol: str, ll_cap: float | None, across_nodes: bool) -> float:
    """A double binary tree's bus bandwidth with ``protocol`` for an all-reduce (tuning.cc)."""
    bandwidth = simple_bytes_per_s * TREE_ALL_REDUCE_FRACTION
    if protocol == "LL128":
        return bandwidth * (TREE_LL128_FRACTION_ACROSS_NODES if across_nodes else TREE_LL128_FRACTION_IN_NODE)
    bandwidth *= TREE_BANDWIDTH_FRACTION[protocol]
    if protocol == "LL" and ll_cap is not None:
        bandwidth = min(bandwidth, ll_cap)
    return bandwidth


def tree_correction(protocol: str, bytes_: float) -> float:
    """tuning.cc treeCorrectionFactor for a message of ``bytes_``."""
    if bytes_ < 64:
        return 1.0
    index = int(bytes_ // 64).bit_length() - 1
    table = TREE_CORRECTION[protocol]
    return table[index] if index < 23 else 1.0
