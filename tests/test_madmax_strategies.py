"""MAD Max Insights 2 and 3 for LLMs (Hsia et al., ISCA 2024, Sec. 6)."""

from __future__ import annotations

import pytest

from meshplan import api, catalog
from meshplan.errors import MeshplanError
from meshplan.parallel.hierarchy import plan_for_strategy

CLUSTER = catalog.cluster("dgx-a100-80gb")


def _estimate(model, devices, strategy, **plan):
    fields = plan_for_strategy(strategy, CLUSTER, devices)
    return api.estimate(model, CLUSTER, num_devices=devices, **{**plan, **fields})


@pytest.mark.parametrize("strategy", [("tp", "ddp"), ("fsdp", "ddp"), ("ddp",)])
def test_gpt3_cross_node_replication_is_out_of_memory(strategy):
    """Insight 2: for GPT-3 any replication of transformer layers across nodes runs out of memory
    on A100-80GB (MAD Max's LLM system: 2048 A100-80GB, batch 2K x 2048)."""
    e = _estimate("gpt3-175b", 2048, strategy, global_batch_size=2048, recompute="full")
    assert not e.fits


def test_gpt3_sharding_across_nodes_fits():
    """...while sharding across nodes (the FSDP baseline) fits."""
    e = _estimate("gpt3-175b", 2048, ("fsdp",), global_batch_size=2048, recompute="full")
    assert e.fits


def test_strategy_order_changes_memory_and_speed():
    """Insight 3: ((TP),(DDP)) shards by devices per node, ((DDP),(TP)) by number of nodes, and puts
    the activation all-reduces on the slower inter-node network."""
    inside = _estimate("llama2-70b", 128, ("tp", "ddp"), global_batch_size=128, recompute="full", zero_stage=0)
    outside = _estimate("llama2-70b", 128, ("ddp", "tp"), global_batch_size=128, recompute="full", zero_stage=0)
    assert outside.memory.weights_bytes < inside.memory.weights_bytes  # 16 nodes shard more than 8 GPUs
    assert outside.step_time_s > 3 * inside.step_time_s  # activations over InfiniBand
    assert outside.breakdown.exposed_comm_s["tp"] > 10 * inside.breakdown.exposed_comm_s["tp"]


def test_hybrid_sharding_trades_memory_for_speed_where_the_network_is_slow():
    """Sharding inside the node and replicating across nodes keeps the per-layer gathers on
    NVLink: faster where the inter-node links are the bottleneck (one NIC per collective); with
    all 8 NICs of a DGX A100 the cross-node fp32 all-reduce costs about what full sharding's
    gathers save."""
    slow = {"global_batch_size": 64, "recompute": "full", "network_rails": 1}
    full = _estimate("llama3-8b", 64, ("fsdp",), **slow)
    hybrid = _estimate("llama3-8b", 64, ("fsdp", "ddp"), **slow)
    assert hybrid.memory.total_bytes > full.memory.total_bytes
    assert hybrid.step_time_s < full.step_time_s


def test_unmodelled_strategy_is_a_clear_error():
    with pytest.raises(MeshplanError) as err:
        plan_for_strategy(("ddp", "fsdp"), CLUSTER, 64)
    assert err.value.field == "strategy.transformer"


def test_strategy_string_for_a_transformer_model():
    e = api.estimate("llama2-70b", "dgx-a100-80gb", num_devices=128, strategy="transformer=(ddp,tp)",
                     global_batch_size=128, recompute="full")
    assert (e.plan["tp"], e.plan["dp"], e.plan["order"]) == (16, 8, "dp-cp-tp-pp")
    with pytest.raises(MeshplanError) as err:
        api.estimate("llama2-70b", "dgx-a100-80gb", num_devices=128, strategy="transformer=(ddp,tp)", tp=8,
                     global_batch_size=128)
    assert err.value.field == "plan.tp"


def test_dlrm_search_ranks_strategies():
    """MAD Max Fig. 9: for DLRM-A on 128 A100s, hierarchical dense strategies beat the FSDP baseline."""
    result = api.search("dlrm-a", "zionex-a100", 128, global_batch_size=65536, top=20)
    labels = [r["strategy"] for r in result.top]
    assert labels.index("embedding=(mp) dense=(tp,ddp)") < labels.index("embedding=(mp) dense=(fsdp)")
    assert all("embedding=(mp)" in label for label in labels)  # replicated tables never fit
    assert result.infeasible_memory > 0
