"""DeepSeek-V3's pre-training on 2048 H800s (tests/data/deepseek_v3_report.yaml), and the
pipeline schedule a case may name."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from meshplan.io.case_inputs import case_inputs
from meshplan.io.validation_cases import run_case

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "deepseek_v3_report.yaml"
(CASE,) = yaml.safe_load(DATA.read_text())


def test_the_step_time_is_the_reports_gpu_hours_per_trillion_tokens():
    """180K H800 GPU hours a trillion tokens, a step of 15360 sequences of 4096 tokens on 2048 GPUs."""
    tokens = CASE["batch"]["global_batch_sequences"] * CASE["batch"]["seq_len"]
    gpu_seconds_per_token = 180e3 * 3600 / 1e12
    assert tokens * gpu_seconds_per_token / CASE["hardware"]["num_devices"] == pytest.approx(CASE["measured"]["step_time_s"], rel=1e-3)


def test_deepseek_v3_on_2048_h800s_within_10_percent():
    """A whole-run average (checkpoints, evaluation and the batch ramp in it), predicted from the
    report's plan: DualPipe over 16 stages, 64-way experts over 8 nodes, block-scaled FP8."""
    result = run_case(copy.deepcopy(CASE), 0)
    assert result.error is None and result.fits
    assert abs(result.relative_error) <= 0.10


def test_dualpipe_is_read_and_runs_faster_than_1f1b_here():
    """DualPipe's bubble is (p/2 - 1) of a paired F&B chunk against 1F1B's (p - 1) forward and
    backward (DeepSeek-V3, Table 2), so with the same plan the step is shorter."""
    plain = copy.deepcopy(CASE)
    plain["parallelism"]["schedule"] = "1F1B"
    assert run_case(copy.deepcopy(CASE), 0).predicted_step_time_s < run_case(plain, 0).predicted_step_time_s


@pytest.mark.parametrize("spelling, schedule", [("DualPipe", "dualpipe"), ("interleaved 1F1B", "1f1b"), ("1f1b", "1f1b"),
                                                ("GPipe", "gpipe"), ("ZB-H1", "zb-h1"), ("zero bubble", "zb-h1")])
def test_schedule_spellings(spelling, schedule):
    case = copy.deepcopy(CASE)
    case["parallelism"]["pipeline_schedule"] = spelling
    del case["parallelism"]["schedule"]
    assert case_inputs(case, "x")["plan"]["schedule"] == schedule


def test_an_unknown_schedule_is_named():
    case = copy.deepcopy(CASE)
    case["parallelism"]["schedule"] = "chimera"
    error = run_case(case, 0).error
    assert "plan.schedule" in error and "chimera" in error and "dualpipe" in error
