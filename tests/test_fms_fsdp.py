"""IBM's fms-fsdp (the Foundation Model Stack's PyTorch FSDP trainer): its preset, whose selective
activation checkpointing checkpoints whole blocks, and its README's published throughput table
(tests/data/fms_fsdp.yaml: Llama 2 7B to 70B on 128 A100s and 96 H100s)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from meshplan import api, catalog
from meshplan.explore.space import SearchSpace, expand
from meshplan.io.case_inputs import framework_name
from meshplan.io.validation_cases import validate
from meshplan.specs.plan import Plan

DATA = Path(__file__).parent / "data" / "fms_fsdp.yaml"
PLAN = dict(tp=1, dp=16, zero_stage=3, micro_batch_size=2, global_batch_size=32, seq_len=4096)


@pytest.fixture(scope="module")
def results():
    return {r.id: r for r in validate(DATA)}


@pytest.mark.parametrize("spelling", ["fms-fsdp", "FMS FSDP", "fms_fsdp", "IBM fms-fsdp", "foundation-model-stack"])
def test_its_names_take_the_fms_fsdp_preset(spelling):
    assert framework_name(spelling) == "fms-fsdp"


def test_selective_checkpointing_recomputes_whole_blocks_as_full_does():
    """fms-fsdp's selective_checkpointing checkpoints a share of the blocks whole, every block at
    its default (fms_fsdp/policies/ac_handler.py, config/training.py): the same step, memory and
    gathers (FSDP gathers a recomputed block's weights a third time) as full recompute. PyTorch
    FSDP's preset keeps selective as the attention core's, which flash attention makes nothing."""
    def step(recompute, framework):
        estimate = api.estimate("llama3-8b", "dgx-h100", {**PLAN, "recompute": recompute, "framework": framework}, 16)
        return estimate.step_time_s, estimate.memory.activations_bytes, estimate.collectives["all_gather"]["serialized_s"]

    assert step("selective", "fms-fsdp") == step("full", "fms-fsdp")
    assert step("selective", "fms-fsdp")[0] > step("none", "fms-fsdp")[0]
    assert step("selective", "pytorch-fsdp") == step("none", "pytorch-fsdp")
    assert catalog.frameworks()["fms-fsdp"]["attention_kernel"] == "flash2"  # PyTorch SDPA's FlashAttention-2


def test_search_keeps_whole_block_selective_once_as_full():
    base = Plan.model_validate({**PLAN, "framework": "fms-fsdp"})
    space = SearchSpace(tp=[1], pp=[1], cp=[1], sequence_parallel=[False], virtual_pipeline_stages=[1], zero_stage=[3],
                        micro_batch_size=[2], recompute=["none", "selective", "full"])
    candidates = expand(space, catalog.model("llama3-8b"), catalog.cluster("dgx-h100"), 16, base)
    assert sorted(s.plan.recompute for s in candidates.scenarios) == ["full", "none"]


def test_published_runs(results):
    """The README's eight runs, all predicted to fit. Every selective run is taken at fms-fsdp's
    default (every block), as its 34B and 70B A100 runs' HFU over MFU (0.74 / 0.55) says; its 13B
    runs checkpointed fewer (1.13 on A100, 1.07 on H100) and are predicted slow by that much more.
    H100: median 7.1% (fast by 6-10% but 13B). A100 is a known miss: every run slow, median 17.2%:
    the Ampere GEMM kernel (fitted on Megatron-LM's 2021 runs, public-cases.yaml) reaches 0.72 of
    the peak on these layers' shapes, where these runs' 0.74 hardware FLOP utilization, attention
    and norms included, needs their GEMMs above 0.78. With selective read as the attention core's
    (PyTorch FSDP's), H100 was 24.7% fast and the 34B and 70B runs did not fit."""
    assert len(results) == 8 and all(r.error is None and r.fits for r in results.values())
    errors = {gpu: [r.relative_error for r in results.values() if r.group == f"fms_fsdp_{gpu}"] for gpu in ("a100", "h100")}
    assert statistics.median(abs(e) for e in errors["h100"]) <= 0.10
    assert max(abs(e) for e in errors["h100"]) <= 0.12
    assert all(0.05 < e < 0.30 for e in errors["a100"]), errors["a100"]
    assert statistics.median(errors["a100"]) < 0.20
