"""Read validation cases (shared/validation/SCHEMA.md, schema v1) and predict each one.

Unknown extra keys are kept and ignored. DLRM cases (``arch: dlrm``) run with MAD Max's default
strategy (embeddings model-parallel, dense layers data-parallel) unless ``parallelism`` gives one
(``strategy: "embedding=(mp) dense=(tp,ddp)"`` or ``embedding:``/``dense:`` lists).

Each case is checked and predicted on its own (SCHEMA.md, rules for readers): a case that is
malformed or cannot be predicted is reported with its id, the field and why (``error``), never
dropped silently, and the others are still scored. A measured step time must be a finite,
positive number. ``hardware.devices_per_node`` is honoured: the cluster's scale-up domain takes
that many devices (same per-device links), or the case is reported as an error. A run larger
than the catalog cluster's ``max_devices`` (the largest such system listed) is predicted on more
of the same nodes: the measurement shows the system existed at that size.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from meshplan import catalog
from meshplan.errors import MeshplanError
from meshplan.io.files import load_yaml_or_json
from meshplan.io.profile import load_profile
from meshplan.specs.dlrm import DLRMModel
from meshplan.specs.profile import Profile
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
    error: str | None = None  # why the case could not be scored: "field: got value; what is valid"
    fits: bool | None = None
    note: str | None = None  # what the reader changed to score the case (a rounded batch)

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


def _get(case: dict, path: str, where: str):
    node = case
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            raise MeshplanError(f"{where}.{path}", None, "this field is required by the validation schema")
        node = node[key]
    return node


#: other spellings of the catalog's framework names (SCHEMA.md's list is open-ended): Megatron-Bridge
#: runs Megatron-Core (the megatron-core preset is read from its performance recipes); mcore is
#: Megatron-Core's own short name; llmfoundry is llm-foundry's package name and Composer its
#: trainer (MosaicML's); FSDP runs of other trainers take PyTorch FSDP's defaults; Megatron-DeepSpeed and GPT-NeoX run
#: Megatron's layers on DeepSpeed's engine (its pipeline engine and ZeRO)
_FRAMEWORK_ALIASES = {"megatron-bridge": "megatron-core", "mcore": "megatron-core", "llmfoundry": "llm-foundry",
                      "composer": "llm-foundry", "mosaicml": "llm-foundry", "mosaicml-composer": "llm-foundry",
                      "mosaicml-llm-foundry": "llm-foundry", "fsdp": "pytorch-fsdp", "fsdp2": "pytorch-fsdp",
                      "megatron-deepspeed": "deepspeed", "gpt-neox": "deepspeed", "nemo-megatron": "nemo"}


#: precisions as published tables and training flags spell them: (plan precision, FP8 scaling or
#: None for the framework's). Megatron-Bridge's performance tables write FP8-CS (current scaling),
#: FP8-DS (delayed), FP8-MX and MXFP8 (a scale per block of 32) and NVFP4 (per block of 16, OCP
#: MX and NVIDIA's NVFP4 formats); torchtitan and PyTorch say float8, bfloat16, float16
_PRECISION_ALIASES = {
    "fp8-cs": ("fp8", "current"), "fp8-ds": ("fp8", "delayed"), "fp8-mx": ("fp8", "block"), "mxfp8": ("fp8", "block"),
    "nvfp4": ("fp4", "nvfp4"), "mxfp4": ("fp4", "block"), "float8": ("fp8", None), "bfloat16": ("bf16", None),
    "float16": ("fp16", None), "float32": ("fp32", None),
}

#: activation_recompute as a yes/no flag (Megatron-LM's --checkpoint-activations, DeepSpeed's
#: activation_checkpointing): every layer recomputed, or none
_RECOMPUTE_FLAGS = {True: "full", False: "none"}


def _word(value):
    """A keyword as the schema spells it: text stripped and lower-cased ("BF16", "SwiGLU"); other
    values as given."""
    return value.strip().lower() if isinstance(value, str) else value


def _option(section: dict, key: str, default):
    """``section[key]``, or ``default`` where the key is absent or null (YAML's null is "not set":
    ``virtual_pipeline_stages: null`` is Megatron's None, no interleaving)."""
    value = section.get(key)
    return default if value is None else value


def _name(value):
    """A name as the catalog spells it: lower case, hyphens for underscores and spaces
    ("Megatron_Core", "PyTorch FSDP", "FP8_CS"); other values as given."""
    return _word(value).replace("_", "-").replace(" ", "-") if isinstance(value, str) else value


def _recompute(value):
    """activation_recompute: none | selective | full, or a yes/no flag (full or none)."""
    return _RECOMPUTE_FLAGS[value] if isinstance(value, bool) else _word(value)


#: NeMo's containers whose launcher ran the nemo-launcher preset (catalog/frameworks.yaml: it
#: turned cuDNN attention off from 24.01 to 24.07); NeMo 1.x is the toolkit version they carried
_NEMO_LAUNCHER_CONTAINERS = ((24, 1), (24, 7))
_NEMO_VERSION = re.compile(r"nemo(?![a-z])\D{0,40}?(?<![\d.])(\d{1,2})\.(\d{1,2})(?:\.\d+)?(?![\d.])", re.IGNORECASE)


def _nemo_era(text) -> str | None:
    """nemo-launcher or nemo from the first NeMo version ``text`` names (a container "24.07" or
    the toolkit's "1.23" / "2.0"); None where it names none."""
    match = _NEMO_VERSION.search(text) if isinstance(text, str) else None
    if match is None:
        return None
    major, minor = int(match.group(1)), int(match.group(2))
    if major < 20:  # the toolkit: NeMo 1.x is the launcher's, 2.x the recipes'
        return "nemo-launcher" if major == 1 else "nemo"
    first, last = _NEMO_LAUNCHER_CONTAINERS
    return "nemo-launcher" if first <= (major, minor) <= last else "nemo"


def framework_name(value, source=None) -> str | None:
    """The catalog framework a case's ``framework`` names, or None (meshplan's own defaults). A
    trailing version is not part of the name ("NeMo 2.0", "Megatron-LM v3", "DeepSpeed 0.9.2"),
    except NeMo's, which picks its era: containers 24.01-24.07 (NeMo 1.x) ran the launcher's
    defaults (``nemo-launcher``), later ones NeMo 2.0's recipes (``nemo``). NeMo named without a
    version takes it from the case's ``source``, where sources name the container they ran."""
    if not isinstance(value, str):
        return None
    for name in (_name(value), re.sub(r"-v?\d[\d.]*$", "", _name(value))):
        name = _FRAMEWORK_ALIASES.get(name, name)
        if name == "nemo":
            return _nemo_era(value) or _nemo_era(source) or name
        if name in catalog.frameworks():
            return name
    return None


#: Megatron-Core's token dispatchers (moe_token_dispatcher_type) -> Plan.ep_dispatch: alltoall
#: sends each token once per expert; flex (DeepEP, HybridEP) once per node and forwards it there
_DISPATCHERS = {"alltoall": "all_to_all", "flex": "hierarchical"}

#: Megatron-Core's exp_avg_dtype (the precision-aware optimizer, fp32 master weights) -> Plan.optimizer_state
_MOMENT_STATES = {"bf16": "bf16_moments", "bfloat16": "bf16_moments", "torch.bfloat16": "bf16_moments",
                  "fp32": "fp32", "float32": "fp32", "torch.float32": "fp32"}


def _ep_overlap(value):
    """Plan.ep_overlap from a case: meshplan's word, or Megatron-Core's boolean switch."""
    if isinstance(value, bool):
        return "paired" if value else "none"
    return _word(value)


def case_inputs(case: dict, where: str) -> dict:
    """Keyword arguments for ``meshplan.estimate`` from one dense or MoE case."""
    model = _get(case, "model", where)
    model_data = {k: _word(model[k]) if k == "ffn_type" else model[k] for k in _MODEL_FIELDS if model.get(k) is not None}
    model_data["id"] = str(case.get("id", "case"))
    model_data["name"] = str(model.get("name", ""))
    if _word(model.get("arch")) == "moe":  # SCHEMA.md's moe block: experts, top_k, expert FFN, shared, leading dense
        moe = dict(_get(case, "model.moe", where))
        if moe.get("expert_ffn_hidden_size") is None and model.get("ffn_hidden_size") is None:
            raise MeshplanError(f"{where}.model.moe.expert_ffn_hidden_size", None,
                                "each expert's FFN width, a positive integer (or model.ffn_hidden_size, which it defaults to)")
        model_data["arch"] = "moe"
        model_data["moe"] = {
            "num_experts": moe.get("num_experts"),
            "top_k": moe.get("top_k"),
            # Megatron-Core's default (TransformerConfig: moe_ffn_hidden_size falls back to
            # ffn_hidden_size), as HF's Mixtral config has one intermediate_size for its experts
            "expert_ffn_hidden_size": _option(moe, "expert_ffn_hidden_size", model.get("ffn_hidden_size")),
            "shared_experts": _option(moe, "shared_experts", 0),
            "first_dense_layers": _option(moe, "first_dense_layers", 0),
        }
    par = case.get("parallelism") or {}
    hardware = _get(case, "hardware", where)
    seq_len = _get(case, "batch.seq_len", where)  # the run's own: a model's default would be a guess
    if seq_len is None:
        raise MeshplanError(f"{where}.batch.seq_len", None, "the run's tokens per sequence, a positive integer")
    plan = {
        "tp": _option(par, "tp", 1),
        "pp": _option(par, "pp", 1),
        "cp": _option(par, "cp", 1),
        "ep": _option(par, "ep", 1),
        "sequence_parallel": bool(_option(par, "sequence_parallel", False)),
        "virtual_pipeline_stages": _option(par, "virtual_pipeline_stages", 1),
        "zero_stage": _option(par, "zero_stage", 0),
        "recompute": _recompute(_option(par, "activation_recompute", "none")),
        "micro_batch_size": _get(case, "batch.micro_batch_size", where),
        "global_batch_size": _get(case, "batch.global_batch_sequences", where),
        "seq_len": seq_len,
    }
    precision = _word(_option(case, "precision", "bf16"))
    plan["precision"], scaling = _PRECISION_ALIASES.get(_name(precision), (precision, None))
    if scaling:  # the recipe the precision names wins over the framework's default
        plan["fp4_scaling" if plan["precision"] == "fp4" else "fp8_scaling"] = scaling
    if par.get("dp") is not None:
        plan["dp"] = par["dp"]
    # an extra key (SCHEMA.md keeps them): the layout the run pinned, in Megatron-Core's syntax
    layout = _option(par, "pipeline_layout", par.get("pipeline_model_parallel_layout"))
    if layout is not None:
        plan["pipeline_layout"] = layout
    group = _option(par, "microbatch_group_size", par.get("microbatch_group_size_per_vp_stage"))
    if group is not None:  # and the interleaved group it ran (Megatron-Core's name too)
        plan["microbatch_group_size"] = group
    tp_overlap = _option(par, "tp_overlap", None)
    if tp_overlap is not None:  # how its tensor-parallel collectives ran (async TP: pipelined)
        plan["tp_overlap"] = _word(tp_overlap)
    ep_overlap = _option(par, "ep_overlap", par.get("moe_a2a_overlap", par.get("overlap_moe_expert_parallel_comm")))
    if ep_overlap is not None:  # the expert all-to-alls beside another micro-batch's compute (Megatron-Core's name too)
        plan["ep_overlap"] = _ep_overlap(ep_overlap)
    dispatch = _option(par, "ep_dispatch", par.get("moe_token_dispatcher_type"))
    if dispatch is not None:  # and the dispatcher that carried them
        plan["ep_dispatch"] = _DISPATCHERS.get(_word(dispatch), _word(dispatch))
    state = _option(par, "optimizer_state", None)
    moments = _word(par.get("exp_avg_dtype"))
    if state is None and moments is not None:  # Megatron-Core's precision-aware optimizer: its moments' dtype
        state = _MOMENT_STATES.get(moments, moments)
    if state is not None:  # how Adam kept its state
        plan["optimizer_state"] = _word(state)
    offloaded = _option(par, "activation_offload_layers", par.get("cpu_offloading_num_layers"))
    if offloaded is not None:  # layers whose activations wait in host memory (Megatron-Core's name too)
        plan["activation_offload_layers"] = offloaded
    graphs = _option(par, "cuda_graphs", None)
    if graphs is not None:  # the whole iteration replayed as CUDA graphs (Megatron-Core full_iteration)
        plan["cuda_graphs"] = _word(graphs)
    framework = framework_name(case.get("framework"), case.get("source"))
    if framework:  # its overlap defaults (SCHEMA.md); others run on meshplan's
        plan["framework"] = framework
    return {
        "model": model_data,
        "cluster": _word(_get(case, "hardware.cluster", where)),
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
        plan["precision"] = _word(case["precision"])  # the MLPs' matmul precision (SCHEMA.md)
    return {
        "model": model_data,
        "cluster": _word(_get(case, "hardware.cluster", where)),
        "num_devices": _get(case, "hardware.num_devices", where),
        "plan": plan,
    }


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
        predicted, fits, note = _predict(case, case_id, profile)
    except MeshplanError as err:
        return CaseResult(case_id, group, measured, None, None, error=str(err))
    except Exception as err:  # noqa: BLE001 - one broken case must not stop the others
        return CaseResult(case_id, group, measured, None, None, error=f"internal error: {type(err).__name__}: {err}")
    return CaseResult(case_id, group, measured, predicted, (predicted - measured) / measured, fits=fits, note=note)


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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise MeshplanError(f"{case_id}.measured.step_time_s", value, "a finite, positive number of seconds")
    return float(value)


def _predict(case: dict, case_id: str, profile: Profile | None = None) -> tuple[float, bool, str | None]:
    """The predicted step time, whether the plan fits, and what was changed to score the case."""
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
    known = known_architecture(inputs["model"]) if arch != "dlrm" else None
    scale, note = _whole_micro_batches(inputs) if arch != "dlrm" else (1.0, None)
    preset = _preset_note(case.get("framework"), inputs["plan"].get("framework")) if arch != "dlrm" else None
    note = "; ".join(n for n in (known, preset, note) if n) or None
    try:
        result = estimate(**inputs)
    except MeshplanError as err:  # name the case in the field path
        raise MeshplanError(f"{case_id}.{err.field}", err.value, err.valid, hint=err.hint) from None
    return result.step_time_s * scale, result.fits, note


def _preset_note(named, preset: str | None) -> str | None:
    """What the result says of the framework preset a case ran on: none for the name it gives,
    or one its source's version picked (framework_name); None where the name chose it."""
    if preset is None:
        return f"no preset for framework {named.strip()!r}: meshplan's defaults" if isinstance(named, str) and named.strip() else None
    return f"{preset} defaults, for the version its source names" if preset != framework_name(named) else None


def _normalized(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


#: catalog model fields the case format has no place for (SCHEMA.md): the attention's latent
#: projections and the norm, and in the moe block the routing's node limit (a DeepSeek-V3 step's
#: attention FLOPs and its expert traffic across nodes turn on them)
_ARCHITECTURE_ONLY = ("mla", "norm")
_MOE_ONLY = ("max_nodes",)


def known_architecture(model_data: dict) -> str | None:
    """Fill in, from the catalog, what the case format cannot say about a model the catalog
    knows: a case that names a catalog model (its id or name, ignoring case and punctuation)
    and repeats its layers, hidden size, heads and vocabulary (and its expert count) takes its
    multi-head latent attention, its norm and its node-limited routing, each cited in
    catalog/models.yaml. Returns a note saying so, or None where nothing was added."""
    name = _normalized(str(model_data.get("name", "")))
    if not name:
        return None
    for model_id in catalog.model_ids():
        known = catalog.model(model_id)
        if name not in (_normalized(model_id), _normalized(known.name)) or getattr(known, "arch", None) not in ("dense", "moe"):
            continue
        dims = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size")
        if any(model_data.get(k) != getattr(known, k) for k in dims):
            return None
        if known.moe is not None and (model_data.get("moe") or {}).get("num_experts") != known.moe.num_experts:
            return None
        added = [k for k in _ARCHITECTURE_ONLY if k not in model_data and getattr(known, k) != type(known).model_fields[k].default]
        for key in added:
            model_data[key] = getattr(known, key).model_dump() if key == "mla" else getattr(known, key)
        if known.moe is not None and isinstance(model_data.get("moe"), dict):
            for key in _MOE_ONLY:
                if model_data["moe"].get(key) is None and getattr(known.moe, key) is not None:
                    model_data["moe"][key] = getattr(known.moe, key)
                    added.append(f"moe.{key}")
        return f"{', '.join(added)} from the catalog's {model_id}" if added else None
    return None


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
    if (cluster.node_devices is not None or len(levels) < 2 or not whole_nodes
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
    """Per group: cases scored, cases that failed, median and maximum absolute relative error
    (None where no case of the group was scored)."""
    groups: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    for r in results:
        groups.setdefault(r.group, [])
        if r.relative_error is not None:
            groups[r.group].append(abs(r.relative_error))
        else:
            failed[r.group] = failed.get(r.group, 0) + 1
    return {
        g: {"cases": len(errs), "failed": failed.get(g, 0),
            "median_abs_error": statistics.median(errs) if errs else None, "max_abs_error": max(errs, default=None)}
        for g, errs in groups.items()
    }
