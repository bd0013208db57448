"""Import a HuggingFace ``config.json`` as a :class:`TransformerModel`, offline.

The file is read with the ``json`` module: no ``transformers`` dependency, no network. Each
supported ``model_type`` belongs to a family that says where its sizes live:

- llama-style (``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``gemma``, ``gemma2``, ``gemma3_text``, ``phi3``, and
  configs with no ``model_type`` that use the llama field names): ``num_hidden_layers``, ``hidden_size``,
  ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``intermediate_size``,
  ``vocab_size``, ``max_position_embeddings``. The MLP is gated: SiLU gives ``swiglu``, GELU
  gives ``geglu`` (Gemma).
- ``gpt_neox``: the same field names, a plain (ungated) GELU MLP, LayerNorm.
- ``phi`` (Phi-1.5, Phi-2): the same field names, a plain GELU MLP whose activation defaults to
  ``gelu_new``, LayerNorm, rotary embeddings.
- ``gpt2``: ``n_layer``, ``n_embd``, ``n_head``, ``n_inner`` (default ``4 * n_embd``),
  ``n_positions``; GELU MLP (``gelu_new`` by default), LayerNorm, tied embeddings. ``gptj``: the
  same keys, rotary embeddings and an untied head.

A GELU MLP whose config names ``gelu_new`` keeps it (``TransformerModel.activation_function``):
the model's code computes it op by op.

Defaults for optional fields follow the HuggingFace config class of each type (for example
``tie_word_embeddings`` is false for Llama and true for Gemma). Mixture-of-experts configs
(Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss, DeepSeek-V2/V3) import their experts, and DeepSeek's
multi-head latent attention. Every layer of Mixtral, Qwen3-MoE and gpt-oss is MoE, so their
``intermediate_size`` sizes no dense FFN.

A config's ``sliding_window`` windows every layer (Mistral 7B v0.1, Phi-3), or those its
``layer_types`` mark ``sliding_attention``; without ``layer_types``, Gemma 2 and gpt-oss window
every other layer and Gemma 3 all but each ``sliding_window_pattern``-th (their config classes'
defaults), and Qwen2/Qwen3 only with ``use_sliding_window`` (TransformerModel.sliding_window).

A llama-style architecture under another ``model_type`` can be imported by loading the JSON,
setting ``"model_type": "llama"`` and passing the dict.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.io.files import parse_json, read_text
from meshplan.specs.base import build
from meshplan.specs.model import TransformerModel

#: ``max_position_embeddings`` is the longest context a model supports (131,072 for Qwen2-7B),
#: not the length it is trained at; meshplan's ``seq_len`` is a default *training* length, and
#: activation memory grows with it, so the default is capped here. Plans set their own length
#: with ``plan.seq_len``.
SEQ_LEN_CAP = 8192

#: keys that give the number of experts; a value above 1 means a mixture-of-experts model
MOE_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")


@dataclass(frozen=True)
class _Family:
    """Where one kind of config keeps its sizes, and the defaults its HF config class uses."""

    layers: str
    hidden: str
    heads: str
    ffn: str
    ffn_optional: bool  # True: 4 * hidden when the ffn key is absent or null (GPT-2)
    positions: str
    activation_keys: tuple[str, ...]
    default_activation: str
    gated: bool
    tied_default: bool
    norm_default: str
    rotary: bool = True  # rotary position embeddings (Llama, Gemma, GPT-NeoX); GPT-2 learns its positions


_LLAMA_KEYS = dict(
    layers="num_hidden_layers",
    hidden="hidden_size",
    heads="num_attention_heads",
    ffn="intermediate_size",
    ffn_optional=False,
    positions="max_position_embeddings",
    activation_keys=("hidden_activation", "hidden_act"),
)
_LLAMA = _Family(**_LLAMA_KEYS, default_activation="silu", gated=True, tied_default=False,
                 norm_default="rmsnorm")
_GEMMA = _Family(**_LLAMA_KEYS, default_activation="gelu_pytorch_tanh", gated=True,
                 tied_default=True, norm_default="rmsnorm")
_NEOX = _Family(**{**_LLAMA_KEYS, "activation_keys": ("hidden_act",)}, default_activation="gelu",
                gated=False, tied_default=False, norm_default="layernorm")
_GPT2 = _Family(layers="n_layer", hidden="n_embd", heads="n_head", ffn="n_inner", ffn_optional=True,
                positions="n_positions", activation_keys=("activation_function",),
                default_activation="gelu_new", gated=False, tied_default=True,
                norm_default="layernorm", rotary=False)

#: Phi-1.5 and Phi-2 (model_type "phi"): a 4h GELU MLP whose hidden_act is gelu_new (PhiConfig's
#: default), LayerNorm, partial rotary embeddings, an untied head
_PHI = _Family(**_LLAMA_KEYS, default_activation="gelu_new", gated=False, tied_default=False, norm_default="layernorm")
#: GPT-J (model_type "gptj"): GPT-2's keys and gelu_new, rotary embeddings, an untied head
_GPTJ = replace(_GPT2, rotary=True, tied_default=False)

FAMILIES: dict[str, _Family] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "gemma": _GEMMA,
    "gemma2": _GEMMA,
    "gemma3_text": _GEMMA,
    "gpt_neox": _NEOX,
    "gpt2": _GPT2,
    "gptj": _GPTJ,
    "phi": _PHI,
    "phi3": _LLAMA,
    "mixtral": _LLAMA,
    "qwen2_moe": _LLAMA,
    "deepseek_v2": _LLAMA,
    "deepseek_v3": _LLAMA,
    "qwen3_moe": _LLAMA,
    "gpt_oss": _LLAMA,
}

#: keys that give the experts each token is routed to (gpt-oss's original config says experts_per_token)
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token")


def model_from_hf_config(
    path_or_dict: str | os.PathLike[str] | dict[str, Any], model_id: str | None = None
) -> TransformerModel:
    """Read a HuggingFace ``config.json`` (a file, a folder holding one, or its parsed dict).

    The model id is ``model_id`` if given, else the file's own name where it is not
    ``config.json`` (``gpt2.json``: gpt2), else the folder holding it (the repo id for a
    HuggingFace cache snapshot), else ``_name_or_path`` from the config. ``sources`` records the
    file read. Every bad input raises :class:`MeshplanError` naming the config key.
    """
    if isinstance(path_or_dict, dict):
        config, path = path_or_dict, None
    elif isinstance(path_or_dict, (str, os.PathLike)):
        path = _config_path(Path(path_or_dict))
        config = _read_json(path)
    else:
        raise MeshplanError("path", path_or_dict, "a path to a config.json, or its parsed dict")
    where = f"in {path}" if path else None

    model_type = config.get("model_type")
    if model_type is None:
        family = _LLAMA  # generic: no model_type, llama field names
    elif isinstance(model_type, str) and model_type in FAMILIES:
        family = FAMILIES[model_type]
    else:
        hint = "this is a multimodal config; pass its text_config dict" if "text_config" in config else where
        raise MeshplanError("model_type", model_type, f"supported: {', '.join(FAMILIES)}", hint=hint)

    hidden = _size(config, family.hidden, where)
    if family.ffn_optional and config.get(family.ffn) is None:
        ffn = 4 * hidden
    else:
        ffn = _size(config, family.ffn, where)
    spec: dict[str, Any] = {
        "id": _model_id(model_id, path, config),
        "num_layers": _size(config, family.layers, where),
        "hidden_size": hidden,
        "num_attention_heads": _size(config, family.heads, where),
        "ffn_hidden_size": ffn,
        "ffn_type": _ffn_type(config, family, where),
        "activation_function": _composite_activation(config, family),
        "vocab_size": _size(config, "vocab_size", where),
        "tied_embeddings": _flag(config, "tie_word_embeddings", family.tied_default, where),
        "norm": _norm(config, family),
        "rotary": family.rotary,
    }
    spec["name"] = spec["id"]
    for key, field in (("num_key_value_heads", "num_kv_heads"), ("head_dim", "head_dim")):
        if family is not _GPT2 and config.get(key) is not None:
            spec[field] = _size(config, key, where)
    _check_heads(spec, family, where)
    moe = _moe(config, where)
    if moe:
        spec["arch"] = "moe"
        spec["moe"] = moe
        if not moe.get("first_dense_layers"):
            spec["ffn_hidden_size"] = None  # every layer is MoE: no dense FFN
    mla = _mla(config, where)
    if mla:
        spec["mla"] = mla
        spec.pop("head_dim", None)
    spec.update(_window(config, spec["num_layers"], where))
    if config.get(family.positions) is not None:
        spec["seq_len"] = min(_size(config, family.positions, where), SEQ_LEN_CAP)
    if config.get("num_nextn_predict_layers"):  # DeepSeek-V3's multi-token-prediction modules
        spec["mtp_layers"] = _size(config, "num_nextn_predict_layers", where)
    if path is not None:
        spec["sources"] = {"hf_config": str(path)}
    elif isinstance(config.get("_name_or_path"), str) and config["_name_or_path"]:
        spec["sources"] = {"hf_config": f"config.json of {config['_name_or_path']}"}
    return build(TransformerModel, spec, "hf_config")


def _config_path(path: Path) -> Path:
    try:
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise MeshplanError("path", str(path.absolute()), "an existing config.json file (or a folder holding one)")
        return path.resolve()
    except (OSError, ValueError) as err:  # a name too long, an embedded NUL, a symlink loop
        raise MeshplanError("path", str(path), f"a path to a config.json ({err})") from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        config = parse_json(read_text(path, "path"), str(path))
    except MeshplanError as err:  # malformed, too deep or not UTF-8: the field is the path
        if err.field == "path":
            raise
        raise MeshplanError("path", str(path), f"{err.valid} at {err.value}") from None
    if not isinstance(config, dict):
        raise MeshplanError("path", str(path), f"a JSON object at the top level, not {type(config).__name__}")
    return config


def _moe(config: dict[str, Any], where: str | None) -> dict[str, Any] | None:
    """The experts of a Mixtral, Qwen2/3-MoE, gpt-oss or DeepSeek config; None for a dense model.

    Mixtral and gpt-oss: ``num_local_experts`` experts of ``intermediate_size``. Qwen2-MoE and
    Qwen3-MoE: ``num_experts`` of ``moe_intermediate_size`` (Qwen2-MoE also a shared expert of
    ``shared_expert_intermediate_size``).
    DeepSeek: ``n_routed_experts`` of ``moe_intermediate_size``, ``n_shared_experts`` and the
    first ``first_k_dense_replace`` layers dense.
    """
    key = next((k for k in MOE_KEYS if config.get(k) not in (None, 0, 1, False)), None)
    if key is None:
        return None
    experts = _size(config, key, where)
    top_k = _size(config, next((k for k in TOP_K_KEYS if k in config), TOP_K_KEYS[0]), where)
    if config.get("moe_intermediate_size") is not None:
        expert_ffn = _size(config, "moe_intermediate_size", where)
    else:
        expert_ffn = _size(config, "intermediate_size", where)
    moe: dict[str, Any] = {"num_experts": experts, "top_k": top_k, "expert_ffn_hidden_size": expert_ffn}
    if config.get("n_shared_experts"):
        moe["shared_experts"] = _size(config, "n_shared_experts", where)
    elif config.get("shared_expert_intermediate_size"):
        moe["shared_experts"] = max(1, round(_size(config, "shared_expert_intermediate_size", where) / expert_ffn))
    if config.get("first_k_dense_replace"):
        moe["first_dense_layers"] = _size(config, "first_k_dense_replace", where)
    return moe


def _mla(config: dict[str, Any], where: str | None) -> dict[str, Any] | None:
    """DeepSeek's multi-head latent attention dimensions, if the config has them."""
    if config.get("kv_lora_rank") is None:
        return None
    mla = {k: _size(config, k, where) for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}
    mla["q_lora_rank"] = _size(config, "q_lora_rank", where) if config.get("q_lora_rank") else 0
    return mla


#: model types whose config class sets sliding_window only with use_sliding_window true
_WINDOW_SWITCHED = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
#: windowed layers' period where a config has no layer_types (Gemma2Config and GptOssConfig:
#: every other layer from the first; Gemma3TextConfig: sliding_window_pattern, 6 by default)
_WINDOW_PERIOD = {"gemma2": ("", 2), "gpt_oss": ("", 2), "gemma3_text": ("sliding_window_pattern", 6)}


def _window(config: dict[str, Any], layers: int, where: str | None) -> dict[str, Any]:
    """sliding_window and sliding_window_pattern of the model: the window, and which layers it
    windows (every one, or all but each p-th: TransformerModel.windowed); empty without one."""
    model_type = config.get("model_type")
    if config.get("sliding_window") is None or model_type in _WINDOW_SWITCHED and not _flag(config, "use_sliding_window", False, where):
        return {}
    window = _size(config, "sliding_window", where)
    kinds, field = config.get("layer_types"), "layer_types"
    if kinds is None and model_type in _WINDOW_SWITCHED:  # Qwen2Config: the layers from max_window_layers on
        first, field = config.get("max_window_layers") or 0, "max_window_layers"
        if isinstance(first, bool) or not isinstance(first, int):
            raise MeshplanError(field, first, "a whole number of layers", hint=where)
        kinds = ["full_attention" if i < first else "sliding_attention" for i in range(layers)]
    if kinds is None:
        key, default = _WINDOW_PERIOD.get(model_type, ("", None))
        return {"sliding_window": window, "sliding_window_pattern": _size(config, key, where) if config.get(key) else default}
    valid = "a list of sliding_attention and full_attention, one per layer"
    if not isinstance(kinds, list) or len(kinds) != layers or not set(kinds) <= {"sliding_attention", "full_attention"}:
        raise MeshplanError("layer_types", kinds, valid, hint=where)
    if "sliding_attention" not in kinds:
        return {}
    windowed = [kind == "sliding_attention" for kind in kinds]
    for period in (None, *range(2, layers + 1)):
        if windowed == [period is None or (i + 1) % period != 0 for i in range(layers)]:
            return {"sliding_window": window, "sliding_window_pattern": period}
    value = config.get(field)
    raise MeshplanError(field, value, "0 or num_hidden_layers: meshplan windows every layer, or all but each p-th"
                        if field == "max_window_layers" else
                        f"{valid}, every layer windowed or full_attention every p-th layer (meshplan's sliding_window_pattern)",
                        hint=where)


def _size(config: dict[str, Any], key: str, where: str | None) -> int:
    """A positive integer from the config (a JSON float with an integer value is accepted)."""
    if key not in config or config[key] is None:
        raise MeshplanError(key, None, "this field is required in the config", hint=where)
    value = config[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise MeshplanError(key, config[key], "a positive integer", hint=where)
    return value


def _check_heads(spec: dict[str, Any], family: _Family, where: str | None) -> None:
    """The spec's shape checks, raised here so the error names the config key."""
    heads, kv = spec["num_attention_heads"], spec.get("num_kv_heads")
    if "head_dim" not in spec and spec["hidden_size"] % heads:
        raise MeshplanError(
            family.heads, heads, f"a divisor of {family.hidden} ({spec['hidden_size']}), or give head_dim",
            hint=where,
        )
    if kv is not None and heads % kv:
        raise MeshplanError("num_key_value_heads", kv, f"a divisor of {family.heads} ({heads})", hint=where)


def _flag(config: dict[str, Any], key: str, default: bool, where: str | None) -> bool:
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise MeshplanError(key, value, "true or false", hint=where)
    return value


def _activation_name(config: dict[str, Any], family: _Family) -> tuple[str, Any]:
    key = next((k for k in family.activation_keys if config.get(k) is not None), family.activation_keys[-1])
    return key, config.get(key) or family.default_activation


def _composite_activation(config: dict[str, Any], family: _Family) -> str | None:
    """gelu_new where the config names it (GPT-2's default): the activation the model's code
    writes as separate tensor ops (TransformerModel.activation_function); None for one kernel."""
    _, act = _activation_name(config, family)
    return "gelu_new" if isinstance(act, str) and act.lower() == "gelu_new" and not family.gated else None


def _ffn_type(config: dict[str, Any], family: _Family, where: str | None) -> str:
    key, act = _activation_name(config, family)
    if not isinstance(act, str):
        raise MeshplanError(key, act, "an activation name such as silu or gelu", hint=where)
    name = act.lower()
    if name in ("silu", "swish") and family.gated:
        return "swiglu"
    if name.startswith("gelu"):
        return "geglu" if family.gated else "gelu"
    if name == "relu" and not family.gated:
        return "relu"
    valid = "silu, swish or gelu*" if family.gated else "gelu* or relu"
    raise MeshplanError(key, act, f"one of {valid} for this model_type", hint=where)


def _norm(config: dict[str, Any], family: _Family) -> str:
    """The norm named by its epsilon key, else the one the family's architecture uses."""
    if "rms_norm_eps" in config:
        return "rmsnorm"
    if any(key in config for key in ("layer_norm_eps", "layer_norm_epsilon")):
        return "layernorm"
    return family.norm_default


def _model_id(model_id: str | None, path: Path | None, config: dict[str, Any]) -> str:
    if model_id:
        return model_id
    if path is not None:
        if path.name != "config.json" and path.stem:  # a config saved under its model's name
            return path.stem
        folder = path.parent
        # HF cache: .../models--ORG--NAME/snapshots/<commit>/config.json
        if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
            return folder.parent.parent.name.removeprefix("models--").replace("--", "/")
        if folder.name:
            return folder.name
    name = config.get("_name_or_path")
    if isinstance(name, str) and name.strip("/"):
        if name.startswith(("/", ".", "~")):  # a local path, not a hub repo id
            return Path(name).name or name
        return name
    return "custom"
