"""A DLRM scenario: model x cluster x devices x per-layer-kind strategy x batch, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import TypeAdapter, ValidationError

from meshplan.errors import MeshplanError
from meshplan.specs.base import Count, build, from_validation_error
from meshplan.specs.cluster import Cluster
from meshplan.specs.dlrm import DLRMModel
from meshplan.specs.strategy import Strategy

#: the plan fields a DLRM takes (parallelism is the per-layer-kind strategy, not tp/pp/dp)
DLRM_PLAN_FIELDS = ("strategy", "global_batch_size", "precision", "framework")
#: how a DLRM trainer exchanges embeddings and reduces gradients (meshplan.parallel.strategy):
#: "torchrec", the default (TorchRec's flat all-to-alls over NCCL, PyTorch DDP's gradient
#: buckets); "hugectr" (NVIDIA Merlin HugeCTR: hierarchical exchange across nodes, fp16 pooled
#: embeddings under mixed precision, one grouped gradient all-reduce)
DLRM_FRAMEWORKS = ("torchrec", "hugectr")
MATMUL_PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
_COUNT = TypeAdapter(Count)


@dataclass(frozen=True)
class DLRMScenario:
    model: DLRMModel
    cluster: Cluster
    num_devices: int
    strategy: Strategy
    global_batch_size: int  # samples per iteration
    precision: str  # the MLPs' matmul precision
    task: str = "pretrain"  # or "inference": forward only, no gradients or optimizer state
    framework: str = "torchrec"  # one of DLRM_FRAMEWORKS


def _count(field: str, value: object) -> int:
    if isinstance(value, bool):
        raise MeshplanError(field, value, "must be a positive integer")
    try:
        return _COUNT.validate_python(value)
    except ValidationError as err:
        raise from_validation_error(err, field) from None


def default_precision(model: DLRMModel, cluster: Cluster) -> str:
    """fp32 MLP weights run their GEMMs in TF32 where the device has it (MAD Max's artifact picks
    the device's f32 rate, 156 TFLOP/s on A100 = TF32), 16-bit weights in fp16 or bf16."""
    peaks = cluster.device.peak_flop_per_s
    if model.bytes_per_dense_param >= 4:
        return "tf32" if "tf32" in peaks else "fp32"
    return "fp16" if "fp16" in peaks else "bf16"


def dlrm_framework(name: object) -> str | None:
    """The DLRM trainer a free-text framework names ("NVIDIA Merlin HugeCTR 24.04", "hugectr",
    "TorchRec"); None for any other."""
    if not isinstance(name, str):
        return None
    lowered = name.lower()
    if "hugectr" in lowered or "merlin" in lowered:
        return "hugectr"
    return "torchrec" if "torchrec" in lowered else None


def make_dlrm_scenario(model: DLRMModel, cluster: Cluster, plan: dict, num_devices: object, task: object = None) -> DLRMScenario:
    """Check a DLRM run; errors name the field (``plan.global_batch_size``, ``strategy``, ...)."""
    for key, value in plan.items():
        if key not in DLRM_PLAN_FIELDS:
            raise MeshplanError(
                f"plan.{key}", value,
                f"DLRM models take plan fields {', '.join(DLRM_PLAN_FIELDS)}; parallelism is a per-layer-kind "
                "strategy, e.g. strategy='embedding=(mp) dense=(tp,ddp)'",
            )
    if isinstance(task, dict):
        for key, value in task.items():
            if key != "kind":  # batch is plan.global_batch_size; no time-to-train for a DLRM yet
                raise MeshplanError(f"task.{key}", value, "DLRM models take only task.kind (pretrain or inference); "
                                    "the batch is plan.global_batch_size")
    kind = task.get("kind", "pretrain") if isinstance(task, dict) else getattr(task, "kind", "pretrain")
    if kind not in ("pretrain", "inference"):
        raise MeshplanError("task.kind", kind, "DLRM models are estimated for pretraining and inference so far")
    if num_devices is None:
        raise MeshplanError("num_devices", None, "give the number of devices (--devices N) for a DLRM")
    devices = _count("num_devices", num_devices)
    cluster.check_devices(devices)
    if plan.get("global_batch_size") is None:
        raise MeshplanError("plan.global_batch_size", None, "give the samples per iteration, e.g. 65536 "
                            "(MAD Max Table 2: 64K for DLRM-A, 256K for DLRM-B)")
    batch = _count("plan.global_batch_size", plan["global_batch_size"])
    if batch % devices:
        raise MeshplanError("plan.global_batch_size", batch, f"must be a multiple of the device count {devices}")
    precision = plan.get("precision")
    if precision is None:
        precision = default_precision(model, cluster)
    if not isinstance(precision, str) or precision not in MATMUL_PRECISIONS or precision not in cluster.device.peak_flop_per_s:
        supported = [p for p in MATMUL_PRECISIONS if p in cluster.device.peak_flop_per_s]
        raise MeshplanError("plan.precision", precision, f"{cluster.device.id} runs {', '.join(supported)}")
    strategy = build(Strategy, plan.get("strategy") or {}, "strategy")
    framework = "torchrec" if plan.get("framework") is None else dlrm_framework(plan["framework"])
    if framework is None:
        raise MeshplanError("plan.framework", plan["framework"], f"a DLRM trainer: {', '.join(DLRM_FRAMEWORKS)}")
    return DLRMScenario(model, cluster, devices, strategy, batch, precision, kind, framework)
