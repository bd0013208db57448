"""DeepSeek-V3 on 2048 H800 with its published plan (DeepSeek-V3 technical report, arXiv
2412.19437: Sec. 3.2 DualPipe, PP 16, EP 64, ZeRO-1, no TP; Sec. 3.3 FP8; 4096-token sequences
and a batch of 15360 from Sec. 4.2), against its reported training cost: 180K H800 GPU-hours per
trillion tokens (Sec. 1), 1e12 / (180e3 * 3600 / 2048) = 3.16M tokens/s. The README's table."""

import copy
from pathlib import Path

import pytest
import yaml

import meshplan
from meshplan.io.case_inputs import case_inputs
from meshplan.io.validation_cases import run_case

REPORTED_TOKENS_PER_S = 1e12 / (180e3 * 3600 / 2048)
PLAN = dict(num_devices=2048, tp=1, pp=16, ep=64, global_batch_size=15360, micro_batch_size=1, zero_stage=1,
            precision="fp8", seq_len=4096, recompute="selective", framework="megatron-core")


def tokens_per_s(**extra) -> tuple[float, meshplan.Estimate]:
    r = meshplan.estimate("deepseek-v3", "dgx-h800", **PLAN, **extra)
    return PLAN["global_batch_size"] * PLAN["seq_len"] / r.step_time_s, r


def test_dualpipe_reproduces_the_reported_throughput():
    predicted, r = tokens_per_s(schedule="dualpipe")
    assert predicted == pytest.approx(REPORTED_TOKENS_PER_S, rel=0.10)
    # what DualPipe does not hide is expert all-to-all, a minority of the step
    assert 0.0 < r.breakdown.exposed_comm_s["ep"] < 0.35 * r.step_time_s


def test_what_dualpipe_and_the_hierarchical_dispatch_are_worth():
    """1F1B leaves every all-to-all blocking; a plain all-to-all sends a copy per expert, not
    per node: both are slower, by more than the prediction's error."""
    dualpipe, paired = tokens_per_s(schedule="dualpipe")
    one_f_one_b, blocking = tokens_per_s()
    flat, _ = tokens_per_s(schedule="dualpipe", ep_dispatch="all_to_all")
    assert one_f_one_b < 0.85 * dualpipe
    assert flat < 0.8 * dualpipe
    assert paired.breakdown.exposed_comm_s["ep"] < 0.6 * blocking.breakdown.exposed_comm_s["ep"]


#: DeepSeek-V3 as Megatron-Bridge trains it on 256 GB200s (its 4 x 4 pipeline)
BRIDGE = dict(num_devices=256, tp=1, pp=4, virtual_pipeline_stages=4, ep=64, zero_stage=1, global_batch_size=2048,
              micro_batch_size=1, precision="fp8", seq_len=4096)


def _deepseek(mtp: int) -> dict:
    return {**meshplan.catalog.model("deepseek-v3").model_dump(), "mtp_layers": mtp}


def test_the_mtp_module_runs_on_the_last_stage_and_a_layout_makes_room_for_it():
    """The multi-token-prediction module (DeepSeek-V3 Sec. 2.2) adds a MoE layer, a projection and
    a second output head and loss to the last pipeline stage, which then paces the pipeline (13%
    on the step); Megatron-Bridge's layout gives that chunk one decoder layer
    (Et*4|(t*4|)*14,tmL) and wins back a third of it."""
    without = meshplan.estimate(_deepseek(0), "gb200-nvl72", **BRIDGE)
    with_mtp = meshplan.estimate(_deepseek(1), "gb200-nvl72", **BRIDGE)
    laid = meshplan.estimate(_deepseek(1), "gb200-nvl72", pipeline_layout="Et*4|(t*4|)*14,tmL", **BRIDGE)
    assert (without.stage_layers, with_mtp.stage_layers, laid.stage_layers) == ((15, 16, 16, 14), (15, 16, 16, 15), (16, 16, 16, 14))
    assert with_mtp.step_time_s > 1.08 * without.step_time_s
    assert without.step_time_s < laid.step_time_s < 0.97 * with_mtp.step_time_s
    # the module's weights (its MoE layer, projection, norms and embedding copy) sit on the last stage
    last = [r for r in with_mtp.roles if r.name == "last"][0]
    plain = [r for r in without.roles if r.name == "last"][0]
    assert last.memory.weights_bytes > plain.memory.weights_bytes
    # and the report says which of the last stage's layers is the module's
    from meshplan.report import estimate_groups
    rows = dict(row for group in estimate_groups(with_mtp).values() for row in group)
    assert (with_mtp.mtp_layers, without.mtp_layers) == (1, 0)
    assert "the last runs 1 of them for multi-token prediction" in rows["layers per pipeline stage"]


def test_one_stage_shares_its_embedding_with_the_mtp_module_and_serving_skips_it():
    from meshplan.parallel.program import build_program
    from meshplan import api
    plan = dict(tp=8, ep=8, expert_tp=1, sequence_parallel=True, global_batch_size=8, micro_batch_size=1, seq_len=1024)
    with_mtp = build_program(api.scenario(_deepseek(1), "dgx-h100", plan, 8)).roles[0]
    without = build_program(api.scenario(_deepseek(0), "dgx-h100", plan, 8)).roles[0]
    model = meshplan.catalog.model("deepseek-v3")
    copy = model.embedding_params / 8  # vocab-parallel over tp 8
    assert with_mtp.params - without.params == pytest.approx(model.mtp_params / 8 - copy, rel=0.02)
    task = {"kind": "inference", "batch_size": 8, "prompt_len": 512, "output_len": 16}
    served = meshplan.estimate(_deepseek(1), "dgx-h200", num_devices=8, tp=8, task=task)
    plain = meshplan.estimate(_deepseek(0), "dgx-h200", num_devices=8, tp=8, task=task)
    assert (served.ttft_s, served.tpot_s) == pytest.approx((plain.ttft_s, plain.tpot_s), rel=1e-12)


@pytest.mark.parametrize(("layout", "says"), [
    ("Et*4m|(t*4|)*14,tL", "in the last chunk"),
    ("Et*4|(t*4|)*14,tmmL", "2 multi-token-prediction layers"),
])
def test_a_layout_places_the_mtp_module_last(layout, says):
    with pytest.raises(meshplan.MeshplanError) as err:
        meshplan.estimate(_deepseek(1), "gb200-nvl72", pipeline_layout=layout, **BRIDGE)
    assert err.value.field == "plan.pipeline_layout" and says in err.value.valid


# the same run as a validation case (tests/data/deepseek_v3_report.yaml), and the pipeline
# schedule a case may name
REPORT = Path(__file__).resolve().parents[1] / "tests" / "data" / "deepseek_v3_report.yaml"
(CASE,) = yaml.safe_load(REPORT.read_text())



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
