"""Inference: a prefill of the prompts, then decoding one token at a time with a KV cache.

The same ops as training (meshplan.workloads.transformer), forward only. Prefill runs the
``prompt_len`` tokens of every sequence at once; a decode step runs one token per sequence that
attends to its cached keys and values. Attention cost is linear in the context length, so the
decode step at the mean context (prompt + output/2) gives the exact mean time per output token.
Tensor-parallel all-reduces follow each attention and MLP block (Megatron-LM); pipeline stages
run one after another for a token, so their times add.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from meshplan import catalog
from meshplan.costs.collectives import collective_s
from meshplan.costs.compute import Roofline
from meshplan.costs.costed import op_times
from meshplan.errors import MeshplanError
from meshplan.parallel.mesh import axis_span, pipeline_neighbour_span
from meshplan.parallel.program import param_share, shard_op
from meshplan.specs.device import BYTES_PER_ELEMENT, activation_bytes
from meshplan.specs.scenario import Scenario
from meshplan.units import format_bytes, format_devices, format_seconds
from meshplan.workloads.transformer import layer_blocks, lower


@dataclass(frozen=True)
class InferenceMemory:
    weights_bytes: float
    kv_cache_bytes: float
    activations_bytes: float  # the working set of prefill, one layer at a time
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_cache_bytes + self.activations_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes


@dataclass(frozen=True)
class PhaseTime:
    time_s: float  # one pass through every pipeline stage
    compute_s: float
    tp_comm_s: float
    pp_comm_s: float
    flop: float  # per device, all decoder layers of the pass
    hbm_bytes: float  # bytes the layers must move through HBM at least (weights, KV cache)
    roofline_s: float  # max(flop / peak, bytes / peak bandwidth) summed over layers: a lower bound

    @property
    def memory_bound(self) -> bool:
        return self.hbm_bytes > 0 and self.roofline_s > 0 and self.arithmetic_intensity < self.ridge

    arithmetic_intensity: float = 0.0  # flop per byte of HBM traffic
    ridge: float = 0.0  # the device's flop per byte at which compute and bandwidth balance


@dataclass(frozen=True)
class InferenceEstimate:
    model_id: str
    cluster_id: str
    num_devices: int
    plan: dict
    batch_size: int
    prompt_len: int
    output_len: int
    ttft_s: float  # time to first token: the prefill
    tpot_s: float  # time per output token: one decode step at the mean context
    request_s: float  # ttft + output_len x tpot
    decode_tokens_per_s: float  # all replicas
    tokens_per_s: float  # output tokens over the whole request, all replicas
    prefill: PhaseTime
    decode: PhaseTime
    memory: InferenceMemory
    fits: bool

    def to_dict(self) -> dict:
        out = asdict(self)
        out["memory"]["total_bytes"] = self.memory.total_bytes
        out["prefill"]["memory_bound"] = self.prefill.memory_bound
        out["decode"]["memory_bound"] = self.decode.memory_bound
        return out

    def __repr__(self) -> str:
        return (
            f"InferenceEstimate({self.model_id} on {format_devices(self.num_devices, self.cluster_id)}, batch {self.batch_size}: "
            f"TTFT {format_seconds(self.ttft_s)}, TPOT {format_seconds(self.tpot_s)}, "
            f"{self.decode_tokens_per_s:,.0f} tokens/s decoding, memory {format_bytes(self.memory.total_bytes)} "
            f"of {format_bytes(self.memory.capacity_bytes)} ({'fits' if self.fits else 'DOES NOT FIT'}))"
        )


def _phase(scenario: Scenario, roof: Roofline, batch: int, seq: int, kv_len: int, weight_bytes: float, kv_bytes_per_token_layer: float) -> PhaseTime:
    """One forward pass of ``batch`` sequences of ``seq`` new tokens attending to ``kv_len`` keys."""
    plan, model, cluster = scenario.plan, scenario.model, scenario.cluster
    tp, pp = plan.tp, plan.pp
    act = activation_bytes(plan.precision)
    element = BYTES_PER_ELEMENT[plan.precision]
    blocks = layer_blocks(model, batch, seq, act, plan.flash_attention, kv_len)
    last_token = lower(model, batch, 1, act, plan.flash_attention)  # logits only for the last position
    head = [shard_op(op, tp, 1, False) for op in lower(model, batch, seq, act, plan.flash_attention).head.ops]
    tail = [shard_op(op, tp, 1, False) for op in last_token.tail.ops]
    peak_bw, peak = cluster.device.hbm_bytes_per_s, roof.peak_flop_per_s

    x_bytes = batch * seq * model.hidden_size * act
    tp_span = axis_span(cluster, plan, "tp")
    tp_layer = 2.0 * collective_s("all_reduce", x_bytes, tp_span) if tp > 1 else 0.0
    compute = sum(op_times(op, roof, element).forward_s for op in (*head, *tail))
    tp_comm = collective_s("all_reduce", x_bytes, tp_span) + collective_s("all_gather", batch * model.vocab_size * act, tp_span) if tp > 1 else 0.0
    flop = hbm = roofline = 0.0
    for block in blocks:
        ops = [shard_op(op, tp, 1, False) for op in block.ops]
        compute += block.count * sum(op_times(op, roof, element).forward_s for op in ops)
        tp_comm += block.count * tp_layer
        layer_flop = sum(op.flop for op in ops)
        # weights read once per pass; of the routed experts only those some token picked:
        # E·(1 - (1 - k/E)^tokens) of them in expectation under uniform routing
        touched = 1.0
        if model.moe and any(op.expert for op in block.ops):
            e, k = model.moe.num_experts, model.moe.top_k
            touched = 1.0 - (1.0 - k / e) ** (batch * seq)
        layer_weights = sum(param_share(op, tp) * (touched if op.expert else 1.0) for op in block.ops) * weight_bytes
        layer_bytes = layer_weights + batch * kv_len * kv_bytes_per_token_layer
        flop += block.count * layer_flop
        hbm += block.count * layer_bytes
        roofline += block.count * max(layer_flop / peak, layer_bytes / peak_bw)
    pp_s = (pp - 1) * collective_s("send_recv", x_bytes / tp, pipeline_neighbour_span(cluster, plan)) if pp > 1 else 0.0
    return PhaseTime(
        time_s=compute + tp_comm + pp_s,
        compute_s=compute,
        tp_comm_s=tp_comm,
        pp_comm_s=pp_s,
        flop=flop,
        hbm_bytes=hbm,
        roofline_s=roofline,
        arithmetic_intensity=flop / hbm,
        ridge=peak / peak_bw,
    )


def inference_estimate(scenario: Scenario) -> InferenceEstimate:
    plan, model, task = scenario.plan, scenario.model, scenario.task
    dp = plan.dp or 1
    if task.batch_size % dp:
        raise MeshplanError("task.batch_size", task.batch_size, f"must be a multiple of dp ({dp}): each replica serves an equal share")
    if plan.cp != 1:
        raise MeshplanError("plan.cp", plan.cp, "context parallelism is modelled for training only; use cp=1 for inference")
    device = scenario.cluster.device
    roof = Roofline.of(device, catalog.efficiency(device.efficiency), plan.precision)
    batch = task.batch_size // dp
    tp, pp = plan.tp, plan.pp
    weight_bytes = BYTES_PER_ELEMENT[plan.precision]
    kv_element = activation_bytes(plan.precision)
    if model.mla:  # the compressed latent and the RoPE key, the same on every tp rank (DeepSeek-V2)
        kv_per_token_layer = (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * kv_element
    else:
        kv_heads_per_device = model.kv_heads / tp if model.kv_heads % tp == 0 else 1.0  # replicated below one head
        kv_per_token_layer = 2.0 * kv_heads_per_device * model.dim_per_head * kv_element  # K and V

    prefill = _phase(scenario, roof, batch, task.prompt_len, task.prompt_len, weight_bytes, kv_per_token_layer)
    mean_context = task.prompt_len + task.output_len / 2.0
    decode = _phase(scenario, roof, batch, 1, int(round(mean_context)), weight_bytes, kv_per_token_layer)

    act = activation_bytes(plan.precision)
    layers = max(scenario.stage_layers)  # the fullest stage holds the most KV cache
    graph = lower(model, batch, task.prompt_len, act, plan.flash_attention)
    if plan.ep != 1:
        raise MeshplanError("plan.ep", plan.ep, "expert parallelism is modelled for training only; use ep=1 (experts split by tp) for inference")
    params = sum(param_share(op, tp) for op in (*graph.head.ops, *graph.tail.ops))
    params += sum(b.count * sum(param_share(op, tp) for op in b.ops) for b in graph.blocks) / pp
    # prefill frees each layer's tensors as it goes: the residual stream in and out, plus the MLP's
    # widest intermediates (up/gate projection and activation output) on this tp shard
    widest = max(model.ffn_widths)
    up_width = (model.ffn_matrices - 1) * widest
    working = batch * task.prompt_len * (2.0 * model.hidden_size + (up_width + widest) / tp) * act
    memory = InferenceMemory(
        weights_bytes=params * weight_bytes,
        kv_cache_bytes=batch * (task.prompt_len + task.output_len) * layers * kv_per_token_layer,
        activations_bytes=working,
        capacity_bytes=device.hbm_bytes,
    )
    request = prefill.time_s + task.output_len * decode.time_s
    return InferenceEstimate(
        model_id=model.id,
        cluster_id=scenario.cluster.id,
        num_devices=scenario.num_devices,
        plan=plan.model_dump(),
        batch_size=task.batch_size,
        prompt_len=task.prompt_len,
        output_len=task.output_len,
        ttft_s=prefill.time_s,
        tpot_s=decode.time_s,
        request_s=request,
        decode_tokens_per_s=task.batch_size / decode.time_s,
        tokens_per_s=task.batch_size * task.output_len / request,
        prefill=prefill,
        decode=decode,
        memory=memory,
        fits=memory.fits,
    )
