"""Inference: prefill is compute bound, decoding is memory-bandwidth bound (roofline)."""

from __future__ import annotations

import json
import random

import pytest
from cli_runner import run_cli

from meshplan import api, catalog
from meshplan.errors import MeshplanError

TASK = {"kind": "inference", "batch_size": 64, "prompt_len": 2048, "output_len": 512}


@pytest.fixture(scope="module")
def llama70b():
    return api.estimate("llama3-70b", "dgx-h100", num_devices=8, tp=8, task=TASK)


def test_decode_is_memory_bound_and_above_its_roofline(llama70b):
    d = llama70b.decode
    assert d.memory_bound
    # weights of one device plus the KV cache it reads, at peak HBM bandwidth
    model = catalog.model("llama3-70b")
    device = catalog.device("h100-sxm5-80gb")
    kv_read = 64 * (2048 + 256) * model.num_layers * 2 * (8 // 8) * 128 * 2
    lower = (model.num_params / 8 * 2 + kv_read) / device.hbm_bytes_per_s
    assert d.roofline_s == pytest.approx(lower, rel=0.03)  # embedding/head not in the layer bound
    assert d.roofline_s <= llama70b.tpot_s
    # the kernels alone within 3x of the bandwidth roofline (which counts no TP all-reduce; the
    # measured per-kernel fixed costs of norms, activations and attention are most of the rest)
    assert d.roofline_s <= d.compute_s <= 3.0 * d.roofline_s


def test_prefill_is_compute_bound_and_above_its_roofline(llama70b):
    p = llama70b.prefill
    assert not p.memory_bound
    assert p.roofline_s <= llama70b.ttft_s
    assert p.arithmetic_intensity > p.ridge


def test_throughput_and_latency_are_consistent(llama70b):
    e = llama70b
    assert e.decode_tokens_per_s == pytest.approx(64 / e.tpot_s)
    assert e.request_s == pytest.approx(e.ttft_s + 512 * e.tpot_s)
    assert e.memory.kv_cache_bytes == pytest.approx(64 * (2048 + 512) * 80 * 2 * 1 * 128 * 2)
    assert e.fits


def test_bigger_batch_raises_throughput_and_kv_cache():
    small = api.estimate("llama3-70b", "dgx-h100", num_devices=8, tp=8, task={**TASK, "batch_size": 8})
    large = api.estimate("llama3-70b", "dgx-h100", num_devices=8, tp=8, task={**TASK, "batch_size": 128})
    assert large.decode_tokens_per_s > small.decode_tokens_per_s
    assert large.memory.kv_cache_bytes == pytest.approx(16 * small.memory.kv_cache_bytes)


def test_fp8_halves_the_weights():
    bf16 = api.estimate("llama3-70b", "dgx-h100", num_devices=8, tp=8, task=TASK)
    fp8 = api.estimate("llama3-70b", "dgx-h100", num_devices=8, tp=8, precision="fp8", task=TASK)
    assert fp8.memory.weights_bytes == pytest.approx(bf16.memory.weights_bytes / 2)
    assert fp8.tpot_s < bf16.tpot_s


def test_batch_must_split_over_replicas():
    with pytest.raises(MeshplanError) as err:
        api.estimate("llama3-8b", "dgx-h100", num_devices=8, tp=1, task={**TASK, "batch_size": 3})
    assert err.value.field == "task.batch_size"


def test_inference_cli(monkeypatch, capsys):
    code, out, err = run_cli(
        monkeypatch, capsys, "estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--devices", "8",
        "--tp", "8", "--task", "inference", "--batch", "64", "--prompt-len", "2048", "--output-len", "512", "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["decode"]["memory_bound"] is True and result["prefill"]["memory_bound"] is False
    assert result["tpot_s"] > 0 and result["ttft_s"] > result["tpot_s"]


def test_serving_search_ranks_by_time_per_token():
    result = api.search("llama3-70b", "dgx-h100", 16, task=TASK, top=5)
    tpots = [r["tpot_s"] for r in result.top]
    assert tpots == sorted(tpots) and all(r["fits"] for r in result.top)
    # every split of 16 devices into tp x pp (x dp) that fits was evaluated
    best = result.top[0]
    direct = api.estimate("llama3-70b", "dgx-h100", num_devices=16, tp=best["tp"], pp=best["pp"], task=TASK)
    assert direct.tpot_s == pytest.approx(best["tpot_s"])


def test_serving_search_cli(monkeypatch, capsys):
    code, out, err = run_cli(
        monkeypatch, capsys, "search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8",
        "--task", "inference", "--batch", "32", "--json",
    )
    assert code == 0, err
    top = json.loads(out)["top"]
    assert top and all(r["decode_memory_bound"] for r in top)


# --- the phases go through the training stages: program, costs, engine ---


def _random_serving(rng):
    model = rng.choice(["llama3-8b", "llama3-70b", "gpt3-175b", "mixtral-8x7b", "deepseek-v3"])
    tp, pp, dp = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4]), rng.choice([1, 2])
    plan = dict(tp=tp, pp=pp, dp=dp, tp_overlap=rng.choice(["none", "bulk", "pipelined"]),
                sequence_parallel=tp > 1 and rng.random() < 0.3, precision=rng.choice(["bf16", "fp8"]))
    task = {"kind": "inference", "batch_size": dp * rng.choice([1, 2, 3, 8, 32]),
            "prompt_len": rng.choice([1, 16, 128, 2048]), "output_len": rng.choice([1, 8, 512])}
    return model, plan, task


def test_composed_phases_equal_unrolled_layers():
    """On 60 random small serving configs (dense and MoE), the prefill and the decode step with
    every layer composed or unrolled agree to 1e-9: time, compute and exposed communication."""
    from meshplan.timeline.inference import inference_estimate

    rng = random.Random(5)
    checked = 0
    while checked < 60:
        model, plan, task = _random_serving(rng)
        try:
            s = api.scenario(model, "dgx-h100", plan, plan["tp"] * plan["pp"] * plan["dp"], task)
            fast = inference_estimate(s)
        except MeshplanError:
            continue
        slow = inference_estimate(s, compose=False)
        for phase in ("prefill", "decode"):
            f, u = getattr(fast, phase), getattr(slow, phase)
            for field in ("time_s", "compute_s", "tp_comm_s", "pp_comm_s"):
                assert getattr(f, field) == pytest.approx(getattr(u, field), rel=1e-9, abs=1e-15), (model, plan, task, phase, field)
        checked += 1


def test_blocking_phase_is_compute_plus_its_collectives():
    """Without overlap a pass is its compute, then each collective in full: per layer two
    all-reduces of the residual stream (Megatron-LM), the embedding's all-reduce, the logits'
    all-gather, and a send per stage boundary."""
    from meshplan.costs.collectives import collective_s
    from meshplan.parallel.mesh import axis_span

    model = catalog.model("llama3-70b")
    e = api.estimate("llama3-70b", "dgx-h100", num_devices=16, tp=8, pp=2, task=TASK)
    s = api.scenario("llama3-70b", "dgx-h100", {"tp": 8, "pp": 2}, 16, TASK)
    span = axis_span(s.cluster, s.plan, "tp")
    x = 64 * model.hidden_size * 2.0  # one token per sequence, bf16
    tp_s = (2 * model.num_layers + 1) * collective_s("all_reduce", x, span) + collective_s("all_gather", 64 * model.vocab_size * 2.0, span)
    d = e.decode
    assert d.tp_comm_s == pytest.approx(tp_s, rel=1e-12)
    assert d.pp_comm_s > 0
    assert d.time_s == pytest.approx(d.compute_s + d.tp_comm_s + d.pp_comm_s, rel=1e-12)


def test_pipelined_tensor_parallelism_hides_communication():
    blocking = api.estimate("llama3-70b", "dgx-h100", num_devices=8, tp=8, task=TASK)
    pipelined = api.estimate("llama3-70b", "dgx-h100", num_devices=8, tp=8, tp_overlap="pipelined", task=TASK)
    for phase in ("prefill", "decode"):
        b, p = getattr(blocking, phase), getattr(pipelined, phase)
        assert p.time_s < b.time_s and p.tp_comm_s < b.tp_comm_s
        assert p.compute_s == pytest.approx(b.compute_s)


def test_memory_is_the_fullest_pipeline_role():
    """Each pipeline role holds its own layers (the first the embedding, the last the output
    layer) and their KV cache; the estimate reports the one with the least headroom."""
    from meshplan.timeline.inference import serving_plans

    s = api.scenario("llama3-8b", "dgx-h100", {"tp": 2, "pp": 2}, 4, TASK)
    roles = serving_plans(s)[1].costed.program.roles
    e = api.estimate_scenario(s)
    assert [r.name for r in roles] == ["first", "last"]
    assert e.memory == min((r.memory for r in roles), key=lambda m: m.headroom_bytes)
    model = catalog.model("llama3-8b")
    kv = 64 * (2048 + 512) * 16 * 2 * (model.kv_heads / 2) * model.dim_per_head * 2
    assert e.memory.kv_cache_bytes == pytest.approx(kv)


def test_pareto_fronts_are_for_training_only():
    with pytest.raises(MeshplanError) as err:
        api.pareto("llama3-8b", "dgx-h100", 8, task=TASK)
    assert err.value.field == "--pareto"
