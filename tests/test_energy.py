"""Energy per step (meshplan.costs.energy): the H100 power data, sums, power against TDP, and
more work never costing less energy."""

import csv
from pathlib import Path

import pytest
from hypothesis import given, settings, HealthCheck
from hypothesis import strategies as st

from meshplan import api, catalog
from meshplan.costs.energy import level_bytes
from meshplan.costs.collectives import group_span

DATA = Path(__file__).parent / "data" / "h100-sxm"
POWER = catalog.efficiency("hopper").power
PROPERTY = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("row", list(csv.DictReader((DATA / "power.csv").open())), ids=lambda r: r["workload"])
def test_h100_constants_reproduce_every_power_row(row):
    """Idle plus energy per flop, per HBM byte and per L2 byte times the measured rates gives
    each row's average power within 10% (shared/calibration/h100-sxm/power.csv)."""
    seconds = float(row["seconds"])
    flop, moved = float(row["flop"] or 0) / seconds, float(row["bytes"] or 0) / seconds
    precision = "fp8" if "fp8" in row["workload"] else "bf16"
    per_byte = POWER.joules_per_l2_byte if row["workload"].startswith("l2") else POWER.joules_per_hbm_byte
    flop_j = POWER.joules_per_flop[precision] if row["workload"].startswith("gemm") else 0.0
    predicted = POWER.idle_w + flop * flop_j + moved * per_byte
    assert predicted == pytest.approx(float(row["avg_power_w"]), rel=0.10)


def test_components_sum_and_links_follow_the_levels():
    e = api.estimate("llama3-70b", "dgx-h100", num_devices=64, tp=8, global_batch_size=64, precision="fp8").energy
    assert e.total_j == pytest.approx(e.compute_j + e.memory_j + sum(e.links_j.values()) + e.static_j, rel=1e-12)
    assert set(e.links_j) == {"nvlink4", "ndr-infiniband"}
    assert e.as_dict()["total_j"] == e.total_j
    assert e.static_j == pytest.approx(POWER.idle_w * 64 * api.estimate(
        "llama3-70b", "dgx-h100", num_devices=64, tp=8, global_batch_size=64, precision="fp8").step_time_s, rel=1e-12)


def test_node_power_sums_its_devices_and_host():
    """A node's average power is its 8 devices' average plus its host watts (links apart); the
    busiest node is 8 of the busiest role's devices plus the host."""
    run = {"num_devices": 64, "tp": 4, "pp": 2, "global_batch_size": 64}
    bare = api.estimate("llama3-70b", "dgx-h100", **run).energy
    e = api.estimate("llama3-70b", "dgx-h100", **run, task={"host_w_per_node": 1000.0}).energy
    assert (e.nodes, e.devices_per_node) == (8, 8)
    assert bare.average_node_w == pytest.approx(8 * bare.average_device_w, rel=1e-12)
    assert e.average_node_w == pytest.approx(8 * e.average_device_w + 1000.0, rel=1e-12)
    assert e.peak_node_w == pytest.approx(8 * e.peak_device_w + 1000.0, rel=1e-12)
    assert e.average_node_w <= e.peak_node_w * (1 + 1e-12)
    assert e.average_node_w * e.nodes * e.step_s == pytest.approx(e.total_j - sum(e.links_j.values()), rel=1e-12)
    assert e.as_dict()["peak_node_w"] == e.peak_node_w
    # fewer devices than a node: the busiest node holds only those
    small = api.estimate("llama3-8b", "dgx-h100", num_devices=2, tp=2, global_batch_size=8).energy
    assert small.nodes == 1 and small.peak_node_w == pytest.approx(2 * small.peak_device_w, rel=1e-12)


def test_energy_by_op_kind_and_collective_sums_to_the_components():
    """Compute and HBM energy split by op kind (MAD Max's kinds plus the optimizer), link energy
    by collective type; each split sums to its components, and the optimizer's share is its
    HBM traffic (ADAM_BYTES_PER_PARAM per parameter it updates) alone."""
    from meshplan.costs.costed import ADAM_BYTES_PER_PARAM
    from meshplan.parallel.program import build_program

    result = api.estimate("llama3-70b", "dgx-h100", num_devices=64, tp=4, pp=2, global_batch_size=64, sequence_parallel=True)
    e = result.energy
    assert set(e.by_op_kind_j) == {"gemm", "attention", "memory_bound", "embedding_lookup", "optimizer"}
    assert sum(e.by_op_kind_j.values()) == pytest.approx(e.compute_j + e.memory_j, rel=1e-12)
    assert sum(e.by_collective_j.values()) == pytest.approx(sum(e.links_j.values()), rel=1e-12)
    # sequence parallel: all-gather and reduce-scatter for tp, send/recv between the stages
    assert {"all_gather", "reduce_scatter", "send_recv"} <= set(e.by_collective_j)
    assert e.by_op_kind_j["gemm"] > 0.5 * (e.compute_j + e.memory_j)
    # every device streams the worst role's optimizer share (Program.optimizer_params)
    program = build_program(api.scenario("llama3-70b", "dgx-h100", num_devices=64, tp=4, pp=2, global_batch_size=64, sequence_parallel=True))
    assert e.by_op_kind_j["optimizer"] == pytest.approx(
        64 * program.optimizer_params * ADAM_BYTES_PER_PARAM * POWER.joules_per_hbm_byte, rel=1e-9)


def test_link_bytes_per_level_follow_the_hierarchical_algorithm():
    """An all-reduce of B over 16 H100s (two nodes of 8): 2·7/8·B on NVLink, 2·1/2·B/8 on
    InfiniBand; an all-to-all sends 7/16 of its buffer inside the node and 8/16 across."""
    cluster = catalog.cluster("dgx-h100")
    span = group_span(cluster, 16, 1)
    assert level_bytes("all_reduce", 1.0, span) == pytest.approx({0: 2 * 7 / 8, 1: 2 * 0.5 / 8})
    assert level_bytes("all_to_all", 1.0, span) == pytest.approx({0: 7 / 16, 1: 8 / 16})
    assert level_bytes("send_recv", 1.0, span) == {1: 1.0}
    # a flat ring of 16 over 2 nodes: 14 edges inside the nodes, 2 across (the ring closes)
    sent = 2 * 15 / 16
    assert level_bytes("all_reduce", 1.0, span, "ring") == pytest.approx({0: sent * 14 / 16, 1: sent * 2 / 16})


@PROPERTY
@given(cluster=st.sampled_from(["dgx-h100", "dgx-a100-80gb", "dgx-b200"]), tp=st.sampled_from([1, 2, 8]),
       precision=st.sampled_from(["bf16", "fp8"]), batch=st.sampled_from([8, 32]))
def test_device_power_never_exceeds_tdp(cluster, tp, precision, batch):
    if precision == "fp8" and cluster == "dgx-a100-80gb":
        precision = "bf16"
    e = api.estimate("llama3-8b", cluster, num_devices=8, tp=tp, global_batch_size=batch, precision=precision).energy
    assert e.average_device_w <= e.peak_device_w * (1 + 1e-9)
    assert e.peak_device_w <= e.tdp_w * (1 + 1e-9)


@PROPERTY
@given(tp=st.sampled_from([1, 2, 4]), recompute=st.sampled_from(["none", "selective", "full"]),
       batch=st.sampled_from([8, 16]))
def test_more_work_never_costs_less_energy(tp, recompute, batch):
    """A bigger batch, or full recompute instead of none, never lowers the dynamic energy."""
    def dynamic(**kw):
        e = api.estimate("llama3-8b", "dgx-h100", num_devices=8, tp=tp, **kw).energy
        return e.compute_j + e.memory_j + sum(e.links_j.values())

    assert dynamic(global_batch_size=2 * batch, recompute=recompute) >= dynamic(global_batch_size=batch, recompute=recompute)
    assert dynamic(global_batch_size=batch, recompute="full") >= dynamic(global_batch_size=batch, recompute="none")


def test_training_footprint_scales_energy_by_pue_carbon_and_price():
    task = {"train_tokens": 1e12, "pue": 1.2, "grid_kg_co2e_per_kwh": 0.4, "price_per_device_hour": 2.0}
    e = api.estimate("llama3-8b", "dgx-h100", num_devices=8, tp=1, global_batch_size=64, task=task)
    steps = 1e12 / (64 * e.plan["seq_len"])
    assert e.energy_to_train_j(1e12) == pytest.approx(steps * e.energy.total_j * 1.2, rel=1e-9)
    assert e.co2e_to_train_kg(1e12) == pytest.approx(e.energy_to_train_j(1e12) / 3.6e6 * 0.4, rel=1e-12)
    assert e.cost_to_train(1e12) == pytest.approx(e.device_hours(1e12) * 2.0, rel=1e-12)
    with pytest.raises(Exception, match="pue"):
        api.estimate("llama3-8b", "dgx-h100", num_devices=8, tp=1, global_batch_size=64, task={"pue": 0.9})


def test_serving_energy_per_token_falls_with_the_batch():
    """Decoding reads every weight once per step whatever the batch: a bigger batch shares that
    energy (and the idle power) among more tokens."""
    def per_token(batch):
        task = {"kind": "inference", "batch_size": batch, "prompt_len": 512, "output_len": 64}
        e = api.estimate("llama3-8b", "dgx-h100", num_devices=1, task=task)
        assert e.decode_energy.total_j == pytest.approx(
            e.decode_energy.compute_j + e.decode_energy.memory_j + e.decode_energy.static_j, rel=1e-12)
        assert e.decode_energy.average_device_w <= e.decode_energy.tdp_w
        return e.energy_per_output_token_j

    assert per_token(32) < per_token(4) < per_token(1)


def test_dlrm_iteration_energy_counts_every_task():
    """A DLRM iteration: lookups, GEMMs and collectives of every device; the all-to-all of the
    embeddings crosses the scale-out network, so that level has link energy."""
    e = api.estimate("dlrm-a", "zionex-a100", num_devices=128, global_batch_size=65536)
    en = e.energy
    assert en.total_j == pytest.approx(en.compute_j + en.memory_j + sum(en.links_j.values()) + en.static_j, rel=1e-12)
    assert en.links_j["roce"] > 0 and en.memory_j > 0
    assert en.peak_device_w <= en.tdp_w
    assert e.to_dict()["energy"]["total_j"] == en.total_j
