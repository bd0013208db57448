"""Scenario = Model x Cluster x Plan x Task, validated once with errors that name the field."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import TypeAdapter, ValidationError

from meshplan.errors import MeshplanError
from meshplan.specs.base import Count, from_validation_error
from meshplan.specs.cluster import Cluster
from meshplan.specs.model import TransformerModel
from meshplan.specs.plan import Plan, Task


@dataclass(frozen=True)
class Scenario:
    model: TransformerModel
    cluster: Cluster
    plan: Plan  # complete: dp, global batch and seq_len are filled in
    num_devices: int
    task: Task = Task()
    stage_layers: tuple[int, ...] = ()  # decoder layers per pipeline stage

    def __post_init__(self):
        if not self.stage_layers:
            object.__setattr__(self, "stage_layers", pipeline_layout(self.model.num_layers, self.plan, self.model.id))

    @property
    def seq_len(self) -> int:
        return self.plan.seq_len  # type: ignore[return-value]

    @property
    def global_batch_size(self) -> int:
        return self.plan.global_batch_size  # type: ignore[return-value]

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches each pipeline runs per step (gradient accumulation steps)."""
        p = self.plan
        return self.global_batch_size // (p.micro_batch_size * p.dp)  # type: ignore[operator]

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len


_COUNT = TypeAdapter(Count)


def _device_count(value: object) -> int:
    """The device count as a positive int (a whole number given as 1536.0 or "1536" is fine)."""
    if isinstance(value, bool):
        raise MeshplanError("num_devices", value, "must be a positive integer")
    try:
        return _COUNT.validate_python(value)
    except ValidationError as err:
        raise from_validation_error(err, "num_devices") from None


def make_scenario(
    model: TransformerModel,
    cluster: Cluster,
    plan: Plan,
    num_devices: int | None = None,
    task: Task | None = None,
) -> Scenario:
    """Check that the plan fits the model and the cluster; fill in what the plan left unset."""
    p = plan
    if num_devices is None:
        num_devices = p.model_parallel * (p.dp or 1)
    num_devices = _device_count(num_devices)
    if cluster.max_devices is not None and num_devices > cluster.max_devices:
        raise MeshplanError("num_devices", num_devices, f"{cluster.id} has at most {cluster.max_devices} devices")
    if num_devices % p.model_parallel:
        raise MeshplanError(
            "num_devices",
            num_devices,
            f"must be a multiple of tp*cp*pp = {p.tp}*{p.cp}*{p.pp} = {p.model_parallel}",
        )
    dp = p.dp if p.dp is not None else num_devices // p.model_parallel
    if p.tp * p.cp * p.pp * dp != num_devices:
        raise MeshplanError(
            "plan.dp",
            dp,
            f"tp*cp*pp*dp must equal the device count {num_devices}; "
            f"tp*cp*pp = {p.model_parallel}, so dp must be {num_devices // p.model_parallel}",
        )
    m = model
    if p.zero_shard_size is not None:
        if dp % p.zero_shard_size:
            raise MeshplanError("plan.zero_shard_size", p.zero_shard_size, f"must divide dp ({dp})")
        if p.ep != 1:
            raise MeshplanError("plan.zero_shard_size", p.zero_shard_size, "hybrid sharding with expert parallelism is not modelled; leave it unset")
    if p.ep != 1:
        if m.moe is None:
            raise MeshplanError("plan.ep", p.ep, "expert parallelism needs an MoE model; use ep=1 for a dense model")
        if dp % p.ep:
            raise MeshplanError("plan.ep", p.ep, f"must divide dp ({dp}): expert parallelism is carved out of data parallelism")
        if m.moe.num_experts % p.ep:
            raise MeshplanError("plan.ep", p.ep, f"must divide num_experts ({m.moe.num_experts}) of {m.id}")
    if m.num_attention_heads % p.tp:
        raise MeshplanError(
            "plan.tp", p.tp, f"must divide num_attention_heads ({m.num_attention_heads}) of {m.id}"
        )
    if m.kv_heads % p.tp and p.tp % m.kv_heads:
        raise MeshplanError(
            "plan.tp", p.tp, f"must divide num_kv_heads ({m.kv_heads}) or be a multiple of it"
        )
    if m.ffn_hidden_size % p.tp:
        raise MeshplanError("plan.tp", p.tp, f"must divide ffn_hidden_size ({m.ffn_hidden_size}) of {m.id}")
    stage_layers = pipeline_layout(m.num_layers, p, m.id)
    if p.virtual_pipeline_stages > 1 and p.pp == 1:
        raise MeshplanError("plan.virtual_pipeline_stages", p.virtual_pipeline_stages, "needs pp > 1")
    if p.virtual_pipeline_stages > 1 and p.schedule != "1f1b":
        raise MeshplanError("plan.schedule", p.schedule, "interleaved stages need the 1f1b schedule")
    seq_len = p.seq_len or m.seq_len
    if seq_len % p.cp:
        raise MeshplanError("plan.cp", p.cp, f"must divide seq_len ({seq_len})")
    global_batch = p.global_batch_size or p.micro_batch_size * dp
    if global_batch % (p.micro_batch_size * dp):
        raise MeshplanError(
            "plan.global_batch_size",
            global_batch,
            f"must be a multiple of micro_batch_size*dp = {p.micro_batch_size}*{dp} = {p.micro_batch_size * dp}",
        )
    micro_batches = global_batch // (p.micro_batch_size * dp)
    if p.virtual_pipeline_stages > 1 and micro_batches % p.pp:
        raise MeshplanError(
            "plan.global_batch_size",
            global_batch,
            f"interleaved 1F1B needs the number of micro-batches ({micro_batches}) to be a multiple of pp ({p.pp})",
        )
    plan = p.model_copy(update={"dp": dp, "global_batch_size": global_batch, "seq_len": seq_len})
    return Scenario(model=m, cluster=cluster, plan=plan, num_devices=num_devices, task=task or Task(), stage_layers=stage_layers)


def pipeline_layout(num_layers: int, p: Plan, model_id: str = "model") -> tuple[int, ...]:
    """Decoder layers on each pipeline stage (all its virtual chunks), first stage first."""
    chunks = p.pp * p.virtual_pipeline_stages
    uneven = p.first_stage_layers is not None or p.last_stage_layers is not None
    if not uneven:
        if num_layers % chunks:
            field, value = ("plan.pp", p.pp) if p.virtual_pipeline_stages == 1 else ("plan.virtual_pipeline_stages", p.virtual_pipeline_stages)
            raise MeshplanError(
                field, value, f"pp*virtual_pipeline_stages ({chunks}) must divide num_layers ({num_layers}) of {model_id}",
                hint="or set plan.first_stage_layers / plan.last_stage_layers for an uneven pipeline",
            )
        return (num_layers // p.pp,) * p.pp
    if p.virtual_pipeline_stages > 1 or p.pp < 2:
        raise MeshplanError("plan.first_stage_layers", p.first_stage_layers, "uneven stages need pp >= 2 and no virtual stages")
    first = p.first_stage_layers
    last = p.last_stage_layers
    inner = p.pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    if rest < inner or (inner and rest % inner) or (not inner and rest):
        raise MeshplanError(
            "plan.first_stage_layers", (first, last),
            f"the other {inner} stages must split the remaining {rest} of {num_layers} layers evenly",
        )
    even = rest // inner if inner else 0
    return (first if first is not None else even,) + (even,) * (p.pp - 2) + (last if last is not None else even,)
