"""Read validation cases (shared/validation/SCHEMA.md, schema v1) and predict each one.

Unknown extra keys are kept and ignored. DLRM cases (``arch: dlrm``) run with MAD Max's default
strategy (embeddings model-parallel, dense layers data-parallel) unless ``parallelism`` gives one
(``strategy: "embedding=(mp) dense=(tp,ddp)"`` or ``embedding:``/``dense:`` lists). Cases meshplan
cannot model yet are reported with a ``skipped`` reason, never dropped silently.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from meshplan import catalog
from meshplan.errors import MeshplanError
from meshplan.io.files import load_yaml_or_json
from meshplan.specs.dlrm import DLRMModel
from meshplan.specs.strategy import LAYER_KINDS

_MODEL_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
    "ffn_hidden_size", "ffn_type", "vocab_size", "tied_embeddings",
)


@dataclass(frozen=True)
class CaseResult:
    id: str
    group: str
    measured_step_time_s: float | None
    predicted_step_time_s: float | None
    relative_error: float | None  # (predicted - measured) / measured
    skipped: str | None = None
    fits: bool | None = None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _get(case: dict, path: str, where: str):
    node = case
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            raise MeshplanError(f"{where}.{path}", None, "this field is required by the validation schema")
        node = node[key]
    return node


def case_inputs(case: dict, where: str) -> dict:
    """Keyword arguments for ``meshplan.estimate`` from one dense or MoE case."""
    model = _get(case, "model", where)
    model_data = {k: model[k] for k in _MODEL_FIELDS if model.get(k) is not None}
    model_data["id"] = str(case.get("id", "case"))
    model_data["name"] = str(model.get("name", ""))
    if model.get("arch") == "moe":  # SCHEMA.md's moe block: experts, top_k, expert FFN, shared, leading dense
        moe = dict(_get(case, "model.moe", where))
        model_data["arch"] = "moe"
        model_data["moe"] = {
            "num_experts": moe.get("num_experts"),
            "top_k": moe.get("top_k"),
            "expert_ffn_hidden_size": moe.get("expert_ffn_hidden_size"),
            "shared_experts": moe.get("shared_experts", 0),
            "first_dense_layers": moe.get("first_dense_layers", 0),
        }
    batch = _get(case, "batch", where)
    par = case.get("parallelism") or {}
    hardware = _get(case, "hardware", where)
    plan = {
        "tp": par.get("tp", 1),
        "pp": par.get("pp", 1),
        "cp": par.get("cp", 1),
        "ep": par.get("ep", 1),
        "sequence_parallel": bool(par.get("sequence_parallel", False)),
        "virtual_pipeline_stages": par.get("virtual_pipeline_stages", 1),
        "zero_stage": par.get("zero_stage", 0),
        "recompute": par.get("activation_recompute", "none"),
        "micro_batch_size": _get(case, "batch.micro_batch_size", where),
        "global_batch_size": _get(case, "batch.global_batch_sequences", where),
        "seq_len": batch.get("seq_len"),
        "precision": case.get("precision", "bf16"),
    }
    if par.get("dp") is not None:
        plan["dp"] = par["dp"]
    return {
        "model": model_data,
        "cluster": _get(case, "hardware.cluster", where),
        "num_devices": hardware.get("num_devices"),
        "plan": plan,
    }


_DLRM_FIELDS = tuple(f for f in DLRMModel.model_fields if f not in ("arch", "id", "name", "sources"))


def dlrm_case_inputs(case: dict, where: str) -> dict:
    """Keyword arguments for ``meshplan.estimate`` from one DLRM case (SCHEMA.md, DLRM cases)."""
    model = _get(case, "model", where)
    model_data = {k: model[k] for k in _DLRM_FIELDS if model.get(k) is not None}
    model_data.update(arch="dlrm", id=str(case.get("id", "case")), name=str(model.get("name", "")))
    par = case.get("parallelism") or {}
    strategy = par.get("strategy") or {k: v for k, v in par.items() if k in LAYER_KINDS}
    batch = _get(case, "batch", where)
    if batch.get("global_batch_samples") is None and batch.get("per_gpu_batch") is not None:
        per_gpu, devices = batch["per_gpu_batch"], _get(case, "hardware.num_devices", where)
        plan = {"global_batch_size": per_gpu * devices if isinstance(per_gpu, int) and isinstance(devices, int) else per_gpu}
    else:
        plan = {"global_batch_size": _get(case, "batch.global_batch_samples", where)}
    if strategy:
        plan["strategy"] = strategy
    if case.get("precision"):
        plan["precision"] = case["precision"]  # the MLPs' matmul precision (SCHEMA.md)
    return {
        "model": model_data,
        "cluster": _get(case, "hardware.cluster", where),
        "num_devices": _get(case, "hardware.num_devices", where),
        "plan": plan,
    }


def load_cases(path: str | Path) -> list[dict]:
    data = load_yaml_or_json(path)
    if not isinstance(data, list):
        raise MeshplanError(str(path), type(data).__name__, "a validation file is a YAML list of cases (SCHEMA.md)")
    for index, case in enumerate(data):
        if not isinstance(case, dict):
            raise MeshplanError(f"{path}[{index}]", case, "each case is a mapping with id, group, model, ...")
    return data


def run_case(case: dict, index: int) -> CaseResult:
    from meshplan.api import estimate

    case_id = str(case.get("id", f"case-{index}"))
    group = str(case.get("group", "ungrouped"))
    measured = (case.get("measured") or {}).get("step_time_s")
    arch = (case.get("model") or {}).get("arch", "dense")
    if arch not in ("dense", "moe", "dlrm"):
        return CaseResult(case_id, group, measured, None, None, skipped=f"arch '{arch}' is not modelled yet")
    cluster_id = (case.get("hardware") or {}).get("cluster")
    if cluster_id not in catalog.cluster_ids():
        return CaseResult(case_id, group, measured, None, None, skipped=f"cluster '{cluster_id}' is not in the catalog")
    inputs = dlrm_case_inputs(case, case_id) if arch == "dlrm" else case_inputs(case, case_id)
    result = estimate(**inputs)
    error = None if not measured else (result.step_time_s - measured) / measured
    return CaseResult(case_id, group, measured, result.step_time_s, error, fits=result.fits)


def validate(path: str | Path) -> list[CaseResult]:
    return [run_case(case, i) for i, case in enumerate(load_cases(path))]


def summarize(results: list[CaseResult]) -> dict[str, dict]:
    """Per group: number of cases, median and maximum absolute relative error."""
    groups: dict[str, list[float]] = {}
    for r in results:
        if r.relative_error is not None:
            groups.setdefault(r.group, []).append(abs(r.relative_error))
    return {
        g: {"cases": len(errs), "median_abs_error": statistics.median(errs), "max_abs_error": max(errs)}
        for g, errs in groups.items()
    }
