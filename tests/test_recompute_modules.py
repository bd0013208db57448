"""Megatron-Core's fine-grained selective recompute (recompute_modules; parallel.recompute
RECOMPUTE_MODULES): which ops each module re-runs in backward, what it no longer keeps, and how
a case says it."""

from __future__ import annotations

import pytest

import meshplan
from meshplan import api
from meshplan.io.case_inputs import case_inputs
from meshplan.parallel.program import build_program

BASE = dict(num_devices=8, tp=1, global_batch_size=16, micro_batch_size=1, seq_len=8192)


def _kind(model: str, devices: int = 8, **plan):
    fields = {**BASE, **plan}
    fields.pop("num_devices")
    return build_program(api.scenario(model, "dgx-h100", None, devices, **fields)).kinds


def modules(*names, **extra):
    return dict(recompute="selective", selective_recompute="modules", recompute_modules=list(names), **extra)


def test_each_module_re_runs_its_own_ops():
    kind = _kind("llama3-8b", **modules("mlp", "layernorm"))["dense_layer"]
    assert dict(kind.recompute_ops) == {"norm_attn": 1.0, "norm_mlp": 1.0, "mlp_up": 1.0, "mlp_activation": 1.0, "mlp_down": 1.0}
    assert dict(_kind("llama3-8b", **modules("core_attn"))["dense_layer"].recompute_ops) == {"attention": 1.0}
    # MLA's up-projections in DeepSeek-V3's layers; its MoE layers have no dense MLP to re-run
    kinds = _kind("deepseek-v3", 1024, tp=2, pp=8, ep=64, global_batch_size=512, seq_len=4096,
                  **modules("mla_up_proj", "mlp"))
    assert dict(kinds["moe_layer"].recompute_ops) == {"q_up": 1.0, "kv_up": 1.0}
    assert set(dict(kinds["dense_layer"].recompute_ops)) == {"q_up", "kv_up", "mlp_up", "mlp_activation", "mlp_down"}


def test_recomputed_modules_cost_their_forward_again_and_keep_less():
    """The MLP is most of a Llama 3 8B layer's FLOPs and its widest activations: re-running it
    and the norms costs most of full recompute's extra time and keeps well under half the
    activations; the attention core alone costs little and keeps about as much as no recompute
    (flash attention keeps only its log-sum-exp)."""
    none = meshplan.estimate("llama3-8b", "dgx-h100", **BASE)
    mlp = meshplan.estimate("llama3-8b", "dgx-h100", **BASE, **modules("mlp", "layernorm"))
    attn = meshplan.estimate("llama3-8b", "dgx-h100", **BASE, **modules("core_attn"))
    full = meshplan.estimate("llama3-8b", "dgx-h100", **BASE, recompute="full")
    assert 0 < attn.breakdown.recompute_s < mlp.breakdown.recompute_s < full.breakdown.recompute_s
    assert none.step_time_s < attn.step_time_s < mlp.step_time_s < full.step_time_s
    assert full.memory.activations_bytes < mlp.memory.activations_bytes < 0.5 * none.memory.activations_bytes
    assert attn.memory.activations_bytes == pytest.approx(none.memory.activations_bytes, rel=0.01)
    # a module the layer does not have changes nothing (no latent attention in Llama)
    mla = meshplan.estimate("llama3-8b", "dgx-h100", **BASE, **modules("mla_up_proj"))
    assert mla.step_time_s == none.step_time_s and mla.memory.activations_bytes == none.memory.activations_bytes
    # the list is read only under selective recompute, as Megatron-Core reads it
    assert meshplan.estimate("llama3-8b", "dgx-h100", **BASE, recompute_modules=["mlp"]).step_time_s == none.step_time_s


@pytest.mark.parametrize("value, says", [([], "at least one"), (["moe"], "core_attn"), ("mlp,bogus", "core_attn")])
def test_a_module_list_names_known_modules(value, says):
    with pytest.raises(meshplan.MeshplanError) as err:
        meshplan.estimate("llama3-8b", "dgx-h100", **BASE, recompute="selective", selective_recompute="modules",
                          recompute_modules=value)
    assert err.value.field.startswith("plan.recompute_modules") and says in err.value.valid


def test_a_case_names_them_as_megatron_core_does():
    case = {"model": {"arch": "dense", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_kv_heads": 8,
                      "ffn_hidden_size": 14336, "ffn_type": "swiglu", "vocab_size": 128256},
            "hardware": {"cluster": "dgx-h100", "num_devices": 8},
            "parallelism": {"recompute_modules": ["mlp", "layernorm"]},
            "batch": {"global_batch_sequences": 8, "micro_batch_size": 1, "seq_len": 8192}}
    plan = case_inputs(case, "c")["plan"]
    assert (plan["recompute"], plan["selective_recompute"], plan["recompute_modules"]) == ("selective", "modules", ["mlp", "layernorm"])
    case["parallelism"]["activation_recompute"] = "full"  # full granularity ignores the list
    assert case_inputs(case, "c")["plan"]["recompute"] == "full" and "recompute_modules" not in case_inputs(case, "c")["plan"]


def test_jax_dots_policy_keeps_the_projections_and_re_runs_the_rest():
    """JAX's checkpoint_dots_with_no_batch_dims (selective_recompute "dots", MaxText's
    remat_policy "minimal"): every op but the projections and the lookup re-runs in backward,
    attention's forward included; a layer keeps its input and its projections' outputs, a row-
    parallel one split over the sequence-parallel ranks."""
    dots = dict(recompute="selective", selective_recompute="dots")
    kind = _kind("llama3-8b", **dots)["dense_layer"]
    matmuls = {o.op.name for o in kind.ops if o.op.kind == "matmul"}
    assert matmuls == {"qkv", "proj", "mlp_up", "mlp_down"}
    assert set(dict(kind.recompute_ops)) == {o.op.name for o in kind.ops} - matmuls
    assert "attention" in dict(kind.recompute_ops)
    tokens, width = 8192, 4096
    kept = tokens * 2 * (width + (4096 + 2 * 1024) + width + 2 * 14336 + width)  # input, qkv, proj, up (gate and up), down
    assert kind.saved_bytes == pytest.approx(kept, rel=1e-6)
    none = meshplan.estimate("llama3-8b", "dgx-h100", **BASE)
    est = meshplan.estimate("llama3-8b", "dgx-h100", **BASE, **dots)
    full = meshplan.estimate("llama3-8b", "dgx-h100", **BASE, recompute="full")
    assert none.step_time_s < est.step_time_s < full.step_time_s
    assert full.memory.activations_bytes < est.memory.activations_bytes < none.memory.activations_bytes


@pytest.mark.parametrize("policy, recompute, selective", [("minimal", "selective", "dots"), ("full", "full", "attention"),
                                                          ("none", "none", "attention")])
def test_a_case_says_maxtexts_remat_policy(policy, recompute, selective):
    case = {"model": {"arch": "dense", "num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8, "ffn_hidden_size": 4096,
                      "vocab_size": 32000}, "hardware": {"cluster": "tpu-v5p-pod", "num_devices": 4},
            "batch": {"global_batch_sequences": 4, "micro_batch_size": 1, "seq_len": 2048}, "precision": "bf16",
            "parallelism": {"zero_stage": 3, "activation_recompute": "selective", "remat_policy": policy}}
    plan = case_inputs(case, "x")["plan"]
    assert (plan["recompute"], plan["selective_recompute"]) == (recompute, selective)
    with pytest.raises(meshplan.MeshplanError, match="remat_policy"):
        case_inputs({**case, "parallelism": {"remat_policy": "save_everything"}}, "x")
