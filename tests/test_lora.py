"""LoRA finetuning (Hu et al. 2021, arXiv:2106.09685): frozen base weights, adapters beside the
chosen linears, gradients through every layer (meshplan.workloads.lora)."""

from __future__ import annotations

import pytest

from meshplan import api, catalog
from meshplan.costs.compute import Roofline
from meshplan.costs.costed import op_times
from meshplan.errors import MeshplanError
from meshplan.explore.bound import lower_bounds
from meshplan.explore.search import brute_force, search
from meshplan.explore.space import SearchSpace, expand
from meshplan.parallel.program import build_program
from meshplan.parallel.shard import shard_op
from meshplan.specs import Plan, Task
from meshplan.workloads.lora import with_adapters
from meshplan.workloads.ops import dense_flop
from meshplan.workloads.transformer import lower

#: a one-layer toy: MHA, GeLU MLP, so every shape is easy to write by hand
TOY = dict(id="toy", name="toy", num_layers=1, hidden_size=1024, num_attention_heads=8, ffn_hidden_size=4096,
           vocab_size=1000, seq_len=512)
H, F, T, R = 1024, 4096, 512, 16  # hidden, FFN, tokens of one micro-batch (1 x 512), rank


def _toy_graph(rank=R, targets="attention"):
    model = api.resolve_model(TOY)
    return model, with_adapters(lower(model, 1, T, 2.0, True), rank, targets, 2.0)


def test_toy_layer_flop_by_hand():
    """Backward: the frozen GEMMs' input gradients only (one forward's flop each), attention's
    twice its forward, each adapter GEMM twice (input and weight gradient)."""
    model, graph = _toy_graph()
    base_gemms = 2 * T * H * 3 * H + 2 * T * H * H + 2 * T * H * F + 2 * T * F * H  # qkv, proj, up, down
    adapters = 2 * T * H * R + 2 * T * R * 3 * H + 2 * T * H * R + 2 * T * R * H  # qkv A, B; proj A, B
    attention = 4 * T * T * H  # 2·b·s·kv·(d_qk + d_v) over all heads (Megatron Eq. 3, no causal halving)
    layer = graph.layer.ops
    assert dense_flop(layer) == pytest.approx(base_gemms + adapters + attention, rel=1e-12)
    assert dense_flop(layer, backward=True) == pytest.approx(base_gemms + 2 * adapters + 2 * attention, rel=1e-12)
    assert sum(op.params for op in layer if not op.frozen) == R * (H + 3 * H) + R * (H + H)


def test_toy_frozen_gemm_backward_is_its_input_gradient():
    _, graph = _toy_graph()
    device = catalog.device("h100-sxm5-80gb")
    roof = Roofline.of(device, catalog.efficiency(device.efficiency), "bf16")
    ops = {op.name: op for op in graph.layer.ops}
    qkv = op_times(shard_op(ops["qkv"], 1, 1, False), roof, 2.0)
    assert qkv.weight_s == 0.0 and qkv.backward_s == pytest.approx(float(roof.matmul_s(T, 3 * H, H, 2.0)))
    a = op_times(shard_op(ops["qkv_lora_a"], 1, 1, False), roof, 2.0)
    assert a.weight_s == pytest.approx(float(roof.matmul_s(H, T, R, 2.0))) and a.input_s > 0


def _toy(task, **plan):
    return api.estimate(TOY, "dgx-h100", num_devices=1, global_batch_size=1, micro_batch_size=1, **plan,
                        task={"kind": "finetune", **task})


def test_toy_memory_counts_only_the_adapters_state():
    """Mixed-precision Adam (ZeRO Sec. 3.1): 16-bit weights for all, fp32 gradients and 12 bytes
    of optimizer state for the adapters only; FP8 or NF4 bases shrink the frozen GEMM weights."""
    _, graph = _toy_graph()
    params = graph.params
    adapters = R * (4 * H) + R * (2 * H)
    lora = _toy({"lora_rank": R})
    assert lora.trainable_params == adapters and lora.params == params
    assert lora.memory.gradients_bytes == pytest.approx(4.0 * adapters)
    assert lora.memory.optimizer_bytes == pytest.approx(12.0 * adapters)
    assert lora.memory.weights_bytes == pytest.approx(2.0 * params)
    base_linears = sum(op.params for op in graph.layer.ops if op.low_precision)  # qkv, proj, up, down
    assert base_linears == pytest.approx(4 * H * H + 2 * H * F, rel=1e-2)
    for dtype, per_weight in (("fp8", 1.0), ("nf4", (4 + 0.127) / 8)):
        stored = _toy({"lora_rank": R, "lora_base_dtype": dtype}).memory.weights_bytes
        # the embedding, norms and output layer stay 16-bit (QLoRA Sec. 3)
        assert stored == pytest.approx(2.0 * (params - base_linears) + per_weight * base_linears, rel=1e-9)


#: micro-batches of 4 sequences: a layer's kernels outlast their dispatch (at 1, tp 8's layers wait
#: for the host, where LoRA's adapter ops cost more than full finetuning's weight gradients)
LLAMA = dict(model="llama3-8b", cluster="dgx-h100", num_devices=8, tp=8, global_batch_size=16, sequence_parallel=True,
             seq_len=4096, micro_batch_size=4)


def _llama(**task):
    return api.estimate(**LLAMA, task={"kind": "finetune", **task})


def test_lora_sits_between_forward_only_and_full_finetuning():
    forward_only = _llama(frozen_layers=32)
    full = _llama()
    lora = _llama(lora_rank=16)
    assert forward_only.step_time_s < lora.step_time_s < full.step_time_s
    assert lora.memory.total_bytes < full.memory.total_bytes
    assert lora.energy.total_j < full.energy.total_j
    assert lora.model_flop_per_step < full.model_flop_per_step


@pytest.mark.parametrize("targets", ["qkv", "attention", "mlp", "all"])
def test_higher_rank_never_faster_or_smaller(targets):
    runs = [_llama(lora_rank=r, lora_targets=targets) for r in (1, 8, 64, 512)]
    for a, b in zip(runs, runs[1:]):
        assert a.step_time_s <= b.step_time_s * (1 + 1e-12)
        assert a.memory.total_bytes < b.memory.total_bytes
        assert a.trainable_params < b.trainable_params


def test_more_targets_never_faster():
    qkv, attention, everything = (_llama(lora_rank=16, lora_targets=t) for t in ("qkv", "attention", "all"))
    assert qkv.step_time_s <= attention.step_time_s <= everything.step_time_s
    assert qkv.trainable_params < attention.trainable_params < everything.trainable_params


def test_data_parallel_reduces_only_the_adapters():
    plan = dict(LLAMA, tp=1, num_devices=8, global_batch_size=8, micro_batch_size=1)
    full = api.estimate(**plan, task={"kind": "finetune"})
    lora = api.estimate(**plan, task={"kind": "finetune", "lora_rank": 16})
    assert lora.comm_total_s["dp"] < 0.01 * full.comm_total_s["dp"]


def test_fields_are_checked():
    for task, field in (({"kind": "pretrain", "lora_rank": 8}, "lora_rank"),
                        ({"kind": "finetune", "lora_targets": "qkv"}, "lora_targets"),
                        ({"kind": "finetune", "lora_rank": 8, "frozen_layers": 2}, "frozen_layers")):
        with pytest.raises(MeshplanError) as err:
            api.estimate(**LLAMA, task=task)
        assert err.value.field.endswith(field)


SPACE = {"tp": [1, 2, 4, 8], "micro_batch_size": [1, 2], "recompute": ["none", "full"], "zero_stage": [0, 1]}


def test_bound_and_search_stay_exact_with_lora():
    model, cluster = catalog.model("llama3-8b"), catalog.cluster("dgx-h100")
    base, task, space = Plan(global_batch_size=32, seq_len=4096), Task(kind="finetune", lora_rank=16), SearchSpace(**SPACE)
    candidates = expand(space, model, cluster, 8, base, task)
    for bound, scenario in zip(lower_bounds(candidates.scenarios), candidates.scenarios):
        assert bound <= api.estimate_scenario(scenario).step_time_s * (1 + 1e-12)
    result = search(model, cluster, 8, base, space, top_k=5, task=task)
    exact = brute_force(model, cluster, 8, base, space, task)
    assert [r["step_time_s"] for r in result.top] == pytest.approx([r["step_time_s"] for r in exact[:5]], rel=1e-12)


def test_qlora_dequantizes_each_base_weight_before_both_its_gemms():
    # bitsandbytes' MatMul4Bit: the NF4 weight (4.127 bits) read and a 16-bit copy written before
    # the forward GEMM and again before the input gradient's; adapters and the output layer run in 16 bits
    task = Task(kind="finetune", lora_rank=16, lora_targets="all", lora_base_dtype="nf4")
    bf16 = task.model_copy(update={"lora_base_dtype": "bf16"})
    plan = dict(tp=2, num_devices=2, global_batch_size=8, micro_batch_size=4, seq_len=2048)
    nf4 = build_program(api.scenario("llama3-8b", "dgx-h100", task=task, **plan))
    plain = build_program(api.scenario("llama3-8b", "dgx-h100", task=bf16, **plan))
    per_weight = (4.127 / 8 + 2) / 2  # over tp 2
    (kind,) = nf4.kinds.values()
    for op, same in zip(kind.ops, plain.kinds["dense_layer"].ops):
        if op.op.kind == "matmul" and op.op.frozen:
            assert op.cast_bytes == pytest.approx((op.op.params * per_weight,) * 2)
        else:
            assert op.cast_bytes == same.cast_bytes
    assert sum(op.cast_bytes[0] for op in kind.ops) == pytest.approx(catalog.model("llama3-8b").params_per_layer * per_weight, rel=1e-3)
    slower = api.estimate("llama3-8b", "dgx-h100", task=task, **plan).step_time_s
    assert slower > api.estimate("llama3-8b", "dgx-h100", task=bf16, **plan).step_time_s
