"""The built-in catalog: devices, clusters, models and efficiency profiles, stored as YAML data.

Every number in these files names its public source in a ``sources`` mapping next to it.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml

from meshplan.errors import MeshplanError, unknown_id
from meshplan.specs import Cluster, Device, Efficiency, TransformerModel
from meshplan.specs.base import build

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


@cache
def efficiency(profile: str) -> Efficiency:
    raw = _raw("efficiency")
    if profile not in raw:
        raise unknown_id("device.efficiency", profile, raw)
    return build(Efficiency, raw[profile], f"efficiency.{profile}")


@cache
def device(device_id: str) -> Device:
    raw = _raw("devices")
    if device_id not in raw:
        raise unknown_id("device", device_id, raw)
    return build(Device, {"id": device_id, **raw[device_id]}, f"devices.{device_id}")


@cache
def cluster(cluster_id: str) -> Cluster:
    raw = _raw("clusters")
    if cluster_id not in raw:
        raise unknown_id("cluster", cluster_id, raw)
    data = dict(raw[cluster_id])
    data["device"] = device(data["device"])
    return build(Cluster, {"id": cluster_id, **data}, f"clusters.{cluster_id}")


@cache
def model(model_id: str) -> TransformerModel:
    raw = _raw("models")
    if model_id not in raw:
        raise unknown_id("model", model_id, raw)
    return build(TransformerModel, {"id": model_id, **raw[model_id]}, f"models.{model_id}")


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
    every = [*device_ids(), *cluster_ids(), *model_ids()]
    raise unknown_id("id", item_id, every)


__all__ = [
    "MeshplanError",
    "cluster",
    "cluster_ids",
    "device",
    "device_ids",
    "efficiency",
    "entry",
    "find",
    "model",
    "model_ids",
]
