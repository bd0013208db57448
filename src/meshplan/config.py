"""Run configs: a YAML/JSON file plus ``--set a.b=c`` overrides, merged before validation."""

from __future__ import annotations

from meshplan.errors import MeshplanError
from meshplan.io.files import MalformedFile, load_yaml_or_json, parse_yaml

#: the top-level keys of a run config
RUN_KEYS = ("model", "cluster", "devices", "plan", "task", "space")


def load_config(path: str | None) -> dict:
    if path is None:
        return {}
    data = load_yaml_or_json(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise MeshplanError(str(path), type(data).__name__, f"a run config is a mapping with keys {', '.join(RUN_KEYS)}")
    unknown = sorted((key for key in data if key not in RUN_KEYS), key=str)
    if unknown:
        raise MeshplanError(f"{path}: {unknown[0]}", data[unknown[0]], f"unknown key; valid keys: {', '.join(RUN_KEYS)}")
    return data


def apply_override(config: dict, assignment: str) -> dict:
    """``plan.tp=4`` sets config['plan']['tp'] = 4 (the value is read as YAML: numbers, lists, ...)."""
    if "=" not in assignment:
        raise MeshplanError("--set", assignment, "expected KEY=VALUE, e.g. plan.tp=4")
    key, raw = assignment.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path or path[0] not in RUN_KEYS:
        raise MeshplanError("--set", assignment, f"the key must start with one of {', '.join(RUN_KEYS)}")
    try:
        value = parse_yaml(raw, f"--set {key.strip()}")
    except MalformedFile:
        value = raw
    out = dict(config)
    node = out
    for depth, part in enumerate(path[:-1]):
        child = node.get(part)
        if depth == 0 and isinstance(child, str) and part in ("model", "cluster"):
            child = _fields(part, child)
        child = dict(child) if isinstance(child, dict) else {}
        node[part] = child
        node = child
    node[path[-1]] = value
    return out


def _fields(key: str, name: str) -> dict:
    """The model or cluster a config names (a catalog id, a config.json path) as the mapping of
    its fields, so that ``--set model.seq_len=4096`` changes that one field of it."""
    from meshplan import api

    spec = api.resolve_model(name) if key == "model" else api.resolve_cluster(name)
    return spec.model_dump()
