"""Serving against TensorRT-LLM's published figures (tests/data/trtllm_perf.yaml): a static batch's
output tokens per second, and the first token's latency at batch 1, on H100 (FP8 weights and KV
cache) and A100 (FP16). Nothing is fitted on them."""

from __future__ import annotations

import statistics
from pathlib import Path

import yaml

import meshplan

DATA = yaml.safe_load((Path(__file__).parent / "data" / "trtllm_perf.yaml").read_text())
CLUSTER = {"h100": "dgx-h100", "a100": "dgx-a100-80gb"}
PRECISION = {"h100": "fp8", "a100": "fp16"}


def _estimate(system: str, model: str, batch: int, tp: int, prompt: int, output: int, kv_cache_dtype=None):
    kv = kv_cache_dtype if kv_cache_dtype is not None else ("fp8" if system == "h100" else None)
    task = {"kind": "inference", "batch_size": batch, "prompt_len": prompt, "output_len": output,
            **({"kv_cache_dtype": kv} if kv else {})}
    return meshplan.estimate({**DATA["models"][model], "name": model}, CLUSTER[system], num_devices=tp, tp=tp, task=task,
                             precision=PRECISION[system])


def throughput_rows():
    """(label, row, predicted, measured): output tokens per second per GPU of each static batch."""
    for row in DATA["throughput"]:
        system, model, batch, tp, prompt, output, measured = row
        estimate = _estimate(system, model, batch, tp, prompt, output)
        yield "throughput", row, batch * output / estimate.request_s / tp, measured


def first_token_rows():
    """(label, row, predicted, measured): the first token's latency in ms at batch 1."""
    for row in DATA["first_token"]:
        system, model, tp, prompt, measured = row
        yield "first token", row, 1e3 * _estimate(system, model, 1, tp, prompt, 1).ttft_s, measured


def test_the_first_token_at_batch_1_within_20_percent():
    """A prefill at batch 1: median 7.6% over the 16 rows, every one within 19%."""
    errors = [predicted / measured - 1 for _, _, predicted, measured in first_token_rows()]
    assert len(errors) == 16
    assert statistics.median(map(abs, errors)) < 0.10
    assert max(map(abs, errors)) < 0.20


def test_static_batches_with_short_outputs_within_20_percent():
    """128 output tokens (the batch's prefill and 128 decode steps): within -17% and +10% on both
    systems. 2048 outputs: on one GPU 13-22% faster than predicted, the multi-head models at tp 2
    within 8%, and the grouped key-value models (Llama 2 70B, Falcon 180B) at tp 2-8 37-70% slower
    than predicted: a decode cost of those engines the model does not have (not traced)."""
    rows = [(row, predicted / measured - 1) for _, row, predicted, measured in throughput_rows()]
    short = [error for row, error in rows if row[5] == 128]
    assert len(rows) == 29 and len(short) == 15
    assert max(map(abs, short)) < 0.20
    assert statistics.median(abs(e) for _, e in rows) < 0.20


def test_an_fp8_kv_cache_is_what_lets_the_published_batches_fit():
    """The H100 rows ran an FP8 KV cache: with it every batch fits in 80 GB, with the
    activations' 16 bits Llama 2 7B's 112 sequences of 2176 tokens (125 GB of cache) do not."""
    for system, model, batch, tp, prompt, output, _ in DATA["throughput"]:
        if system == "h100":
            assert _estimate(system, model, batch, tp, prompt, output).fits, (model, batch)
    wide = _estimate("h100", "LLaMA 7B", 112, 1, 128, 2048, kv_cache_dtype="bf16")
    narrow = _estimate("h100", "LLaMA 7B", 112, 1, 128, 2048)
    assert not wide.fits
    assert wide.memory.kv_cache_bytes == 2 * narrow.memory.kv_cache_bytes
    assert narrow.tpot_s < wide.tpot_s
