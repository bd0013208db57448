"""MAD Max Table 1 (Hsia et al., ISCA 2024): LLaMA-65B on 2048 A100-80GB, 1.4T tokens."""

from __future__ import annotations

import pytest

import meshplan

TOKENS = 1.4e12
MEASURED_DAYS = 20.83  # MAD Max Table 1, from Touvron et al. 2023 ("approximately 21 days")
MEASURED_GPU_HOURS_306K_STEPS = 1_022_361  # MAD Max Table 1


@pytest.fixture(scope="module")
def best():
    """The fastest plan meshplan finds for LLaMA-65B's published batch (4M tokens of 2048)."""
    result = meshplan.search("llama-65b", "dgx-a100-80gb", 2048, global_batch_size=2048, seq_len=2048, top=1)
    return result.best


def test_days_to_train_within_15_percent(best):
    days = TOKENS / best["tokens_per_s"] / 86400
    assert days == pytest.approx(MEASURED_DAYS, rel=0.15)


def test_gpu_hours_for_306k_steps_within_15_percent(best):
    hours = 306_000 * best["step_time_s"] * 2048 / 3600
    assert hours == pytest.approx(MEASURED_GPU_HOURS_306K_STEPS, rel=0.15)


def test_the_best_plan_fits_and_keeps_tensor_parallelism_inside_the_node(best):
    """With every NIC of a node carrying data-parallel traffic, FSDP over tp 2-4 ties tp 8."""
    assert best["fits"] and 8 % best["tp"] == 0 and best["tp"] > 1
