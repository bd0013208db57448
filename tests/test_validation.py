"""meshplan validate against published, measured runs (shared/validation/public-cases.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan.io.validation_cases import summarize, validate

CASES = Path(__file__).resolve().parents[2] / "shared" / "validation" / "public-cases.yaml"

pytestmark = pytest.mark.skipif(not CASES.is_file(), reason="shared/validation is not beside the repo")

#: the groups the Ampere profile is fitted on (benchmarks/calibrate.py), and MAD Max's DLRM case;
#: the Hopper/Blackwell groups are scored here; NeMo 24.07 is held to issue 10's bar below, and
#: Megatron-Bridge's target still belongs to the engine and hardware-profile work (issues 8-10)
FITTED_GROUPS = ("megatron_sc21", "korthikanti_2022", "madmax_dlrm")


@pytest.fixture(scope="module")
def results():
    return validate(CASES)


def test_every_public_case_is_scored(results):
    assert len(results) == 63
    assert [r.id for r in results if r.error] == []
    assert all(r.predicted_step_time_s > 0 for r in results)
    assert all(r.fits for r in results if r.group in FITTED_GROUPS)


#: median |error| target per group: 10% for the dense groups the Ampere profile is fitted on; the
#: one MAD Max DLRM case is not fitted on and gets MAD Max Table 1's 15% (tests/test_dlrm.py)
MEDIAN_TARGET = {"madmax_dlrm": 0.15}


def test_median_error_per_group_within_10_percent(results):
    for group, stats in summarize(results).items():
        if group in FITTED_GROUPS:
            assert stats["median_abs_error"] <= MEDIAN_TARGET.get(group, 0.10), group


def test_every_case_within_25_percent(results):
    misses = {r.id: r.relative_error for r in results if r.group in FITTED_GROUPS and abs(r.relative_error) > 0.25}
    assert not misses


def test_nemo_24_07_runs_within_issue_10s_bar(results):
    """NeMo 24.07's H100 FP8 runs, predicted (not fitted) with the nemo-launcher preset their
    container ran (FlashAttention-2 on Hopper, catalog/frameworks.yaml): the group's median within
    5% (issue 10's bar), and every run within 12% (GPT-3 5B is the farthest, 9% fast)."""
    nemo = [r for r in results if r.group == "nemo_perf_2407"]
    assert len(nemo) == 12 and all(r.note and "nemo-launcher" in r.note for r in nemo)
    assert summarize(nemo)["nemo_perf_2407"]["median_abs_error"] <= 0.05
    assert max(abs(r.relative_error) for r in nemo) <= 0.12
