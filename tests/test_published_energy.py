"""Published training energy, reproduced from the run's own plan with the publication's method."""

import pytest

from meshplan import api

#: Luccioni, Viguier & Ligozat 2022, "Estimating the Carbon Footprint of BLOOM, a 176B Parameter
#: Language Model", Table 2: 1,082,990 GPU-hours, 400 W TDP, 433 MWh ("dynamic power
#: consumption" = GPU-hours x TDP)
BLOOM_MWH = 433.0
BLOOM_GPU_HOURS = 1_082_990
A100_TDP_KW = 0.4
#: Le Scao et al. 2022 (BLOOM), Sec. 3.5: 366B tokens
BLOOM_TOKENS = 366e9


def bloom():
    """BLOOM's plan (bigscience-workshop/bigscience train/tr11-176B-ml/tr11-176B-ml.slurm): 48
    nodes of 8 A100 80GB, tp 4, pp 12 (embeddings partitioned as layers: 5 decoder layers on
    the first and last stages), micro-batch 2, global batch 2048 of 2048 tokens, activation
    checkpointing, bf16 with ZeRO-1, Megatron-DeepSpeed without flash attention."""
    return api.estimate("bloom-176b", "jean-zay-a100-80gb", num_devices=384, tp=4, pp=12, micro_batch_size=2,
                        global_batch_size=2048, recompute="full", flash_attention=False, zero_stage=1,
                        framework="deepspeed", first_stage_layers=5, last_stage_layers=5,
                        task={"train_tokens": BLOOM_TOKENS})


def test_bloom_training_energy_within_25_percent_by_its_reporting_method():
    """Predicted GPU-hours to train 366B tokens times the 400 W TDP, against 433 MWh."""
    e = bloom()
    predicted_mwh = e.device_hours(BLOOM_TOKENS) * A100_TDP_KW / 1000.0
    assert predicted_mwh == pytest.approx(BLOOM_MWH, rel=0.25)
    assert e.device_hours(BLOOM_TOKENS) == pytest.approx(BLOOM_GPU_HOURS, rel=0.25)


def test_bloom_modelled_energy_is_below_the_tdp_bound():
    """meshplan's own energy (work plus idle power, no facility overhead) is less than the
    GPU-hours x TDP bound: the devices average below their TDP."""
    e = bloom()
    assert e.energy_to_train_j(BLOOM_TOKENS) < e.device_hours(BLOOM_TOKENS) * A100_TDP_KW * 3.6e6  # kWh -> J
    assert 0.5 < e.energy.average_device_w / e.energy.tdp_w < 1.0
