"""Sliding-window attention (TransformerModel.sliding_window): which layers it windows, what
their flash kernels skip, what a server caches, and how configs and cases name it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import meshplan
from meshplan import catalog
from meshplan.costs.kernels import keys_per_query
from meshplan.errors import MeshplanError
from meshplan.io.hf_config import model_from_hf_config
from meshplan.api import scenario
from meshplan.parallel.program import build_program
from meshplan.specs.base import build
from meshplan.specs.model import TransformerModel
from meshplan.workloads.transformer import lower

HF = Path(__file__).parent / "fixtures" / "hf"
LLAMA = catalog.model("llama3-8b").model_dump(exclude={"sources"})


def windowed(window: int | None, pattern: int | None = None, **fields) -> dict:
    return {**LLAMA, "sliding_window": window, "sliding_window_pattern": pattern, **fields}


def test_a_block_of_queries_computes_on_its_window_and_the_diagonal():
    # 128-row blocks over a 4096-token causal sequence: 2112 keys on average without a window
    assert keys_per_query(4096, 4096, True, 128) == 2112
    # a 1024 window: the first 8 blocks ramp up as causal ones do (128, 256, ..., 1024), then
    # every block spans 1024 + 127 keys: (128 * 36 + 1151 * 24) / 32
    assert keys_per_query(4096, 4096, True, 128, 1024) == pytest.approx((128 * 36 + 1151 * 24) / 32)
    assert keys_per_query(4096, 4096, True, 128, 4096) == 2112  # a window over every key changes nothing
    assert keys_per_query(1, 8192, True, 128, 1024) == 1024  # a decoding step reads its window
    assert keys_per_query(1, 100, True, 128, 1024) == 100  # or the whole cache while it is shorter


def test_a_window_as_wide_as_the_sequence_changes_no_estimate():
    plan = dict(tp=8, num_devices=8, global_batch_size=8, micro_batch_size=1, seq_len=4096)
    plain = meshplan.estimate(LLAMA, "dgx-h100", **plan)
    wide = meshplan.estimate(windowed(4096), "dgx-h100", **plan)
    assert wide.step_time_s == plain.step_time_s
    assert [b.name for b in lower(TransformerModel(**windowed(4096)), 1, 4096).blocks] == ["dense_layer"]


def test_windowed_layers_attend_at_the_cost_of_their_window():
    plan = dict(tp=8, num_devices=8, global_batch_size=8, micro_batch_size=1, seq_len=32768)
    full = meshplan.estimate(LLAMA, "dgx-h100", **plan)
    mistral = meshplan.estimate(windowed(4096), "dgx-h100", **plan)
    # model flop: each query counts its window's 4096 keys instead of the 32768 of the square
    attention = full.model_flop_per_step - mistral.model_flop_per_step
    square = 3 * 2 * 32768 * 32768 * 2 * 4096 * 32 * 8  # fwd + bwd over every layer and sequence, Megatron's count
    assert attention == pytest.approx(square * (1 - 4096 / 32768), rel=1e-9)
    # time: the flash kernel computes on about 4223 keys a query instead of 16448
    ratio = mistral.serialized_by_op_s["attention"] / full.serialized_by_op_s["attention"]
    assert 0.22 < ratio < 0.32
    assert mistral.step_time_s < full.step_time_s
    assert mistral.serialized_by_op_s["gemm"] == full.serialized_by_op_s["gemm"]


def test_a_pattern_windows_all_but_each_pth_layer_and_stages_count_them_by_kind():
    gemma = TransformerModel(**windowed(1024, 6, num_layers=62))
    assert gemma.windowed_layers == 52
    assert [gemma.windowed(i) for i in range(6)] == [True] * 5 + [False]
    graph = lower(gemma, 1, 8192)
    assert {b.name for b in graph.blocks} == {"dense_layer", "dense_layer_windowed"}
    assert sum(b.count for b in graph.blocks if b.name == "dense_layer_windowed") == 52
    assert len(graph.blocks) == 21  # runs of five windowed layers and one global, two windowed at the end
    s = scenario(gemma, "dgx-h100", tp=8, pp=2, num_devices=16, global_batch_size=16, micro_batch_size=1, seq_len=8192)
    counts = [dict((k, n) for k, n, _ in role.layer_counts) for role in build_program(s).roles]
    assert counts == [{"dense_layer_windowed": 26, "dense_layer": 5}] * 2  # layers 0-30 and 31-61 alike


def test_a_server_caches_a_windowed_layers_window_only():
    task = {"kind": "inference", "batch_size": 8, "prompt_len": 8192, "output_len": 1024}
    gemma = catalog.model("gemma-3-27b").model_dump()
    plain = {**gemma, "sliding_window": None, "sliding_window_pattern": None}
    windowed_cache = meshplan.estimate(gemma, "dgx-h100", tp=8, num_devices=8, task=task).memory.kv_cache_bytes
    full_cache = meshplan.estimate(plain, "dgx-h100", tp=8, num_devices=8, task=task).memory.kv_cache_bytes
    assert windowed_cache / full_cache == pytest.approx((10 * 9216 + 52 * 1024) / (62 * 9216))


def test_a_decoding_step_reads_a_windowed_layers_window():
    task = {"kind": "inference", "batch_size": 32, "prompt_len": 16384, "output_len": 256}
    gemma = catalog.model("gemma-3-27b").model_dump()
    plain = {**gemma, "sliding_window": None, "sliding_window_pattern": None}
    fast = meshplan.estimate(gemma, "dgx-h100", tp=8, num_devices=8, task=task)
    slow = meshplan.estimate(plain, "dgx-h100", tp=8, num_devices=8, task=task)
    assert fast.decode.time_s < 0.75 * slow.decode.time_s


def test_the_window_needs_its_size():
    with pytest.raises(MeshplanError, match="sliding_window_pattern: got 6"):
        build(TransformerModel, windowed(None, 6), "model")


def test_configs_name_their_windowed_layers():
    oss = model_from_hf_config(HF / "gpt-oss-120b" / "config.json")  # no layer_types: GptOssConfig alternates
    assert (oss.sliding_window, oss.sliding_window_pattern, oss.windowed_layers) == (128, 2, 18)
    assert model_from_hf_config(HF / "mistral-7b" / "config.json").windowed_layers == 32  # every layer, v0.1's 4096
    assert model_from_hf_config(HF / "qwen2-7b" / "config.json").sliding_window is None  # use_sliding_window false
    assert model_from_hf_config(HF / "mixtral-8x7b" / "config.json").sliding_window is None
    config = json.loads((HF / "gpt-oss-120b" / "config.json").read_text())
    listed = model_from_hf_config({**config, "layer_types": ["sliding_attention", "full_attention"] * 18})
    assert listed.sliding_window_pattern == 2
    gemma3 = {**json.loads((HF / "llama3-8b" / "config.json").read_text()), "model_type": "gemma3_text", "sliding_window": 1024}
    assert model_from_hf_config(gemma3).sliding_window_pattern == 6  # Gemma3TextConfig's default
    with pytest.raises(MeshplanError, match="layer_types"):
        model_from_hf_config({**config, "layer_types": ["full_attention"] * 3 + ["sliding_attention"] * 33})
    with pytest.raises(MeshplanError, match="max_window_layers"):
        qwen = json.loads((HF / "qwen2-7b" / "config.json").read_text())
        model_from_hf_config({**qwen, "use_sliding_window": True, "max_window_layers": 4})


def test_the_catalog_gpt_oss_matches_its_model_card():
    assert catalog.model("gpt-oss-120b").num_params == pytest.approx(116.83e9, rel=1e-3)
    assert catalog.model("gpt-oss-20b").num_params == pytest.approx(20.91e9, rel=1e-3)
    assert catalog.model("gemma-3-27b").num_params - catalog.model("gemma-3-27b").embedding_params == pytest.approx(25.6e9, rel=2e-3)


def test_an_attention_block_attends_through_its_window():
    block = dict(block="attention", num_layers=1, hidden_size=4096, num_attention_heads=32, ffn_hidden_size=1, vocab_size=1000,
                 seq_len=32768)
    graph = lower(TransformerModel(**block, sliding_window=4096), 1, 32768)
    (core,) = [op for b in graph.blocks for op in b.ops if op.kind == "attention"]
    assert core.attention.window == 4096
    assert core.flop == 2.0 * 32768 * 4096 * 2 * 4096


def test_the_catalog_mistral_windows_every_layer():
    mistral = catalog.model("mistral-7b")
    assert mistral.num_params == pytest.approx(7_241_732_096, rel=1e-3)  # mistralai/Mistral-7B-v0.1's safetensors
    assert (mistral.sliding_window, mistral.windowed_layers) == (4096, 32)
    plan = dict(tp=8, num_devices=8, global_batch_size=8, micro_batch_size=1)
    windowed = meshplan.estimate("mistral-7b", "dgx-h100", **plan)  # its 8192-token context
    full = meshplan.estimate({**mistral.model_dump(), "sliding_window": None}, "dgx-h100", **plan)
    # at 8192 tokens the window leaves a query block 0.76 of the causal keys; the kernels' launches
    # and K/V passes stay
    assert windowed.serialized_by_op_s["attention"] < 0.9 * full.serialized_by_op_s["attention"]
