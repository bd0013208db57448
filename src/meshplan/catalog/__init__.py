"""The built-in catalog: devices, clusters, models, efficiency profiles and prices, stored as YAML data.

Every number in these files names its public source in a ``sources`` mapping next to it.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

import yaml

from meshplan.errors import MeshplanError, unknown_id
from meshplan.specs import Cluster, Device, Efficiency, TransformerModel
from meshplan.specs.base import build
from meshplan.specs.dlrm import DLRMModel
from meshplan.specs.profile import INLINE_PROFILE

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def _raw(kind: str) -> dict[str, dict]:
    text = resources.files(__package__).joinpath(f"{kind}.yaml").read_text()
    return yaml.load(text, Loader=_LOADER) or {}


def device_ids() -> list[str]:
    return sorted(_raw("devices"))


def cluster_ids() -> list[str]:
    return sorted(_raw("clusters"))


def model_ids() -> list[str]:
    return sorted(_raw("models"))


def dlrm_model_ids() -> list[str]:
    """DLRM recommenders (catalog/dlrm.yaml), kept apart from the transformer models."""
    return sorted(_raw("dlrm"))


@cache
def efficiency(profile: str) -> Efficiency:
    """A profile of efficiency.yaml, or one a measured profile put inline (specs/profile.py)."""
    if profile.startswith(INLINE_PROFILE):
        return build(Efficiency, json.loads(profile.removeprefix(INLINE_PROFILE)), "profile.efficiency")
    raw = _raw("efficiency")
    if profile not in raw:
        raise unknown_id("device.efficiency", profile, raw)
    return build(Efficiency, raw[profile], f"efficiency.{profile}")


def prices() -> dict:
    """The TCO price book (prices.yaml): defaults and per-cluster capital prices, with sources."""
    return _raw("prices")


@cache
def frameworks() -> dict[str, dict]:
    """Plan defaults per training framework (frameworks.yaml), without their sources or their
    per-device-family changes (framework_on)."""
    return {name: {k: v for k, v in entry.items() if k not in ("source", "families")} for name, entry in _raw("frameworks").items()}


#: other spellings of the catalog's framework names (SCHEMA.md's list is open-ended): Megatron-Bridge
#: runs Megatron-Core (the megatron-core preset is read from its performance recipes); mcore is
#: Megatron-Core's own short name; llmfoundry is llm-foundry's package name and Composer its
#: trainer (MosaicML's); FSDP runs of other trainers take PyTorch FSDP's defaults, as do PyTorch's own
#: training loops (DDP) and the trainers over them that run the model's modules eager (Hugging Face
#: Transformers, Accelerate and TRL; LitGPT); IBM's fms-fsdp is the Foundation Model Stack's
#: (fms, its model package's name); Megatron-DeepSpeed and GPT-NeoX run
#: Megatron's layers on DeepSpeed's engine (its pipeline engine and ZeRO); Megatron alone is the
#: Megatron-LM repository and its command-line defaults (--overlap-grad-reduce and the like are opt-in)
FRAMEWORK_ALIASES = {"megatron": "megatron-lm", "megatron-bridge": "megatron-core", "mcore": "megatron-core",
                     "llmfoundry": "llm-foundry", "composer": "llm-foundry", "mosaicml": "llm-foundry",
                     "mosaicml-composer": "llm-foundry", "mosaicml-llm-foundry": "llm-foundry",
                     "fsdp": "pytorch-fsdp", "fsdp2": "pytorch-fsdp", "pytorch-fsdp2": "pytorch-fsdp",
                     "pytorch": "pytorch-fsdp", "pytorch-ddp": "pytorch-fsdp", "ddp": "pytorch-fsdp",
                     "huggingface": "pytorch-fsdp", "hugging-face": "pytorch-fsdp", "hf": "pytorch-fsdp",
                     "transformers": "pytorch-fsdp", "hf-transformers": "pytorch-fsdp", "huggingface-transformers": "pytorch-fsdp",
                     "hugging-face-transformers": "pytorch-fsdp", "accelerate": "pytorch-fsdp", "hf-accelerate": "pytorch-fsdp",
                     "huggingface-accelerate": "pytorch-fsdp", "trl": "pytorch-fsdp", "litgpt": "pytorch-fsdp", "lit-gpt": "pytorch-fsdp",
                     "hf-trainer": "pytorch-fsdp", "huggingface-trainer": "pytorch-fsdp", "hugging-face-trainer": "pytorch-fsdp",
                     "transformers-trainer": "pytorch-fsdp", "lightning": "pytorch-fsdp", "pytorch-lightning": "pytorch-fsdp",
                     "lightning-fabric": "pytorch-fsdp",
                     "fms": "fms-fsdp", "foundation-model-stack": "fms-fsdp", "ibm-fms": "fms-fsdp", "ibm-fms-fsdp": "fms-fsdp",
                     "megatron-deepspeed": "deepspeed", "gpt-neox": "deepspeed", "nemo-megatron": "nemo",
                     # NeMo AutoModel, NeMo's PyTorch-native trainer: FSDP2 (fully_shard) and
                     # torch.distributed.pipelining as torchtitan builds them (its README), not Megatron
                     "nemo-automodel": "torchtitan", "automodel": "torchtitan"}


def framework_id(value) -> str | None:
    """The catalog framework ``value`` names, as the catalog spells it or another way
    (FRAMEWORK_ALIASES; any case, underscores or spaces for hyphens), or None."""
    if not isinstance(value, str):
        return None
    name = value.strip().lower().replace("_", "-").replace(" ", "-")
    name = FRAMEWORK_ALIASES.get(name, name)
    return name if name in frameworks() else None


def recipes(framework: str) -> list[dict]:
    """A framework's published recipes, where they set switches its preset does not
    (recipes.yaml: the entries a case from that framework's benchmarks matches)."""
    return list(_raw("recipes").get(framework) or [])


def framework_on(name: str, family: str) -> dict:
    """What a framework's defaults become on a device family (frameworks.yaml ``families``: a
    family whose published runs ran the framework otherwise); empty where nothing changes."""
    entry = _raw("frameworks").get(name) or {}
    return {k: v for k, v in (entry.get("families") or {}).get(family, {}).items() if k != "source"}


def _spec(kind: str, field: str, item_id: str, cls, resolve=None):
    """Build the spec of catalog entry ``item_id`` of ``kind``; unknown ids suggest close ones."""
    raw = _raw(kind)
    if item_id not in raw:
        raise unknown_id(field, item_id, raw)
    data = {"id": item_id, **raw[item_id]}
    if resolve:
        data = resolve(data)
    return build(cls, data, f"{kind}.{item_id}")


@cache
def device(device_id: str) -> Device:
    return _spec("devices", "device", device_id, Device)


@cache
def cluster(cluster_id: str) -> Cluster:
    return _spec("clusters", "cluster", cluster_id, Cluster, lambda data: {**data, "device": device(data["device"])})


@cache
def model(model_id: str) -> TransformerModel | DLRMModel:
    """A transformer from models.yaml, or a DLRM from dlrm.yaml."""
    if model_id in _raw("dlrm"):
        return dlrm_model(model_id)
    if model_id not in _raw("models"):
        raise unknown_id("model", model_id, [*_raw("models"), *_raw("dlrm")])
    return _spec("models", "model", model_id, TransformerModel)


@cache
def dlrm_model(model_id: str) -> DLRMModel:
    return _spec("dlrm", "model", model_id, DLRMModel)


def entry(kind: str, item_id: str) -> dict:
    """The raw catalog entry (with its sources), for ``meshplan catalog show``."""
    raw = _raw(kind)
    if item_id not in raw:
        raise unknown_id(kind.rstrip("s"), item_id, raw)
    return raw[item_id]


def find(item_id: str) -> tuple[str, dict]:
    """Look an id up in every kind of catalog entry; (kind, raw entry)."""
    for kind in ("devices", "clusters", "models"):
        if item_id in _raw(kind):
            return kind, _raw(kind)[item_id]
    if item_id in _raw("dlrm"):
        return "models", _raw("dlrm")[item_id]
    every = [*device_ids(), *cluster_ids(), *model_ids(), *dlrm_model_ids()]
    raise unknown_id("id", item_id, every)


__all__ = [
    "MeshplanError",
    "cluster",
    "cluster_ids",
    "device",
    "device_ids",
    "dlrm_model",
    "dlrm_model_ids",
    "efficiency",
    "entry",
    "find",
    "model",
    "model_ids",
]
