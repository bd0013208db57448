"""Published formulas, reproduced exactly: Megatron Eq. 3, Korthikanti's activation memory,
ring collectives, COMET's GEMM traffic, and the pipeline bubble."""

from __future__ import annotations

import pytest

from meshplan import api, catalog
from meshplan.costs.collectives import bytes_sent_per_device, collective_s, group_span
from meshplan.costs.compute import gemm_traffic_bytes
from meshplan.parallel.program import build_program
from meshplan.network.span import capped_rails
from meshplan.timeline.pipeline_schedule import pipeline_time_s, simulate_1f1b
from meshplan.workloads.transformer import lower

GPT_SHAPES = [
    # (model id or shape, layers, hidden, vocab)
    ("gpt3-175b", 96, 12288, 51200),
    ("megatron-1t", 128, 25600, 51200),
]


@pytest.mark.parametrize("model_id,layers,hidden,vocab", GPT_SHAPES)
@pytest.mark.parametrize("batch,seq", [(1536, 2048), (64, 1024)])
def test_hardware_flop_equals_megatron_eq3(model_id, layers, hidden, vocab, batch, seq):
    """Narayanan et al. SC21, Eq. 3: 96·B·s·l·h²·(1 + s/6h + V/16lh) with full recompute."""
    e = api.estimate(model_id, "dgx-a100-80gb", num_devices=64, tp=8, pp=8, global_batch_size=batch,
                     seq_len=seq, recompute="full")
    eq3 = 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))
    assert e.hardware_flop_per_step == pytest.approx(eq3, rel=1e-12)
    # without recompute: 72·B·s·l·h²·(1 + s/6h + V/12lh) (the same count, three passes)
    e = api.estimate(model_id, "dgx-a100-80gb", num_devices=64, tp=8, pp=8, global_batch_size=batch,
                     seq_len=seq, recompute="none")
    eq3_no_recompute = 72 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))
    assert e.model_flop_per_step == pytest.approx(eq3_no_recompute, rel=1e-12)
    assert e.hardware_flop_per_step == pytest.approx(eq3_no_recompute, rel=1e-12)


def _activation_bytes_per_layer(tp, sp, recompute, seq=2048, micro_batch=1, model_id="gpt3-175b"):
    s = api.scenario(model_id, "dgx-a100-80gb", num_devices=tp, tp=tp, micro_batch_size=micro_batch,
                     global_batch_size=micro_batch, seq_len=seq, sequence_parallel=sp, recompute=recompute,
                     flash_attention=False)
    return build_program(s).kinds["dense_layer"].saved_bytes


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_activation_memory_equals_korthikanti(tp):
    """Korthikanti et al. 2022, Table 2: bytes of activations per layer (s, b, h, a, t)."""
    s, b, h, a = 2048, 1, 12288, 96
    sbh = s * b * h
    none = sbh * (10 + 24 / tp + 5 * a * s / (h * tp))
    sp = sbh * (34 / tp + 5 * a * s / (h * tp))
    selective_sp = sbh * 34 / tp
    selective = sbh * (10 + 24 / tp)
    full = 2 * sbh
    full_sp = 2 * sbh / tp
    assert _activation_bytes_per_layer(tp, False, "none") == pytest.approx(none, rel=1e-12)
    assert _activation_bytes_per_layer(tp, False, "selective") == pytest.approx(selective, rel=1e-12)
    assert _activation_bytes_per_layer(tp, False, "full") == pytest.approx(full, rel=1e-12)
    if tp > 1:
        assert _activation_bytes_per_layer(tp, True, "none") == pytest.approx(sp, rel=1e-12)
        assert _activation_bytes_per_layer(tp, True, "selective") == pytest.approx(selective_sp, rel=1e-12)
        assert _activation_bytes_per_layer(tp, True, "full") == pytest.approx(full_sp, rel=1e-12)


def test_first_stage_holds_pp_micro_batches_and_interleaving_factor():
    """1F1B keeps pp micro-batches on the first stage (Korthikanti Sec. 4.2.3): L layers' worth;
    interleaving multiplies it by 1 + (p-1)/(p·v)."""
    def first_stage(vpp):
        s = api.scenario("gpt3-175b", "dgx-a100-80gb", num_devices=64, tp=8, pp=8, global_batch_size=64,
                         recompute="full", virtual_pipeline_stages=vpp)
        return build_program(s).roles[0].memory.activations_bytes

    per_layer_full = 2 * 2048 * 12288
    assert first_stage(1) >= 96 * per_layer_full  # 12 layers x 8 micro-batches in flight
    assert first_stage(3) == pytest.approx(first_stage(1) * (1 + 7 / 24), rel=0.02)


@pytest.mark.parametrize("n", [2, 8, 64, 1024])
def test_ring_all_reduce_moves_2_n_minus_1_over_n(n):
    assert bytes_sent_per_device("all_reduce", 1e9, n) == pytest.approx(2 * (n - 1) / n * 1e9)
    assert bytes_sent_per_device("all_gather", 1e9, n) == pytest.approx((n - 1) / n * 1e9)


def test_ring_all_reduce_time_inside_one_node():
    """Inside an NVLink node the ring moves 2(n-1)/n of the buffer at the level's bandwidth, with
    NCCL's Simple-protocol latency: 8.4 us a call and 3.4 us a step over NVLink (tuning.cc)."""
    cluster = catalog.cluster("dgx-a100-80gb")
    level = cluster.levels[0]
    span = group_span(cluster, 8, 1)
    size = 1e9
    expected = 2 * 7 / 8 * size / level.effective_bytes_per_s + 8.4e-6 + 2 * 7 * 3.4e-6
    assert collective_s("all_reduce", size, span, "ring", "Simple") == pytest.approx(expected)
    # reduce-scatter and all-gather are each half an all-reduce (each pays the call once)
    rs = collective_s("reduce_scatter", size, span, "ring", "Simple")
    ag = collective_s("all_gather", size, span, "ring", "Simple")
    assert rs + ag == pytest.approx(expected + 8.4e-6)


def test_group_span_follows_the_mesh():
    cluster = catalog.cluster("dgx-a100-80gb")
    tp = group_span(cluster, 8, 1)  # TP=8 inside the node
    assert tp.levels == (0,)
    dp = group_span(cluster, 12, 8)  # DP across nodes, one member per node
    assert dp.levels == (1,) and dp.hops[0].members == 12 and dp.hops[0].inside == 1
    mixed = group_span(cluster, 32, 2)  # 4 members per node, 8 nodes
    assert [(h.level, h.members, h.inside) for h in mixed.hops] == [(0, 4, 1), (1, 8, 4)]
    rails = cluster.levels[1].rails
    assert mixed.hops[1].parallel_links == min(4, rails)


def test_comet_gemm_traffic():
    """COMET Sec. 3.3.2: min(ceil(U/S)·V + U, ceil(V/S)·U + V) + W."""
    u, v, w, s = 100.0, 30.0, 50.0, 40.0
    assert gemm_traffic_bytes(u, v, w, s) == pytest.approx(min(3 * 30 + 100, 1 * 100 + 30) + 50)
    # with an unbounded buffer every operand moves once
    assert gemm_traffic_bytes(u, v, w, 1e12) == pytest.approx(u + v + w)


@pytest.mark.parametrize("p,m", [(1, 4), (4, 4), (4, 16), (8, 3), (16, 64)])
def test_1f1b_simulation_matches_closed_form_for_uniform_stages(p, m):
    f, b = 1.0, 2.0
    events = simulate_1f1b([f] * p, [b] * p, m)
    makespan = max(end for stage in events for *_, end in stage)
    total, bubble = pipeline_time_s([(f + b, p)], m)
    assert makespan == pytest.approx(total)
    assert bubble == pytest.approx((p - 1) * (f + b))  # bubble fraction (p-1)/m of m·(f+b)


def test_closed_form_bounds_heterogeneous_stages():
    """A slower last stage (logits): the closed form stays within a few % of the event schedule."""
    p, m = 8, 32
    forward = [1.0] * (p - 1) + [1.3]
    backward = [2.0] * (p - 1) + [2.5]
    events = simulate_1f1b(forward, backward, m)
    makespan = max(end for stage in events for *_, end in stage)
    total, _ = pipeline_time_s([(3.0, p - 1), (3.8, 1)], m)
    assert total == pytest.approx(makespan, rel=0.05)


def test_interleaving_divides_the_bubble():
    total1, bubble1 = pipeline_time_s([(3.0, 8)], 64, 1)
    total4, bubble4 = pipeline_time_s([(3.0, 8)], 64, 4)
    assert bubble4 == pytest.approx(bubble1 / 4)
    assert total1 - total4 == pytest.approx(bubble1 * 3 / 4)


@pytest.mark.parametrize("model_id", ["gpt3-175b", "llama3-70b", "llama2-70b", "megatron-1t"])
def test_lowered_graph_has_the_model_parameters(model_id):
    model = catalog.model(model_id)
    graph = lower(model, 1, 128)
    assert graph.layer.params == model.params_per_layer
    assert graph.params == pytest.approx(model.num_params, rel=1e-9)


def test_gqa_and_swiglu_shapes():
    """Llama-3-70B: 64 query heads, 8 KV heads of 128; SwiGLU with three 8192 x 28672 matrices."""
    model = catalog.model("llama3-70b")
    ops = {op.name: op for op in lower(model, 1, 8192).layer.ops}
    assert ops["qkv"].n == (64 + 2 * 8) * 128
    assert ops["mlp_up"].n == 2 * 28672
    assert ops["mlp_down"].k == 28672
    assert ops["attention"].flop == pytest.approx(4 * 8192**2 * 64 * 128)


def test_zero_stages_shard_states():
    """ZeRO (Rajbhandari et al. 2020): stage 1 shards optimizer states, 2 gradients, 3 weights."""
    mem = {
        z: api.estimate("llama3-8b", "dgx-a100-80gb", num_devices=64, tp=1, zero_stage=z, global_batch_size=64,
                        recompute="full").memory
        for z in range(4)
    }
    params = catalog.model("llama3-8b").num_params
    assert mem[0].optimizer_bytes == pytest.approx(12 * params, rel=1e-6)
    assert mem[1].optimizer_bytes == pytest.approx(12 * params / 64, rel=1e-6)
    assert mem[1].gradients_bytes == mem[0].gradients_bytes
    assert mem[2].gradients_bytes == pytest.approx(mem[0].gradients_bytes / 64)
    assert mem[3].weights_bytes == pytest.approx(mem[0].weights_bytes / 64)
    assert mem[0].total_bytes > mem[1].total_bytes > mem[2].total_bytes > mem[3].total_bytes


def test_zero3_reduces_a_layer_of_gradients_at_a_time():
    """ZeRO-3 / FSDP reduce-scatter each gathered layer's gradients once its backward ends: their
    buffers hold at most two layers' worth however wide the data-parallel group, where DDP's
    default bucket grows with it (1M parameters per rank, Megatron-Core)."""
    def memory(zero_stage, dp):
        return api.estimate("llama3-8b", "dgx-h100", num_devices=dp, tp=1, zero_stage=zero_stage, global_batch_size=dp,
                            seq_len=2048, recompute="full").memory

    layer = 4096**2 * (2 + 2 * 8 / 32) + 3 * 4096 * 14336  # q, o, k, v; up, gate, down (218M)
    # ZeRO-3 reduces its gradients in 16 bits (Plan.grad_reduce_precision)
    assert memory(3, 64).comm_buffers_bytes == pytest.approx(2 * 2 * 64e6)  # the bucket, under a layer
    assert memory(3, 4096).comm_buffers_bytes == pytest.approx(2 * 2 * layer, rel=0.01)
    assert memory(1, 4096).comm_buffers_bytes == pytest.approx(2 * 4 * 4096e6)  # fp32, 4096M a bucket


@pytest.mark.parametrize(("state", "state_bytes", "step_bytes"), [
    ("fp32", 12, 30), ("fp32_remainders", 10, 28), ("bf16_moments", 8, 22), ("bf16", 4, 16)])
def test_adam_state_as_the_optimizer_keeps_it(state, state_bytes, step_bytes):
    """Adam's state per parameter and the HBM its step moves (parallel.memory.OPTIMIZER_STATES):
    fp32 master and moments; Apex's master as weight plus a 16-bit remainder; Megatron-Core's
    bf16 moments; Apex's bf16 state with no master. The step is memory-bound: its time scales
    with the bytes."""
    def run(optimizer_state):
        return api.estimate("llama3-8b", "dgx-h100", num_devices=8, tp=1, zero_stage=1, global_batch_size=8,
                            seq_len=2048, optimizer_state=optimizer_state)

    params = catalog.model("llama3-8b").num_params
    e, fp32 = run(state), run("fp32")
    assert e.memory.optimizer_bytes == pytest.approx(state_bytes * params / 8, rel=1e-6)
    assert e.memory.weights_bytes == fp32.memory.weights_bytes and e.memory.gradients_bytes == fp32.memory.gradients_bytes
    assert e.breakdown.optimizer_s == pytest.approx(fp32.breakdown.optimizer_s * step_bytes / 30, rel=0.02)
    fp32_training = api.estimate("llama3-8b", "dgx-h100", num_devices=8, global_batch_size=8, seq_len=2048,
                                 precision="fp32", optimizer_state=state, zero_stage=1)
    assert fp32_training.memory.optimizer_bytes == pytest.approx((8 if state_bytes >= 10 else 4) * params / 8, rel=1e-6)


def test_nemo_1_keeps_adams_master_as_remainders():
    """NeMo 24.07's distributed Adam (the nemo-launcher preset) stores the fp32 master as the bf16
    weight and a 16-bit remainder: 10 bytes of state a parameter where Megatron-Core keeps 12."""
    def run(framework):
        return api.estimate("llama3-8b", "dgx-h100", num_devices=8, tp=1, zero_stage=1, global_batch_size=8,
                            seq_len=2048, framework=framework)

    assert run("nemo-launcher").memory.optimizer_bytes == pytest.approx(run("nemo").memory.optimizer_bytes * 10 / 12)


def test_rails_stripe_a_collective_over_several_links():
    """A stride-1 group spanning nodes: with rails=8 a ring crosses each node boundary on 8 links."""
    striped = catalog.cluster("dgx-a100-80gb")
    assert striped.levels[1].rails == 8  # every HDR NIC of the node
    one_nic = capped_rails(striped, 1)
    assert one_nic.levels[1].rails == 1 and capped_rails(striped, None) is striped
    one = collective_s("all_gather", 1e10, group_span(one_nic, 64, 1), "ring", "Simple")
    eight = collective_s("all_gather", 1e10, group_span(striped, 64, 1), "ring", "Simple")
    latency = 8.4e-6 + 56 * 3.4e-6 + 7 * 14e-6  # NCCL Simple: 56 NVLink steps, 7 network steps
    assert (one - latency) == pytest.approx(8 * (eight - latency))


def test_plan_network_rails_caps_the_nics_a_data_parallel_collective_drives():
    """A 32-way data-parallel group over 4 DGX A100 nodes: the gradient all-reduce crosses the
    node boundary on all 8 NICs unless the plan (or the megatron-lm preset) allows fewer."""
    def dp_comm(**fields):
        e = api.estimate("llama3-8b", "dgx-a100-80gb", num_devices=32, global_batch_size=32, seq_len=2048, **fields)
        return e.comm_total_s["dp"]

    every_nic, one_nic = dp_comm(), dp_comm(network_rails=1)
    assert one_nic > 4 * every_nic
    # the megatron-lm preset caps ZeRO-3's gathers and reduce-scatters alone (SC21's DeepSpeed
    # ZeRO-3 runs); its own data-parallel all-reduce drives every NIC
    assert dp_comm(framework="megatron-lm") == pytest.approx(dp_comm(framework="megatron-lm", network_rails=8))
    sharded = dict(zero_stage=3, framework="megatron-lm")
    assert dp_comm(**sharded) == pytest.approx(dp_comm(**sharded, zero3_network_rails=1))
    assert dp_comm(**sharded) > 4 * dp_comm(**sharded, zero3_network_rails=8)


@pytest.mark.parametrize("plan", [
    dict(num_devices=1536, tp=8, pp=16, global_batch_size=1536, recompute="full"),
    dict(num_devices=64, tp=8, pp=8, global_batch_size=64, recompute="selective", sequence_parallel=True, zero_stage=1),
    dict(num_devices=384, tp=1, pp=1, global_batch_size=1536, micro_batch_size=4, recompute="full", zero_stage=3),
])
def test_madmax_breakdowns_add_up(plan):
    """MAD Max Fig. 15: serialized compute by op kind and communication by collective type."""
    e = api.estimate("gpt3-175b", "dgx-a100-80gb", **plan)
    assert sum(e.serialized_by_op_s.values()) == pytest.approx(e.breakdown.compute_s + e.breakdown.optimizer_s, rel=1e-9)
    assert sum(c["serialized_s"] for c in e.collectives.values()) == pytest.approx(sum(e.comm_total_s.values()), rel=1e-9)
    exposed = sum(c["exposed_s"] for c in e.collectives.values())
    assert exposed == pytest.approx(sum(e.breakdown.exposed_comm_s.values()), rel=1e-6)
    for c in e.collectives.values():
        assert 0.0 <= c["hidden_fraction"] <= 1.0
