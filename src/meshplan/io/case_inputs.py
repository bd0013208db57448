"""One validation case's fields (shared/validation/SCHEMA.md) as ``meshplan.estimate`` inputs.

Published tables spell the same thing many ways: frameworks ("Megatron-Bridge", "NeMo 24.07"),
precisions ("FP8-CS", "NVFP4", "bfloat16"), recompute flags, and the Megatron-Core switches a
recipe sets (dispatcher, expert all-to-all overlap, Adam's moments, activation offload), kept as
extra keys SCHEMA.md allows. Each is read here into a plan field, through the spellings of
``meshplan.io.case_words``; a value meshplan does not know is passed on, so the plan's own
validation names the field and what is valid.
"""

from __future__ import annotations

import re

from meshplan import catalog
from meshplan.errors import MeshplanError
from meshplan.io.case_fields import lookup as _lookup, option as _option, required as _get, word as _word
from meshplan.io.case_recompute import recompute_fields, recompute_word
from meshplan.io.case_words import (ATTENTION_KERNELS, DISPATCHERS, FFN_TYPES, MOMENT_STATES, PRECISION_ALIASES, PURE_BF16,
                                    SCHEDULES, TP_COMM_OVERLAP, UNFUSED_ATTENTION)
from meshplan.io.recipes import name_key, recipe_switches
from meshplan.specs.dlrm import DLRMModel
from meshplan.specs.dlrm_scenario import dlrm_framework
from meshplan.specs.model import ACTIVATION_FFN_TYPES
from meshplan.specs.strategy import LAYER_KINDS

_MODEL_FIELDS = (
    "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim",
    "ffn_hidden_size", "ffn_type", "vocab_size", "tied_embeddings", "sliding_window", "sliding_window_pattern",
)


def _name(value):
    """A name as the catalog spells it: lower case, hyphens for underscores and spaces
    ("Megatron_Core", "PyTorch FSDP", "FP8_CS"); other values as given."""
    return _word(value).replace("_", "-").replace(" ", "-") if isinstance(value, str) else value


#: the keys a case may say torch.compile ran under (SCHEMA.md keeps extra keys), at its top level
#: or with its parallelism: torchtitan's job config calls it compile, others torch_compile
_COMPILE_KEYS = ("compiled", "torch_compile", "compile")
_SWITCH_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def _switch(value):
    """A flag as a case may spell it: a bool, a word (true/yes/on, false/no/off) or an
    environment variable's 1/0; other values as given, for the plan's validation to name."""
    if isinstance(value, str):
        return _SWITCH_WORDS.get(_word(value), {"1": True, "0": False}.get(value.strip(), value))
    return {1: True, 0: False}.get(value, value) if type(value) is int else value


def _fusion(case: dict, par: dict, where: str) -> str | None:
    """The plan's ``fusion`` where the case says how its norms and rotary embeddings ran: a
    ``fusion`` key, whether torch.compile ran (fused) or not (eager), or the framework so
    qualified ("torchtitan (torch.compile)", "FSDP (eager)"); None where it says none of these,
    for the framework's default."""
    for section in (par, case):
        if section.get("fusion") is not None:
            return _word(section["fusion"])
        for key in _COMPILE_KEYS:
            value = section.get(key)
            if value is None:
                continue
            flag = _SWITCH_WORDS.get(_word(value)) if isinstance(value, str) else value
            if not isinstance(flag, bool):
                raise MeshplanError(f"{where}.{key}", value, "true or false: whether the run's model ran under torch.compile")
            return "fused" if flag else "eager"
    framework = case.get("framework")
    said = " ".join(_qualifiers(framework)[1:]).lower() if isinstance(framework, str) else ""  # "torchtitan (torch.compile)"
    if re.search(r"\b(no|without)[ -]+(torch\.)?compile|\beager\b", said):
        return "eager"
    return "fused" if "compile" in said else None


#: sharding strategies as PyTorch FSDP (ShardingStrategy), fms-fsdp and Accelerate name them
#: (keyed by name_key): the ZeRO stage, and whether the shards stay inside a node, replicated
#: across nodes (HYBRID_SHARD, fms-fsdp's "hsdp": Plan.zero_shard_size the node's devices)
_SHARDING = {"fullshard": (3, False), "fsdp": (3, False), "hybridshard": (3, True), "hsdp": (3, True),
             "shardgradop": (2, False), "hybridshardzero2": (2, True), "noshard": (0, False), "ddp": (0, False)}
_SHARDING_KEYS = ("sharding_strategy", "fsdp_sharding_strategy")
#: Plan.zero_shard_size's stand-in for "the node's devices", which the cluster resolves
NODE = "node"


def _sharding(case: dict, par: dict, plan: dict, where: str) -> None:
    """Hybrid sharding where the case says it: ``zero_shard_size``; torchtitan's
    data_parallel_shard_degree under a data_parallel_replicate_degree above 1; or a sharding
    strategy by name, as a key or qualifying the framework ("PyTorch FSDP (HSDP)"): HYBRID_SHARD's
    shards the node's devices; its ZeRO stage where the case gives none."""
    size = _option(par, "zero_shard_size", None)
    replicas = par.get("data_parallel_replicate_degree")
    if size is None and isinstance(replicas, int) and not isinstance(replicas, bool) and replicas > 1:
        size = par.get("data_parallel_shard_degree")
    if size is not None:
        plan["zero_shard_size"] = size
        return
    said = [(key, section[key]) for section in (par, case) for key in _SHARDING_KEYS if section.get(key) is not None]
    framework = case.get("framework")
    if not said and isinstance(framework, str):
        said = [("framework", q) for q in _qualifiers(framework)[1:] if name_key(q) in _SHARDING]
    if not said:
        return
    key, name = said[0]
    known = _SHARDING.get(name_key(name)) if isinstance(name, str) else None
    if known is None:
        raise MeshplanError(f"{where}.{key}", name, "one of FULL_SHARD, HYBRID_SHARD (HSDP), SHARD_GRAD_OP, _HYBRID_SHARD_ZERO2, NO_SHARD")
    if par.get("zero_stage") is None:
        plan["zero_stage"] = known[0]
    if known[1]:
        plan["zero_shard_size"] = NODE


#: a case's norm and positions, as configs write them (SCHEMA.md keeps extra keys; keyed by
#: name_key): the norm by name (Hugging Face's rms_norm_eps names RMSNorm), the positions by kind
#: (Hugging Face's position_embedding_type, GPT-NeoX's pos_emb): rotary, or learned, ALiBi or none
_NORMS = {"rmsnorm": "rmsnorm", "layernorm": "layernorm"}
_POSITIONS = {"rope": True, "rotary": True, "learned": False, "absolute": False, "alibi": False, "none": False}
_POSITION_KEYS = ("position_embedding", "position_embedding_type", "pos_emb", "positional_encoding")


#: keys a config names the FFN's activation by (Hugging Face: GPT-2's activation_function, the
#: Llama family's hidden_act), and the activations by name_key (ACT2FN's "swish" is silu)
_ACTIVATION_KEYS = ("activation_function", "hidden_act")
_ACTIVATIONS = {name_key(name): name for name in ACTIVATION_FFN_TYPES} | {"swish": "silu"}


def _architecture(model: dict, where: str) -> dict:
    """The model's ``norm``, ``rotary`` and ``activation_function`` where the case says them;
    otherwise they follow its FFN (specs.model.family_defaults) or the catalog model it names."""
    out = {}
    said = [(k, model[k]) for k in _ACTIVATION_KEYS if model.get(k) is not None]
    if said:
        key, value = said[0]
        name = _ACTIVATIONS.get(name_key(value)) if isinstance(value, str) else None
        if name is None:
            raise MeshplanError(f"{where}.model.{key}", value, f"one of {', '.join(ACTIVATION_FFN_TYPES)}")
        out["activation_function"] = name
    if model.get("norm") is not None:
        norm = _NORMS.get(name_key(model["norm"])) if isinstance(model["norm"], str) else None
        if norm is None:
            raise MeshplanError(f"{where}.model.norm", model["norm"], "rmsnorm or layernorm")
        out["norm"] = norm
    said = [(k, model[k]) for k in ("rotary", *_POSITION_KEYS) if model.get(k) is not None]
    if said:
        key, value = said[0]
        rotary = value if key == "rotary" else (_POSITIONS.get(name_key(value)) if isinstance(value, str) else None)
        if not isinstance(rotary, bool):
            valid = "true or false" if key == "rotary" else "rope (rotary), learned, absolute, alibi or none"
            raise MeshplanError(f"{where}.model.{key}", value, valid)
        out["rotary"] = rotary
    return out


def _zero_stage(value) -> bool:
    """Whether ``value`` is a ZeRO stage as the schema writes one, 0 to 3 (another is left for
    the plan's validation to name, not overridden)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3


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


#: the first PyTorch release whose SDPA prefers cuDNN's attention on Hopper and Blackwell: 2.10's
#: sdp_utils.cpp check_prefer_cudnn_attention orders cuDNN first on sm90 and sm100 where cuDNN is
#: past 9.15, and 2.11's wheels are the first to bundle one (catalog/frameworks.yaml, pytorch-fsdp)
SDPA_CUDNN_FROM = (2, 11)
_TORCH_VERSION = re.compile(r"(?<![a-z])(?:pytorch|torch)[\s=v-]{0,3}(\d)\.(\d{1,2})(?![\d])", re.IGNORECASE)


def torch_version(*texts) -> tuple[int, int] | None:
    """The first PyTorch version the texts name ("PyTorch 2.11.0+cu130", "torch==2.5.1")."""
    for text in texts:
        match = _TORCH_VERSION.search(text) if isinstance(text, str) else None
        if match:
            return int(match.group(1)), int(match.group(2))
    return None


def sdpa_prefers_cudnn(preset: str, *texts) -> bool:
    """Whether a run on a preset whose attention is PyTorch SDPA's FlashAttention-2 ran cuDNN's
    instead: its framework or source names PyTorch 2.11 or later (SDPA_CUDNN_FROM)."""
    from meshplan import catalog

    version = torch_version(*texts)
    return (version is not None and version >= SDPA_CUDNN_FROM
            and catalog.frameworks().get(preset, {}).get("attention_kernel") == "flash2")


def _qualifiers(value: str) -> list[str]:
    """A framework as sources qualify it, split into its name and what follows: "torchtitan
    (torch.compile)", "FSDP2 + torch.compile", "PyTorch FSDP, HSDP", "Megatron-LM with ZeRO"."""
    return [part.strip() for part in re.split(r"[(),+;/]|\s(?=with(?:out)?\s)", value) if part.strip()] or [value]


def framework_name(value, source=None) -> str | None:
    """The catalog framework a case's ``framework`` names, or None (meshplan's own defaults). A
    trailing version is not part of the name ("NeMo 2.0", "Megatron-LM v3", "DeepSpeed 0.9.2"),
    except NeMo's, which picks its era: containers 24.01-24.07 (NeMo 1.x) ran the launcher's
    defaults (``nemo-launcher``), later ones NeMo 2.0's recipes (``nemo``). NeMo named without a
    version takes it from the case's ``source``, where sources name the container they ran."""
    if not isinstance(value, str):
        return None
    lead = _name(_qualifiers(value)[0])  # "torchtitan (torch.compile)", "FSDP2 + torch.compile"
    for name in (_name(value), re.sub(r"-v?\d[\d.]*$", "", _name(value)), lead, re.sub(r"-v?\d[\d.]*$", "", lead)):
        name = catalog.FRAMEWORK_ALIASES.get(name, name)
        if name == "nemo":
            return _nemo_era(value) or _nemo_era(source) or name
        if name in catalog.frameworks():
            return name
    return None


def _ep_overlap(value):
    """Plan.ep_overlap from a case: meshplan's word, or Megatron-Core's boolean switch."""
    if isinstance(value, bool):
        return "paired" if value else "none"
    return _word(value)


def case_inputs(case: dict, where: str) -> dict:
    """Keyword arguments for ``meshplan.estimate`` from one dense or MoE case."""
    model = _get(case, "model", where)
    model_data = {k: model[k] for k in _MODEL_FIELDS if model.get(k) is not None}
    if isinstance(model_data.get("ffn_type"), str):
        model_data["ffn_type"] = FFN_TYPES.get(name_key(model_data["ffn_type"]), _word(model_data["ffn_type"]))
    model_data.update(_architecture(model, where))
    model_data["id"] = str(case.get("id", "case"))
    model_data["name"] = str(model.get("name", ""))
    if _word(model.get("arch")) == "moe":  # SCHEMA.md's moe block: experts, top_k, expert FFN, shared, leading dense
        moe = _get(case, "model.moe", where)
        if not isinstance(moe, dict):
            raise MeshplanError(f"{where}.model.moe", moe, "a mapping of the experts' fields (num_experts, top_k, ...)")
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
    if isinstance(par, dict):  # a Megatron-Bridge recipe's switches, under the case's own keys
        par = {**recipe_switches(case)[0], **par}
    # multi-token-prediction modules trained with it: the model's (Hugging Face's name too), or
    # the run's (Megatron-Core's mtp_num_layers)
    mtp = _option(model, "mtp_layers", model.get("num_nextn_predict_layers"))
    if mtp is None and isinstance(par, dict):
        mtp = par.get("mtp_num_layers")
    if mtp is not None:
        model_data["mtp_layers"] = mtp
    hardware = _get(case, "hardware", where)
    seq_len = _get(case, "batch.seq_len", where)  # the run's own: a model's default would be a guess
    if seq_len is None:
        raise MeshplanError(f"{where}.batch.seq_len", None, "the run's tokens per sequence, a positive integer")
    plan = {
        "tp": _option(par, "tp", 1),
        "pp": _option(par, "pp", 1),
        "cp": _option(par, "cp", 1),
        "ep": _option(par, "ep", 1),
        "sequence_parallel": _option(par, "sequence_parallel", False),
        "virtual_pipeline_stages": _option(par, "virtual_pipeline_stages", 1),
        "zero_stage": _option(par, "zero_stage", 0),
        "recompute": recompute_word(_option(par, "activation_recompute", "none")),
        "micro_batch_size": _get(case, "batch.micro_batch_size", where),
        "global_batch_size": _get(case, "batch.global_batch_sequences", where),
        "seq_len": seq_len,
    }
    precision = _word(_option(case, "precision", "bf16"))
    plan["precision"], scaling = PRECISION_ALIASES.get(name_key(precision), (precision, None))
    if scaling:  # the recipe the precision names wins over the framework's default
        plan["fp4_scaling" if plan["precision"] == "fp4" else "fp8_scaling"] = scaling
    if name_key(precision) in PURE_BF16:  # bf16 weights, gradients and Adam state, no fp32 master
        plan.update(optimizer_state="bf16", grad_reduce_precision="bf16")
    if par.get("dp") is not None:
        plan["dp"] = par["dp"]
    # an extra key (SCHEMA.md keeps them): the layout the run pinned, in Megatron-Core's syntax
    layout = _option(par, "pipeline_layout", par.get("pipeline_model_parallel_layout"))
    if layout is not None:
        plan["pipeline_layout"] = layout
    attention = _option(par, "attention_kernel", par.get("attention_backend"))
    if attention is not None and name_key(attention) in UNFUSED_ATTENTION:  # scores in HBM, no flash kernel
        plan["flash_attention"] = False
    elif attention is not None:  # the attention kernel the run names (an extra key)
        plan["attention_kernel"] = _lookup(ATTENTION_KERNELS, name_key(attention), _word(attention))
    flash = _option(par, "flash_attention", par.get("use_flash_attn"))
    if flash is not None:  # whether the run's attention was flash-fused (Megatron-LM's --use-flash-attn)
        plan["flash_attention"] = _SWITCH_WORDS.get(_word(flash), flash) if isinstance(flash, str) else flash
    hadamard = _switch(par.get("fp4_hadamard"))
    disabled = _switch(par.get("nvfp4_disable_rht"))
    if hadamard is None and isinstance(disabled, bool):  # Transformer Engine's NVTE_NVFP4_DISABLE_RHT
        hadamard = not disabled
    elif hadamard is None and disabled is not None:
        raise MeshplanError(f"{where}.parallelism.nvfp4_disable_rht", disabled, "true or false (1 or 0)")
    if hadamard is not None:  # NVFP4's Hadamard transform of the weight gradient's operands
        plan["fp4_hadamard"] = hadamard
    schedule = _option(par, "schedule", par.get("pipeline_schedule"))
    if schedule is not None:  # the pipeline schedule the run names (an extra key)
        plan["schedule"] = _lookup(SCHEDULES, name_key(schedule), _word(schedule))
    group = _option(par, "microbatch_group_size", par.get("microbatch_group_size_per_vp_stage"))
    if group is not None:  # and the interleaved group it ran (Megatron-Core's name too)
        plan["microbatch_group_size"] = group
    tp_overlap = _option(par, "tp_overlap", TP_COMM_OVERLAP.get(par.get("tp_comm_overlap")))
    if tp_overlap is not None:  # how its tensor-parallel collectives ran (async TP: pipelined)
        plan["tp_overlap"] = _word(tp_overlap)
    ep_overlap = _option(par, "ep_overlap", par.get("moe_a2a_overlap", par.get("overlap_moe_expert_parallel_comm")))
    if ep_overlap is not None:  # the expert all-to-alls beside another micro-batch's compute (Megatron-Core's name too)
        plan["ep_overlap"] = _ep_overlap(ep_overlap)
    expert_tp = _option(par, "expert_tp", par.get("expert_tensor_parallel_size"))
    if expert_tp is not None:  # tensor parallelism inside each routed expert (Megatron-Core's name too)
        plan["expert_tp"] = expert_tp
    dispatch = _option(par, "ep_dispatch", par.get("moe_token_dispatcher_type"))
    if dispatch is not None:  # and the dispatcher that carried them
        plan["ep_dispatch"] = _lookup(DISPATCHERS, _word(dispatch), _word(dispatch))
    stored = _option(par, "fp8_params", par.get("fp8_param_gather", par.get("fp4_param_gather")))
    if stored is not None:  # FP8/FP4 primary weights (Megatron-Core's fp8_param_gather, fp4_param_gather)
        plan["fp8_params"] = stored
    fp8_attention = _switch(_option(par, "fp8_attention", par.get("fp8_dot_product_attention", par.get("fp8_dpa"))))
    if fp8_attention is not None:  # attention in FP8 too (Megatron-Bridge's fp8_dot_product_attention, NeMo's FP8_DPA)
        plan["fp8_attention"] = fp8_attention
    implementation = _option(par, "optimizer_impl", None)
    if implementation is not None:  # how its optimizer step ran: fused, or PyTorch's foreach
        plan["optimizer_impl"] = _word(implementation)
    state = _option(par, "optimizer_state", None)
    moments = _word(par.get("exp_avg_dtype"))
    if state is None and moments is not None:  # Megatron-Core's precision-aware optimizer: its moments' dtype
        state = _lookup(MOMENT_STATES, moments, moments)
    if state is not None:  # how Adam kept its state
        plan["optimizer_state"] = _word(state)
    # Megatron-FSDP, as Bridge's recipes run it: optim_grads_params shards weights, gradients and
    # optimizer state
    if _option(par, "use_megatron_fsdp", False) is True and _zero_stage(plan["zero_stage"]):
        plan["zero_stage"] = 3
    offloaded = _option(par, "activation_offload_layers", par.get("cpu_offloading_num_layers"))
    if offloaded is not None:  # layers whose activations wait in host memory (Megatron-Core's name too)
        plan["activation_offload_layers"] = offloaded
    recompute_fields(par, plan, model_data.get("num_layers"), where)
    grad_reduce = _option(par, "overlap_grad_reduce", None)
    if grad_reduce is not None:  # gradients reduced beside the last backward, or after it
        plan["overlap_grad_reduce"] = grad_reduce
    bucket = _option(par, "grad_bucket_size", par.get("ddp_bucket_size", par.get("bucket_size")))
    if bucket is not None:  # parameters per gradient bucket (Megatron-Core's --ddp-bucket-size, MLPerf's BUCKET_SIZE)
        plan["grad_bucket_size"] = bucket
    graphs = _option(par, "cuda_graphs", None)
    if graphs is not None:  # the whole iteration replayed as CUDA graphs (Megatron-Core full_iteration)
        plan["cuda_graphs"] = _word(graphs)
    fused_loss = _option(par, "fused_loss", par.get("cross_entropy_loss_fusion"))
    if fused_loss is not None:  # the loss as one fused kernel (Megatron-Core's name too)
        plan["fused_loss"] = fused_loss
    _sharding(case, par, plan, where)
    fusion = _fusion(case, par, where)
    if fusion is not None:  # its norms and rotary embeddings fused (torch.compile) or eager
        plan["fusion"] = fusion
    framework = framework_name(case.get("framework"), case.get("source"))
    if framework:  # its overlap defaults (SCHEMA.md); others run on meshplan's
        plan["framework"] = framework
        if "attention_kernel" not in plan and sdpa_prefers_cudnn(framework, case.get("framework"), case.get("source")):
            plan["attention_kernel"] = None  # the device family's newest: cuDNN's on Hopper and Blackwell
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
    if case.get("precision") is not None:
        plan["precision"] = _word(case["precision"])  # the MLPs' matmul precision (SCHEMA.md)
    trainer = dlrm_framework(case.get("framework"))
    if trainer:
        plan["framework"] = trainer
    return {
        "model": model_data,
        "cluster": _word(_get(case, "hardware.cluster", where)),
        "num_devices": _get(case, "hardware.num_devices", where),
        "plan": plan,
    }
