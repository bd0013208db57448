"""A plan's forced collective algorithm and protocol (Plan.collective_algorithm /
collective_protocol, NCCL_ALGO / NCCL_PROTO): it changes the step in the direction the tuner's
choice says, and an algorithm that cannot run where a collective's group sits is one error."""

from __future__ import annotations

import pytest

import meshplan
from cli_runner import run_cli
from meshplan import catalog
from meshplan.costs.collectives import NcclChoice, collective_s, group_span
from meshplan.errors import MeshplanError
from meshplan.network.tuner import choose
from meshplan.specs.plan import Plan

#: data parallelism over 8 DGX H100 nodes: one gradient all-reduce per 64M-parameter bucket
DP_HEAVY = dict(num_devices=64, tp=1, pp=1, global_batch_size=64, micro_batch_size=1, seq_len=4096)


def test_forcing_ring_on_a_multi_node_all_reduce_slows_the_step_by_the_ring_s_extra_time():
    auto = meshplan.estimate("llama3-8b", "dgx-h100", **DP_HEAVY)
    ring = meshplan.estimate("llama3-8b", "dgx-h100", collective_algorithm="ring", **DP_HEAVY)
    span = group_span(catalog.cluster("dgx-h100"), 64, 1)
    bucket = max(40e6, 1e6 * 64) * 4  # Megatron-Core's default bucket at dp 64, of fp32 gradients
    assert choose("all_reduce", bucket, span)[0] != "ring"  # NVLS in the node, a tree across
    slower = collective_s("all_reduce", bucket, span, "ring") / collective_s("all_reduce", bucket, span)
    assert slower > 1.05
    assert ring.step_time_s > auto.step_time_s
    # the exposed gradient reduction (the buckets left after the backward) grows by the ring's ratio
    assert ring.breakdown.exposed_comm_s["dp"] / auto.breakdown.exposed_comm_s["dp"] == pytest.approx(slower, rel=0.01)


@pytest.mark.parametrize("algorithm", ["ring", "tree", "nvls_tree"])
def test_a_forced_algorithm_is_never_faster_than_the_tuner(algorithm):
    auto = meshplan.estimate("llama3-8b", "dgx-h100", **DP_HEAVY)
    forced = meshplan.estimate("llama3-8b", "dgx-h100", collective_algorithm=algorithm, **DP_HEAVY)
    assert forced.step_time_s >= auto.step_time_s * (1 - 1e-12)


def test_a_forced_protocol_applies_to_every_collective_and_ll_costs_bandwidth():
    auto = meshplan.estimate("llama3-8b", "dgx-h100", **DP_HEAVY)
    ll = meshplan.estimate("llama3-8b", "dgx-h100", collective_protocol="LL", **DP_HEAVY)
    assert ll.breakdown.exposed_comm_s["dp"] > 2 * auto.breakdown.exposed_comm_s["dp"]  # LL: half the bandwidth or less


def test_nvls_off_an_nvswitch_or_across_nodes_is_rejected_naming_the_field_and_what_runs_there():
    with pytest.raises(MeshplanError) as err:  # DGX A100's NVSwitch does not reduce
        meshplan.estimate("llama3-8b", "dgx-a100-80gb", collective_algorithm="nvls", **DP_HEAVY)
    assert err.value.field == "plan.collective_algorithm" and "valid there: auto, ring, tree" in err.value.valid
    with pytest.raises(MeshplanError) as err:  # NVLS reduces inside one NVSwitch domain only
        meshplan.estimate("llama3-8b", "dgx-h100", collective_algorithm="nvls", **DP_HEAVY)
    assert "nvls_tree" in err.value.valid and "dp all-reduce over 64 devices" in err.value.valid
    with pytest.raises(MeshplanError) as err:  # NVLS runs Simple only
        meshplan.estimate("llama3-8b", "dgx-h100", num_devices=8, tp=8, global_batch_size=8,
                          collective_algorithm="nvls", collective_protocol="LL")
    assert err.value.field == "plan.collective_protocol"


def test_meshplans_level_by_level_ring_is_not_an_nccl_algorithm():
    with pytest.raises(MeshplanError) as err:
        meshplan.estimate("llama3-8b", "dgx-h100", collective_algorithm="hierarchical", **DP_HEAVY)
    assert err.value.field == "plan.collective_algorithm" and "hierarchical" not in err.value.valid


def test_nccl_spellings_and_per_kind_forms():
    assert Plan(collective_algorithm="NVLSTree").collective_algorithm == "nvls_tree"
    assert Plan(collective_algorithm="CollNetDirect").collective_algorithm == "collnet"
    mapping = Plan(collective_algorithm={"allreduce": "Tree", "all_gather": "ring"}).collective_algorithm
    assert mapping == "all_gather:ring;all_reduce:tree"
    assert Plan(collective_algorithm=mapping).collective_algorithm == mapping
    assert Plan(collective_protocol="ll128").collective_protocol == "LL128"
    choice = NcclChoice("tree", "LL")
    assert choice.for_kind("all_reduce") == ("tree", "LL")
    assert choice.for_kind("all_gather") == ("auto", "LL")  # a tree runs all-reduces only
    assert choice.for_kind("all_to_all") == ("auto", "auto")
    assert NcclChoice(mapping).for_kind("reduce_scatter") == ("auto", "auto")


@pytest.mark.parametrize(("setting", "field"), [
    ("plan.collective_algorithm=butterfly", "plan.collective_algorithm"),
    ("plan.collective_algorithm=all_gather:tree", "plan.collective_algorithm"),
    ("plan.collective_protocol=LL64", "plan.collective_protocol"),
    ("plan.collective_algorithm=nvls", "plan.collective_algorithm"),  # no NVLS on DGX A100
])
def test_bad_forced_collectives_are_one_error_line(monkeypatch, capsys, setting, field):
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb",
                           "--devices", "64", "--tp", "8", "--pp", "8", "--global-batch", "64", "--set", setting)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}"), err
