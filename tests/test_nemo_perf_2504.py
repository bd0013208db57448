"""NeMo 25.04's published GB200 pre-training runs (tests/data/nemo_perf_2504_gb200.yaml), a table
nothing in meshplan is fitted on."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from meshplan.io.validation_cases import validate
from test_scaling import per_gpu_tokens_per_s

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "nemo_perf_2504_gb200.yaml"
CASES = yaml.safe_load(DATA.read_text())


def test_every_row_converts_its_tokens_per_gpu_to_the_step_time():
    for case in CASES:
        measured = case["measured"]
        assert per_gpu_tokens_per_s(measured["step_time_s"], case) == pytest.approx(measured["tokens_per_s_per_gpu"], rel=1e-5)
        par = case["parallelism"]
        assert par["tp"] * par["pp"] * par["cp"] * par["dp"] == case["hardware"]["num_devices"]


def test_nemo_2504_gb200_runs():
    """Dense models from 8B to 405B and Mixtral 8x7B on 8 to 128 GB200s: median 5.3%, Llama 3.1
    405B (tp 4, pp 8 x vp 8, cp 2) the farthest at -11.0%."""
    results = validate(DATA)
    errors = [r.relative_error for r in results]
    assert len(errors) == 7 and all(e is not None for e in errors)
    assert statistics.median(abs(e) for e in errors) <= 0.06
    assert max(abs(e) for e in errors) <= 0.15
