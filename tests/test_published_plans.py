"""Plans that real runs used, run as published (issue: published plans as published).

Layers that do not divide pp x vpp split as torchtitan does by default (the embedding and the
loss count as a layer each; the earliest chunks take the remainder), which for Llama 3.1 405B is
Megatron-Bridge's account_for_embedding/loss_in_pipeline_split; every-layer-MoE models; MoE
parallel folding; TPU v4 pods over the data-center network.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan import api, catalog
from meshplan.errors import MeshplanError
from meshplan.specs import Plan
from meshplan.specs.base import build
from meshplan.specs.plan import parse_pipeline_layout
from meshplan.specs.scenario import EVEN_SPLIT, GIVEN_SPLIT, LAYOUT_SPLIT, WEIGHTED_SPLIT, pipeline_layout

HF = Path(__file__).parent / "fixtures" / "hf"


@pytest.mark.parametrize(
    ("layers", "pp", "vpp", "chunks"),
    [
        (126, 16, 1, (7,) + (8,) * 14 + (7,)),  # Llama 3 405B: 128 slots / 16
        (126, 8, 8, (1,) + (2,) * 62 + (1,)),  # Megatron-Bridge 405B recipe: 128 slots / 64 chunks
        (61, 16, 1, (3,) + (4,) * 14 + (2,)),  # DeepSeek-V3: 63 slots, first 15 stages take 4
        (61, 8, 4, (1,) + (2,) * 30 + (0,)),  # 63 slots / 32: the last chunk holds only the loss (as Megatron-Bridge's DeepSeek-V3 layout)
        (70, 12, 1, (5,) + (6,) * 10 + (5,)),  # BLOOM 176B on 12 stages: 72 slots
        (27, 4, 1, (7, 7, 7, 6)),  # torchtitan's own example: 29 slots, stage 0 takes the extra one
    ],
)
def test_uneven_split_as_torchtitan(layers, pp, vpp, chunks):
    got, rule = pipeline_layout(layers, Plan(pp=pp, virtual_pipeline_stages=vpp))
    assert got == chunks and sum(got) == layers and rule == WEIGHTED_SPLIT


def test_even_and_given_splits_are_unchanged():
    assert pipeline_layout(96, Plan(pp=16)) == ((6,) * 16, EVEN_SPLIT)
    assert pipeline_layout(61, Plan(pp=16, first_stage_layers=3, last_stage_layers=2)) == ((3,) + (4,) * 14 + (2,), GIVEN_SPLIT)


#: Megatron-Bridge's Llama 3 70B H100 FP8 recipe (perf_recipes/llama/h100/llama3.py, commit 56ae11d,
#: Aug 2026): pp 8 x vpp 5, one layer moved off the last rank (it holds the output layer and loss)
LLAMA3_70B_LAYOUT = "Et*2|(t*2|)*34,t*3|(t*2|)*3,tL"


def test_a_megatron_core_layout_places_every_chunk():
    chunks = parse_pipeline_layout(LLAMA3_70B_LAYOUT)
    assert len(chunks) == 40 and chunks[0] == "Ett" and chunks[35] == "ttt" and chunks[-1] == "tL"
    layers, rule = pipeline_layout(80, Plan(pp=8, virtual_pipeline_stages=5, pipeline_layout=LLAMA3_70B_LAYOUT))
    assert rule == LAYOUT_SPLIT and layers == (2,) * 35 + (3, 2, 2, 2, 1)
    # chunk c runs on rank c mod 8: chunk 35 (three layers) on rank 3, chunk 39 (one) on rank 7
    assert tuple(sum(layers[r::8]) for r in range(8)) == (10, 10, 10, 11, 10, 10, 10, 9)
    assert parse_pipeline_layout("E(tt|)*2t, t|tL") == ("Ett", "tt", "tt", "tL")  # commas only for reading


#: 40 chunks where rank 0 (chunks 0, 8, 16, 24, 32) holds only the embedding
EMPTY_RANK_0 = "|".join(["E"] + ["" if c % 8 == 0 else "ttt" if c < 12 else "tt" for c in range(1, 39)] + ["ttL"])


@pytest.mark.parametrize(
    ("layout", "says"),
    [
        ("Et*2|(t*2|)*35,t*3|(t*2|)*3,tL", "41 model chunks"),
        ("Et*2|(t*2|)*34,t*3|(t*2|)*3,ttL", "81 decoder layers"),
        ("t*2E|(t*2|)*34,t*3|(t*2|)*3,tL", "embedding (E) once"),
        ("Et*2|(t*2|)*34,t*3|(t*2|)*3,tLL", "loss (L) once"),
        ("Et*2|(t*2|)*34,t*3|(t*2|)*3,tmL", "multi-token-prediction"),
        ("Et*2|(t*2|)*34,t*3|(t*2|)*3,tX", "Megatron-Core's syntax"),
        (EMPTY_RANK_0, "every pipeline rank needs a decoder layer"),
        ("E(t*99999|)*99999L", "at most 100000 letters"),
    ],
)
def test_a_bad_layout_says_what_is_wrong(layout, says):
    with pytest.raises(MeshplanError) as err:
        pipeline_layout(80, build(Plan, {"pp": 8, "virtual_pipeline_stages": 5, "pipeline_layout": layout}, "plan"))
    assert err.value.field == "plan.pipeline_layout" and says in err.value.valid


def test_a_layout_and_first_stage_layers_do_not_mix():
    with pytest.raises(MeshplanError) as err:
        pipeline_layout(80, Plan(pp=8, virtual_pipeline_stages=5, pipeline_layout=LLAMA3_70B_LAYOUT, first_stage_layers=9))
    assert err.value.field == "plan.pipeline_layout" and "not both" in err.value.valid


def test_a_layout_of_the_default_split_changes_nothing():
    """Megatron-Bridge's DeepSeek-V3 layout without its MTP layer is the torchtitan-style split."""
    plan = dict(tp=1, pp=8, virtual_pipeline_stages=4, ep=8, global_batch_size=512, seq_len=4096, precision="fp8")
    default = api.estimate("deepseek-v3", "dgx-h100", num_devices=512, **plan)
    given = api.estimate("deepseek-v3", "dgx-h100", num_devices=512, pipeline_layout="Et|(tt|)*30L", **plan)
    assert given.stage_layers == default.stage_layers and given.pipeline_split == LAYOUT_SPLIT
    assert given.step_time_s == pytest.approx(default.step_time_s, rel=1e-12)


def test_moving_a_layer_off_the_output_rank_shortens_the_step():
    """The last rank of an even split also runs the output layer and the loss, so it paces the
    pipeline; the recipe's layout gives it one layer less (and rank 3 one more)."""
    plan = dict(tp=4, pp=8, virtual_pipeline_stages=5, sequence_parallel=True, global_batch_size=128, seq_len=8192,
                precision="fp8", framework="megatron-core")
    even = api.estimate("llama3-70b", "dgx-h100", num_devices=64, **plan)
    laid = api.estimate("llama3-70b", "dgx-h100", num_devices=64, pipeline_layout=LLAMA3_70B_LAYOUT, **plan)
    assert laid.stage_layers == (10, 10, 10, 11, 10, 10, 10, 9)
    assert laid.step_time_s < 0.95 * even.step_time_s


def test_interleaving_runs_a_micro_batch_count_that_is_not_a_multiple_of_pp():
    """50 micro-batches over pp 4 cannot go in Megatron-Core's default groups of 4 (the last would
    hold 2); the plan runs them in groups of 5, as --microbatch-group-size-per-virtual-pipeline-
    stage 5 does, and the step takes more than the 48-micro-batch one and at most 50/48 of it
    (the work grows by 50/48, the warm-up and cool-down do not)."""
    plan = dict(tp=4, pp=4, cp=2, virtual_pipeline_stages=5, sequence_parallel=True, seq_len=8192, precision="fp8")
    base = api.estimate("llama3-70b", "dgx-h100", num_devices=64, global_batch_size=96, **plan)
    odd = api.estimate("llama3-70b", "dgx-h100", num_devices=64, global_batch_size=100, **plan)
    assert base.plan["microbatch_group_size"] == 4 and odd.plan["microbatch_group_size"] == 5
    assert base.step_time_s * 1.02 < odd.step_time_s <= base.step_time_s * 50 / 48
    same = api.estimate("llama3-70b", "dgx-h100", num_devices=64, global_batch_size=100, microbatch_group_size=5, **plan)
    assert same.step_time_s == odd.step_time_s
    for group, says in [(3, ">= pp"), (6, "leave 2"), (60, "at most the 50")]:
        with pytest.raises(MeshplanError) as err:
            api.estimate("llama3-70b", "dgx-h100", num_devices=64, global_batch_size=100, microbatch_group_size=group, **plan)
        assert err.value.field == "plan.microbatch_group_size" and says in err.value.valid
    with pytest.raises(MeshplanError) as err:  # 3 micro-batches: fewer than pp
        api.estimate("llama3-70b", "dgx-h100", num_devices=64, global_batch_size=6, **plan)
    assert err.value.field == "plan.global_batch_size"


def test_too_many_stages_say_why():
    with pytest.raises(MeshplanError) as err:
        pipeline_layout(4, Plan(pp=8))
    assert err.value.field == "plan.pp"
    with pytest.raises(MeshplanError) as err:
        pipeline_layout(3, Plan(pp=2, virtual_pipeline_stages=4))  # 5 slots for 8 chunks
    assert err.value.field == "plan.virtual_pipeline_stages"
    with pytest.raises(MeshplanError) as err:
        pipeline_layout(2, Plan(pp=4))  # 4 slots: the first stage would hold only the embedding
    assert err.value.field == "plan.pp" and "every pipeline stage" in err.value.valid


def test_interleaved_ranks_hold_every_pp_th_chunk():
    s = api.scenario("llama3-405b", "dgx-h100", num_devices=1024, tp=8, pp=8, virtual_pipeline_stages=8,
                     global_batch_size=512, seq_len=8192)
    assert s.stage_layers == (15,) + (16,) * 6 + (15,)
    assert s.rank_layer_ranges(0)[:2] == ((0, 1), (15, 17))  # chunk 0 (embedding + 1 layer), chunk 8


def test_llama3_405b_and_deepseek_v3_pp16_estimate_and_say_how():
    llama = api.estimate("llama3-405b", "dgx-h100", num_devices=2048, tp=8, pp=16, global_batch_size=2048,
                         seq_len=8192, recompute="full", sequence_parallel=True)
    assert llama.stage_layers == (7,) + (8,) * 14 + (7,) and llama.pipeline_split == WEIGHTED_SPLIT
    assert llama.step_time_s > 0 and llama.breakdown.total_s == pytest.approx(llama.step_time_s, rel=1e-9)
    deepseek = api.estimate("deepseek-v3", "dgx-h800", num_devices=2048, pp=16, ep=64, global_batch_size=15360,
                            zero_stage=1, recompute="full", precision="fp8")
    assert deepseek.stage_layers == (3,) + (4,) * 14 + (3,)
    # the first stage's three layers are DeepSeek's three dense ones; MoE layers fill the rest,
    # and the last stage also runs the multi-token-prediction module's layer
    assert sum(r.devices for r in deepseek.roles) == 2048


def test_search_explores_uneven_pipelines():
    result = api.search("llama3-405b", "dgx-h100", 2048, global_batch_size=2048, seq_len=8192, top=3,
                        space={"tp": [8], "pp": [16], "micro_batch_size": [1], "virtual_pipeline_stages": [1],
                               "recompute": ["full"], "zero_stage": [1], "sequence_parallel": [True]})
    assert [row["pp"] for row in result.top] == [16]
    deepseek = api.search("deepseek-v3", "dgx-h800", 2048, global_batch_size=15360, precision="fp8", top=1,
                          space={"tp": [1], "pp": [16], "ep": [64], "micro_batch_size": [1], "recompute": ["full"],
                                 "zero_stage": [1], "virtual_pipeline_stages": [1]})
    assert deepseek.top[0]["pp"] == 16


@pytest.mark.parametrize(("fixture", "experts", "top_k", "expert_ffn"), [
    ("qwen3-30b-a3b", 128, 8, 768), ("gpt-oss-120b", 128, 4, 2880),
])
def test_every_layer_moe_models_need_no_dense_ffn(fixture, experts, top_k, expert_ffn):
    model = api.resolve_model(str(HF / fixture / "config.json"))
    assert model.ffn_hidden_size is None and model.dense_layers == 0
    assert (model.moe.num_experts, model.moe.top_k, model.moe.expert_ffn_hidden_size) == (experts, top_k, expert_ffn)
    e = api.estimate(model, "dgx-h100", num_devices=16, ep=16, global_batch_size=64, seq_len=4096, zero_stage=1)
    assert e.step_time_s > 0


def test_qwen3_30b_active_parameters():
    """Qwen3-30B-A3B: 30.5B parameters, 3.3B activated (Qwen3 technical report, Table 2)."""
    model = api.resolve_model(str(HF / "qwen3-30b-a3b" / "config.json"))
    assert model.num_params == pytest.approx(30.5e9, rel=0.01)
    assert model.active_params == pytest.approx(3.3e9, rel=0.03)


def test_dense_layers_still_need_their_ffn():
    with pytest.raises(MeshplanError) as err:
        api.resolve_model({"arch": "moe", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100,
                           "moe": {"num_experts": 4, "top_k": 1, "expert_ffn_hidden_size": 64, "first_dense_layers": 1}})
    assert "ffn_hidden_size" in str(err.value)


def test_moe_parallel_folding_lets_ep_span_tp():
    """Qwen3-235B on 256 H100 as Megatron-Bridge runs it: tp 2, pp 8, ep 32 > dp 16, experts without tp."""
    plan = dict(num_devices=256, tp=2, pp=8, ep=32, sequence_parallel=True, virtual_pipeline_stages=4,
                zero_stage=1, global_batch_size=2048, seq_len=4096)
    model = {"id": "qwen3-235b-a22b", "arch": "moe", "num_layers": 94, "hidden_size": 4096, "num_attention_heads": 64,
             "num_kv_heads": 4, "head_dim": 128, "ffn_type": "swiglu", "vocab_size": 151936,
             "moe": {"num_experts": 128, "top_k": 8, "expert_ffn_hidden_size": 1536}}
    folded = api.estimate(model, "dgx-h100", **plan)
    assert folded.plan["expert_tp"] == 1 and folded.step_time_s > 0
    with pytest.raises(MeshplanError) as err:  # keeping tp in the experts needs ep | dp
        api.estimate(model, "dgx-h100", **plan, expert_tp=2)
    assert err.value.field == "plan.ep"
    with pytest.raises(MeshplanError) as err:  # Megatron-Core needs sequence parallelism here
        api.estimate(model, "dgx-h100", **{**plan, "sequence_parallel": False})
    assert err.value.field == "plan.ep"


def test_folding_keeps_flop_and_moves_expert_weights():
    """Experts without tp hold whole experts (twice the weights at tp 2) and compute the same flop."""
    base = dict(num_devices=16, tp=2, ep=8, sequence_parallel=True, global_batch_size=64, seq_len=4096, zero_stage=1)
    keep = api.scenario("mixtral-8x7b", "dgx-h100", **base, expert_tp=2)
    fold = api.scenario("mixtral-8x7b", "dgx-h100", **base, expert_tp=1)
    from meshplan.parallel.program import build_program

    kept, folded = build_program(keep).kinds["moe_layer"], build_program(fold).kinds["moe_layer"]
    assert sum(o.flop for o in kept.ops) == pytest.approx(sum(o.flop for o in folded.ops), rel=1e-12)
    assert folded.expert_params == pytest.approx(2 * kept.expert_params, rel=1e-12)
    assert folded.ep_comms[0].span.size == 8


def test_expert_parallelism_spans_the_context_parallel_ranks():
    """Megatron-Core lays the experts' ranks in the attention's order with cp dropped
    (parallel_state, core_v0.15.0): ep starts next to tp, over the cp ranks (which see different
    tokens) before dp's, so ep may exceed dp and an ep of 8 at cp 2 stays in one 8-GPU node."""
    from meshplan.parallel.mesh import expert_mesh
    from meshplan.parallel.program import build_program

    base = dict(num_devices=16, tp=1, cp=2, global_batch_size=64, seq_len=8192, recompute="full", zero_stage=1)
    wide = api.scenario("mixtral-8x7b", "dgx-h100", **base, ep=8)  # dp 8: ep | dp, yet over cp first
    assert expert_mesh(wide.plan) == (1, 1, 2, 8)
    assert build_program(wide).kinds["moe_layer"].ep_comms[0].span.size == 8
    assert [hop.members for hop in build_program(wide).kinds["moe_layer"].ep_comms[0].span.hops] == [8]
    beyond = api.scenario("mixtral-8x7b", "dgx-h100", **{**base, "num_devices": 8}, ep=8)  # dp 4 < ep 8 <= cp*dp
    assert beyond.plan.dp == 4 and expert_mesh(beyond.plan) == (1, 1, 1, 8)
    with pytest.raises(MeshplanError) as err:
        api.scenario("mixtral-8x7b", "dgx-h100", **{**base, "num_devices": 4}, ep=8)
    assert err.value.field == "plan.ep" and "cp*dp (4)" in err.value.valid


def test_palm_6144_tpu_v4_chips_span_two_pods():
    """PaLM 540B (Chowdhery et al. 2022, Sec. 4): 6144 TPU v4 chips in two pods over the data-center network."""
    palm = {"id": "palm-540b", "num_layers": 118, "hidden_size": 18432, "num_attention_heads": 48, "num_kv_heads": 1,
            "head_dim": 256, "ffn_hidden_size": 73728, "ffn_type": "swiglu", "vocab_size": 256000, "tied_embeddings": True}
    e = api.estimate(palm, "tpu-v4-pod", num_devices=6144, tp=12, global_batch_size=2048, seq_len=2048,
                     zero_stage=3, recompute="full")
    inside = api.estimate(palm, "tpu-v4-pod", num_devices=3072, tp=12, global_batch_size=2048, seq_len=2048,
                          zero_stage=3, recompute="full")
    assert e.fits and e.step_time_s < inside.step_time_s
    assert e.comm_total_s["dp"] > inside.comm_total_s["dp"] / 2  # the cross-pod step is slow DCN


def test_palm_540b_step_time_against_its_report():
    """PaLM 540B's 238.3K tokens/s on 6144 TPU v4 chips (Chowdhery et al. 2022, Sec. 4 and Table 3):
    2048 x 2048 tokens a step, 17.6 s. With full recompute, one sequence a micro-batch, meshplan
    says 19.1 s (+8%): PaLM rematerialized a quarter of its flop (57.8% HFU against 46.2% MFU),
    not a whole forward, and ran attention and MLP as parallel layers, neither of which the plan
    expresses, so the plan's step is the slower one. While the TPU profile ran its GEMMs at
    Hopper's per-SM fraction it said 21.4 s (+22%), and 24.0 s (+36%) while it also capped clocks
    at the 192 W Google measured in service; the GEMMs' fraction is now fitted on MaxText's TPU v4
    runs (benchmarks/fit_tpu_gemm.py), which hold PaLM out."""
    palm = {"id": "palm-540b", "num_layers": 118, "hidden_size": 18432, "num_attention_heads": 48, "num_kv_heads": 1,
            "head_dim": 256, "ffn_hidden_size": 73728, "ffn_type": "swiglu", "vocab_size": 256000, "tied_embeddings": True}
    e = api.estimate(palm, "tpu-v4-pod", num_devices=6144, tp=12, global_batch_size=2048, seq_len=2048,
                     zero_stage=3, recompute="full")
    measured = 2048 * 2048 / 238.3e3
    assert measured < e.step_time_s < 1.15 * measured


def test_a_job_larger_than_the_outermost_level_is_refused():
    cluster = catalog.cluster("tpu-v4-pod")
    two_levels = cluster.model_copy(update={"levels": cluster.levels[:2], "max_devices": None})
    with pytest.raises(MeshplanError) as err:
        api.estimate("gpt3-175b", two_levels, num_devices=8192, tp=8, pp=8, global_batch_size=1024)
    assert err.value.field == "num_devices" and "data-center" in (err.value.hint or "")


def test_context_parallel_ranks_share_the_distributed_optimizer():
    """Megatron-Core reduces gradients and shards the distributed optimizer over dp x cp: Llama 3 8B
    on 8 H100 with cp 2, dp 4 (NeMo 24.07) holds the optimizer states of dp 8, and fits (with
    NeMo's FP8 primary weights; its 16-bit weights and their cached FP8 copies would not)."""
    base = dict(num_devices=8, zero_stage=1, global_batch_size=128, seq_len=8192, precision="fp8", framework="nemo")
    cp2 = api.estimate("llama3-8b", "dgx-h100", cp=2, **base)
    dp8 = api.estimate("llama3-8b", "dgx-h100", **base)
    assert cp2.memory.optimizer_bytes == pytest.approx(dp8.memory.optimizer_bytes, rel=1e-12)
    assert cp2.fits
    assert cp2.comm_total_s["dp"] > 0


def test_a_context_parallel_ring_calls_attention_once_a_step():
    """Megatron-Core's context parallelism (Transformer Engine's P2P ring) and torchtitan's ring
    attention run one attention kernel call per ring step, forward and backward, each with the
    kernel's fixed cost (the fit's launch_s): a cp-way ring pays it cp times. The work is the
    same load-balanced causal share either way."""
    from dataclasses import replace

    from meshplan.costs.kernels import Chip, attention_s
    from meshplan.parallel.program import build_program

    plan = dict(num_devices=8, tp=1, global_batch_size=8, seq_len=8192, zero_stage=1)
    for cp in (1, 2, 4):
        program = build_program(api.scenario("llama3-8b", "dgx-h100", cp=cp, **plan))
        (attention,) = [o.attention for o in program.kinds["dense_layer"].ops if o.op.kind == "attention"]
        assert attention.calls == cp
    device = catalog.device("h100-sxm5-80gb")
    chip = Chip(device.sustained_peak("bf16"), device.sm_count, device.hbm_bytes_per_s, device.sram_bytes)
    kernel = catalog.efficiency("hopper").kernels.attention
    for backward, fit in ((False, kernel.forward), (True, kernel.backward)):
        ring = attention_s(attention, kernel, 2.0, 1e6, chip, backward)
        single = attention_s(replace(attention, calls=1.0), kernel, 2.0, 1e6, chip, backward)
        assert ring - single == pytest.approx(3 * fit.launch_s, rel=1e-9)
