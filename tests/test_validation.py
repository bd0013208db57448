"""meshplan validate against published, measured runs (shared/validation/public-cases.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshplan.io.validation_cases import summarize, validate

CASES = Path(__file__).resolve().parents[2] / "shared" / "validation" / "public-cases.yaml"

pytestmark = pytest.mark.skipif(not CASES.is_file(), reason="shared/validation is not beside the repo")



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


#: median |error| target per group: 10% for the dense groups the Ampere profile is fitted on; the
#: one MAD Max DLRM case is not fitted on and gets MAD Max Table 1's 15% (tests/test_dlrm.py)
MEDIAN_TARGET = {"madmax_dlrm": 0.15}


def test_median_error_per_group_within_10_percent(results):
    for group, stats in summarize(results).items():
        assert stats["median_abs_error"] <= MEDIAN_TARGET.get(group, 0.10), group


def test_every_case_within_25_percent(results):
    misses = {r.id: r.relative_error for r in results if r.relative_error is not None and abs(r.relative_error) > 0.25}
    assert not misses
