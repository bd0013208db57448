"""Mixture-of-experts models: parameters, expert parallelism, routing imbalance."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan import api, catalog
from meshplan.errors import MeshplanError
from meshplan.parallel.program import build_program
from meshplan.workloads.transformer import lower

MIXTRAL = dict(num_devices=64, tp=2, global_batch_size=256, micro_batch_size=1, recompute="full", zero_stage=1)


@pytest.mark.parametrize(
    ("model_id", "total", "active", "rel"),
    [
        ("deepseek-v3", 671e9, 37e9, 0.01),  # DeepSeek-V3 report: 671B total, 37B activated per token
        ("mixtral-8x7b", 46.7e9, 12.9e9, 0.01),  # Jiang et al. 2024: 46.7B, 12.9B active
        ("madmax-llm-moe-1.8t", 1.8e12, 275e9, 0.07),  # MAD Max Table 2: 1.8T, 550B FLOPs per token
    ],
)
def test_catalog_moe_parameters(model_id, total, active, rel):
    model = catalog.model(model_id)
    assert model.num_params == pytest.approx(total, rel=rel)
    assert model.active_params == pytest.approx(active, rel=max(rel, 0.02) if model_id != "madmax-llm-moe-1.8t" else 0.1)
    assert lower(model, 1, 16).params == pytest.approx(model.num_params + model.mtp_params, rel=1e-12)


@pytest.mark.parametrize(("model_id", "total", "activated"), [
    ("deepseek-v2", 236e9, 21e9),  # DeepSeek-V2 (arXiv 2405.04434) abstract: 236B total, 21B activated per token
    ("deepseek-v2-lite", 15.7e9, 2.4e9),  # ibid. Appendix B: 15.7B total, 2.4B activated
    ("deepseek-v3", 671e9, 37e9),
])
def test_deepseeks_activated_parameters_leave_out_the_input_embedding(model_id, total, activated):
    """DeepSeek's reports count a token's activated parameters without the input embedding (a
    lookup, no FLOPs): so counted, the catalog's MLA and MoE dimensions give each published pair,
    to the two digits printed (V2-Lite's 2.45B is printed 2.4B)."""
    model = catalog.model(model_id)
    assert model.num_params == pytest.approx(total, rel=0.005)
    assert model.active_params - model.vocab_size * model.hidden_size == pytest.approx(activated, rel=0.025)


def test_deepseek_v3_multi_token_prediction_weights():
    """DeepSeek-V3's Hugging Face card: 685B in all, 671B of the main model and 14B of the MTP
    module, whose checkpoint keeps its own embedding and output head; meshplan's module (one
    MoE layer, the 2h-to-h projection, norms, the embedding copy, the head shared) plus that
    head copy comes to 13.4B. Serving leaves the module out."""
    model = catalog.model("deepseek-v3")
    assert model.mtp_layers == 1
    assert model.mtp_params + model.embedding_params == pytest.approx(14e9, rel=0.05)
    assert lower(model, 1, 16, logits_per_sequence=1).params == pytest.approx(model.num_params, rel=1e-12)


def test_expert_parallelism_adds_all_to_all_and_splits_experts():
    one = api.estimate("mixtral-8x7b", "dgx-h100", ep=1, **MIXTRAL)
    eight = api.estimate("mixtral-8x7b", "dgx-h100", ep=8, **MIXTRAL)
    assert one.breakdown.exposed_comm_s["ep"] == 0.0
    assert eight.breakdown.exposed_comm_s["ep"] > 0.0
    assert eight.memory.weights_bytes < one.memory.weights_bytes / 4  # experts are most of the weights


def test_expert_weights_per_device():
    scenario = api.scenario("mixtral-8x7b", "dgx-h100", ep=4, **MIXTRAL)
    program = build_program(scenario)
    model = catalog.model("mixtral-8x7b")
    moe = program.kinds["moe_layer"]
    # 8 experts over ep=4 and tp=2: two experts, each split in two
    assert moe.expert_params == pytest.approx(2 * model.expert_params / 2, rel=1e-9)


def test_routing_imbalance_costs_time_and_capacity_caps_it():
    base = catalog.model("mixtral-8x7b")
    skewed = base.model_copy(update={"moe": base.moe.model_copy(update={"load_imbalance": 1.5})})
    capped = base.model_copy(update={"moe": base.moe.model_copy(update={"load_imbalance": 1.5, "capacity_factor": 1.0})})
    times = [api.estimate(m, "dgx-h100", ep=8, **MIXTRAL).step_time_s for m in (base, skewed, capped)]
    assert times[1] > times[0]
    assert times[2] == pytest.approx(times[0], rel=1e-12)


@pytest.mark.parametrize(
    ("devices", "ep", "words"),
    [(48, 16, "dp"), (64, 16, "num_experts")],  # dp = 24 is not a multiple of 16; 8 experts over 16
)
def test_bad_expert_parallelism(devices, ep, words):
    with pytest.raises(MeshplanError) as err:
        api.estimate("mixtral-8x7b", "dgx-h100", **{**MIXTRAL, "num_devices": devices, "global_batch_size": 48}, ep=ep)
    assert err.value.field == "plan.ep" and words in err.value.valid


def test_dense_model_refuses_expert_parallelism():
    with pytest.raises(MeshplanError) as err:
        api.estimate("llama3-8b", "dgx-h100", num_devices=16, ep=2, global_batch_size=16)
    assert err.value.field == "plan.ep"


def test_deepseek_v3_uneven_pipeline_and_roles():
    e = api.estimate("deepseek-v3", "dgx-h800", num_devices=2048, tp=1, pp=16, ep=64, global_batch_size=15360,
                     micro_batch_size=1, zero_stage=1, recompute="full", precision="fp8",
                     first_stage_layers=3, last_stage_layers=2)
    assert sum(r.devices for r in e.roles) == 2048
    assert e.breakdown.exposed_comm_s["ep"] > 0
    assert e.breakdown.total_s == pytest.approx(e.step_time_s, rel=1e-9)


def test_hf_moe_config_estimates():
    path = Path(__file__).parent / "fixtures" / "hf" / "mixtral-8x7b" / "config.json"
    e = api.estimate(str(path), "dgx-h100", ep=8, seq_len=4096, **MIXTRAL)
    ref = api.estimate("mixtral-8x7b", "dgx-h100", ep=8, seq_len=4096, **MIXTRAL)
    assert e.step_time_s == pytest.approx(ref.step_time_s, rel=1e-9)


def test_search_covers_expert_parallelism():
    result = api.search("mixtral-8x7b", "dgx-h100", 64, global_batch_size=256, seq_len=4096, top=3,
                        space={"tp": [1, 2], "pp": [1, 2], "recompute": ["full"], "micro_batch_size": [1]})
    assert {row["ep"] for row in result.evaluated_rows} > {1}


def test_validation_reads_moe_cases():
    """SCHEMA.md's moe block (experts, top_k, expert FFN size) is read and predicted, not skipped."""
    from meshplan.io.validation_cases import validate

    [result] = validate(Path(__file__).parent / "fixtures" / "moe_case.yaml")
    assert result.error is None and result.predicted_step_time_s > 0
    direct = api.estimate("mixtral-8x7b", "dgx-h100", num_devices=64, tp=2, ep=8, zero_stage=1, recompute="full",
                          global_batch_size=256, micro_batch_size=1, seq_len=4096)
    # the schema has no norm field, so the case uses layernorm where Mixtral has RMSNorm
    assert result.predicted_step_time_s == pytest.approx(direct.step_time_s, rel=0.01)


def test_hit_probability_of_a_group_of_experts():
    """k of E experts without replacement miss a group of E/D with C(E - E/D, k) / C(E, k)."""
    from math import comb

    from meshplan.parallel.dispatch import hit_probability

    assert hit_probability(256, 8, 8) == pytest.approx(1 - comb(224, 8) / comb(256, 8), rel=1e-12)
    assert hit_probability(8, 2, 8) == pytest.approx(2 / 8)  # one expert a device: top-2 hits 2 of 8
    assert hit_probability(16, 16, 4) == 1.0


def _dispatch(ep_dispatch: str, model="deepseek-v3", cluster="dgx-h800", devices=512, ep=64, **plan):
    s = api.scenario(model, cluster, num_devices=devices, pp=8, ep=ep, global_batch_size=64, micro_batch_size=1,
                     seq_len=4096, precision="fp8", ep_dispatch=ep_dispatch, **plan)
    kind = build_program(s).kinds["moe_layer"]
    return kind.ep_comms


def test_hierarchical_dispatch_sends_each_token_once_per_node():
    """EP 64 over 8 DGX nodes, 4096 local tokens of 7168 bf16 values: all-to-all sends 8 copies;
    DeepEP sends one per node reached, at most DeepSeek-V3's 4 (Sec. 2.1.2), over the rail to
    one GPU of each node (a group of 8, one per node)."""
    token_bytes = 4096 * 7168 * 2.0
    (plain,) = _dispatch("all_to_all")
    assert plain.bytes == pytest.approx(token_bytes * 8) and plain.span.size == 64
    (hier,) = _dispatch("hierarchical")
    assert hier.bytes == pytest.approx(token_bytes * 4) and hier.span.size == 8 and hier.count == 2
    assert [h.members for h in hier.span.hops] == [8] and hier.span.hops[0].fabric.link == "network"


def test_hierarchical_dispatch_inside_one_nvlink_domain_dedups_per_gpu():
    """EP 64 inside an NVL72 rack: 4 experts a GPU, so a token reaches 64 x (1 - C(252,8)/C(256,8))
    GPUs, not 8 copies."""
    from math import comb

    (hier,) = _dispatch("hierarchical", cluster="gb200-nvl72", devices=512)
    per_gpu = 64 * (1 - comb(252, 8) / comb(256, 8))
    assert hier.bytes == pytest.approx(4096 * 7168 * 2.0 * per_gpu) and hier.span.size == 64


def test_hierarchical_dispatch_is_faster_across_nodes():
    fast = api.estimate("deepseek-v3", "dgx-h800", num_devices=512, pp=8, ep=64, global_batch_size=64, seq_len=4096,
                        precision="fp8", ep_dispatch="hierarchical")
    slow = api.estimate("deepseek-v3", "dgx-h800", num_devices=512, pp=8, ep=64, global_batch_size=64, seq_len=4096,
                        precision="fp8")
    assert fast.comm_total_s["ep"] < 0.6 * slow.comm_total_s["ep"]
    assert fast.step_time_s < slow.step_time_s
