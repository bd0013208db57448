"""Import of HuggingFace config.json files: fields, published parameter totals, clear errors.

Published totals are the parameter counts of the released checkpoints (sum of tensor sizes in
the safetensors files on the HuggingFace Hub). meshplan leaves out learned position embeddings
(GPT-2's 786,432) and small per-model extras, so the tolerance is 2%.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan.errors import MeshplanError
from meshplan.io.hf_config import SEQ_LEN_CAP, model_from_hf_config

HF = Path(__file__).parent / "fixtures" / "hf"

PUBLISHED_PARAMS = {
    "llama3-8b": 8_030_261_248,  # meta-llama/Meta-Llama-3-8B
    "mistral-7b": 7_241_732_096,  # mistralai/Mistral-7B-v0.1
    "qwen2-7b": 7_615_616_512,  # Qwen/Qwen2-7B
    "gpt2": 124_439_808,  # openai-community/gpt2, includes 1024x768 position embeddings
}


def config(folder: str) -> dict:
    return json.loads((HF / folder / "config.json").read_text())


@pytest.mark.parametrize("folder", sorted(PUBLISHED_PARAMS))
def test_params_match_published_total(folder):
    model = model_from_hf_config(HF / folder / "config.json")
    assert model.num_params == pytest.approx(PUBLISHED_PARAMS[folder], rel=0.02)


def test_llama3_8b_fields():
    model = model_from_hf_config(HF / "llama3-8b" / "config.json")
    assert model.id == "llama3-8b"
    assert (model.num_layers, model.hidden_size, model.ffn_hidden_size) == (32, 4096, 14336)
    assert (model.num_attention_heads, model.kv_heads, model.dim_per_head) == (32, 8, 128)
    assert model.vocab_size == 128256
    assert model.ffn_type == "swiglu"
    assert model.norm == "rmsnorm"
    assert model.tied_embeddings is False
    assert model.seq_len == 8192
    assert model.sources["hf_config"] == str((HF / "llama3-8b" / "config.json").resolve())


def test_mistral_7b_fields_and_seq_len_cap():
    model = model_from_hf_config(HF / "mistral-7b" / "config.json")
    assert (model.num_layers, model.hidden_size, model.ffn_hidden_size, model.vocab_size) == (
        32, 4096, 14336, 32000,
    )
    assert model.kv_heads == 8
    assert model.ffn_type == "swiglu"
    assert model.seq_len == SEQ_LEN_CAP  # max_position_embeddings is 32768


def test_qwen2_7b_fields():
    model = model_from_hf_config(HF / "qwen2-7b" / "config.json")
    assert (model.num_layers, model.hidden_size, model.ffn_hidden_size) == (28, 3584, 18944)
    assert (model.num_attention_heads, model.kv_heads, model.dim_per_head) == (28, 4, 128)
    assert model.vocab_size == 152064
    assert model.seq_len == SEQ_LEN_CAP  # max_position_embeddings is 131072
    assert model.tied_embeddings is False


def test_gpt2_fields():
    model = model_from_hf_config(HF / "gpt2" / "config.json")
    assert (model.num_layers, model.hidden_size, model.num_attention_heads) == (12, 768, 12)
    assert model.ffn_hidden_size == 4 * 768  # n_inner absent
    assert model.num_kv_heads is None
    assert (model.ffn_type, model.norm, model.tied_embeddings) == ("gelu", "layernorm", True)
    assert (model.vocab_size, model.seq_len) == (50257, 1024)
    assert model.activation_function == "gelu_new"  # GPT2Config's default, op by op when eager


def test_gpt_neox_pythia_160m():
    # EleutherAI/pythia-160m config.json; total 162,322,944 from Biderman et al. 2023, Table 1
    cfg = {
        "model_type": "gpt_neox", "_name_or_path": "EleutherAI/pythia-160m",
        "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
        "intermediate_size": 3072, "vocab_size": 50304, "max_position_embeddings": 2048,
        "hidden_act": "gelu", "layer_norm_eps": 1e-5, "tie_word_embeddings": False,
    }
    model = model_from_hf_config(cfg)
    assert model.id == "EleutherAI/pythia-160m"
    assert (model.ffn_type, model.norm, model.seq_len) == ("gelu", "layernorm", 2048)
    assert model.activation_function is None  # PyTorch's GELU, one kernel
    assert model.num_params == pytest.approx(162_322_944, rel=0.02)


@pytest.mark.parametrize("config, params", [
    # microsoft/phi-2 config.json; its safetensors total 2,779,683,840
    ({"_name_or_path": "microsoft/phi-2", "model_type": "phi", "hidden_act": "gelu_new", "hidden_size": 2560,
      "intermediate_size": 10240, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048, "num_attention_heads": 32,
      "num_hidden_layers": 32, "num_key_value_heads": 32, "partial_rotary_factor": 0.4, "tie_word_embeddings": False,
      "vocab_size": 51200}, 2_779_683_840),
    # EleutherAI/gpt-j-6b config.json (no tie_word_embeddings key: GPTJConfig does not tie); 6,053,381,344
    ({"_name_or_path": "EleutherAI/gpt-j-6b", "model_type": "gptj", "n_embd": 4096, "n_head": 16, "n_layer": 28,
      "n_positions": 2048, "rotary_dim": 64, "vocab_size": 50400, "activation_function": "gelu_new"}, 6_053_381_344),
])
def test_phi2_and_gptj_run_gelu_new_with_rotary_embeddings(config, params):
    model = model_from_hf_config(config)
    assert (model.ffn_type, model.activation_function, model.norm, model.rotary, model.tied_embeddings) == (
        "gelu", "gelu_new", "layernorm", True, False)
    assert model.num_params == pytest.approx(params, rel=0.02)


def test_gemma_gated_gelu_head_dim_and_tied_default():
    # google/gemma-7b config.json (no tie_word_embeddings key: GemmaConfig ties by default);
    # published total 8,537,680,896
    cfg = {
        "model_type": "gemma", "hidden_size": 3072, "intermediate_size": 24576,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
        "head_dim": 256, "hidden_act": "gelu", "vocab_size": 256000,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
    }
    model = model_from_hf_config(cfg, model_id="gemma-7b")
    assert model.id == "gemma-7b"
    assert (model.ffn_type, model.dim_per_head, model.tied_embeddings) == ("geglu", 256, True)
    assert model.num_params == pytest.approx(8_537_680_896, rel=0.02)


def test_generic_config_without_model_type_uses_llama_names():
    cfg = config("llama3-8b")
    del cfg["model_type"]
    model = model_from_hf_config(cfg)
    assert model.num_params == model_from_hf_config(config("llama3-8b")).num_params
    assert model.id == "custom"


def test_folder_and_model_id_argument(tmp_path):
    assert model_from_hf_config(HF / "gpt2").id == "gpt2"
    assert model_from_hf_config(HF / "gpt2" / "config.json", model_id="my-gpt").id == "my-gpt"
    renamed = tmp_path / "gpt2-small.json"  # a config saved under its model's name, not config.json
    renamed.write_text((HF / "gpt2" / "config.json").read_text())
    assert model_from_hf_config(renamed).id == "gpt2-small"


def test_hf_cache_snapshot_gives_repo_id(tmp_path):
    snapshot = tmp_path / "models--meta-llama--Meta-Llama-3-8B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config("llama3-8b")))
    assert model_from_hf_config(snapshot / "config.json").id == "meta-llama/Meta-Llama-3-8B"


# errors: each names the field


def test_missing_file():
    with pytest.raises(MeshplanError) as err:
        model_from_hf_config(HF / "no-such-model" / "config.json")
    assert err.value.field == "path"


def test_malformed_json_names_line_and_column():
    with pytest.raises(MeshplanError) as err:
        model_from_hf_config(HF / "malformed" / "config.json")
    assert err.value.field == "path"
    assert err.value.value == str((HF / "malformed" / "config.json").resolve())
    assert "line 4 column 3" in err.value.valid


def test_top_level_not_an_object(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(MeshplanError) as err:
        model_from_hf_config(tmp_path / "config.json")
    assert err.value.field == "path"


@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size"])
def test_missing_field(key):
    cfg = config("mistral-7b")
    del cfg[key]
    with pytest.raises(MeshplanError) as err:
        model_from_hf_config(cfg)
    assert (err.value.field, err.value.value) == (key, None)


def test_missing_gpt2_field():
    cfg = config("gpt2")
    del cfg["n_embd"]
    with pytest.raises(MeshplanError) as err:
        model_from_hf_config(cfg)
    assert err.value.field == "n_embd"


@pytest.mark.parametrize("value", [0, -4096, 4096.5, "4096", True])
def test_non_positive_or_non_integer_size(value):
    cfg = config("llama3-8b")
    cfg["hidden_size"] = value
    with pytest.raises(MeshplanError) as err:
        model_from_hf_config(cfg)
    assert (err.value.field, err.value.value) == ("hidden_size", value)


def test_unsupported_model_type_lists_supported():
    cfg = config("llama3-8b") | {"model_type": "t5"}
    with pytest.raises(MeshplanError) as err:
        model_from_hf_config(cfg)
    assert (err.value.field, err.value.value) == ("model_type", "t5")
    for supported in ("llama", "mistral", "qwen2", "gpt2", "gpt_neox"):
        assert supported in err.value.valid


def test_unsupported_activation():
    cfg = config("llama3-8b") | {"hidden_act": "relu"}
    with pytest.raises(MeshplanError) as err:
        model_from_hf_config(cfg)
    assert (err.value.field, err.value.value) == ("hidden_act", "relu")


def test_moe_config_needs_experts_per_token():
    cfg = config("mistral-7b") | {"model_type": "mixtral", "num_local_experts": 8}
    with pytest.raises(MeshplanError) as err:
        model_from_hf_config(cfg)
    assert err.value.field == "num_experts_per_tok"


@pytest.mark.parametrize(
    ("name", "total", "active"),
    [
        ("mixtral-8x7b", 46.7e9, 12.9e9),  # Jiang et al. 2024: 47B parameters, 13B active
        ("deepseek-v3", 671e9, 37e9),  # DeepSeek-V3 report: 671B total, 37B activated
    ],
)
def test_moe_configs_import(name, total, active):
    model = model_from_hf_config(HF / name / "config.json")
    assert model.arch == "moe" and model.moe is not None
    assert model.num_params == pytest.approx(total, rel=0.01)
    assert model.active_params == pytest.approx(active, rel=0.02)


def test_deepseek_v3_fields():
    model = model_from_hf_config(HF / "deepseek-v3" / "config.json")
    assert (model.moe.num_experts, model.moe.top_k, model.moe.shared_experts, model.moe.first_dense_layers) == (256, 8, 1, 3)
    assert model.mla.kv_lora_rank == 512 and model.mla.q_lora_rank == 1536
    assert model.ffn_hidden_size == 18432 and model.moe.expert_ffn_hidden_size == 2048
    assert model.mtp_layers == 1  # num_nextn_predict_layers
    assert model_from_hf_config(config("llama3-8b")).mtp_layers == 0
    with pytest.raises(MeshplanError) as err:
        model_from_hf_config(config("llama3-8b") | {"num_nextn_predict_layers": -1})
    assert err.value.field == "num_nextn_predict_layers"


def test_kv_heads_must_divide_heads():
    cfg = config("llama3-8b") | {"num_key_value_heads": 5}
    with pytest.raises(MeshplanError) as err:
        model_from_hf_config(cfg)
    assert (err.value.field, err.value.value) == ("num_key_value_heads", 5)


def test_heads_must_divide_hidden_without_head_dim():
    cfg = config("gpt2") | {"n_head": 7}
    with pytest.raises(MeshplanError) as err:
        model_from_hf_config(cfg)
    assert (err.value.field, err.value.value) == ("n_head", 7)
