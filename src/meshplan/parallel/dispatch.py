"""Expert-parallel token dispatch and combine: which bytes cross which links.

``all_to_all`` (Megatron-Core's alltoall dispatcher, GShard): every (token, expert) pair is a
copy sent to the expert's device, ``top_k`` copies of each local token, and combined back the
same way (Lepikhin et al. 2020).

``hierarchical`` (DeepEP's internode kernels, Megatron-Core's flex dispatcher with DeepEP or
HybridEP, and DeepSeek-V3's own; DeepSeek-V3 technical report, Sec. 3.2.2): a token crosses the
scale-out network once per node that hosts any of its experts, to the GPU of the same rail there,
which forwards it over NVLink once to each GPU of the node that hosts any of them; combine
reduces on the way back over the same path. The NVLink forwarding runs while the RDMA transfers
do (DeepSeek-V3, Sec. 3.2.2: "fully overlapped"), so a group that spans nodes is timed by its
network stage alone; inside one scale-up domain a token still reaches each GPU once.

With the experts spread evenly, a token's ``k`` experts drawn from ``E`` hit a group holding
``E/D`` of them with probability ``1 - C(E - E/D, k) / C(E, k)`` (routing balanced, as the
aux-loss-free and forced-balance benchmarks run); node-limited routing (``MoE.max_nodes``) caps
the nodes a token reaches.
"""

from __future__ import annotations

from typing import Literal

from meshplan.network.span import GroupSpan, group_span
from meshplan.specs.cluster import Cluster
from meshplan.specs.model import MoE

EPDispatch = Literal["all_to_all", "hierarchical"]


def hit_probability(experts: int, top_k: int, groups: int) -> float:
    """Chance that a token's ``top_k`` distinct experts include one of a group's ``experts/groups``."""
    held = experts / groups
    miss = 1.0
    for j in range(top_k):
        miss *= max(experts - held - j, 0.0) / (experts - j)
    return 1.0 - miss


def dispatch_spans(cluster: Cluster, ep: int, stride: int) -> dict[str, GroupSpan]:
    """The part of an expert-parallel group a hierarchical dispatch sends across the network: one
    member per scale-up domain, on the same rail (``ep_nodes``)."""
    local = 1
    for hop in group_span(cluster, ep, stride).hops:
        if hop.fabric.link == "network":
            break
        local *= hop.members
    return {"ep_nodes": group_span(cluster, ep // local, stride * local)}


def dispatch_buffers(tokens_bytes: float, moe: MoE, ep: int, spans: dict[str, GroupSpan],
                     how: EPDispatch) -> tuple[tuple[str, float], ...]:
    """(span name, per-device all-to-all buffer) of one dispatch (or combine) of a device's local
    tokens (``tokens_bytes``, one copy each). Each buffer is what an all-to-all over that span
    sends, (n-1)/n of it to other members."""
    copies = moe.top_k * moe.routed_factor
    if how == "all_to_all":
        return (("ep", tokens_bytes * copies),)
    nodes = spans["ep_nodes"].size
    if nodes > 1:
        reached = nodes * hit_probability(moe.num_experts, moe.top_k, nodes)
        if moe.max_nodes is not None:
            reached = min(reached, float(moe.max_nodes))
        return (("ep_nodes", tokens_bytes * reached * moe.routed_factor),)
    # one scale-up domain: each GPU gets a token once however many of its experts it uses
    return (("ep", tokens_bytes * ep * hit_probability(moe.num_experts, moe.top_k, ep) * moe.routed_factor),)
