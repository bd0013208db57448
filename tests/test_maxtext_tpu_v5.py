"""MaxText's published TPU v5e and v5p runs (tests/data/maxtext_tpu_v5.yaml), held out of every
fit: the tpu profile's GEMMs are fitted on TPU v4 (tests/test_maxtext_tpu.py), the v5 chips and
pods are their datasheets'."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from meshplan import catalog
from meshplan.io.validation_cases import validate

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "maxtext_tpu_v5.yaml"
CASES = yaml.safe_load(DATA.read_text())
PEAK = {"tpu-v5e-pod": 197e12, "tpu-v5p-pod": 459e12}


def test_every_run_converts_its_tflops_to_the_step_time():
    """MaxText's TFLOP/s per chip (train.py's calculate_training_tflops): 6 x parameters x 2048
    tokens x the per-chip batch, plus 12 x heads x layers x head_dim x 2048^2 x the per-chip batch
    for attention, halved for causality in the v5p table (December 2023), over the step time; the
    table's TFLOP/s is its MFU of the chip's peak, rounded."""
    assert len(CASES) == 40
    for case in CASES:
        m, batch, par = case["model"], case["batch"], case["parallelism"]
        chips = case["hardware"]["num_devices"]
        per_chip = batch["global_batch_sequences"] / chips
        assert batch["micro_batch_size"] == per_chip * par["tp"] and par["dp"] * par["tp"] == chips
        params = m["num_layers"] * (4 * m["hidden_size"] * m["num_attention_heads"] * m["head_dim"]
                                    + 2 * m["hidden_size"] * m["ffn_hidden_size"]) + m["vocab_size"] * m["hidden_size"]
        attention = 12 * m["num_attention_heads"] * m["num_layers"] * m["head_dim"] * batch["seq_len"] ** 2 * per_chip
        causal = case["hardware"]["cluster"] == "tpu-v5p-pod"
        flop = 6 * params * batch["seq_len"] * per_chip + (attention / 2 if causal else attention)
        achieved = flop / case["measured"]["step_time_s"]
        assert achieved == pytest.approx(case["measured"]["mfu"] * PEAK[case["hardware"]["cluster"]], rel=1e-4)
        assert achieved / 1e12 == pytest.approx(case["measured"]["tflops_per_gpu"], abs=0.5)


def test_the_v5_chips_take_their_datasheets_and_tpu_v4s_kernels():
    v5e, v5p = catalog.device("tpu-v5e"), catalog.device("tpu-v5p")
    assert (v5e.peak("bf16"), v5e.hbm_bytes_per_s, v5e.sm_count) == (197e12, 819e9, 4)
    assert (v5p.peak("bf16"), v5p.hbm_bytes_per_s, v5p.sm_count) == (459e12, 2765e9, 8)
    assert "fp8" not in v5e.peak_flop_per_s
    tpu = catalog.efficiency("tpu").kernels
    for device in (v5e, v5p):
        assert catalog.efficiency(device.efficiency).kernels == tpu
    pod = catalog.cluster("tpu-v5e-pod")
    assert [lvl.size for lvl in pod.levels] == [256, None] and pod.levels[0].torus_dims == (16, 16)
    assert pod.levels[1].bytes_per_s == pytest.approx(6.4e12 / 8 / 256)  # 6.4 Tb/s per pod
    assert [lvl.size for lvl in catalog.cluster("tpu-v5p-pod").levels] == [64, 6144, None]


@pytest.mark.parametrize("group, median_bound, max_bound", [("maxtext_tpu_v5e", 0.08, 0.18), ("maxtext_tpu_v5p", 0.11, 0.25)])
def test_published_tpu_v5_runs(group, median_bound, max_bound):
    """Measured at HEAD: v5e median 6.6%, max 16.9% (32B on one slice, slow); v5p median 8.6%,
    max 22.8% (512B, slow). The v5e runs lose 7-21% from 1 to 32 slices where the prediction
    stays flat: their data-center-network gradient reduction is hidden under the backward here."""
    errors = [r.relative_error for r in validate(DATA) if r.group == group]
    assert len(errors) == (24 if group.endswith("v5e") else 16) and all(e is not None for e in errors)
    assert statistics.median(abs(e) for e in errors) <= median_bound
    assert max(abs(e) for e in errors) <= max_bound
