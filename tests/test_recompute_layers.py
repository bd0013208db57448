"""Whole-layer recompute of some layers only (Plan.recompute_layers): Megatron-Core's block
method (--recompute-method block --recompute-num-layers N, the first N layers of each model
chunk re-run, the rest keep their activations), and how cases say it (Megatron's and NeMo's
keys, torchtitan's layer checkpointing, fms-fsdp's share of blocks)."""

from __future__ import annotations

import pytest

import meshplan
from meshplan import api
from meshplan.costs.costed import cost_program
from meshplan.explore.bound import lower_bounds
from meshplan.io.case_inputs import case_inputs
from meshplan.parallel.program import build_program

# Llama 3 8B, 32 layers: 16 a stage
BASE = dict(tp=2, pp=2, micro_batch_size=1, global_batch_size=32, seq_len=4096, zero_stage=1)


def estimate(**plan):
    return meshplan.estimate("llama3-8b", "dgx-h100", {**BASE, **plan}, 16)


@pytest.mark.parametrize("zero", [1, 3])
def test_all_layers_is_full_recompute_and_none_is_no_recompute(zero):
    """recompute_layers at a stage's 16 layers (or more) is full recompute; 0 keeps every layer's
    activations and re-runs nothing, as recompute none: the same step and memory (ZeRO-3's
    third gather a layer included)."""
    full, none = estimate(recompute="full", zero_stage=zero), estimate(recompute="none", zero_stage=zero)
    for layers in (16, 40):
        e = estimate(recompute="full", recompute_layers=layers, zero_stage=zero)
        assert e.step_time_s == pytest.approx(full.step_time_s, rel=1e-12)
        assert e.memory.total_bytes == pytest.approx(full.memory.total_bytes, rel=1e-12)
    zero_layers = estimate(recompute="full", recompute_layers=0, zero_stage=zero)
    assert zero_layers.step_time_s == pytest.approx(none.step_time_s, rel=1e-12)
    assert zero_layers.memory.total_bytes == pytest.approx(none.memory.total_bytes, rel=1e-12)


def test_each_recomputed_layer_costs_its_forward_again_and_frees_its_activations():
    """Half the layers re-run half of full recompute's forward; each 4 more layers re-run cost
    about the same time and, while the first stage holds the most, free the same bytes (at 16 the
    last stage, with the loss's activations, holds more)."""
    steps = [estimate(recompute="full", recompute_layers=n) for n in (0, 4, 8, 12, 16)]
    full = steps[-1]
    assert steps[2].breakdown.recompute_s == pytest.approx(full.breakdown.recompute_s / 2, rel=1e-9)
    times = [e.step_time_s for e in steps]
    memory = [e.memory.total_bytes for e in steps]
    assert all(a < b for a, b in zip(times, times[1:]))
    assert all(a > b for a, b in zip(memory[1:], memory[2:]))  # the first adds the recompute buffer
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert gaps == pytest.approx([gaps[0]] * 4, rel=0.05)
    freed = [a - b for a, b in zip(memory[1:], memory[2:])]
    assert freed[1] == pytest.approx(freed[0], rel=1e-9)


def test_interleaved_chunks_each_recompute_their_first_layers():
    """With 2 model chunks a stage, 4 layers a chunk re-run 8 of the stage's 16: as much
    recompute as 8 layers without interleaving."""
    chunked = estimate(recompute="full", recompute_layers=4, virtual_pipeline_stages=2)
    flat = estimate(recompute="full", recompute_layers=8)
    assert chunked.breakdown.recompute_s == pytest.approx(flat.breakdown.recompute_s, rel=1e-9)


def test_zero3_gathers_again_only_for_the_layers_that_re_run():
    """FSDP gathers a layer's weights before its forward and its backward, and once more for the
    re-run of a recomputed one: 8 of 16 layers recomputed add half of full recompute's gathers."""
    def gathers(**plan):
        s = api.scenario("llama3-8b", "dgx-h100", {**BASE, "zero_stage": 3, **plan}, 16)
        return cost_program(build_program(s)).zero3_gather_s
    none, half, full = gathers(recompute="none"), gathers(recompute="full", recompute_layers=8), gathers(recompute="full")
    assert full == pytest.approx(1.5 * none, rel=1e-12)
    assert half == pytest.approx(1.25 * none, rel=1e-12)


def test_the_search_bound_stays_below_a_partial_recompute():
    scenarios = [api.scenario("llama3-8b", "dgx-h100", {**BASE, "recompute": "full", "recompute_layers": n}, 16) for n in (0, 5, 16)]
    for bound, s in zip(lower_bounds(scenarios), scenarios):
        assert bound <= meshplan.estimate("llama3-8b", "dgx-h100", s.plan.model_dump(), 16).step_time_s


def test_recompute_layers_needs_whole_layer_recompute():
    with pytest.raises(meshplan.MeshplanError, match="plan.recompute_layers"):
        estimate(recompute="selective", recompute_layers=4)
    with pytest.raises(meshplan.MeshplanError, match="plan.recompute_layers"):
        estimate(recompute="none", recompute_layers=4)


def _case(par: dict, layers: int = 32) -> dict:
    return {"id": "c", "group": "g", "source": "s",
            "model": {"arch": "dense", "num_layers": layers, "hidden_size": 4096, "num_attention_heads": 32, "num_kv_heads": 8,
                      "ffn_hidden_size": 14336, "ffn_type": "swiglu", "vocab_size": 128256},
            "hardware": {"cluster": "dgx-h100", "num_devices": 8},
            "parallelism": {"tp": 1, "pp": 1, "zero_stage": 3, "activation_recompute": "full", **par},
            "batch": {"global_batch_sequences": 8, "micro_batch_size": 1, "seq_len": 4096},
            "precision": "bf16", "measured": {"step_time_s": 1.0}}


@pytest.mark.parametrize("par, expected", [
    ({"recompute_num_layers": 6, "recompute_method": "block"}, ("full", 6)),  # Megatron-Core / NeMo 2 / Bridge
    ({"activations_checkpoint_num_layers": 5, "activations_checkpoint_method": "block"}, ("full", 5)),  # NeMo 1
    ({"recompute_num_layers": 1, "recompute_method": "uniform"}, ("full", None)),  # groups of 1: every layer
    ({"recompute_layers": 7}, ("full", 7)),
    ({"activation_recompute": "selective", "selective_ac_option": "2"}, ("selective", 16)),  # torchtitan: blocks 0, 2, 4, ...
    ({"activation_recompute": "selective", "selective_ac_option": 3}, ("selective", 11)),
    ({"activation_recompute": "selective", "selective_ac_option": "op"}, ("selective", None)),
    ({"activation_recompute": "selective", "selective_checkpointing": 0.5}, ("selective", 16)),  # fms-fsdp
    ({"activation_recompute": "selective", "selective_checkpointing": "1/3"}, ("selective", 11)),
    ({"activation_recompute": "none", "selective_checkpointing": 0.39}, ("selective", 12)),
])
def test_cases_say_which_layers_re_run(par, expected):
    plan = case_inputs(_case(par), "cases[0]")["plan"]
    assert (plan["recompute"], plan.get("recompute_layers")) == expected
    if expected[0] == "selective" and expected[1] is not None:
        assert plan["selective_recompute"] == "blocks"


def test_a_share_outside_0_to_1_is_an_error_naming_its_key():
    with pytest.raises(meshplan.MeshplanError, match="selective_checkpointing"):
        case_inputs(_case({"selective_checkpointing": 1.5}), "cases[0]")
    with pytest.raises(meshplan.MeshplanError, match="selective_checkpointing"):
        case_inputs(_case({"selective_checkpointing": "a third"}), "cases[0]")


def test_a_search_finds_the_fewest_layers_to_recompute_that_fit():
    """Llama 3 70B at 16K tokens on 32 H100s: no plan fits without recompute, and the best plan
    re-running every layer (pp 2, 24.3 s) is not the fastest that fits: pp 4 recomputing the
    first 4 of each stage's 20 layers is (20.1 s; pp 2 with 16 of 40, 20.6 s). Each candidate's
    bound stays below its time, so the search stays exact."""
    space = dict(tp=[8], pp=[2, 4], micro_batch_size=[1], recompute=["none", "full"], virtual_pipeline_stages=[1],
                 zero_stage=[1], sequence_parallel=[True])
    plan = dict(global_batch_size=32, seq_len=16384)
    every = meshplan.search("llama3-70b", "dgx-h100", 32, plan, space=space, top=1).best
    some = meshplan.search("llama3-70b", "dgx-h100", 32, plan, space={**space, "recompute_layers": [None, 4, 8, 12, 16]}, top=1)
    assert every["recompute"] == "full" and every["recompute_layers"] is None
    best = some.best
    assert best["recompute"] == "full" and best["recompute_layers"] is not None
    assert best["step_time_s"] < every["step_time_s"]
    for row in some.evaluated_rows:
        assert row["recompute_layers"] is None or row["recompute"] == "full"
    from meshplan.explore.space import SearchSpace, expand
    model, cluster = meshplan.catalog.model("llama3-70b"), meshplan.catalog.cluster("dgx-h100")
    candidates = expand(SearchSpace(**{**space, "recompute_layers": [None, 4, 8, 12, 16]}), model, cluster, 32,
                        meshplan.specs.Plan(**plan))
    for bound, s in zip(lower_bounds(candidates.scenarios), candidates.scenarios):
        assert bound <= meshplan.estimate(model, cluster, s.plan.model_dump(), 32).step_time_s * (1 + 1e-9)


@pytest.mark.parametrize("framework, again", [("deepspeed", True), ("torchtitan", False), ("fms-fsdp", False),
                                              ("megatron-core", False)])
def test_only_deepspeed_gathers_again_for_the_recompute(framework, again):
    """DeepSpeed's ZeRO-3 fetches a module's weights in the recompute's forward hooks and releases
    them after, so the backward fetches them again: three gathers a recomputed layer. PyTorch
    FSDP's pre-forward skips the unshard during the backward (FSDPState._pre_forward at
    TrainingState.PRE_BACKWARD), and Megatron-FSDP's finds the weights gathered: two."""
    def gathers(**plan):
        s = api.scenario("llama3-8b", "dgx-h100", {**BASE, "pp": 1, "global_batch_size": 16, "zero_stage": 3,
                                                   "framework": framework, **plan}, 16)
        return cost_program(build_program(s)).zero3_gather_s
    none, full = gathers(recompute="none"), gathers(recompute="full")
    assert full == pytest.approx(none * (1.5 if again else 1.0), rel=1e-12)
