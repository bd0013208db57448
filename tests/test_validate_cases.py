"""meshplan validate scores each case on its own (SCHEMA.md, rules for readers)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from cli_runner import run_cli
from meshplan.io.validation_cases import run_case, summarize, validate
from meshplan.specs.model import TransformerModel

CASES = Path(__file__).resolve().parents[2] / "shared" / "validation" / "public-cases.yaml"

# Narayanan et al. SC21 Table 1, the 1.7B row (a small, fast case)
GOOD = {
    "id": "sc21_1p7b", "group": "g", "source": "test",
    "model": {"arch": "dense", "num_layers": 24, "hidden_size": 2304, "num_attention_heads": 24, "num_kv_heads": 24,
              "ffn_hidden_size": 9216, "ffn_type": "gelu", "vocab_size": 51200},
    "hardware": {"cluster": "dgx-a100-80gb", "num_devices": 32, "devices_per_node": 8},
    "parallelism": {"tp": 1, "pp": 1, "dp": 32, "activation_recompute": "full"},
    "batch": {"global_batch_sequences": 512, "micro_batch_size": 16, "seq_len": 2048},
    "precision": "fp16",
    "measured": {"step_time_s": 2.0},
}


def case(**changes) -> dict:
    out = copy.deepcopy(GOOD)
    for path, value in changes.items():
        node = out
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    return out


@pytest.fixture
def estimated(monkeypatch) -> dict:
    """What validate passed meshplan.estimate for the last case run."""
    from meshplan import api

    seen: dict = {}
    real = api.estimate

    def spy(**inputs):
        seen.clear()
        seen.update(inputs)
        return real(**inputs)

    monkeypatch.setattr(api, "estimate", spy)
    return seen


def write(tmp_path, cases) -> Path:
    path = tmp_path / "cases.yaml"
    path.write_text(yaml.safe_dump(cases))
    return path


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0.0, "1.2M", True, None])
def test_measured_time_must_be_finite_and_positive(value):
    result = run_case(case(measured__step_time_s=value), 0)
    assert result.relative_error is None and result.predicted_step_time_s is None
    assert "sc21_1p7b.measured.step_time_s" in result.error


def test_a_bad_case_is_reported_and_the_others_are_scored(tmp_path):
    bad_model = case(id="bad_tp", parallelism__tp=5)  # 5 does not divide 24 heads
    results = validate(write(tmp_path, [GOOD, bad_model, "not a mapping", case(id="no_model", model=None)]))
    assert [r.id for r in results] == ["sc21_1p7b", "bad_tp", "case-2", "no_model"]
    assert results[0].error is None and results[0].relative_error is not None
    assert results[1].error.startswith("bad_tp.num_devices") and "tp*cp*pp" in results[1].error
    assert results[2].error and results[3].error.startswith("no_model.model")
    assert summarize(results)["g"] == {"cases": 1, "failed": 2, "median_abs_error": abs(results[0].relative_error),
                                       "max_abs_error": abs(results[0].relative_error),
                                       "median_error": results[0].relative_error, "memory_cases": 0,
                                       "memory_median_abs_error": None, "memory_max_abs_error": None,
                                       "memory_median_error": None}


def test_a_measured_peak_memory_is_scored_beside_the_step_time(tmp_path, monkeypatch, capsys):
    """A case that gives measured.peak_allocated_gib (PyTorch's max_memory_allocated) gets its
    memory error too, per case and per group; a bad one is named like any measured value."""
    peaked = case(id="peaked", measured={"step_time_s": 1.0, "peak_allocated_gib": 40.0})
    bad = case(id="bad_peak", measured={"step_time_s": 1.0, "peak_allocated_gib": -3})
    results = validate(write(tmp_path, [GOOD, peaked, bad]))
    assert results[0].memory_error is None and results[0].measured_memory_bytes is None
    assert results[1].measured_memory_bytes == 40.0 * 2**30
    assert results[1].memory_error == pytest.approx(results[1].predicted_memory_bytes / (40.0 * 2**30) - 1.0)
    assert results[2].error.startswith("bad_peak.measured.peak_allocated_gib")
    stats = summarize(results)["g"]
    assert stats["memory_cases"] == 1 and stats["memory_median_error"] == pytest.approx(results[1].memory_error)
    assert results[1].as_dict()["memory_error"] == results[1].memory_error
    code, out, _ = run_cli(monkeypatch, capsys, "validate", str(tmp_path / "cases.yaml"))
    assert code == 0 and "Memory per device: error per group" in out and f"{results[1].memory_error:+.1%}" in out


def test_a_null_option_is_the_same_as_leaving_it_out():
    expected = run_case(GOOD, 0).predicted_step_time_s
    for key in ("cp", "ep", "virtual_pipeline_stages", "zero_stage", "sequence_parallel"):
        assert run_case(case(**{f"parallelism__{key}": None}), 0).predicted_step_time_s == expected, key
    stated = run_case(case(parallelism__activation_recompute="none"), 0).predicted_step_time_s
    assert run_case(case(parallelism__activation_recompute=None), 0).predicted_step_time_s == stated
    assert run_case(case(precision=None), 0).predicted_step_time_s == run_case(case(precision="bf16"), 0).predicted_step_time_s


def test_keywords_are_read_in_any_case():
    expected = run_case(GOOD, 0).predicted_step_time_s
    shouted = case(precision="FP16", model__arch="Dense", model__ffn_type="GeLU", hardware__cluster="DGX-A100-80GB",
                   parallelism__activation_recompute="Full")
    assert run_case(shouted, 0).predicted_step_time_s == expected


@pytest.mark.parametrize("spelling, precision, scaling", [
    ("MXFP8", "fp8", "block"), ("fp8-mx", "fp8", "block"), ("FP8-CS", "fp8", "current"), ("fp8_ds", "fp8", "delayed"),
    ("NVFP4", "fp4", "nvfp4"), ("MXFP4", "fp4", "block"), ("float8", "fp8", None), ("bfloat16", "bf16", None), ("BF16", "bf16", None),
    ("bf16-mixed", "bf16", None), ("16-mixed", "fp16", None), ("float8_e4m3fn", "fp8", None), ("FP8 hybrid", "fp8", None),
    ("FP8 (delayed scaling)", "fp8", "delayed"), ("fp8-blockwise", "fp8", "block"), ("FP8 block", "fp8", "block"),
    ("float8 rowwise", "fp8", "current"), ("fp8-tensorwise", "fp8", "current"), ("AMP", "fp16", None),
    ("mixed precision", "fp16", None)])
def test_precision_spellings_of_published_tables(spelling, precision, scaling):
    """Megatron-Bridge's tables, PyTorch's dtype names, Lightning's and NeMo's trainer precisions,
    Transformer Engine's FP8 formats; a named scaling recipe overrides the framework's
    (megatron-core: current)."""
    from meshplan.io.validation_cases import case_inputs

    plan = case_inputs(case(precision=spelling, framework="megatron-core"), "x")["plan"]
    assert plan["precision"] == precision
    assert plan.get("fp4_scaling" if precision == "fp4" else "fp8_scaling") == scaling
    on_h100 = run_case(case(precision=spelling, hardware__cluster="dgx-h100"), 0)
    assert on_h100.error is None or precision == "fp4"  # Hopper has no FP4 tensor cores
    assert "fp4" in (run_case(case(precision="nvfp4", hardware__cluster="dgx-h100"), 0).error or "")


@pytest.mark.parametrize("spelling, ffn_type", [("squared-relu", "squared_relu"), ("Squared ReLU", "squared_relu"),
                                                 ("relu2", "squared_relu"), ("silu", "swiglu"), ("gelu_new", "gelu"),
                                                 ("gated-gelu", "geglu"), ("gelu_pytorch_tanh", "gelu"),
                                                 ("ReGLU", "swiglu")])
def test_ffn_type_spellings_of_configs(spelling, ffn_type):
    """NeMo's Nemotron configs write squared-relu, Hugging Face's relu2: the schema's squared_relu;
    Hugging Face's silu is the gated Llama MLP's (swiglu), its gelu_new GPT-2's plain one, T5 v1.1's
    gated-gelu geglu."""
    expected = run_case(case(model__ffn_type=ffn_type), 0).predicted_step_time_s
    assert run_case(case(model__ffn_type=spelling), 0).predicted_step_time_s == expected


def test_activation_recompute_may_be_a_flag():
    """--checkpoint-activations / activation_checkpointing: true is full recompute; so is the flag
    written as a word, and Megatron's recompute methods (uniform, block); a word that goes on to
    say more is its first word; a word that is none of these is still refused, naming the field."""
    for flags, word in (((True, "true", "Yes", "uniform", "block", "full (uniform)"), "full"),
                        ((False, "false", "off"), "none"), (("selective (core attention)", "Selective, attention"), "selective")):
        expected = run_case(case(parallelism__activation_recompute=word), 0).predicted_step_time_s
        for flag in flags:
            assert run_case(case(parallelism__activation_recompute=flag), 0).predicted_step_time_s == expected, flag
    error = run_case(case(parallelism__activation_recompute="sometimes"), 0).error
    assert error.startswith("sc21_1p7b.plan.recompute: got 'sometimes'")


@pytest.mark.parametrize("published", [514, 500])
def test_a_batch_that_is_not_whole_micro_batches_is_rounded_and_scaled_back(published):
    """16 x 32 = 512 sequences per micro-batch round: 514 and 500 are scored as one round, at the
    predicted throughput (the step time times published / 512)."""
    whole = run_case(GOOD, 0)
    rounded = run_case(case(batch__global_batch_sequences=published), 0)
    assert rounded.error is None and "rounded to 512" in rounded.note
    assert rounded.predicted_step_time_s == pytest.approx(whole.predicted_step_time_s * published / 512, rel=1e-12)
    assert whole.note is None


def test_a_batch_far_from_whole_micro_batches_is_still_refused():
    error = run_case(case(batch__global_batch_sequences=400), 0).error
    assert error.startswith("sc21_1p7b.plan.global_batch_size: got 400") and "multiple of" in error


@pytest.mark.parametrize("spelling", ["NeMo", "nemo", "Megatron-Core", "megatron_core", "mcore", "Megatron-Bridge"])
def test_framework_spellings_pick_the_catalog_preset(spelling):
    from meshplan.io.validation_cases import framework_name

    assert framework_name(spelling) in ("nemo", "megatron-core")
    assert framework_name("maxtext") is None and framework_name(None) is None
    assert framework_name("PyTorch FSDP2") == framework_name("fsdp2") == "pytorch-fsdp"


@pytest.mark.parametrize("spelling", ["PyTorch", "PyTorch DDP", "PyTorch 2.4", "Hugging Face Transformers", "HF Accelerate",
                                      "Transformers 4.40", "TRL", "LitGPT"])
def test_pytorch_training_loops_and_hugging_face_trainers_run_eager(spelling):
    """Trainers that run the model's own modules as PyTorch does take the pytorch-fsdp preset:
    its overlaps, and the Llama-style norms and rotary embeddings op by op."""
    from meshplan.io.validation_cases import framework_name

    assert framework_name(spelling) == "pytorch-fsdp"
    eager = run_case(case(framework=spelling, model={**GOOD["model"], "ffn_type": "swiglu"}), 0)
    fused = run_case(case(framework=spelling, compiled=True, model={**GOOD["model"], "ffn_type": "swiglu"}), 0)
    assert eager.error is None and eager.note is None
    assert eager.predicted_step_time_s > fused.predicted_step_time_s


@pytest.mark.parametrize("spelling", ["dgx_h100", "DGX H100", "DGX-H100"])
def test_a_cluster_id_with_other_punctuation_is_the_catalogs(spelling):
    expected = run_case(case(hardware__cluster="dgx-h100"), 0).predicted_step_time_s
    assert run_case(case(hardware__cluster=spelling), 0).predicted_step_time_s == expected
    error = run_case(case(hardware__cluster="dgx h900"), 0).error
    assert error.startswith("sc21_1p7b.hardware.cluster: got 'dgx h900'")


@pytest.mark.parametrize("spelling, preset", [
    ("NeMo 2.0", "nemo"), ("NeMo 24.07", "nemo-launcher"), ("Megatron-LM v3", "megatron-lm"), ("Megatron", "megatron-lm"),
    ("DeepSpeed 0.9.2", "deepspeed"), ("torchtitan", "torchtitan"),
    ("MosaicML Composer", "llm-foundry"), ("llm-foundry 0.10", "llm-foundry"), ("FSDP2", "pytorch-fsdp"),
])
def test_framework_names_may_carry_a_version(spelling, preset):
    from meshplan.io.validation_cases import framework_name

    assert framework_name(spelling) == preset
    assert framework_name("megatron-9000-lm") is None  # only a trailing version is dropped


@pytest.mark.parametrize("framework, source, preset", [
    ("NeMo 24.07", None, "nemo-launcher"), ("nemo_24.01", None, "nemo-launcher"), ("NeMo 1.23.0", None, "nemo-launcher"),
    ("NeMo 24.09", None, "nemo"), ("NeMo 25.02", None, "nemo"), ("NeMo 2.0", None, "nemo"), ("nemo-launcher", None, "nemo-launcher"),
    ("nemo", "NVIDIA NeMo Framework performance summary, container NeMo 24.07 (DGX-H100, FP8)", "nemo-launcher"),
    ("nemo", "NeMo 24.12 performance summary", "nemo"), ("nemo", "a blog post", "nemo"), ("nemo", None, "nemo"),
    ("NeMo 24.09", "container NeMo 24.07", "nemo"),  # the framework's own version wins
    ("megatron-core", "NeMo 24.07", "megatron-core"),
])
def test_nemo_names_its_era_by_container(framework, source, preset):
    """NeMo's containers 24.01-24.07 ran the NeMo Framework Launcher's defaults (cuDNN attention
    off), later ones NeMo 2.0's recipes; a bare "nemo" takes the version its source names."""
    from meshplan.io.validation_cases import framework_name

    assert framework_name(framework, source) == preset


def test_a_case_scored_under_its_containers_preset_says_so():
    nemo = case(framework="nemo", source="NeMo 24.07 performance summary", hardware__cluster="dgx-h100",
                parallelism__tp=8, parallelism__dp=4, precision="fp8")
    launcher = run_case(nemo, 0)
    assert launcher.note == "nemo-launcher defaults, for the version its source names"
    assert run_case(case(**{k: v for k, v in nemo.items() if k != "source"}), 0).note is None
    later = run_case({**nemo, "source": "NeMo 24.12 performance summary"}, 0)
    assert later.note is None and later.predicted_step_time_s < launcher.predicted_step_time_s


def test_a_framework_without_a_preset_is_scored_on_meshplans_defaults_and_says_so():
    result = run_case(case(framework="MaxText"), 0)
    assert result.error is None and result.note == "no preset for framework 'MaxText': meshplan's defaults"
    assert result.predicted_step_time_s == run_case(case(), 0).predicted_step_time_s


@pytest.mark.skipif(not CASES.is_file(), reason="shared/validation is not beside the repo")
def test_a_dlrm_case_naming_a_framework_gets_no_preset_note():
    dlrm = next(c for c in yaml.safe_load(CASES.read_text()) if c["model"]["arch"] == "dlrm")
    assert run_case({**dlrm, "framework": "nemo"}, 0).note is None


def test_a_case_may_carry_its_pipeline_layout():
    staged = case(parallelism__pp=2, parallelism__dp=16, batch__global_batch_sequences=512)
    even = run_case(staged, 0)
    for key in ("pipeline_layout", "pipeline_model_parallel_layout"):
        laid = run_case(case(parallelism__pp=2, parallelism__dp=16, batch__global_batch_sequences=512,
                             **{f"parallelism__{key}": "Et*13|t*11L"}), 0)
        assert laid.error is None and laid.predicted_step_time_s != even.predicted_step_time_s
    bad = run_case(case(parallelism__pp=2, parallelism__dp=16, parallelism__pipeline_layout="Et*13|t*10L"), 0)
    assert bad.error.startswith("sc21_1p7b.plan.pipeline_layout") and "23 decoder layers" in bad.error


def test_a_case_may_say_it_replays_its_iteration_as_cuda_graphs():
    """A small-layer run held to its host's dispatch; with the iteration captured as CUDA graphs
    (Megatron-Core full_iteration) no host stands between the kernels."""
    small = dict(hardware__cluster="dgx-h100", parallelism__tp=8, parallelism__dp=4, batch__micro_batch_size=1)
    eager = run_case(case(**small), 0)
    graphs = run_case(case(**small, parallelism__cuda_graphs="full"), 0)
    assert eager.error is None and graphs.error is None
    assert graphs.predicted_step_time_s < eager.predicted_step_time_s
    bad = run_case(case(**small, parallelism__cuda_graphs="partly"), 0)
    assert bad.error.startswith("sc21_1p7b.plan.cuda_graphs") and "full" in bad.error


DEEPSEEK_V3 = {"name": "DeepSeek-V3", "arch": "moe", "num_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
               "num_kv_heads": 128, "ffn_hidden_size": 18432, "ffn_type": "swiglu", "vocab_size": 129280,
               "moe": {"num_experts": 256, "top_k": 8, "expert_ffn_hidden_size": 2048, "shared_experts": 1,
                       "first_dense_layers": 3}}


def test_a_catalog_model_brings_what_the_case_format_cannot_say():
    """A case naming DeepSeek-V3 with its dimensions runs its multi-head latent attention and
    its routing to at most 4 nodes (catalog/models.yaml, cited), and says so; the same name
    with other dimensions is taken as written."""
    from meshplan.io.validation_cases import known_architecture

    model = copy.deepcopy(DEEPSEEK_V3)
    note = known_architecture(model)
    # its RMSNorm is what a gated-FFN model has anyway (TransformerModel.norm), so no note of it
    assert model["mla"]["kv_lora_rank"] == 512 and model["moe"]["max_nodes"] == 4 and "norm" not in model
    assert note == "mla, moe.max_nodes from the catalog's deepseek-v3"
    for changed in ({"num_layers": 60}, {"name": "deepseek v3"}, {"name": "Mixtral-8x7B"}):
        model = {**copy.deepcopy(DEEPSEEK_V3), **changed}
        note = known_architecture(model)
        assert ("mla" in model) == (note is not None) == (changed == {"name": "deepseek v3"})
    run = case(model=DEEPSEEK_V3, hardware__cluster="dgx-h800", hardware__num_devices=256, parallelism__pp=8,
               parallelism__dp=32, parallelism__ep=32, parallelism__activation_recompute="none",
               batch__global_batch_sequences=1024, batch__micro_batch_size=1, batch__seq_len=4096, precision="fp8")
    result = run_case(run, 0)
    assert result.error is None and "from the catalog's deepseek-v3" in result.note


def test_a_case_may_say_how_its_expert_all_to_alls_ran():
    """Megatron-Core's switches, as a recipe writes them: the alltoall dispatcher sends a token
    once per expert (slower across nodes than the flex dispatcher megatron-core's preset assumes),
    and moe_a2a_overlap runs it beside another micro-batch's compute; meshplan's own words too."""
    small_moe = {"name": "moe", "arch": "moe", "num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16,
                 "num_kv_heads": 4, "ffn_hidden_size": None, "ffn_type": "swiglu", "vocab_size": 32000,
                 "moe": {"num_experts": 32, "top_k": 4, "expert_ffn_hidden_size": 768}}
    run = dict(model=small_moe, hardware__cluster="dgx-h100", hardware__num_devices=16, parallelism__dp=16,
               parallelism__ep=16, parallelism__activation_recompute="none", batch__micro_batch_size=1,
               batch__seq_len=4096, precision="bf16", framework="megatron-core")

    def predicted(**extra):
        result = run_case(case(**run, **{f"parallelism__{k}": v for k, v in extra.items()}), 0)
        assert result.error is None, result.error
        return result.predicted_step_time_s

    flex = predicted()
    assert predicted(moe_token_dispatcher_type="flex") == predicted(ep_dispatch="hierarchical") == flex
    alltoall = predicted(moe_token_dispatcher_type="alltoall")
    assert alltoall == predicted(ep_dispatch="all_to_all") > flex
    overlapped = predicted(moe_token_dispatcher_type="alltoall", moe_a2a_overlap=True)
    assert overlapped == predicted(ep_dispatch="all_to_all", ep_overlap="paired") < alltoall
    assert predicted(moe_token_dispatcher_type="alltoall", overlap_moe_expert_parallel_comm=False) == alltoall
    for key, value, field in (("ep_overlap", "sometimes", "plan.ep_overlap"), ("moe_token_dispatcher_type", "allgather", "plan.ep_dispatch")):
        bad = run_case(case(**run, **{f"parallelism__{key}": value}), 0)
        assert bad.error.startswith(f"sc21_1p7b.{field}: got {value!r}"), bad.error


def test_a_case_may_say_how_adam_kept_its_state():
    """Megatron-Core's precision-aware optimizer names its moments' dtype (exp_avg_dtype); meshplan's
    own optimizer_state is read too; a state meshplan does not know is one error naming the field."""
    from meshplan.io.validation_cases import case_inputs

    def state(**keys):
        return case_inputs(case(**{f"parallelism__{k}": v for k, v in keys.items()}), "x")["plan"].get("optimizer_state")

    assert state() is None
    assert state(exp_avg_dtype="bf16") == state(exp_avg_dtype="torch.bfloat16") == "bf16_moments"
    assert state(exp_avg_dtype="float32") == "fp32" and state(optimizer_state="FP32_Remainders") == "fp32_remainders"
    fp32, moments = (run_case(case(parallelism__exp_avg_dtype=d, parallelism__zero_stage=1), 0) for d in ("fp32", "bf16"))
    assert moments.error is None and moments.predicted_step_time_s < fp32.predicted_step_time_s  # a lighter Adam step
    bad = run_case(case(parallelism__exp_avg_dtype="fp8"), 0)
    assert bad.error.startswith("sc21_1p7b.plan.optimizer_state: got 'fp8'"), bad.error


def test_an_moe_case_may_count_dp_as_the_experts_replicas():
    """Mixtral 8x7B on 64 GPUs, tp 2, ep 8: SCHEMA.md's dp is 64 / tp = 32; a case that writes the
    experts' data-parallel degree instead is scored the same and says so: 4 when the experts keep
    tp 2 (tp x dp x ep = 64), 8 when the expert layers fold tp into ep (dp x ep = 64). A dp that
    neither reading makes fill the devices is still refused."""
    mixtral = {"name": "Mixtral-8x7B", "arch": "moe", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
               "num_kv_heads": 8, "ffn_hidden_size": 14336, "ffn_type": "swiglu", "vocab_size": 32000,
               "moe": {"num_experts": 8, "top_k": 2}}
    run = dict(model=mixtral, hardware__num_devices=64, parallelism__tp=2, parallelism__ep=8,
               parallelism__sequence_parallel=True, batch__micro_batch_size=1)
    schema = run_case(case(**run, parallelism__dp=32), 0)
    assert schema.error is None and "data-parallel degree" not in (schema.note or "")
    for dp in (4, 8):
        expert = run_case(case(**run, parallelism__dp=dp), 0)
        assert expert.error is None, expert.error
        assert expert.predicted_step_time_s == schema.predicted_step_time_s
        assert f"dp {dp} read as the experts' data-parallel degree (ep 8): the dense layers' dp is 32" in expert.note
    error = run_case(case(**run, parallelism__dp=3), 0).error
    assert error.startswith("sc21_1p7b.plan.dp: got 3") and "dp must be 32" in error


def test_the_experts_ffn_width_defaults_to_the_models():
    """As Megatron-Core's moe_ffn_hidden_size (and Mixtral's one intermediate_size): a case that
    gives ffn_hidden_size and no expert width runs experts of that width; with neither it is
    refused, naming the field."""
    mixtral = {"name": "Mixtral-8x7B", "arch": "moe", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
               "num_kv_heads": 8, "ffn_hidden_size": 14336, "ffn_type": "swiglu", "vocab_size": 32000,
               "moe": {"num_experts": 8, "top_k": 2}}
    run = dict(hardware__num_devices=64, parallelism__tp=2, parallelism__dp=32, parallelism__ep=8,
               parallelism__sequence_parallel=True, batch__micro_batch_size=1)
    implied = run_case(case(model=mixtral, **run), 0)
    stated = copy.deepcopy(mixtral)
    stated["moe"]["expert_ffn_hidden_size"] = 14336
    assert implied.error is None
    assert implied.predicted_step_time_s == run_case(case(model=stated, **run), 0).predicted_step_time_s
    neither = copy.deepcopy(mixtral)
    neither["ffn_hidden_size"] = None
    error = run_case(case(model=neither, **run), 0).error
    assert error.startswith("sc21_1p7b.model.moe.expert_ffn_hidden_size") and "ffn_hidden_size" in error


def test_an_interleaved_case_need_not_have_a_multiple_of_pp_micro_batches():
    """10 micro-batches over pp 4: scored in groups of 5 (the smallest group Megatron-Core
    accepts), or in the group the case gives under Megatron-Core's name."""
    odd = dict(parallelism__pp=4, parallelism__dp=8, parallelism__virtual_pipeline_stages=2,
               batch__global_batch_sequences=1280)
    auto = run_case(case(**odd), 0)
    given = run_case(case(**odd, parallelism__microbatch_group_size_per_vp_stage=10), 0)
    assert auto.error is None and given.error is None and given.predicted_step_time_s > 0
    bad = run_case(case(**odd, parallelism__microbatch_group_size_per_vp_stage=7), 0)
    assert bad.error.startswith("sc21_1p7b.plan.microbatch_group_size") and "leave 3" in bad.error


def test_an_unknown_cluster_names_the_case_and_field():
    error = run_case(case(hardware__cluster="dgx-h1000"), 0).error
    assert error.startswith("sc21_1p7b.hardware.cluster: got 'dgx-h1000'") and "dgx-h100" in error


def test_repeated_ids_are_reported(tmp_path):
    results = validate(write(tmp_path, [GOOD, GOOD]))
    assert results[0].error is None and "unique" in results[1].error


def test_devices_per_node_is_honoured_on_single_node_domains():
    """Four GPUs per node (a 4-GPU NVLink node, as Perlmutter) moves traffic off NVLink."""
    eight = run_case(case(parallelism__tp=8, parallelism__dp=4), 0)
    four = run_case(case(parallelism__tp=8, parallelism__dp=4, hardware__devices_per_node=4), 0)
    assert eight.error is None and four.error is None
    assert four.predicted_step_time_s > eight.predicted_step_time_s


@pytest.mark.parametrize(("cluster", "per_node"), [("gb200-nvl72", 8), ("dgx-a100-80gb", 3), ("dgx-a100-80gb", 0),
                                                 ("dgx-a100-80gb", 16), ("dgx-a100-80gb", 2**63)])
def test_devices_per_node_that_cannot_be_honoured_is_rejected(cluster, per_node):
    result = run_case(case(hardware__cluster=cluster, hardware__devices_per_node=per_node), 0)
    assert result.error.startswith("sc21_1p7b.hardware.devices_per_node")


@pytest.mark.parametrize(("path", "value", "field"), [
    ("precision", [1, 2], "precision"),
    ("precision", {}, "precision"),
    ("parallelism__tp", True, "tp"),
    ("parallelism__pp", "8", "pp"),
    ("batch__micro_batch_size", True, "micro_batch_size"),
    ("model__num_layers", "24", "num_layers"),
    ("parallelism__zero_stage", True, "zero_stage"),
    ("parallelism__sequence_parallel", "abc", "sequence_parallel"),
    ("parallelism__sequence_parallel", [], "sequence_parallel"),
])
def test_a_value_of_the_wrong_kind_is_refused_naming_its_field(path, value, field):
    """SCHEMA.md: numbers given as strings are not valid, nor is true a count of one; a list or a
    mapping where a word belongs is refused by name, never an internal error."""
    error = run_case(case(**{path: value}), 0).error
    assert error is not None and "internal" not in error
    assert error.split(":")[0].endswith(field), error


@pytest.mark.parametrize("value", [1.5, "abc", [1, 2], None, True])
def test_an_moe_block_that_is_not_a_mapping_is_refused(value):
    moe = case(model__arch="moe")
    moe["model"]["moe"] = value
    error = run_case(moe, 0).error
    assert error.startswith("sc21_1p7b.model.moe") and "internal" not in error


@pytest.mark.parametrize(("recompute", "zero_stage"), [("abc", 1), ("full", "abc")])
def test_a_recipe_switch_does_not_hide_a_bad_value_it_would_override(recompute, zero_stage):
    """recompute_modules sets selective recomputation and Megatron-FSDP ZeRO-3, each over what
    the case says; what the case says must still be a valid value."""
    bad = case(parallelism__activation_recompute=recompute, parallelism__zero_stage=zero_stage)
    bad["parallelism"].update(recompute_modules=["core_attn"], use_megatron_fsdp=True)
    error = run_case(bad, 0).error
    assert error is not None and "internal" not in error


WRONG_KINDS = ([1, 2], {"a": 1}, True, "8", None, float("nan"), -1)


def _fields(node, path=()):
    for key, value in node.items():
        yield (*path, key)
        if isinstance(value, dict):
            yield from _fields(value, (*path, key))


@pytest.mark.skipif(not CASES.is_file(), reason="shared/validation is not beside the repo")
@pytest.mark.parametrize("prefix", ["korthikanti22_175B", "mbridge_25.09_h100_deepseekv3", "madmax_dlrm"])
def test_every_field_of_a_wrong_kind_is_an_error_that_names_it_or_a_score(prefix):
    """Each field of a dense, an MoE (DeepSeek-V3, whose architecture the catalog completes) and a
    DLRM public case, given each of WRONG_KINDS: the case is scored or refused by a field, never
    an internal error, and never by printing a whole section of the case as the value (a check
    across fields names the field that breaks it)."""
    original = next(c for c in yaml.safe_load(CASES.read_text()) if c["id"].startswith(prefix))
    for path in _fields(original):
        for value in WRONG_KINDS:
            broken = copy.deepcopy(original)
            node = broken
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
            result = run_case(broken, 0)
            assert result.error is None or "internal error" not in result.error, (path, value, result.error)
            assert result.error is None or "got {'" not in result.error.replace("got {'a': 1}", ""), result.error


def test_nvl72_trays_of_four_are_the_catalog_node():
    result = run_case(case(hardware__cluster="gb200-nvl72", hardware__devices_per_node=4), 0)
    assert result.error is None


@pytest.mark.parametrize(("cluster", "host", "domain"), [("gb200-nvl72", 4, 72), ("gb300-nvl72", 4, 72), ("tpu-v4-pod", 4, 64)])
def test_a_node_named_by_its_scale_up_domain_is_the_same_system(cluster, host, domain):
    """A source may call an NVL72 rack (or a TPU v4 cube) the node: the same cluster as its
    hosts of four, predicted the same; another size is refused, naming both that are valid."""
    runs = {per_node: run_case(case(hardware__cluster=cluster, hardware__devices_per_node=per_node, precision="bf16"), 0)
            for per_node in (host, domain, None)}
    assert all(r.error is None for r in runs.values())
    assert runs[host].predicted_step_time_s == runs[domain].predicted_step_time_s == runs[None].predicted_step_time_s
    other = run_case(case(hardware__cluster=cluster, hardware__devices_per_node=8, precision="bf16"), 0)
    assert other.error.startswith("sc21_1p7b.hardware.devices_per_node")
    assert f"{host} devices per node ({domain} in its" in other.error


@pytest.mark.parametrize("seq_len", ["absent", None])
def test_a_case_without_its_sequence_length_is_refused(seq_len):
    """The run's own sequence length: a model default would score a guess against a measurement."""
    broken = case()
    if seq_len == "absent":
        del broken["batch"]["seq_len"]
    else:
        broken["batch"]["seq_len"] = seq_len
    result = run_case(broken, 0)
    assert result.predicted_step_time_s is None and result.error.startswith("sc21_1p7b.batch.seq_len")


def test_a_run_larger_than_the_listed_system_is_predicted_not_refused():
    """dgx-a100-40gb lists Selene's 2,240 GPUs; a published run on 4,096 is more of the same nodes,
    and 128 times the data-parallel replicas of the 32-GPU run take about the same time per
    replica (the gradient all-reduce moves the same bytes per GPU, in fewer, larger buckets)."""
    small = run_case(case(hardware__cluster="dgx-a100-40gb"), 0)
    large = run_case(case(hardware__cluster="dgx-a100-40gb", hardware__num_devices=4096, parallelism__dp=4096,
                          batch__global_batch_sequences=65536), 0)
    assert small.error is None and large.error is None
    assert large.predicted_step_time_s == pytest.approx(small.predicted_step_time_s, rel=0.2)


def test_cli_json_lists_failed_cases_with_their_error(monkeypatch, capsys, tmp_path):
    path = write(tmp_path, [GOOD, case(id="nan", measured__step_time_s=float("nan"))])
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(path), "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert rows[0]["error"] is None and rows[1]["error"].startswith("nan.measured.step_time_s")
    code, out, _ = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 0 and "not scored" in out


def test_each_group_reports_its_bias_the_median_signed_error(monkeypatch, capsys, tmp_path):
    """Group g's two cases predicted 10% and 30% slower than measured: median |error| 20%, bias
    +20%; group h's two 10% and 30% faster: bias -20%."""
    predicted = run_case(GOOD, 0).predicted_step_time_s
    slow = [case(id=f"s{k}", measured__step_time_s=predicted / f) for k, f in enumerate((1.1, 1.3))]
    fast = [case(id=f"f{k}", group="h", measured__step_time_s=predicted / f) for k, f in enumerate((0.9, 0.7))]
    stats = summarize(validate(write(tmp_path, slow + fast)))
    assert stats["g"]["median_error"] == pytest.approx(0.2) == pytest.approx(stats["g"]["median_abs_error"])
    assert stats["h"]["median_error"] == pytest.approx(-0.2)
    code, out, _ = run_cli(monkeypatch, capsys, "validate", str(tmp_path / "cases.yaml"))
    assert code == 0 and "bias" in out and "+20.0%" in out and "-20.0%" in out


@pytest.mark.skipif(not CASES.is_file(), reason="shared/validation is not beside the repo")
def test_free_text_dlrm_interaction_as_schema_allows():
    """SCHEMA.md: interaction may read 'dcnv2 ...'; a case that spells it out is scored."""
    dlrm = {
        "id": "dcn", "group": "g",
        "model": {"arch": "dlrm", "embedding_dim": 128, "table_rows": [40000000] * 4 + [1000] * 22,
                  "multi_hot_sizes": [3] * 26, "bottom_mlp": [512, 256, 128], "top_mlp": [1024, 1024, 512, 256, 1],
                  "num_dense_features": 13, "interaction": "DCNv2 MultiCross, 3 layers, low-rank projection 512"},
        "hardware": {"cluster": "dgx-a100-80gb", "num_devices": 8},
        "batch": {"global_batch_samples": 65536},
        "measured": {"step_time_s": 0.1},
    }
    result = run_case(dlrm, 0)
    assert result.error is None and result.predicted_step_time_s > 0
    for key, value in (("precision", ""), ("precision", []), ("batch", None)):
        error = run_case({**dlrm, key: value}, 0).error
        assert error.startswith(f"dcn.{'batch' if key == 'batch' else 'plan.precision'}") and "internal" not in error, error
    for key, value in (("multi_hot_sizes", [True] * 26), ("bytes_per_emb_param", "2")):
        error = run_case({**dlrm, "model": {**dlrm["model"], key: value}}, 0).error
        assert error is not None and key in error, error
    short = run_case({**dlrm, "model": {**dlrm["model"], "interaction": "dcnv2 3", "dcn_low_rank_dim": 512}}, 0)
    assert short.predicted_step_time_s == pytest.approx(result.predicted_step_time_s, rel=1e-12)


@pytest.mark.parametrize("changes, stage, shard", [
    ({"parallelism__sharding_strategy": "HYBRID_SHARD"}, 3, 8),
    ({"parallelism__sharding_strategy": "hsdp", "parallelism__zero_stage": 2}, 2, 8),
    ({"fsdp_sharding_strategy": "FULL_SHARD"}, 3, None),
    ({"parallelism__sharding_strategy": "SHARD_GRAD_OP"}, 2, None),
    ({"parallelism__zero_stage": 3, "parallelism__zero_shard_size": 16}, 3, 16),
    ({"parallelism__zero_stage": 3, "parallelism__data_parallel_shard_degree": 4, "parallelism__data_parallel_replicate_degree": 8}, 3, 4),
    ({"parallelism__zero_stage": 3, "parallelism__data_parallel_shard_degree": 32, "parallelism__data_parallel_replicate_degree": 1}, 3, None),
    ({"framework": "PyTorch FSDP (HSDP)"}, 3, 8),
    ({"framework": "PyTorch FSDP, hybrid_shard", "parallelism__zero_stage": 3}, 3, 8),
])
def test_a_case_may_say_it_sharded_within_nodes(estimated, changes, stage, shard):
    """PyTorch FSDP's strategies by name (HYBRID_SHARD, fms-fsdp's hsdp: shards inside each node
    of 8, replicas across), Plan.zero_shard_size, or torchtitan's shard and replicate degrees."""
    result = run_case(case(**changes), 0)
    assert result.error is None
    plan = estimated["plan"]
    assert plan["zero_stage"] == stage and plan.get("zero_shard_size") == shard


def test_an_unknown_sharding_strategy_is_refused_naming_it():
    result = run_case(case(parallelism__sharding_strategy="HALF_SHARD"), 0)
    assert result.error.startswith("sc21_1p7b.sharding_strategy") and "HYBRID_SHARD" in result.error


@pytest.mark.parametrize("extra, norm, rotary", [
    ({}, "rmsnorm", True),
    ({"norm": "LayerNorm"}, "layernorm", True),
    ({"position_embedding_type": "alibi"}, "rmsnorm", False),
    ({"pos_emb": "rotary", "norm": "rms_norm"}, "rmsnorm", True),
    ({"rotary": False}, "rmsnorm", False),
])
def test_a_case_may_say_its_norm_and_positions(estimated, extra, norm, rotary):
    """A gated-FFN model has RMSNorm and rotary embeddings unless the case says otherwise, as
    configs write it (norm; rotary; position_embedding_type, pos_emb)."""
    result = run_case(case(model={**GOOD["model"], "ffn_type": "swiglu", **extra}), 0)
    assert result.error is None
    model = TransformerModel(**estimated["model"])
    assert (model.norm, model.rotary) == (norm, rotary)


@pytest.mark.parametrize("extra, activation", [({}, None), ({"activation_function": "gelu_new"}, "gelu_new"),
                                               ({"hidden_act": "GELU"}, "gelu"), ({"activation_function": "gelu_pytorch_tanh"}, "gelu_pytorch_tanh"),
                                               ({"hidden_act": "relu2", "ffn_type": "squared_relu"}, "relu2")])
def test_a_case_may_say_its_activation_as_configs_name_it(estimated, extra, activation):
    """Hugging Face's names (activation_function, hidden_act): gelu_new is GPT-2's op-by-op GELU."""
    assert run_case(case(model={**GOOD["model"], **extra}), 0).error is None
    assert TransformerModel(**estimated["model"]).activation_function == activation


@pytest.mark.parametrize("extra, field", [({"norm": "batchnorm"}, "model.norm"), ({"pos_emb": "xpos"}, "model.pos_emb"),
                                          ({"rotary": "maybe"}, "model.rotary"), ({"hidden_act": "gelu_fast"}, "model.hidden_act"),
                                          ({"activation_function": "silu"}, "model.activation_function")])
def test_an_unknown_norm_or_position_is_refused_naming_it(extra, field):
    result = run_case(case(model={**GOOD["model"], **extra}), 0)
    assert result.error.startswith(f"sc21_1p7b.{field}")


@pytest.mark.parametrize("key", ["fused_loss", "cross_entropy_loss_fusion"])
def test_a_case_may_say_its_loss_was_fused(estimated, key):
    """Megatron-Core's cross_entropy_loss_fusion (a recipe switch) or the plan's own name: one
    kernel over the 16-bit logits instead of PyTorch's fp32 passes, so a faster step."""
    unfused = run_case(case(), 0)
    fused = run_case(case(**{f"parallelism__{key}": True}), 0)
    assert estimated["plan"]["fused_loss"] is True
    assert fused.predicted_step_time_s < unfused.predicted_step_time_s
    bad = run_case(case(**{f"parallelism__{key}": "sometimes"}), 0)
    assert bad.error.startswith("sc21_1p7b.plan.fused_loss")
