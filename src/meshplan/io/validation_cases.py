"""Read validation cases (shared/validation/SCHEMA.md, schema v1) and predict each one.

Unknown extra keys are kept and ignored. DLRM cases (``arch: dlrm``) run with MAD Max's default
strategy (embeddings model-parallel, dense layers data-parallel) unless ``parallelism`` gives one
(``strategy: "embedding=(mp) dense=(tp,ddp)"`` or ``embedding:``/``dense:`` lists).

Each case is checked and predicted on its own (SCHEMA.md, rules for readers): a case that is
malformed or cannot be predicted is reported with its id, the field and why (``error``), never
dropped silently, and the others are still scored. A measured step time must be a finite,
positive number. ``hardware.devices_per_node`` is honoured: the cluster's scale-up domain takes
that many devices (same per-device links; at most the catalog's node, a larger one is another
system), or the case is reported as an error. A run larger than the catalog cluster's
``max_devices`` (the largest such system listed) is predicted on more of the same nodes: the
measurement shows the system existed at that size. How a case's fields become estimate inputs
(spellings, framework eras, recipe switches) is meshplan.io.case_inputs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from meshplan import catalog
from meshplan.errors import MeshplanError
from meshplan.io.case_fields import option as _option, required as _get, word as _word
from meshplan.io.case_inputs import NODE, case_inputs, dlrm_case_inputs, framework_name
from meshplan.io.files import load_yaml_or_json
from meshplan.io.profile import load_profile
from meshplan.units import finite_number
from meshplan.io.recipes import name_key, recipe_switches
from meshplan.specs.model import family_defaults
from meshplan.specs.profile import Profile



@dataclass(frozen=True)
class CaseResult:
    id: str
    group: str
    measured_step_time_s: float | None
    predicted_step_time_s: float | None
    relative_error: float | None  # (predicted - measured) / measured
    error: str | None = None  # why the case could not be scored: "field: got value; what is valid"
    fits: bool | None = None
    note: str | None = None  # what the reader changed to score the case (a rounded batch)
    # where the case gives a measured peak (measured.peak_allocated_gib: PyTorch's
    # max_memory_allocated, in GiB): it and the predicted memory per device, in bytes
    measured_memory_bytes: float | None = None
    predicted_memory_bytes: float | None = None
    memory_error: float | None = None  # (predicted - measured) / measured memory per device

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    def _repr_html_(self) -> str:
        from meshplan.plots.notebook import cases_html

        return cases_html([self])


class CaseResults(list):
    """The cases of a validation file, in file order (a list that renders itself in notebooks)."""

    def _repr_html_(self) -> str:
        from meshplan.plots.notebook import cases_html

        return cases_html(self)


def load_cases(path: str | Path) -> list[dict]:
    data = load_yaml_or_json(path)
    if not isinstance(data, list):
        raise MeshplanError(str(path), type(data).__name__, "a validation file is a YAML list of cases (SCHEMA.md)")
    return data


def run_case(case: dict, index: int, profile: Profile | None = None) -> CaseResult:
    """Predict one case; a case that cannot be read or predicted comes back with ``error``.
    A measured ``profile`` replaces the catalog's for the cases on its device (on every case if
    it names none)."""
    if not isinstance(case, dict):
        return CaseResult(f"case-{index}", "ungrouped", None, None, None,
                          error=str(MeshplanError(f"case-{index}", case, "a mapping with id, group, model, ... (SCHEMA.md)")))
    case_id = _label(case.get("id"), f"case-{index}")
    group = _label(case.get("group"), "ungrouped")
    measured = None  # echoed next to an error only once it is known to be valid
    try:
        measured = _measured(case, case_id)
        peak = _measured_peak(case, case_id)
        predicted, fits, note, memory = _predict(case, case_id, profile)
    except MeshplanError as err:
        return CaseResult(case_id, group, measured, None, None, error=str(err))
    except Exception as err:  # noqa: BLE001 - one broken case must not stop the others
        return CaseResult(case_id, group, measured, None, None, error=f"internal error: {type(err).__name__}: {err}")
    peaks = dict(measured_memory_bytes=peak, predicted_memory_bytes=memory, memory_error=(memory - peak) / peak) if peak else {}
    return CaseResult(case_id, group, measured, predicted, (predicted - measured) / measured, fits=fits, note=note, **peaks)


def _label(value, default: str) -> str:
    """A case's id or group as text: a non-blank string, or a number written out; else ``default``."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return default


def _measured(case: dict, case_id: str) -> float:
    """The measured step time: a finite, positive number (SCHEMA.md)."""
    value = _get(case, "measured.step_time_s", case_id)
    if not finite_number(value) or value <= 0:
        raise MeshplanError(f"{case_id}.measured.step_time_s", value, "a finite, positive number of seconds")
    return float(value)


def _measured_peak(case: dict, case_id: str) -> float | None:
    """The measured peak memory per device in bytes, where the case gives one
    (``measured.peak_allocated_gib``, an extra key: PyTorch's torch.cuda.max_memory_allocated in
    GiB); it must then be a finite, positive number."""
    measured = case.get("measured")
    value = measured.get("peak_allocated_gib") if isinstance(measured, dict) else None
    if value is None:
        return None
    if not finite_number(value) or value <= 0:
        raise MeshplanError(f"{case_id}.measured.peak_allocated_gib", value, "a finite, positive number of GiB")
    return float(value) * 2**30


def _predict(case: dict, case_id: str, profile: Profile | None = None) -> tuple[float, bool, str | None, float]:
    """The predicted step time, whether the plan fits, what was changed to score the case, and
    the predicted memory per device."""
    from meshplan.api import estimate

    model = _get(case, "model", case_id)
    if not isinstance(model, dict):
        raise MeshplanError(f"{case_id}.model", model, "a mapping of model fields (SCHEMA.md)")
    arch = _word(_option(model, "arch", "dense"))
    if arch not in ("dense", "moe", "dlrm"):
        raise MeshplanError(f"{case_id}.model.arch", arch, "one of dense, moe, dlrm")
    for section in ("hardware", "batch", "parallelism"):
        if case.get(section) is not None and not isinstance(case[section], dict):
            raise MeshplanError(f"{case_id}.{section}", case[section], "a mapping (SCHEMA.md)")
    inputs = dlrm_case_inputs(case, case_id) if arch == "dlrm" else case_inputs(case, case_id)
    cluster = _cluster(case, case_id)
    if profile is not None and profile.device in (None, cluster.device.id):
        cluster = profile.apply(cluster)
    inputs["cluster"] = cluster
    if inputs["plan"].get("zero_shard_size") == NODE:  # hybrid sharding: shards inside each node
        inputs["plan"]["zero_shard_size"] = cluster.devices_per_node
    known = known_architecture(inputs["model"]) if arch != "dlrm" else None
    experts = _expert_data_parallel(inputs) if arch == "moe" else None
    scale, note = _whole_micro_batches(inputs) if arch != "dlrm" else (1.0, None)
    preset = _preset_note(case.get("framework"), inputs["plan"].get("framework")) if arch != "dlrm" else None
    recipe = _recipe_note(case) if arch != "dlrm" else None
    named = isinstance(case.get("parallelism"), dict) and any(
        case["parallelism"].get(k) is not None for k in ("attention_kernel", "attention_backend", "flash_attention", "use_flash_attn"))
    sdpa = ("SDPA's cuDNN attention, as PyTorch 2.11 and later pick it on Hopper and Blackwell"
            if arch != "dlrm" and not named and "attention_kernel" in inputs["plan"] and inputs["plan"]["attention_kernel"] is None
            else None)
    note = "; ".join(n for n in (known, experts, preset, recipe, sdpa, note) if n) or None
    try:
        result = estimate(**inputs)
    except MeshplanError as err:  # name the case in the field path
        raise MeshplanError(f"{case_id}.{err.field}", err.value, err.valid, hint=err.hint) from None
    return result.step_time_s * scale, result.fits, note, result.memory.total_bytes


def _preset_note(named, preset: str | None) -> str | None:
    """What the result says of the framework preset a case ran on: none for the name it gives,
    or one its source's version picked (framework_name); None where the name chose it."""
    if preset is None:
        return f"no preset for framework {named.strip()!r}: meshplan's defaults" if isinstance(named, str) and named.strip() else None
    return f"{preset} defaults, for the version its source names" if preset != framework_name(named) else None


def _recipe_note(case: dict) -> str | None:
    """The Megatron-Bridge recipe switches a case took (meshplan.io.recipes) beyond its own keys."""
    switches, _ = recipe_switches(case)
    own = case.get("parallelism") if isinstance(case.get("parallelism"), dict) else {}
    taken = {k: v for k, v in switches.items() if k not in own}
    if not taken:
        return None
    note = "Megatron-Bridge recipe: " + ", ".join(f"{k} {_switch_word(v)}" for k, v in taken.items())
    stage = own.get("zero_stage", 0)
    if taken.get("use_megatron_fsdp") is True and stage != 3:  # the run's sharding over the case's word
        note += f" (ZeRO-3, not the case's zero_stage {stage})"
    return note


def _switch_word(value) -> str:
    """A switch's value as a note writes it: true, false; a list joined by "+"."""
    if isinstance(value, bool):
        return str(value).lower()
    return "+".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


#: catalog model fields the case format has no place for (SCHEMA.md): the attention's latent
#: projections, the norm, the positions, the FFN's activation as the model's code writes it and
#: the sliding window, and in the moe block the routing's node limit (a DeepSeek-V3 step's
#: attention FLOPs and its expert traffic across nodes turn on them; an eager GPT-2 or Phi-2
#: step's elementwise time on gelu_new and rotary embeddings; gpt-oss's attention on its window)
_ARCHITECTURE_ONLY = ("mla", "norm", "rotary", "activation_function", "sliding_window", "sliding_window_pattern")
_MOE_ONLY = ("max_nodes",)


def known_architecture(model_data: dict) -> str | None:
    """Fill in, from the catalog, what the case format cannot say about a model the catalog
    knows: a case that names a catalog model (its id or name, ignoring case and punctuation)
    and repeats its layers, hidden size, heads and vocabulary (and its expert count) takes its
    multi-head latent attention, its norm and its node-limited routing, each cited in
    catalog/models.yaml. Returns a note saying so, or None where nothing was added."""
    name = name_key(str(model_data.get("name", "")))
    if not name:
        return None
    for model_id in catalog.model_ids():
        known = catalog.model(model_id)
        if name not in (name_key(model_id), name_key(known.name)) or getattr(known, "arch", None) not in ("dense", "moe"):
            continue
        dims = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size")
        if any(model_data.get(k) != getattr(known, k) for k in dims):
            return None
        moe = model_data.get("moe")
        if known.moe is not None and (not isinstance(moe, dict) or moe.get("num_experts") != known.moe.num_experts):
            return None  # not the catalog's experts (a malformed moe is the model's validation to name)
        left_out = family_defaults(model_data.get("ffn_type"))  # what the case's model takes without them
        added = [k for k in _ARCHITECTURE_ONLY if k not in model_data and getattr(known, k) != left_out.get(k, type(known).model_fields[k].default)]
        for key in added:
            model_data[key] = getattr(known, key).model_dump() if key == "mla" else getattr(known, key)
        if known.moe is not None and isinstance(model_data.get("moe"), dict):
            for key in _MOE_ONLY:
                if model_data["moe"].get(key) is None and getattr(known.moe, key) is not None:
                    model_data["moe"][key] = getattr(known.moe, key)
                    added.append(f"moe.{key}")
        return f"{', '.join(added)} from the catalog's {model_id}" if added else None
    return None


def _expert_data_parallel(inputs: dict) -> str | None:
    """An MoE case whose ``dp`` counts the replicas of each expert (Megatron-Core's expert data
    parallel size, the degree MoE plans often quote) where SCHEMA.md's counts those of the dense
    layers, devices / (tp x cp x pp). Where only that reading fills the devices, ``dp`` becomes
    the dense layers' degree: dp x ep when the experts keep the dense layers' tp x cp
    (tp x cp x pp x dp x ep = devices), dp x ep / (tp x cp) when the expert layers fold tp and cp
    into ep (pp x dp x ep = devices, Megatron-Core's expert_tensor_parallel_size 1). Returns a
    note saying so, or None where ``dp`` already fills the devices or neither reading does."""
    plan, devices = inputs["plan"], inputs["num_devices"]
    fields = (devices, plan["tp"], plan["cp"], plan["pp"], plan.get("dp"), plan["ep"])
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in fields) or plan["ep"] == 1:
        return None
    model_ranks, dp, ep = plan["tp"] * plan["cp"] * plan["pp"], plan["dp"], plan["ep"]
    if model_ranks * dp == devices:
        return None
    if model_ranks * dp * ep == devices:
        dense = dp * ep
    elif plan["pp"] * dp * ep == devices and (dp * ep) % (plan["tp"] * plan["cp"]) == 0:
        dense = dp * ep // (plan["tp"] * plan["cp"])
    else:
        return None
    plan["dp"] = dense
    return f"dp {dp} read as the experts' data-parallel degree (ep {ep}): the dense layers' dp is {dense}"


def _whole_micro_batches(inputs: dict) -> tuple[float, str | None]:
    """A published global batch within 5% of a whole number of micro-batches per data-parallel
    rank is rounded to it (GPT-NeoX-20B's paper says 1538 sequences of a run that took 1536: 32
    micro-batches of 4 on 12 ranks), and the step time scaled back to the published batch at the
    predicted throughput. Returns that scale and a note saying so. A batch further off is a plan
    that does not add up, left for ``estimate`` to refuse, as are plans it cannot read."""
    plan, devices = inputs["plan"], inputs["num_devices"]
    fields = (plan["global_batch_size"], plan["micro_batch_size"], devices, plan["tp"], plan["pp"], plan["cp"], plan.get("dp", 1))
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in fields):
        return 1.0, None
    model_ranks = plan["tp"] * plan["pp"] * plan["cp"]
    dp = plan.get("dp", devices // model_ranks)
    per_step = plan["micro_batch_size"] * dp
    if dp == 0 or devices % model_ranks or plan["global_batch_size"] % per_step == 0:
        return 1.0, None
    published = plan["global_batch_size"]
    rounded = max(1, round(published / per_step)) * per_step
    if abs(published - rounded) > 0.05 * rounded:
        return 1.0, None
    plan["global_batch_size"] = rounded
    return published / rounded, (f"global batch {published} rounded to {rounded} (micro-batch {plan['micro_batch_size']} x dp {dp}); "
                                 "the step time is scaled back to the published batch")


def _cluster(case: dict, case_id: str):
    """The catalog cluster, its scale-up domain resized to ``hardware.devices_per_node`` if given."""
    cluster_id = _word(_get(case, "hardware.cluster", case_id))
    if not isinstance(cluster_id, str):
        raise MeshplanError(f"{case_id}.hardware.cluster", cluster_id, f"a cluster id: {', '.join(catalog.cluster_ids())}")
    # an id written with other punctuation ("dgx_h100", "DGX H100") is the catalog's
    cluster_id = {name_key(known): known for known in catalog.cluster_ids()}.get(name_key(cluster_id), cluster_id)
    try:
        cluster = catalog.cluster(cluster_id)
    except MeshplanError as err:
        raise MeshplanError(f"{case_id}.hardware.cluster", cluster_id, err.valid, hint=err.hint) from None
    devices = case["hardware"].get("num_devices")
    if isinstance(devices, int) and not isinstance(devices, bool) and cluster.max_devices is not None and devices > cluster.max_devices:
        # a measured run shows the system was built that large: more of the same nodes and links
        cluster = cluster.model_copy(update={"max_devices": devices})
    per_node = case["hardware"].get("devices_per_node")
    if per_node is None or per_node == cluster.devices_per_node:
        return cluster
    if cluster.node_devices is not None and per_node == cluster.scale_up_devices:
        return cluster  # a node named by its scale-up domain: an NVL72 rack's 72 GPUs, a TPU v4 cube's 64 chips
    field = f"{case_id}.hardware.devices_per_node"
    if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
        raise MeshplanError(field, per_node, "a positive integer")
    levels = cluster.levels
    outer = levels[1].size if len(levels) > 1 else None
    whole_nodes = not isinstance(devices, int) or devices <= per_node or devices % per_node == 0
    if (cluster.node_devices is not None or len(levels) < 2 or not whole_nodes or per_node > cluster.devices_per_node
            or (outer is not None and (per_node >= outer or outer % per_node))):
        named = (f"{cluster.devices_per_node} devices per node ({cluster.scale_up_devices} in its {levels[0].name} domain, "
                 "which may also be given)" if cluster.node_devices is not None else f"{cluster.devices_per_node} devices per node")
        raise MeshplanError(
            field, per_node, f"{cluster_id} has {named}; a node of {per_node} is another system (give a cluster whose "
            "scale-up domain is that node, dividing its next network level and the device count)",
        )
    resized = (levels[0].model_copy(update={"size": per_node}), *levels[1:])
    return cluster.model_copy(update={"levels": resized, "id": f"{cluster_id} ({per_node} devices per node)"})


def validate(path: str | Path, progress=None, profile: str | Path | Profile | None = None) -> CaseResults:
    """Every case of the file, each scored on its own; a repeated id is reported as an error.
    ``profile``: a measured profile (``meshplan calibrate``) for the cases on its device."""
    measured = None if profile is None else load_profile(profile)
    cases = load_cases(path)
    results, seen = [], set()
    for index, case in enumerate(cases):
        result = run_case(case, index, measured)
        if result.id in seen:
            result = CaseResult(result.id, result.group, result.measured_step_time_s, None, None,
                                error=str(MeshplanError(f"{result.id}.id", result.id, "ids must be unique in a file")))
        seen.add(result.id)
        results.append(result)
        if progress:
            progress(index + 1, len(cases))
    return CaseResults(results)


def summarize(results: list[CaseResult]) -> dict[str, dict]:
    """Per group: cases scored, cases that failed, median and maximum absolute relative error,
    and the median signed one (the group's bias: below 0, predicted fast); None where no case of
    the group was scored. The same of memory per device (``memory_*``), over the cases that give
    a measured peak."""
    groups: dict[str, list[float]] = {}
    memory: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    for r in results:
        groups.setdefault(r.group, [])
        if r.relative_error is not None:
            groups[r.group].append(r.relative_error)
        else:
            failed[r.group] = failed.get(r.group, 0) + 1
        if r.memory_error is not None:
            memory.setdefault(r.group, []).append(r.memory_error)
    return {g: {"cases": len(errs), "failed": failed.get(g, 0), **_error_stats(errs, ""),
                **_error_stats(memory.get(g, []), "memory_"), "memory_cases": len(memory.get(g, []))}
            for g, errs in groups.items()}


def _error_stats(errs: list[float], prefix: str) -> dict[str, float | None]:
    """Median and largest absolute relative error and the median signed one (None without cases)."""
    return {f"{prefix}median_abs_error": statistics.median(map(abs, errs)) if errs else None,
            f"{prefix}max_abs_error": max(map(abs, errs), default=None),
            f"{prefix}median_error": statistics.median(errs) if errs else None}
