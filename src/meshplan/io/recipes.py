"""The Megatron-Core switches Megatron-Bridge's performance recipes set beyond the megatron-core
preset, for cases from its performance summary (catalog/recipes.yaml).

A row of the summary gives a run's model, system, precision, batch and layout; the recipe behind
it also chose the expert dispatcher and its overlap, Adam's moment dtype, activation offload and
CUDA graphs. A case whose source or framework names Megatron-Bridge, and whose source names the
NeMo container it ran in, takes the switches of every catalog entry it matches; the keys the case
gives itself win (meshplan.io.case_inputs), but for one: a recipe that ran Megatron-FSDP
(use_megatron_fsdp) shards everything whatever zero_stage the case says, since the table's FSDP
column, which the case format has no field for, says so too.
"""

from __future__ import annotations

import re

from meshplan import catalog

_CONTAINER = re.compile(r"container\s+(\d{2}\.\d{2}(?:\.\d{1,2})?)(?![\d.])", re.IGNORECASE)
_LAYOUT = {"tp": "tp", "pp": "pp", "vp": "virtual_pipeline_stages", "ep": "ep"}


def name_key(value) -> str:
    """A name with case, spaces and punctuation aside ("Qwen3 235B A22B" is "qwen3235ba22b")."""
    return re.sub(r"[^a-z0-9]", "", str(value).lower())


def _matches(entry: dict, case: dict, container: str) -> bool:
    model = case.get("model") if isinstance(case.get("model"), dict) else {}
    hardware = case.get("hardware") if isinstance(case.get("hardware"), dict) else {}
    par = case.get("parallelism") if isinstance(case.get("parallelism"), dict) else {}
    batch = case.get("batch") if isinstance(case.get("batch"), dict) else {}
    checks = (
        "model" not in entry or name_key(entry["model"]) == name_key(model.get("name", "")),
        "clusters" not in entry or name_key(hardware.get("cluster", "")) in {name_key(c) for c in entry["clusters"]},
        "containers" not in entry or container in entry["containers"],
        all(par.get(_LAYOUT[name], 1) == value for name, value in (entry.get("layout") or {}).items()),
        "zero_stage" not in entry or par.get("zero_stage", 0) == entry["zero_stage"],
        "precisions" not in entry or name_key(case.get("precision", "bf16")) in {name_key(p) for p in entry["precisions"]},
        "global_batch" not in entry or batch.get("global_batch_sequences") == entry["global_batch"],
    )
    return all(checks)


def recipe_switches(case: dict) -> tuple[dict, tuple[str, ...]]:
    """(switches, their sources) of the Megatron-Bridge recipe entries ``case`` matches; empty
    unless its source or framework names Megatron-Bridge and its source a NeMo container."""
    source = case.get("source")
    if not isinstance(source, str) or "megatronbridge" not in name_key(source) + name_key(case.get("framework", "")):
        return {}, ()
    found = _CONTAINER.search(source)
    if found is None:
        return {}, ()
    switches: dict = {}
    sources: list[str] = []
    for entry in catalog.recipes("megatron-bridge"):
        if _matches(entry, case, found.group(1)):
            switches.update(entry["switches"])
            sources.append(entry["source"])
    return switches, tuple(sources)
