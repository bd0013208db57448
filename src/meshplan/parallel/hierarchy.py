"""MAD Max hierarchical strategies for transformer layers, as plans (MAD Max Sec. 2.2).

``(inner, outer)`` applies ``inner`` across the devices of a node (network level 0) and
``outer`` across nodes. For transformer layers:

- ``(tp, ddp)``: tensor parallel inside the node, data parallel across nodes (Megatron's usual
  layout; activations over NVLink, gradients over the network);
- ``(ddp, tp)``: data parallel inside, tensor parallel across nodes (activations over the
  network: MAD Max Insight 3);
- ``(tp, fsdp)`` / ``(fsdp, tp)``: the same with weights sharded (ZeRO-3) over the dp ranks;
- ``(fsdp, ddp)``: hybrid sharding, shard inside the node and replicate across nodes (HSDP);
- a single entry (``ddp``, ``fsdp``, ``tp``) spans every device.
"""

from __future__ import annotations

from meshplan.errors import MeshplanError
from meshplan.specs.cluster import Cluster

#: mesh orders (innermost first) that put tp inside or outside the node
TP_INSIDE = "tp-cp-dp-pp"
TP_OUTSIDE = "dp-cp-tp-pp"


def plan_for_strategy(strategy: tuple[str, ...], cluster: Cluster, num_devices: int) -> dict:
    """Plan fields (tp, dp, zero_stage, zero_shard_size, order) for transformer layers."""
    node = min(cluster.scale_up_devices, num_devices)
    if num_devices % node:
        raise MeshplanError("num_devices", num_devices, f"a multiple of the {node} devices of a node")
    nodes = num_devices // node
    if len(strategy) == 1 or nodes == 1:
        only = strategy[0] if len(strategy) == 1 else strategy[0]
        return {
            "ddp": {"tp": 1, "dp": num_devices, "zero_stage": 0},
            "fsdp": {"tp": 1, "dp": num_devices, "zero_stage": 3},
            "tp": {"tp": num_devices, "dp": 1, "zero_stage": 0},
        }[only]
    if len(strategy) != 2:
        raise MeshplanError("strategy.transformer", strategy, f"{cluster.id} has two network levels: give (inner, outer)")
    layouts = {
        ("tp", "ddp"): {"tp": node, "dp": nodes, "zero_stage": 0, "order": TP_INSIDE},
        ("tp", "fsdp"): {"tp": node, "dp": nodes, "zero_stage": 3, "order": TP_INSIDE},
        ("ddp", "tp"): {"tp": nodes, "dp": node, "zero_stage": 0, "order": TP_OUTSIDE},
        ("fsdp", "tp"): {"tp": nodes, "dp": node, "zero_stage": 3, "order": TP_OUTSIDE},
        ("fsdp", "ddp"): {"tp": 1, "dp": num_devices, "zero_stage": 3, "zero_shard_size": node},
    }
    if tuple(strategy) not in layouts:
        valid = ", ".join(f"({a},{b})" for a, b in layouts)
        raise MeshplanError("strategy.transformer", "(" + ",".join(strategy) + ")", f"modelled for transformer layers: {valid}")
    return layouts[tuple(strategy)]
