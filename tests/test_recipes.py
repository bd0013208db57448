"""Cases from Megatron-Bridge's performance summary take the switches its recipes set beyond the
megatron-core preset (catalog/recipes.yaml, meshplan.io.recipes)."""

from __future__ import annotations

import copy

import pytest

from meshplan import catalog
from meshplan.io.case_inputs import case_inputs
from meshplan.io.recipes import recipe_switches
from meshplan.io.validation_cases import run_case

#: the public case mbridge_26.04.01_h100_qwen3_235b_a22b_256gpu (shared/validation/public-cases.yaml)
QWEN = {
    "id": "qwen", "group": "g", "source": "NVIDIA Megatron-Bridge performance summary, NeMo container 26.04.01",
    "model": {"name": "Qwen3-235B-A22B", "arch": "moe", "num_layers": 94, "hidden_size": 4096, "num_attention_heads": 64,
              "num_kv_heads": 4, "ffn_hidden_size": None, "ffn_type": "swiglu", "vocab_size": 151936, "head_dim": 128,
              "moe": {"num_experts": 128, "top_k": 8, "expert_ffn_hidden_size": 1536, "shared_experts": 0, "first_dense_layers": 0}},
    "hardware": {"cluster": "dgx-h100", "num_devices": 256, "devices_per_node": 8},
    "precision": "fp8", "framework": "megatron-core",
    "measured": {"step_time_s": 76.56},
    "parallelism": {"tp": 2, "pp": 8, "dp": 16, "cp": 1, "ep": 32, "sequence_parallel": True, "virtual_pipeline_stages": 4,
                    "zero_stage": 1, "activation_recompute": "none"},
    "batch": {"global_batch_sequences": 8192, "micro_batch_size": 1, "seq_len": 4096},
}

#: the switches recipes.yaml may set: each is a key meshplan.io.case_inputs reads
READ_KEYS = {"cross_entropy_loss_fusion", "moe_token_dispatcher_type", "moe_a2a_overlap", "exp_avg_dtype", "cuda_graphs", "cpu_offloading_num_layers", "use_megatron_fsdp",
             "recompute_modules", "fp8_param_gather", "fp4_param_gather", "mtp_num_layers", "expert_tensor_parallel_size",
             "overlap_grad_reduce", "pipeline_model_parallel_layout", "tp_comm_overlap", "fp8_dot_product_attention"}


#: every Megatron-Bridge run fuses its loss with Transformer Engine's kernel (recipes.yaml's first
#: entry)
LOSS = {"cross_entropy_loss_fusion": True}

#: and every DeepSeek-V3 run trains its MTP module with whole experts and no userbuffers overlap
DEEPSEEK = {"mtp_num_layers": 1, "expert_tensor_parallel_size": 1, "tp_comm_overlap": False}


def changed(base: dict, **changes) -> dict:
    out = copy.deepcopy(base)
    for path, value in changes.items():
        node = out
        *parents, last = path.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    return out


def test_a_bridge_case_runs_its_recipes_expert_all_to_alls():
    """Qwen3-235B on 256 H100s: the recipe of every release from 25.11 to 26.06 sends tokens with
    the alltoall dispatcher and overlaps them with another micro-batch (the table says neither)."""
    switches, sources = recipe_switches(QWEN)
    assert switches == {**LOSS, "moe_token_dispatcher_type": "alltoall", "moe_a2a_overlap": True, "tp_comm_overlap": False}
    assert len(sources) == 2 and "cross_entropy_fusion_impl='te'" in sources[0] and "v0.2.1 to v0.5.0" in sources[1]
    plan = case_inputs(QWEN, "qwen")["plan"]
    assert (plan["ep_dispatch"], plan["ep_overlap"]) == ("all_to_all", "paired")


@pytest.mark.parametrize("changes", [
    {"parallelism__ep": 16, "parallelism__dp": 16},  # another layout: not that recipe
    {"source": "NVIDIA Megatron-Bridge performance summary, NeMo container 26.08"},  # a release it does not cover
    {"hardware__cluster": "dgx-b200"},
    {"source": "a Megatron-Core run, NeMo container 26.04.01", "framework": "megatron-core"},  # not Megatron-Bridge's
    {"source": "NVIDIA Megatron-Bridge performance summary"},  # no container named
    {"model__name": "Qwen3-235B"},
])
def test_a_case_outside_the_recipe_keeps_the_preset(changes):
    """Outside the Qwen3-235B H100 recipe a case keeps the preset's dispatch; a Megatron-Bridge
    case of a known container still fuses its loss, the others take nothing."""
    other = changed(QWEN, **changes)
    bridge_container = "source" not in changes or changes["source"].endswith("26.08")
    assert recipe_switches(other)[0] == (LOSS if bridge_container else {})
    plan = case_inputs(other, "qwen")["plan"]
    assert "ep_dispatch" not in plan and "ep_overlap" not in plan


def test_the_framework_may_name_megatron_bridge_and_model_names_ignore_case_and_punctuation():
    renamed = changed(QWEN, source="NeMo container 26.04.01 performance tables", framework="Megatron-Bridge",
                      model__name="qwen3 235b a22b")
    assert recipe_switches(renamed)[0]["moe_token_dispatcher_type"] == "alltoall"


def test_the_cases_own_keys_win():
    own = changed(QWEN, parallelism__moe_a2a_overlap=False)
    plan = case_inputs(own, "qwen")["plan"]
    assert (plan["ep_dispatch"], plan["ep_overlap"]) == ("all_to_all", "none")
    assert case_inputs(changed(QWEN, parallelism__ep_dispatch="hierarchical"), "qwen")["plan"]["ep_dispatch"] == "hierarchical"


def test_validate_says_which_switches_a_case_took_and_they_change_its_prediction():
    result = run_case(QWEN, 0)
    assert result.error is None
    assert "Megatron-Bridge recipe: cross_entropy_loss_fusion true, moe_token_dispatcher_type alltoall, moe_a2a_overlap true" in result.note
    plain = run_case(changed(QWEN, source="NVIDIA Megatron-Bridge performance summary"), 0)
    assert plain.note is None or "recipe" not in plain.note
    assert plain.predicted_step_time_s != pytest.approx(result.predicted_step_time_s, rel=1e-3)


def test_deepseek_v3_on_h100_in_25_09_ran_deepep_with_the_overlap_and_recomputed_modules():
    deepseek = changed(QWEN, model__name="DeepSeek-V3", source="NVIDIA Megatron-Bridge performance summary, NeMo container 25.09",
                       parallelism__ep=64, parallelism__dp=64, hardware__num_devices=1024)
    switches = recipe_switches(deepseek)[0]
    assert switches["recompute_modules"] == ["mla_up_proj", "mlp"] and switches["moe_a2a_overlap"] is True
    plan = case_inputs(deepseek, "d")["plan"]
    assert (plan["recompute"], plan["selective_recompute"], plan["ep_dispatch"]) == ("selective", "modules", "hierarchical")


def test_gpt_oss_recomputes_norms_and_expert_activations_and_its_gb200_v2_recipe_overlaps():
    oss = changed(QWEN, model__name="gpt-oss-120b", precision="bf16", hardware__cluster="gb200-nvl72",
                  source="Megatron-Bridge performance summary, NeMo container 26.04.01", batch__global_batch_sequences=1280)
    assert recipe_switches(oss)[0] == {**LOSS, "recompute_modules": ["layernorm", "moe_act"], "moe_a2a_overlap": True}
    assert recipe_switches(changed(oss, batch__global_batch_sequences=512))[0] == {**LOSS, "recompute_modules": ["layernorm", "moe_act"]}
    assert recipe_switches(changed(oss, hardware__cluster="gb300-nvl72"))[0] == LOSS  # GB300's recipe graphs instead


def test_deepseek_v3_keeps_bf16_moments_unless_fully_sharded():
    deepseek = changed(QWEN, model__name="DeepSeek-V3", hardware__cluster="gb200-nvl72",
                       source="NVIDIA Megatron-Bridge performance summary, NeMo container 25.11")
    assert recipe_switches(deepseek)[0] == {**LOSS, **DEEPSEEK, "exp_avg_dtype": "bf16"}
    assert case_inputs(deepseek, "d")["plan"]["optimizer_state"] == "bf16_moments"
    assert recipe_switches(changed(deepseek, parallelism__zero_stage=3))[0] == {**LOSS, **DEEPSEEK}


def test_deepseek_v3_trains_its_mtp_module_keeps_experts_whole_and_lays_the_pipeline_out():
    """Every DeepSeek-V3 recipe trains one multi-token-prediction module with expert tensor
    parallelism 1 and leaves its tensor-parallel collectives unpipelined; its layout by pp x vpp (here 8 x 4 on H100, which also leaves the gradient
    reduction after the backward) puts the module and the loss with one layer in the last chunk."""
    deepseek = changed(QWEN, model__name="DeepSeek-V3", model__num_layers=61, model__hidden_size=7168,
                       model__num_attention_heads=128, model__vocab_size=129280, model__ffn_hidden_size=18432,
                       model__moe={"num_experts": 256, "top_k": 8, "expert_ffn_hidden_size": 2048, "shared_experts": 1,
                                   "first_dense_layers": 3},
                       source="NVIDIA Megatron-Bridge performance summary, NeMo container 26.04.01",
                       parallelism__ep=64, parallelism__dp=64, hardware__num_devices=1024)
    switches = recipe_switches(deepseek)[0]
    assert switches["pipeline_model_parallel_layout"] == "Et|(tt|)*30mL" and switches["overlap_grad_reduce"] is False
    inputs = case_inputs(deepseek, "d")
    assert inputs["model"]["mtp_layers"] == 1
    plan = inputs["plan"]
    assert (plan["expert_tp"], plan["overlap_grad_reduce"], plan["pipeline_layout"]) == (1, False, "Et|(tt|)*30mL")
    assert plan["tp_overlap"] == "none"  # the megatron-core preset pipelines them (userbuffers)
    result = run_case(deepseek, 0)
    assert result.error is None and "mtp_num_layers 1" in result.note
    for pp, vp, last in ((4, 4, "tmL"), (2, 8, "tmL"), (16, 1, "tmL"), (8, 1, "t*5mL"), (4, 1, "t*13mL")):
        laid = recipe_switches(changed(deepseek, hardware__cluster="gb200-nvl72", parallelism__pp=pp,
                                       parallelism__virtual_pipeline_stages=vp))[0]
        assert laid["pipeline_model_parallel_layout"].endswith(last) and "overlap_grad_reduce" not in laid


def test_nvl72_mxfp8_moe_recipes_replay_the_iteration_as_cuda_graphs_from_26_06():
    qwen30 = changed(QWEN, model__name="Qwen3-30B-A3B", hardware__cluster="gb200-nvl72", precision="mxfp8",
                     source="Megatron-Bridge docs/performance-summary.md, NeMo container 26.06")
    assert recipe_switches(qwen30)[0] == {**LOSS, "cuda_graphs": "full", "moe_a2a_overlap": True, "fp8_param_gather": True,
                                          "fp8_dot_product_attention": True}
    for changes in ({"source": "Megatron-Bridge, NeMo container 26.04.01"}, {"hardware__cluster": "dgx-h100"},
                    {"precision": "bf16"}, {"model__name": "Llama 3 70B"}):
        assert "cuda_graphs" not in recipe_switches(changed(qwen30, **changes))[0]


def test_the_mxfp8_moe_recipes_run_attention_in_fp8_but_deepseek_v3_on_gb200():
    """Tag v0.5.0's *_FP8_MX configs and the perf recipes after them set fp8_dot_product_attention
    for GPT-OSS, Qwen3 and DeepSeek-V3 on GB300; DeepSeek-V3's GB200 recipe keeps the helper's
    default, 16-bit attention."""
    base = changed(QWEN, hardware__cluster="gb300-nvl72", precision="mxfp8",
                   source="Megatron-Bridge docs/performance-summary.md, NeMo container 26.08")
    for model in ("Qwen3-30B-A3B", "Qwen3-235B-A22B", "gpt-oss-120b", "DeepSeek-V3"):
        case = changed(base, model__name=model)
        assert recipe_switches(case)[0].get("fp8_dot_product_attention") is True, model
        assert case_inputs(case, "c")["plan"]["fp8_attention"] is True
    on_gb200 = changed(base, model__name="DeepSeek-V3", hardware__cluster="gb200-nvl72")
    assert "fp8_dot_product_attention" not in recipe_switches(on_gb200)[0] and recipe_switches(on_gb200)[0]["cuda_graphs"] == "full"
    assert "fp8_attention" not in case_inputs(on_gb200, "c")["plan"]


def test_llama3_70b_fsdp_recipes_offload_activations_by_system_and_precision():
    llama = changed(QWEN, model__name="Llama 3 70B", hardware__cluster="gb200-nvl72", precision="fp8-cs",
                    parallelism__tp=1, parallelism__pp=1, parallelism__ep=1, parallelism__zero_stage=3,
                    source="Megatron-Bridge, NeMo container 25.11")
    fsdp = {"use_megatron_fsdp": True}
    assert recipe_switches(llama)[0] == {**LOSS, **fsdp, "cpu_offloading_num_layers": 40}
    assert recipe_switches(changed(llama, precision="bf16"))[0] == {**LOSS, **fsdp, "cpu_offloading_num_layers": 20}
    assert recipe_switches(changed(llama, hardware__cluster="gb300-nvl72", precision="bf16"))[0] == {**LOSS, **fsdp, "cpu_offloading_num_layers": 30}
    # the MXFP8 recipes offload nothing (and keep MXFP8 weights, as every MXFP8 recipe does)
    assert recipe_switches(changed(llama, precision="mxfp8"))[0] == {**LOSS, "fp8_param_gather": True}
    assert recipe_switches(changed(llama, parallelism__pp=4))[0] == LOSS
    # Llama 3.1 405B's 128-GPU recipes shard it over tp 2 alone
    big = changed(llama, model__name="Llama 3.1 405B", parallelism__tp=2, hardware__num_devices=128)
    assert recipe_switches(big)[0] == {**LOSS, **fsdp, "cpu_offloading_num_layers": 92}


def test_a_bridge_case_that_misses_its_rows_fsdp_runs_the_recipes_zero_3():
    """The public case of Llama 3 70B on 64 GB200s (NeMo 26.04.01) says zero_stage 0, where its
    table row says FSDP 64 and its recipe use_megatron_fsdp: 70B weights with their gradients
    and Adam's state on one GPU (tp 1, pp 1) fit only sharded. The recipe's sharding wins, and
    the note says the case's own word was not taken."""
    llama = changed(QWEN, model__name="Llama 3 70B", model__arch="dense", model__moe=None, model__num_layers=80,
                    model__hidden_size=8192, model__num_kv_heads=8, model__ffn_hidden_size=28672, model__vocab_size=128256,
                    model__head_dim=None, hardware__cluster="gb200-nvl72", hardware__num_devices=64, hardware__devices_per_node=4,
                    parallelism__tp=1, parallelism__pp=1, parallelism__ep=1, parallelism__dp=64, parallelism__zero_stage=0,
                    parallelism__virtual_pipeline_stages=1, parallelism__sequence_parallel=False,
                    batch__global_batch_sequences=256, batch__micro_batch_size=2, batch__seq_len=8192)
    assert case_inputs(llama, "l")["plan"]["zero_stage"] == 3
    result = run_case(llama, 0)
    assert result.fits and "(ZeRO-3, not the case's zero_stage 0)" in result.note
    # a case that names the switch itself keeps its own word (and its zero_stage)
    own = changed(llama, parallelism__use_megatron_fsdp=False)
    assert case_inputs(own, "l")["plan"]["zero_stage"] == 0 and not run_case(own, 0).fits


def test_mxfp8_recipes_keep_mxfp8_weights_and_nvfp4_ones_nvfp4_weights_from_26_06():
    """Every MXFP8 recipe stores and gathers its weights in MXFP8 (bf16_with_mxfp8_mixed:
    fp8_param_gather); NVFP4 recipes do so in NVFP4 from container 26.06, DeepSeek-V3's not. The
    run holds the quantized weights instead of 16-bit ones beside their quantized copies."""
    llama = changed(QWEN, model__name="Llama 3.1 405B", model__arch="dense", model__moe=None, hardware__cluster="gb300-nvl72",
                    precision="mxfp8", parallelism__ep=1, source="Megatron-Bridge performance summary, NeMo container 26.04.01")
    assert recipe_switches(llama)[0] == {**LOSS, "fp8_param_gather": True}
    assert case_inputs(llama, "l")["plan"]["fp8_params"] is True
    assert "fp8_params" not in case_inputs(changed(llama, precision="fp8-cs"), "l")["plan"]
    nvfp4 = changed(llama, precision="nvfp4")
    assert recipe_switches(nvfp4)[0] == LOSS
    assert case_inputs(changed(nvfp4, source="Megatron-Bridge, NeMo container 26.06"), "l")["plan"]["fp8_params"] is True
    deepseek = changed(nvfp4, model__name="DeepSeek-V3", source="Megatron-Bridge, NeMo container 26.06")
    assert case_inputs(deepseek, "d")["plan"]["fp8_params"] is False
    # the case's own key wins, under meshplan's name or Megatron-Core's
    assert case_inputs(changed(llama, parallelism__fp8_params=False), "l")["plan"]["fp8_params"] is False
    assert case_inputs(changed(llama, parallelism__fp8_param_gather=False), "l")["plan"]["fp8_params"] is False


def test_mxfp8_weights_free_the_16_bit_copy():
    """The 16-bit weights the MXFP8 recipe does not keep: their MXFP8 copy is the weight, so the
    prediction's memory drops by two bytes per GEMM weight of the device's share (a 405B model
    over tp 4 x pp 8: 15 or 16 layers of 0.79e9, about 24 GB)."""
    from meshplan.api import estimate
    llama = changed(QWEN, model__name="Llama 3.1 405B", model__arch="dense", model__moe=None, hardware__cluster="gb300-nvl72",
                    precision="mxfp8", parallelism__ep=1, parallelism__tp=4, parallelism__dp=8,
                    source="Megatron-Bridge performance summary, NeMo container 26.04.01")
    llama["model"] = {"name": "Llama 3.1 405B", "arch": "dense", "num_layers": 126, "hidden_size": 16384, "num_attention_heads": 128,
                      "num_kv_heads": 8, "ffn_hidden_size": 53248, "ffn_type": "swiglu", "vocab_size": 128256}
    kept = estimate(**case_inputs(llama, "l")).memory
    plain = estimate(**case_inputs(changed(llama, parallelism__fp8_params=False), "l")).memory
    dropped = plain.total_bytes - kept.total_bytes
    assert 22e9 < dropped < 26e9


def test_every_recipe_entry_names_its_source_and_sets_keys_the_case_reader_reads():
    entries = catalog.recipes("megatron-bridge")
    assert len(entries) >= 10
    for entry in entries:
        assert entry["source"] and entry.get("model", "every model") and entry["switches"]
        assert set(entry["switches"]) <= READ_KEYS, entry
        assert set(entry) <= {"model", "clusters", "containers", "layout", "zero_stage", "precisions", "global_batch", "switches", "source"}
        assert set(entry.get("layout") or {}) <= {"tp", "pp", "vp", "ep"}
        assert set(entry.get("clusters") or []) <= set(catalog.cluster_ids())
    assert catalog.recipes("torchtitan") == []
