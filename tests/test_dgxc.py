"""NVIDIA's DGX Cloud benchmarking recipes (v24.11.1): 70 measured H100 runs of Llama 3.1 8B, 70B
and 405B, Nemotron-4 15B and 340B and GPT-3 175B, BF16 and FP8, 8 to 2304 GPUs
(tests/data/dgxc_h100.yaml, written by benchmarks/import_dgxc_tables.py)."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import yaml

from meshplan.io.validation_cases import validate

DATA = Path(__file__).resolve().parent / "data" / "dgxc_h100.yaml"


def _errors() -> dict[str, list[float]]:
    """Relative errors per model and precision (the case id's middle)."""
    out: dict[str, list[float]] = {}
    for r in validate(DATA):
        assert r.relative_error is not None, r.id
        key = re.match(r"dgxc_\d\d\.\d\d_(.+)_\d+gpu$", r.id)[1]
        out.setdefault(key, []).append(r.relative_error)
    return out


def test_every_table_column_is_a_case_with_its_plan():
    cases = yaml.safe_load(DATA.read_text())
    assert len(cases) == 70
    for case in cases:
        p = case["parallelism"]
        assert p["tp"] * p["pp"] * p["cp"] * p["dp"] == case["hardware"]["num_devices"]
        assert case["batch"]["global_batch_sequences"] % (p["dp"] * case["batch"]["micro_batch_size"]) == 0


def test_dgxc_h100_runs_within_their_measured_step_times():
    """Median 4.3% over the 70 runs; every Llama and Nemotron run within 13% (the 70B FP8 runs
    the furthest, 8-12% fast). GPT-3 175B runs 9-21% fast (the FP8 runs at 512 and 1024 GPUs
    measured 9-13% slower than at 128 and 2048). Its recipe, unlike the others, keeps NeMo's GPT-3
    dropout (0.1 on the hidden states and on the attention probabilities,
    nemo_megatron/gpt3_175b_hydra.yaml), which the plan does not express, but that is not the gap:
    cuDNN's fused attention pays about 3% more attention time for it on Hopper (TransformerEngine
    issue 3312: H200, sbhd layout, head dim 128: 0.594 to 0.614 ms)."""
    errors = _errors()
    every = [e for v in errors.values() for e in v]
    assert statistics.median(abs(e) for e in every) <= 0.05
    for key, values in errors.items():
        bound = 0.22 if key.startswith("gpt3") else 0.13
        assert max(abs(e) for e in values) <= bound, key
