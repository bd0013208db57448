"""Scenario = Model x Cluster x Plan x Task, validated once with errors that name the field."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

from pydantic import TypeAdapter, ValidationError

from meshplan.errors import MeshplanError
from meshplan.specs.base import Count, from_validation_error
from meshplan.specs.cluster import Cluster
from meshplan.specs.model import TransformerModel
from meshplan.specs.plan import Plan, group_problem, interleave_group, parse_pipeline_layout
from meshplan.specs.task import Task


def _expert_tp(p: Plan, dp: int) -> int:
    """The experts' tensor-parallel degree (parallel.mesh.expert_mesh), checked against the mesh:
    by default tp when ep divides cp*dp (the ranks that see different tokens), else 1 where that
    folding is possible."""
    inner = p.tp * p.cp * dp
    can_fold = p.tp > 1 and p.sequence_parallel and inner % p.ep == 0
    if p.expert_tp is None:
        if p.cp * dp % p.ep == 0:
            return p.tp
        if can_fold:
            return 1
        raise MeshplanError(
            "plan.ep", p.ep, f"must divide cp*dp ({p.cp * dp}): expert parallelism is carved out of the "
            "context- and data-parallel ranks",
            hint=f"or, with tp > 1, sequence_parallel and expert_tp=1, divide tp*cp*dp ({inner})",
        )
    if p.expert_tp == p.tp:
        if p.cp * dp % p.ep:
            raise MeshplanError("plan.ep", p.ep, f"must divide cp*dp ({p.cp * dp}) when the experts keep tp (expert_tp={p.tp})")
        return p.tp
    if p.expert_tp != 1:
        raise MeshplanError("plan.expert_tp", p.expert_tp, f"1 or tp ({p.tp})")
    if not can_fold:
        raise MeshplanError(
            "plan.expert_tp", 1, f"experts without tp need tp > 1, sequence_parallel (as Megatron-Core requires "
            f"for MoE with tensor parallelism) and ep ({p.ep}) dividing tp*cp*dp ({inner})",
        )
    return 1


#: how the layers were split over pipeline stages, for the output
EVEN_SPLIT = "even"
GIVEN_SPLIT = "first/last stage layers as given"
LAYOUT_SPLIT = "as the plan's pipeline_layout gives"
WEIGHTED_SPLIT = (
    "uneven: the embedding and the loss count as a layer each, the earliest chunks take the remainder "
    "(torchtitan; Megatron-Core's account_for_embedding/loss_in_pipeline_split)"
)


@dataclass(frozen=True)
class Scenario:
    model: TransformerModel
    cluster: Cluster
    plan: Plan  # complete: dp, global batch and seq_len are filled in
    num_devices: int
    task: Task = Task()
    chunk_layers: tuple[int, ...] = ()  # decoder layers per model chunk, pp x vpp in pipeline order
    pipeline_split: str = EVEN_SPLIT  # how the layers were split (pipeline_layout)

    def __post_init__(self):
        if not self.chunk_layers:
            chunks, rule = pipeline_layout(self.model.pipeline_layers, self.plan, self.model.id, self.model.block == "layer",
                                           training_mtp(self.model, self.task))
            object.__setattr__(self, "chunk_layers", chunks)
            object.__setattr__(self, "pipeline_split", rule)

    @cached_property
    def stage_layers(self) -> tuple[int, ...]:
        """Decoder layers on each pipeline rank (all its virtual chunks), first rank first."""
        pp = self.plan.pp
        return tuple(sum(self.chunk_layers[r::pp]) for r in range(pp))

    @cached_property
    def _chunk_starts(self) -> tuple[int, ...]:
        return (0, *itertools.accumulate(self.chunk_layers))

    def rank_layer_ranges(self, rank: int) -> tuple[tuple[int, int], ...]:
        """The [start, end) model-order ranges of decoder layers that pipeline rank ``rank`` holds."""
        starts = self._chunk_starts
        chunks = range(rank, len(self.chunk_layers), self.plan.pp)
        return tuple((starts[c], starts[c + 1]) for c in chunks if starts[c + 1] > starts[c])

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


def device_count(value: object) -> int:
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
    num_devices = device_count(num_devices)
    cluster.check_devices(num_devices)
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
    if p.optimizer_offload > 0:
        _check_offload(p, cluster, task or Task())
    if p.activation_offload_layers:
        _check_activation_offload(p, model, cluster, task or Task())
    if p.recompute_layers is not None and not p.whole_layer_recompute:
        raise MeshplanError("plan.recompute_layers", p.recompute_layers,
                            f"applies to whole-layer recompute: recompute full (or selective with selective_recompute blocks), not {p.recompute!r}"
                            + (f" with {p.selective_recompute!r}" if p.recompute == "selective" else ""))
    if p.zero_shard_size is not None:
        if dp % p.zero_shard_size:
            raise MeshplanError("plan.zero_shard_size", p.zero_shard_size, f"must divide dp ({dp})")
        if p.ep != 1:
            raise MeshplanError("plan.zero_shard_size", p.zero_shard_size, "hybrid sharding with expert parallelism is not modelled; leave it unset")
    expert_tp = p.tp
    if p.ep != 1:
        if m.moe is None:
            raise MeshplanError("plan.ep", p.ep, "expert parallelism needs an MoE model; use ep=1 for a dense model")
        expert_tp = _expert_tp(p, dp)
        if m.moe.num_experts % p.ep:
            raise MeshplanError("plan.ep", p.ep, f"must divide num_experts ({m.moe.num_experts}) of {m.id}")
    elif p.expert_tp not in (None, p.tp):
        raise MeshplanError("plan.expert_tp", p.expert_tp, f"applies with expert parallelism only; leave it unset or {p.tp} (tp) when ep is 1")
    if m.num_attention_heads % p.tp:
        raise MeshplanError(
            "plan.tp", p.tp, f"must divide num_attention_heads ({m.num_attention_heads}) of {m.id}"
        )
    if m.kv_heads % p.tp and p.tp % m.kv_heads:
        raise MeshplanError(
            "plan.tp", p.tp, f"must divide num_kv_heads ({m.kv_heads}) or be a multiple of it"
        )
    for width in m.ffn_widths:  # the FFN's hidden dimension is split over tp (Megatron-LM)
        if width % p.tp:
            raise MeshplanError("plan.tp", p.tp, f"must divide the FFN hidden size ({width}) of {m.id}")
    chunk_layers, split = pipeline_layout(m.pipeline_layers, p, m.id, m.block == "layer", training_mtp(m, task or Task()))
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
    group = None
    if p.virtual_pipeline_stages > 1:
        if micro_batches < p.pp:
            raise MeshplanError("plan.global_batch_size", global_batch, f"interleaved 1F1B needs at least pp ({p.pp}) "
                                f"micro-batches; this plan has {micro_batches}")
        group = p.microbatch_group_size or interleave_group(p.pp, micro_batches)
        problem = group_problem(p.pp, micro_batches, group)
        if problem:
            raise MeshplanError(*problem)
    if p.schedule == "dualpipe" and (p.pp % 2 or micro_batches % 2 or micro_batches < 2 * p.pp):
        # deepseek-ai/DualPipe: two directions over an even number of stages, fed from both ends
        field, value = ("plan.pp", p.pp) if p.pp % 2 else ("plan.global_batch_size", global_batch)
        raise MeshplanError(field, value, f"DualPipe needs an even pp and an even number of micro-batches of at least "
                                          f"2 x pp ({2 * p.pp}); this plan has pp {p.pp} and {micro_batches} micro-batches")
    plan = p.model_copy(update={"dp": dp, "global_batch_size": global_batch, "seq_len": seq_len, "expert_tp": expert_tp,
                                "microbatch_group_size": group})
    return Scenario(model=m, cluster=cluster, plan=plan, num_devices=num_devices, task=task or Task(),
                    chunk_layers=chunk_layers, pipeline_split=split)


def _check_offload(p: Plan, cluster: Cluster, task: Task) -> None:
    """Optimizer offload needs the distributed optimizer, a training task and a cluster that
    describes its hosts. Megatron-Core's offload runs inside the precision-aware distributed
    optimizer (megatron/training/arguments.py asserts --use-precision-aware-optimizer with
    --optimizer-cpu-offload; megatron/core/optimizer/__init__.py allows that only with
    --use-distributed-optimizer); DeepSpeed offloads ZeRO stage 1-3's optimizer partition."""
    if p.zero_stage < 1:
        raise MeshplanError("plan.optimizer_offload", p.optimizer_offload,
                            "needs zero_stage >= 1: the offloaded optimizer is the distributed optimizer "
                            "(Megatron-Core --use-distributed-optimizer, DeepSpeed ZeRO stage 1-3)")
    if task.kind == "inference":
        raise MeshplanError("plan.optimizer_offload", p.optimizer_offload, "applies to training only (inference has no optimizer); use 0")
    if cluster.host is None:
        raise MeshplanError(
            "plan.optimizer_offload", p.optimizer_offload,
            f"cluster {cluster.id} states no host memory or host link (cluster.host): 0, or a cluster that does",
            hint="give the cluster a host: {memory_bytes, memory_bytes_per_s, link_bytes_per_s, ...}",
        )


def _check_activation_offload(p: Plan, model, cluster: Cluster, task: Task) -> None:
    """Activation offload as Megatron-Core allows it (TransformerConfig.__post_init__: fewer layers
    than the model's, no pipeline parallelism, no recompute; no CUDA graphs), in training, on a
    cluster that describes its hosts."""
    n = p.activation_offload_layers
    field = "plan.activation_offload_layers"
    if task.kind == "inference":
        raise MeshplanError(field, n, "applies to training only (serving keeps no activations for a backward); use 0")
    if n >= model.num_layers:
        raise MeshplanError(field, n, f"fewer than the model's {model.num_layers} layers (Megatron-Core offloads at most all but one)")
    if p.pp > 1:
        raise MeshplanError(field, n, f"needs pp 1 (Megatron-Core has no CPU offloading with pipeline parallelism; pp is {p.pp})")
    if p.recompute != "none":
        raise MeshplanError(field, n, f"needs recompute none (Megatron-Core's CPU offloading does not run with recompute {p.recompute!r})")
    if p.cuda_graphs != "none":
        raise MeshplanError(field, n, "needs cuda_graphs none (CUDA graphs do not run with CPU offloading)")
    if cluster.host is None:
        raise MeshplanError(field, n, f"cluster {cluster.id} states no host memory or host link (cluster.host): 0, or a cluster that does",
                            hint="give the cluster a host: {memory_bytes, memory_bytes_per_s, link_bytes_per_s, ...}")


def training_mtp(model: TransformerModel, task: Task) -> int:
    """The multi-token-prediction layers a task runs: the model's in training, none in serving."""
    return 0 if task.kind == "inference" else model.mtp_layers


def pipeline_layout(num_layers: int, p: Plan, model_id: str = "model", edges: bool = True, mtp: int = 0) -> tuple[tuple[int, ...], str]:
    """Decoder layers of each model chunk (pp x virtual stages, in pipeline order) and how they
    were split. The ``mtp`` multi-token-prediction layers go to the last chunk after its decoder
    layers, where Megatron-Core runs them (its MTP block is part of the last stage's
    post-processing); a layout may place them there itself (m).

    Rank r holds chunks r, r + pp, r + 2pp, ... (interleaved 1F1B, Narayanan et al. SC21
    Sec. 2.2.2). Four rules, as the frameworks split:

    - the layers divide pp x vpp: every chunk gets the same number (Megatron-Core);
    - ``pipeline_layout`` given (Megatron-Core --pipeline-model-parallel-layout): each chunk
      takes the decoder layers it lists (_given_layout);
    - ``first_stage_layers`` / ``last_stage_layers`` given (Megatron-LM
      --decoder-first/last-pipeline-num-layers): those stages take that many and the others
      split the rest evenly;
    - otherwise the embedding and the output layer (norm, logits, loss) each count as one
      layer, the chunks take floor((L + 2) / chunks) slots each and the first
      (L + 2) mod chunks chunks one more (torchtitan's ``generate_llm_fqn_per_model_part``;
      with L + 2 divisible, the same as Megatron-Core's account_for_embedding_in_pipeline_split
      and account_for_loss_in_pipeline_split, as Megatron-Bridge runs Llama 3.1 405B).

    A block model (``edges`` false: no embedding or output layer) splits its einsums the same
    way with no slots for them.
    """
    if p.pipeline_layout is not None:
        if p.first_stage_layers is not None or p.last_stage_layers is not None:
            raise MeshplanError("plan.pipeline_layout", p.pipeline_layout,
                                "a layout or first/last_stage_layers, not both: the layout already places every layer")
        return _given_layout(num_layers, p, model_id, edges, mtp), LAYOUT_SPLIT
    layers, rule = _split(num_layers, p, model_id, edges)
    return (*layers[:-1], layers[-1] + mtp), rule


def _split(num_layers: int, p: Plan, model_id: str, edges: bool) -> tuple[tuple[int, ...], str]:
    """The decoder layers per chunk without a layout (pipeline_layout's other three rules)."""
    pp, v = p.pp, p.virtual_pipeline_stages
    chunks = pp * v
    if p.first_stage_layers is not None or p.last_stage_layers is not None:
        return _given_split(num_layers, p), GIVEN_SPLIT
    if num_layers % chunks == 0:
        return (num_layers // chunks,) * chunks, EVEN_SPLIT
    slots = num_layers + 2 * edges
    field, value = ("plan.pp", pp) if v == 1 else ("plan.virtual_pipeline_stages", v)
    if slots < chunks:
        raise MeshplanError(
            field, value, f"pp*virtual_pipeline_stages ({chunks}) exceeds the {num_layers} layers of {model_id} "
            + ("plus its embedding and output layer" if edges else "(a block model's einsums)"),
        )
    base, extra = divmod(slots, chunks)
    layers = [base + (c < extra) for c in range(chunks)]
    layers[0] -= edges  # the embedding's slot
    layers[-1] -= edges  # the output layer's slot
    ranks = [sum(layers[r::pp]) for r in range(pp)]
    if min(ranks) < 1:
        raise MeshplanError(
            field, value, f"every pipeline stage needs a decoder layer; {num_layers} layers of {model_id} "
            f"split as {ranks}",
        )
    return tuple(layers), WEIGHTED_SPLIT


def _given_layout(num_layers: int, p: Plan, model_id: str, edges: bool, mtp: int = 0) -> tuple[int, ...]:
    """Decoder layers per chunk from ``plan.pipeline_layout``, checked as Megatron-Core checks it
    (PipelineParallelLayerLayout.__init__ and validate_layer_layout): pp x virtual_pipeline_stages
    chunks, the embedding first and the loss last, once each, and every decoder layer of the
    model. The model's ``mtp`` multi-token-prediction layers (m) sit in the last chunk; a layout
    that leaves them out gets them there. meshplan also needs a decoder layer on every pipeline
    rank (a rank's work is its layers)."""
    chunks = parse_pipeline_layout(p.pipeline_layout)
    field, layout = "plan.pipeline_layout", p.pipeline_layout
    flat = "".join(chunks)
    expected = p.pp * p.virtual_pipeline_stages
    if len(chunks) != expected:
        raise MeshplanError(field, layout, f"{len(chunks)} model chunks; the plan has pp ({p.pp}) x "
                                           f"virtual_pipeline_stages ({p.virtual_pipeline_stages}) = {expected}")
    if "m" in flat and flat.count("m") != mtp:
        raise MeshplanError(field, layout, f"{flat.count('m')} multi-token-prediction layers (m); {model_id} trains {mtp} "
                                           "(list that many, or none: they go to the last chunk)")
    if "m" in "".join(chunks[:-1]):
        raise MeshplanError(field, layout, "multi-token-prediction layers (m) run on the last stage: list them in the last chunk")
    if not edges and ("E" in flat or "L" in flat):
        raise MeshplanError(field, layout, f"{model_id} has no embedding or loss: list its layers as t only")
    if edges and (flat.count("E") != 1 or flat.count("L") != 1 or flat[0] != "E" or flat[-1] != "L"):
        raise MeshplanError(field, layout, "the embedding (E) once, first in the first chunk, and the loss (L) once, "
                                           "last in the last chunk (Megatron-Core's rule)")
    if flat.count("t") != num_layers:
        raise MeshplanError(field, layout, f"{flat.count('t')} decoder layers (t); {model_id} has {num_layers}")
    layers = tuple(c.count("t") for c in chunks)
    ranks = [sum(layers[r::p.pp]) for r in range(p.pp)]
    if min(ranks) < 1:
        raise MeshplanError(field, layout, f"every pipeline rank needs a decoder layer; this layout gives the ranks {ranks}")
    return (*layers[:-1], layers[-1] + mtp)


def _given_split(num_layers: int, p: Plan) -> tuple[int, ...]:
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
