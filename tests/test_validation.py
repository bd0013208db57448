"""meshplan validate against published, measured runs (shared/validation/public-cases.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan.io.validation_cases import summarize, validate

CASES = Path(__file__).resolve().parents[2] / "shared" / "validation" / "public-cases.yaml"

pytestmark = pytest.mark.skipif(not CASES.is_file(), reason="shared/validation is not beside the repo")

#: DeepSpeed ZeRO-3 runs of Megatron SC21 Table 2: measured step times imply about one NIC of
#: bandwidth per GPU for the weight gathers, far below the multi-rail NCCL rings meshplan models.
#: Known misses, kept visible rather than tuned away.
KNOWN_MISSES = {
    "megatron_sc21_t2_zero3_175B_384gpu",
    "megatron_sc21_t2_zero3_175B_768gpu",
    "megatron_sc21_t2_zero3_175B_1536gpu",
    "megatron_sc21_t2_zero3_530B_640gpu",
    "megatron_sc21_t2_zero3_530B_1120gpu",
    "megatron_sc21_t2_zero3_530B_2240gpu",
}


@pytest.fixture(scope="module")
def results():
    return validate(CASES)


def test_every_dense_case_is_predicted_and_others_say_why(results):
    for r in results:
        if r.skipped:
            assert r.relative_error is None and r.predicted_step_time_s is None
        else:
            assert r.predicted_step_time_s > 0 and r.fits
    dense = [r for r in results if not r.skipped]
    assert len(dense) >= 30


def test_median_error_per_group_within_10_percent(results):
    for group, stats in summarize(results).items():
        assert stats["median_abs_error"] <= 0.10, group


def test_every_case_within_25_percent(results):
    misses = {r.id: r.relative_error for r in results if r.relative_error is not None and abs(r.relative_error) > 0.25}
    assert set(misses) <= KNOWN_MISSES, misses


@pytest.mark.xfail(strict=True, reason="ZeRO-3 (DeepSpeed 2021) cases: see KNOWN_MISSES")
def test_zero3_cases_within_25_percent(results):
    errors = [abs(r.relative_error) for r in results if r.id in KNOWN_MISSES]
    assert max(errors) <= 0.25
