"""The device mesh: how ranks are laid out over the axes tp, cp, dp, pp (innermost first)."""

from __future__ import annotations

from meshplan.costs.collectives import GroupSpan, group_span
from meshplan.specs.cluster import Cluster
from meshplan.specs.plan import Plan


def degrees(plan: Plan) -> dict[str, int]:
    return {"tp": plan.tp, "cp": plan.cp, "dp": plan.dp or 1, "pp": plan.pp}


def axis_stride(plan: Plan, axis: str) -> int:
    """Rank distance between neighbours on ``axis``: the product of the degrees inside it."""
    sizes = degrees(plan)
    stride = 1
    for name in plan.order.split("-"):
        if name == axis:
            return stride
        stride *= sizes[name]
    raise KeyError(axis)


def axis_span(cluster: Cluster, plan: Plan, axis: str) -> GroupSpan:
    """The network levels a group along ``axis`` spans."""
    return group_span(cluster, degrees(plan)[axis], axis_stride(plan, axis))


def pipeline_neighbour_span(cluster: Cluster, plan: Plan) -> GroupSpan:
    """The link between two adjacent pipeline stages (a group of two, pp-stride apart)."""
    if plan.pp == 1:
        return GroupSpan(1, ())
    return group_span(cluster, 2, axis_stride(plan, "pp"))


def weight_replicas(plan: Plan) -> tuple[int, int, int]:
    """(ranks holding the same weights, their stride, ZeRO/FSDP shard group size).

    Context-parallel ranks see different tokens of the same sequences with the same weights, so
    gradients are reduced, and the distributed optimizer sharded, over dp x cp (Megatron-Core's
    data-parallel group with context parallelism). Hybrid sharding shards within
    ``zero_shard_size`` dp ranks (times cp). With cp inside dp (the default order) the group is
    contiguous from cp's stride; in another order its span is approximated by the inner stride.
    """
    dp, cp = plan.dp or 1, plan.cp
    shard = (plan.zero_shard_size or dp) * cp
    if cp == 1:
        return dp, axis_stride(plan, "dp"), shard
    return dp * cp, min(axis_stride(plan, "cp"), axis_stride(plan, "dp")), shard


def expert_mesh(plan: Plan) -> tuple[int, int, int, int]:
    """(expert tp, ep stride, expert dp, expert-dp stride) of the routed experts' mesh.

    Megatron-Core lays the experts over the same tp x cp x dp ranks as the attention, as
    expert-tp x ep x expert-dp, expert-tp innermost ("MoE parallel folding", Liu et al. 2025,
    arXiv:2504.14960; Megatron-Core 0.15 parallel_state.initialize_model_parallel builds the
    experts' ranks in the attention's order with cp dropped): ep starts next to expert-tp, so it
    spans the context-parallel ranks before the data-parallel ones, and with expert-tp = 1 (as
    Megatron-Bridge's MoE recipes set) the tp ranks too.
    """
    etp = plan.expert_tp or plan.tp
    inner = plan.tp * plan.cp * (plan.dp or 1)
    return etp, etp, inner // (etp * plan.ep), etp * plan.ep
