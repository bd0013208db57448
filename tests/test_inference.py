"""Inference: prefill is compute bound, decoding is memory-bandwidth bound (roofline)."""

from __future__ import annotations

import json

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
    assert d.roofline_s <= llama70b.tpot_s <= 3.0 * d.roofline_s


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
