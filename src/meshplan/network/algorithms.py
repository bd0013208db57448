"""Collective algorithms: the time of one collective of ``bytes_`` over a group's span, per protocol.

Every function returns seconds, or None where the algorithm does not apply (NVLS without an
NVSwitch that reduces, a tree for anything but an all-reduce...). ``bytes_`` is the full buffer
for all-reduce, all-gather (the gathered result) and reduce-scatter (the input); the per-device
send buffer for all-to-all. Bandwidths are a level's achieved per-device bus bandwidth (its
``bytes_per_s`` x ``efficiency``, what nccl-tests reports as busbw for large rings) times the links
a collective drives at once. Latencies follow NCCL's model (``network.protocols``): a base cost per
call plus a per-step cost for each step over each kind of link.

Sources, per algorithm:
- ring: Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
  workstations" (JPDC): 2(n-1)/n of the buffer per device, 2(n-1) steps; all-gather and
  reduce-scatter (n-1)/n and n-1 steps (Thakur, Rabenseifner & Gropp 2005, "Optimization of
  Collective Communication Operations in MPICH", IJHPCA). Steps crossing each level as NCCL
  counts them (tuning.cc: nInterSteps = 2(nNodes-1)).
- tree: NCCL's double binary tree (Sanders, Speck & Träff 2009; Jeaugey, NVIDIA blog "Massively
  Scale Your Deep Learning Training with NCCL 2.4", 2019): the whole buffer up and down, each
  half on one of two trees: 2 x buffer / bandwidth, chain inside a node, log2 steps across nodes.
- hierarchical: reduce-scatter inside, all-reduce across, all-gather inside, level by level
  (the 2D/hierarchical ring of Jia et al. 2018 / Goyal et al. 2017; Calculon's tiers).
- halving-doubling: recursive halving reduce-scatter then recursive doubling all-gather
  (Thakur et al. 2005 Sec. 4.4, Rabenseifner 2004): ring volume, 2 log2(n) steps; on rings and
  tori a partner 2^j away loads every link on the way (Dally & Towles 2004 Ch. 3).
- bucket: torus dimension-ordered reduce-scatter/all-gather, one ring per dimension, the buffer
  cut in D parts that visit the dimensions in rotated order so every link works at once (Jouppi et
  al. ISCA 2023 Sec. 4 for TPU v4; Sack & Gropp 2015 "Collective algorithms for multiported torus
  networks"): ring volume at full injection bandwidth, sum(d_i - 1) steps.
- nvls: NVLink SHARP on NVSwitch (NVIDIA H100 whitepaper 2022; NCCL 2.17 release notes): each
  GPU pushes its buffer into the switch once and reads the reduced result once: buffer /
  (reduction_efficiency x link), not 2(n-1)/n x buffer / link, in chunks that NCCL shrinks for
  smaller buffers and that flow through a pipeline (``nvls_s``). nvls_tree adds NCCL's tree
  across nodes (tuning.cc NVLS_TREE).
- collnet: SHARP in the InfiniBand switches (Graham et al. 2016, "Scalable Hierarchical
  Aggregation Protocol (SHArP)", COMHPC; NCCL CollNet Direct): inside the node as hierarchical,
  across it each link sends its share up once and receives the result once.
- direct: all-to-all as pairwise sends, each level bounded by injection, taper and bisection
  (``network.topology.all_to_all_bound_s``).
"""

from __future__ import annotations

import math

from meshplan.network.protocols import (
    CHANNEL_THREADS,
    COLLNET_ARITY_S,
    THREAD_THRESHOLD_BYTES,
    base_latency_s,
    ring_bandwidth,
    runs,
    step_latency_s,
    tree_bandwidth,
)
from meshplan.network.span import GroupSpan, LevelHop
from meshplan.network.topology import (
    all_to_all_bound_s,
    hop_count,
    links_per_device,
    ring_edge_factor,
    torus_group_dims,
)

#: tuning.cc getNetOverhead: a ring that leaves the node posts every step to the network proxy,
#: 1 us a step (x3 for Simple) on x86 hosts; with one GPU per node a ring step across the network
#: costs the tree's network latency (tuning.cc: "With ppn=1 latencies are fully exposed")
NET_OVERHEAD_S = 1e-6

#: NCCL_P2P_LL_THRESHOLD default: point-to-point chunks up to 16 KiB go with LL (NCCL docs)
P2P_LL_THRESHOLD_BYTES = 16384

#: passes over the buffer: an all-reduce is a reduce-scatter then an all-gather
PASSES = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}


def _ll_cap(span: GroupSpan) -> float | None:
    caps = [h.fabric.ll_bytes_per_s for h in span.hops if h.fabric.ll_bytes_per_s is not None]
    return min(caps) if caps else None


def _hop_bandwidth(hop: LevelHop, ring_over_torus: bool) -> float:
    """A ring's bandwidth over ``hop``: its links, tapered where it leaves a leaf or a dragonfly
    group; a ring embedded in a torus drives 2 of a device's 2D links."""
    bandwidth = hop.bytes_per_s * hop.parallel_links * ring_edge_factor(hop.fabric, hop.members, hop.inside, hop.gap)
    if ring_over_torus and hop.fabric.torus_dims is not None:
        bandwidth *= 2.0 / links_per_device(hop.fabric, hop.members)
    return bandwidth


def _ring_steps(span: GroupSpan) -> list[int]:
    """Steps of one ring pass that cross each hop: a ring over D_t = prod(k_u, u >= t) sub-domains
    of level t crosses its boundary D_t - 1 times, so D_t - D_(t+1) steps belong to hop t."""
    domains = [math.prod(h.members for h in span.hops[t:]) for t in range(len(span.hops))] + [1]
    return [domains[t] - domains[t + 1] for t in range(len(span.hops))]


def _step_s(hop: LevelHop, family: str, protocol: str) -> float:
    """One step's latency over ``hop``: the level's measured LL step where it has one
    (NetworkLevel.ll_step_s), else NCCL's tuning table."""
    if protocol == "LL" and hop.fabric.ll_step_s is not None:
        return hop.fabric.ll_step_s
    return step_latency_s(hop.fabric.link, family, protocol, hop.latency_s)


def _call_s(family: str, protocol: str, span: GroupSpan) -> float:
    """A call's fixed cost: the measured LL call of the span's levels where each has one (the
    largest; NetworkLevel.ll_call_s), else the measured call of every protocol where each level
    has one (NetworkLevel.call_s: a library slower to start a call than NCCL), else NCCL's
    tuning table."""
    calls = [h.fabric.ll_call_s for h in span.hops]
    if protocol == "LL" and all(c is not None for c in calls):
        return max(calls)
    fixed = [h.fabric.call_s for h in span.hops]
    if all(c is not None for c in fixed):
        return max(fixed)
    return base_latency_s(family, protocol)


def ring_s(kind: str, bytes_: float, span: GroupSpan, protocol: str) -> float | None:
    """Flat ring over every member: passes x (n-1)/n of the buffer through the slowest boundary."""
    if kind not in PASSES or not all(runs(h.fabric.link, "ring", protocol) for h in span.hops):
        return None
    n = span.size
    passes = PASSES[kind]
    bandwidth = ring_bandwidth(min(_hop_bandwidth(h, True) for h in span.hops), protocol, _ll_cap(span))
    latency = _call_s("ring", protocol, span) if _nccl(span) else 0.0
    across = any(h.fabric.link == "network" for h in span.hops)
    for hop, steps in zip(span.hops, _ring_steps(span)):
        family = "tree" if hop.fabric.link == "network" and hop.inside == 1 and len(span.hops) == 1 else "ring"
        step = _step_s(hop, family, protocol)
        if across and hop.fabric.link in ("nvlink", "pcie"):
            step = max(step, NET_OVERHEAD_S * (3.0 if protocol == "Simple" else 1.0))
        latency += passes * steps * step
    return latency + passes * (n - 1) / n * bytes_ / bandwidth


def tree_s(kind: str, bytes_: float, span: GroupSpan, protocol: str) -> float | None:
    """NCCL double binary tree all-reduce: 2 x buffer / bandwidth; 2 x (chain in the node + log2
    across nodes) steps (tuning.cc).

    tuning.cc also divides a tree's bandwidth by a per-size correction (treeCorrectionFactor,
    0.4-1.0 between 1 KB and 256 MB) so its tuner avoids trees where NCCL's own trees fall short;
    it is left out: it makes the time fall as the message grows past each size bucket (a larger
    message must never be faster), and the DLRM-A validation on ZionEX (MAD Max Table 1) does
    not show the slowdown (``protocols.tree_correction`` keeps the table for reference).
    """
    if kind != "all_reduce" or not _nccl(span) or span.size < 2:
        return None
    across = any(h.fabric.link == "network" for h in span.hops)
    simple = min(_hop_bandwidth(h, True) for h in span.hops)
    bandwidth = tree_bandwidth(simple, protocol, _ll_cap(span), across)
    latency = _call_s("tree", protocol, span)
    for hop in span.hops:
        steps = hop.members - 1 if hop.fabric.link in ("nvlink", "pcie") else math.ceil(math.log2(hop.members))
        latency += 2.0 * steps * _step_s(hop, "tree", protocol)
    return latency + 2.0 * bytes_ / bandwidth


def _level_phase_s(hop: LevelHop, bytes_: float, passes: float, protocol: str, cap: float | None,
                   steps_of: str = "ring") -> float:
    """One level's share of a hierarchical collective: passes x (k-1)/k of the buffer over the
    hop's links (each of the c inside members works on 1/c of it over the links they share). Torus
    levels run the bucket algorithm (all links, sum(d_i-1) steps); ``steps_of`` = "log" counts
    log2(k) steps (halving-doubling) and loads each link with the mean hop count."""
    k = hop.members
    torus = hop.fabric.torus_dims is not None
    bandwidth = ring_bandwidth(_hop_bandwidth(hop, False), protocol, cap)
    if steps_of == "log":
        steps = math.ceil(math.log2(k))
        bandwidth /= hop_count(hop.fabric, k, hop.gap) if hop.fabric.kind in ("ring",) or torus else 1.0
    elif torus:
        steps = sum(d - 1 for d in torus_group_dims(hop.fabric.torus_dims, k))
    else:
        steps = k - 1
    return passes * (k - 1) / k * bytes_ / bandwidth + passes * steps * _step_s(hop, "ring", protocol)


def hierarchical_s(kind: str, bytes_: float, span: GroupSpan, protocol: str) -> float | None:
    """The levels one after another, each on its share of the buffer (torus levels dimension by dimension)."""
    if kind not in PASSES or not all(runs(h.fabric.link, "ring", protocol) for h in span.hops):
        return None
    cap = _ll_cap(span)
    latency = _call_s("ring", protocol, span) if _nccl(span) else 0.0
    return latency + sum(_level_phase_s(h, bytes_, PASSES[kind], protocol, cap) for h in span.hops)


def bucket_s(kind: str, bytes_: float, span: GroupSpan, protocol: str) -> float | None:
    """Torus dimension-ordered (bucket) algorithm; where the span has no torus level, None."""
    if not any(h.fabric.torus_dims is not None for h in span.hops):
        return None
    return hierarchical_s(kind, bytes_, span, protocol)


def halving_doubling_s(kind: str, bytes_: float, span: GroupSpan, protocol: str) -> float | None:
    """Recursive halving / doubling: ring volume, log2(k) steps a level (power-of-two groups;
    others pay one more step each way, Thakur et al. 2005)."""
    if kind not in PASSES or not all(runs(h.fabric.link, "ring", protocol) for h in span.hops):
        return None
    cap = _ll_cap(span)
    latency = _call_s("ring", protocol, span) if _nccl(span) else 0.0
    total = latency + sum(_level_phase_s(h, bytes_, PASSES[kind], protocol, cap, "log") for h in span.hops)
    if span.size & (span.size - 1):
        total += PASSES[kind] * _step_s(span.hops[-1], "ring", protocol)
    return total


#: NCCL_NVLS_CHUNKSIZE's default (transport/nvls.cc, NCCL 2.18 to 2.29)
NVLS_CHUNK_BYTES = 128 * 1024

#: what each NVLS chunk costs beyond its bytes, in bytes at the chunk's share of the bandwidth
#: (the flags a chunk waits on and posts between the kernel's stages), and the loops a buffer
#: takes beyond its own to fill and drain the pipeline (the kernel's scatter, reduce-multicast
#: and gather warps run a loop each at once: at most 2). Fitted together, least squares on the
#: bus bandwidth, on the 12 sizes 4 MiB - 8 GiB of one 8x H100 node's NVLS all-reduce (Together
#: AI, NCCL 2.26.2; tests/data/nccl_tests_busbw.csv, h100-together-nvls) by
#: benchmarks/nccl_curves.py --fit-nvls: 9 KB and 1.25 loops
NVLS_CHUNK_OVERHEAD_BYTES = 9000.0
NVLS_FILL_LOOPS = 1.25

#: NVLS heads at most (NCCL_MAX_NVLS_ARITY, src/include/device.h: 32 from NCCL 2.21, 8 before;
#: graph/search.cc gives NVLS as many heads as GPUs up to it)
NVLS_MAX_HEADS = 32


#: (loops, chunk): NCCL cuts the NVLS chunk to ``chunk`` for a buffer under ``loops`` loops of
#: the chunk it has so far (enqueue.cc: NCCL_ALGO_NVLS the same from 2.18.3 to 2.29.2;
#: NCCL_ALGO_NVLS_TREE as from 2.26, starting at NVLS_CHUNK_BYTES)
NVLS_CHUNK_CUTS = ((64, 65536), (8, 32768), (2, 16384))
NVLS_TREE_CHUNK_CUTS = ((32, 262144), (16, 131072), (4, 65536), (1, 32768))


def nvls_chunk_bytes(bytes_: float, concurrent: int, cuts=NVLS_CHUNK_CUTS) -> int:
    """The chunk NCCL's NVLS all-reduce runs ``bytes_`` in, over ``concurrent`` = channels x
    heads chunks at once: 128 KiB, cut to smaller ones for smaller buffers (``cuts``)."""
    chunk = NVLS_CHUNK_BYTES
    for loops, smaller in cuts:
        if bytes_ < loops * concurrent * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def _nvls_chunks_s(bytes_: float, hop: LevelHop, bandwidth: float, cuts, fill: float) -> float:
    """``bytes_`` through NCCL's NVLS pipeline on ``hop``'s switch (nvls_s): loops of channels x
    heads chunks, each chunk its bytes plus NVLS_CHUNK_OVERHEAD_BYTES at the rate that makes the
    largest chunks run at ``bandwidth``, and ``fill`` loops more."""
    concurrent = hop.fabric.nvls_channels * min(hop.members, NVLS_MAX_HEADS)
    chunk = nvls_chunk_bytes(bytes_, concurrent, cuts)
    loops = math.ceil(bytes_ / (concurrent * chunk))
    rate = bandwidth * (1.0 + NVLS_CHUNK_OVERHEAD_BYTES / NVLS_CHUNK_BYTES)  # of chunks without their cost
    return (loops + fill) * concurrent * (chunk + NVLS_CHUNK_OVERHEAD_BYTES) / rate


def nvls_s(kind: str, bytes_: float, span: GroupSpan, protocol: str) -> float | None:
    """NVLink SHARP all-reduce inside one NVSwitch domain, as NCCL's NVLS kernel runs it
    (device/all_reduce.h, NCCL_ALGO_NVLS, one node): each of ``nvls_channels`` thread blocks
    loops over its part of the buffer, a chunk per head (every GPU of the group heads one part,
    up to NVLS_MAX_HEADS), each loop scattered into the switch's buffers, reduced and multicast
    by the switch, and gathered out. A loop of ``concurrent`` chunks takes their bytes plus a
    fixed cost per chunk (NVLS_CHUNK_OVERHEAD_BYTES), at the rate that makes the largest chunks
    run at reduction_efficiency x link; the buffer takes its loops plus NVLS_FILL_LOOPS, after
    NCCL's NVLS latency (tuning.cc: 25 us over NVLink). Small buffers run small chunks, so an 8 MiB all-reduce on 8
    H100s reaches about a third of a 1 GiB one's bandwidth, as nccl-tests measures."""
    if kind != "all_reduce" or protocol != "Simple" or len(span.hops) != 1:
        return None
    hop = span.hops[0]
    if not hop.fabric.in_network_reduction or hop.fabric.link != "nvlink" or hop.inside != 1:
        return None
    bandwidth = hop.line_bytes_per_s * hop.fabric.reduction_efficiency
    return (step_latency_s("nvlink", "nvls", protocol, hop.latency_s)
            + _nvls_chunks_s(bytes_, hop, bandwidth, NVLS_CHUNK_CUTS, NVLS_FILL_LOOPS))


def nvls_tree_s(kind: str, bytes_: float, span: GroupSpan, protocol: str) -> float | None:
    """NVLS inside each NVSwitch domain and a tree between them (tuning.cc NVLS_TREE): the slower
    of the in-switch reduction and the node's links across (x2 on two nodes, where the tree is one
    exchange); latency NVLS + 2 log2(nodes) network steps. The buffer goes in NVLS chunks as
    nvls_s's (NVLS_TREE_CHUNK_CUTS), and each level of the tree, up and down, is one more loop
    of the pipeline to fill."""
    if kind != "all_reduce" or protocol != "Simple" or len(span.hops) < 2:
        return None
    inner, outer = span.hops[0], span.hops[1:]
    if not inner.fabric.in_network_reduction or inner.fabric.link != "nvlink" or inner.inside != 1:
        return None
    if any(h.fabric.link != "network" for h in outer):
        return None
    in_switch = inner.line_bytes_per_s * inner.fabric.reduction_efficiency
    across = min(_hop_bandwidth(h, False) * (1.0 if h.members <= 2 else 0.5) for h in outer)
    steps = [2 * math.ceil(math.log2(h.members)) for h in outer]  # each tree level, up and down
    latency = step_latency_s("nvlink", "nvls", protocol, inner.latency_s)
    latency += sum(n * step_latency_s("network", "nvls_tree", protocol, h.latency_s) for n, h in zip(steps, outer))
    return latency + _nvls_chunks_s(bytes_, inner, min(in_switch, across), NVLS_TREE_CHUNK_CUTS,
                                    NVLS_FILL_LOOPS + sum(steps))


def collnet_s(kind: str, bytes_: float, span: GroupSpan, protocol: str) -> float | None:
    """SHARP (CollNet Direct) all-reduce: hierarchical inside the SHARP level, and across it each
    link sends its share up once and receives the reduced share once (Graham et al. 2016).
    Latency as tuning.cc: 2 x (NVLink step + 0.4 us per local rank) + the network's CollNet step."""
    if kind != "all_reduce" or protocol != "Simple":
        return None
    sharp = [i for i, h in enumerate(span.hops) if h.fabric.in_network_reduction and h.fabric.link == "network"]
    if not sharp:
        return None
    at = sharp[0]
    cap = _ll_cap(span)
    latency, transfer = 2.0 * (span.hops[at].inside - 1) * COLLNET_ARITY_S, 0.0
    for i, hop in enumerate(span.hops):
        if i == at:
            reduce_bw = hop.bytes_per_s * hop.parallel_links * hop.fabric.reduction_efficiency
            stage, step = bytes_ / reduce_bw, step_latency_s("network", "collnet", protocol, hop.latency_s)
        else:
            step = _level_phase_s(hop, 0.0, 2.0, protocol, cap)
            stage = _level_phase_s(hop, bytes_, 2.0, protocol, cap) - step
        # chunks stream through the levels (NCCL's CollNet chain pipelines them): the slowest
        # level sets the pace, every level adds its latency
        latency, transfer = latency + step, max(transfer, stage)
    return latency + transfer


#: NCCL's grouped sends over NVLink reach this share of the link: each peer's part goes over its
#: own channels (one CTA each, several a peer: scheduleP2pTasksToPlan and addP2pToPlan in
#: src/enqueue.cc), copied by the SMs in 512 KiB chunks (NCCL_P2P_NVL_CHUNKSIZE). Fitted on the
#: slope of NVIDIA's 8x H100 alltoall_perf sweep from 256 to 512 MiB (aiconfigurator, NCCL 2.29.2:
#: 369 GB/s of the model's 421 algorithm bandwidth); the same slope gives 0.86 on H200, 0.90 on
#: A100 and 0.93 on B200 (over its NVLink5 level's fitted efficiency; tests/test_collective_algorithms.py)
P2P_NVLINK_FRACTION = 0.876

#: channels one round of grouped sends spreads over (comm->p2pnChannels: the collectives' channel
#: count rounded up to a power of two, src/graph/paths.cc; 16 to 32 on NVSwitch nodes, 32 taken);
#: a peer takes at least one, so up to this many peers are reached at once, the others in later
#: rounds
P2P_CHANNELS = 32


def direct_s(kind: str, bytes_: float, span: GroupSpan, protocol: str) -> float | None:
    """All-to-all as grouped point-to-point sends (NCCL ``ncclSend``/``ncclRecv`` to every peer).

    Bandwidth: the slowest level's bound (injection, taper, bisection), at the protocol's share
    of the link, and over NVLink at the share NCCL's sends reach (P2P_NVLINK_FRACTION). Protocol:
    NCCL sends a peer's chunk with LL up to NCCL_P2P_LL_THRESHOLD (16 KiB) and with Simple above
    (NCCL environment-variable docs); a torus of chip links has no NCCL protocols and sends at
    the link's bandwidth. Latency: one call (tuning.cc base), a step over NVLink or PCIe for
    each round of peers, and a step for each peer across the network. The GPU moves the peers in
    a node at once: NCCL schedules the sends of a group over its p2p channels, a peer a channel
    or more (src/enqueue.cc scheduleP2pTasksToPlan), so only more than P2P_CHANNELS peers take
    further rounds. Across the network each peer's sends and receives are posted by the rank's
    one proxy thread, peer after peer, which overlaps the transfer of earlier peers, so that part
    is the larger of the two. MAD Max Sec. 4.3: an all-to-all is bound by its slowest level.
    """
    if kind != "all_to_all":
        return None
    n = span.size
    nccl = _nccl(span)
    if protocol != ("LL" if nccl and bytes_ / n <= P2P_LL_THRESHOLD_BYTES else "Simple"):
        return None
    share = ring_bandwidth(1.0, protocol, None)
    shares = [share * (P2P_NVLINK_FRACTION if nccl and h.fabric.link == "nvlink" else 1.0) for h in span.hops]
    transfer = max(all_to_all_bound_s(h.fabric, bytes_, h.bytes_per_s * hop_share, h.parallel_links, h.members,
                                      h.inside, n, h.gap) for h, hop_share in zip(span.hops, shares))
    if not nccl:  # torus ICI: one step per peer as before (no NCCL protocol)
        return transfer + (n - 1) * max(h.latency_s for h in span.hops)
    rounds = math.ceil((n - 1) / P2P_CHANNELS)
    local = 0.0  # one step over the node's links a round of peers
    posted = 0.0  # the network peers' sends, posted one after another
    inner = 1
    for hop in span.hops:
        peers = inner * hop.members - inner  # peers first reached across this level
        step = _step_s(hop, "ring", protocol)
        if hop.fabric.link == "network":
            posted += peers * step
        else:
            local = max(local, rounds * step)
        inner *= hop.members
    return _call_s("ring", protocol, span) + local + max(transfer, posted)


def send_recv_s(bytes_: float, span: GroupSpan) -> float:
    """Point-to-point over the level joining the two peers: bytes / link + the level's latency
    (pipeline neighbours are adjacent ranks: one link on rings and tori, one switch otherwise)."""
    hop = span.hops[-1]
    return bytes_ / hop.bytes_per_s + hop.latency_s


def nccl_channels(bytes_: float, span: GroupSpan, algorithm: str, protocol: str) -> int:
    """The channels (thread blocks) NCCL runs one call of ``algorithm`` x ``protocol`` on
    (src/enqueue.cc, topoGetAlgoInfo): NVLS its NVLS channels; a ring or tree its coll channels,
    one fewer while the buffer is under channels x threads x the protocol's bytes a thread
    (``protocols.THREAD_THRESHOLD_BYTES``), down to one. An 8-GPU LL ring takes one channel per
    32 KiB of buffer, all 24 from 768 KiB. Grouped sends (all-to-all) are counted as one."""
    if not span.hops or algorithm == "direct":
        return 1
    if algorithm in ("nvls", "nvls_tree"):
        return span.hops[0].fabric.nvls_channels
    channels = min(h.fabric.coll_channels for h in span.hops)
    threshold = THREAD_THRESHOLD_BYTES[protocol] * (span.size if algorithm == "ring" and protocol == "LL" else 1)
    return max(1, min(channels, int(bytes_ // (CHANNEL_THREADS[protocol] * threshold))))


def _nccl(span: GroupSpan) -> bool:
    return all(h.fabric.link in ("nvlink", "pcie", "network") for h in span.hops)


#: every algorithm a caller may force, by name
ALGORITHMS = {
    "ring": ring_s,
    "tree": tree_s,
    "hierarchical": hierarchical_s,
    "halving_doubling": halving_doubling_s,
    "bucket": bucket_s,
    "nvls": nvls_s,
    "nvls_tree": nvls_tree_s,
    "collnet": collnet_s,
    "direct": direct_s,
}
