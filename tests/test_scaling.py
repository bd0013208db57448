"""Step time of one model scaled with device count follows the measured trend (issue 9).

tests/data/scaling_cases.yaml: MLPerf Training GPT-3 175B on NVIDIA Eos (DGX H100, FP8): v3.1's
same TP 4 x PP 8 plan at 512, 8192 and 10752 GPUs, each step time the log's steady-state
train_step_timing, and v4.0's at 512 GPUs (TP 4 x PP 8) and 10752 and 11616 (TP 4 x PP 6, per-layer
CUDA graphs), and v4.1's (TP 4 x PP 8) on a B200 preview, on Eos and on Oracle's H100s; MLPerf
Training v5.0 Llama 3.1 405B, one plan shape (PP 8 x VP 8 x CP 2) on 512 to 8192 H100s (Eos), 512
and 1024 H200s (Nebius) and 512 to 2496 GB200s (CoreWeave's Carina). From v4.0 on, step times are
the logs' evaluation blocks. The file cites each log and plan, and lists what it infers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from meshplan.io.validation_cases import validate

CASES = Path(__file__).parent / "data" / "scaling_cases.yaml"

#: the per-GPU throughput ratio, largest over smallest scale, within this much of the measured one
RATIO_TOLERANCE = 0.15
#: per group, the largest error any of its scales may have
BOUNDS = {"mlperf_v31_gpt3_scaling": 0.07, "mlperf_v40_gpt3_scaling": 0.06, "mlperf_v41_gpt3_b200": 0.05,
          "mlperf_v41_gpt3_eos": 0.07, "mlperf_v41_gpt3_oracle": 0.12, "mlperf_v50_llama405b_h100": 0.05,
          "mlperf_v50_llama405b_h200": 0.06, "mlperf_v50_llama405b_gb200": 0.12}


@pytest.fixture(scope="module")
def scored():
    results = validate(CASES)
    cases = {c["id"]: c for c in yaml.safe_load(CASES.read_text())}
    return [(r, cases[r.id]) for r in results]


def per_gpu_tokens_per_s(step_time_s: float, case: dict) -> float:
    tokens = case["batch"]["global_batch_sequences"] * case["batch"]["seq_len"]
    return tokens / step_time_s / case["hardware"]["num_devices"]


def _groups(scored) -> dict[str, list]:
    out: dict[str, list] = {}
    for result, case in scored:
        out.setdefault(case["group"], []).append((result, case))
    return out


def test_every_scaling_case_is_scored_cites_its_log_and_matches_its_tokens_per_gpu(scored):
    groups = _groups(scored)
    assert set(groups) == set(BOUNDS)
    for name in ("mlperf_v31_gpt3_scaling", "mlperf_v40_gpt3_scaling", "mlperf_v50_llama405b_h100"):
        scales = sorted(c["hardware"]["num_devices"] for _, c in groups[name])
        assert len(scales) >= 3 and scales[0] <= 512 and scales[-1] >= 8192
    for result, case in scored:
        assert result.error is None and result.fits, result
        release = case["group"].split("_")[1]  # v31, v40, v41, v50
        assert f"github.com/mlcommons/training_results_{release[:2]}.{release[2:]}" in case["source"]
        assert per_gpu_tokens_per_s(case["measured"]["step_time_s"], case) == pytest.approx(
            case["measured"]["tokens_per_s_per_gpu"], rel=1e-3)


def test_every_scale_is_predicted_within_its_groups_bound(scored):
    """At 8192 and 10752 GPUs the predictions were 1.23x and 1.30x the measurement while each
    interleaved chunk's parameter all-gather was chained along the pipeline's warm-up; they are
    gathered a chunk ahead on every stage at once, as Megatron-Core does (step.interleaved_param_wait).
    Each interleaved chunk's gradients are reduced from its last micro-batch's backward on,
    beside the other chunks' backwards (step.reduce_tail): with only the step's last backward to
    hide it, v4.0's 10752 and 11616 GPUs (six micro-batches over six stages) were 9.7% slow and
    v3.1's 10752 5.0%; now 4.6% and 0.9%, and v3.1's 512 to 10752 go from -5.6% to +0.9% (from
    -5.4% to +5.0%). Llama 3.1 405B on H100 is within 3.1% from 512 to 8192 GPUs, on H200 within
    2.8%; on GB200 every scale is 6-7% fast, as NeMo 25.04's performance summary and DGX Cloud
    benchmarking v25.05 find for the same layout on 128 to 512 GB200s (not in the test data). v4.1's
    GPT-3 on a B200 preview (64 GPUs) is 3.9% slow, on Eos (NeMo 24.09) 6-7% slow; Oracle's 3072
    H100s (RoCE, taken as dgx-h100's InfiniBand) are 9% fast where its 1536 are 3% slow."""
    for result, case in scored:
        assert abs(result.relative_error) < BOUNDS[case["group"]], result.id


@pytest.mark.parametrize("group", sorted(g for g in BOUNDS if g != "mlperf_v41_gpt3_b200"))
def test_per_gpu_throughput_ratio_from_smallest_to_largest_scale_follows_the_measurement(scored, group):
    """v3.1, 512 to 10752 GPUs: 0.70 predicted against 0.74 measured; v4.0, 512 to 11616: 0.66
    against 0.66; v4.1 on Eos, 256 to 512: 0.97 against 0.96, on Oracle's H100s, 1536 to 3072: 0.90
    against 0.79; v5.0 on H100, 512 to 8192: 0.87 against 0.88; on GB200, 512 to 2496: 0.94
    against 0.95."""
    ordered = sorted(_groups(scored)[group], key=lambda rc: rc[1]["hardware"]["num_devices"])
    (small, small_case), (large, large_case) = ordered[0], ordered[-1]
    measured = (per_gpu_tokens_per_s(large.measured_step_time_s, large_case)
                / per_gpu_tokens_per_s(small.measured_step_time_s, small_case))
    predicted = (per_gpu_tokens_per_s(large.predicted_step_time_s, large_case)
                 / per_gpu_tokens_per_s(small.predicted_step_time_s, small_case))
    assert predicted == pytest.approx(measured, rel=RATIO_TOLERANCE)


def test_mlperf_v51_llama31_8b_on_nvl72_racks():
    """MLPerf v5.1's Llama 3.1 8B on GB200 and GB300 racks, held out, each within 8%: on 72 GPUs
    (cp 2, 4096 tokens a GPU) with the runs' 768M-parameter gradient buckets (Megatron's default,
    72M for 72 ranks, puts them 5-15% slow: their 72-rank rings pay the latency 10x as often); on
    512 (tp 2 x cp 4, 2048 tokens a GPU), where the measured step halves for a quarter of the
    work, -5%, once each of the ring's 4 steps is an attention call with its own fixed cost (23-25%
    fast while the ring was one call)."""
    rows = {r.id: r for r in validate(Path(__file__).parent / "data" / "mlperf_v51_llama31_8b.yaml")}
    bf16_attention = {k: r for k, r in rows.items() if "ngpu8_" not in k}
    assert len(bf16_attention) == 4 and all(r.error is None and abs(r.relative_error) <= 0.08 for r in bf16_attention.values())


def test_mlperf_v51_llama31_8b_in_nvfp4_with_fp8_attention():
    """The 8-GPU submissions, held out: NVFP4 GEMMs and attention in FP8 (FP8_DPA). GB300 -1.1%;
    GB200 +11.3%, NVFP4 on GB200 being the known miss (the 405B's rows below). With attention
    timed in 16 bits, as meshplan could only time it before, they were +21.4% and +9.5%."""
    import copy

    from meshplan.io.validation_cases import run_case

    cases = yaml.safe_load((Path(__file__).parent / "data" / "mlperf_v51_llama31_8b.yaml").read_text())
    rows = {c["id"]: (c, run_case(copy.deepcopy(c), 0)) for c in cases if "ngpu8_" in c["id"]}
    assert set(rows) == {"mlperf51_tyche_ngpu8_llama31_8b", "mlperf51_theia_ngpu8_llama31_8b"}
    assert abs(rows["mlperf51_theia_ngpu8_llama31_8b"][1].relative_error) <= 0.05
    assert 0.0 < rows["mlperf51_tyche_ngpu8_llama31_8b"][1].relative_error <= 0.15
    for case, result in rows.values():
        in_16_bits = copy.deepcopy(case)
        in_16_bits["parallelism"]["fp8_dpa"] = 0
        slower = run_case(in_16_bits, 0).predicted_step_time_s / result.predicted_step_time_s
        assert 1.07 < slower < 1.15, case["id"]


def test_gradient_bucket_size_is_read_and_fewer_larger_buckets_pay_less_latency():
    """``ddp_bucket_size`` (or grad_bucket_size, bucket_size) sets Plan.grad_bucket_size; on the
    72-GPU rows Megatron's default buckets (72M parameters for 72 ranks) are 5-15% slower."""
    from meshplan.io.case_inputs import case_inputs
    from meshplan.io.validation_cases import run_case

    cases = yaml.safe_load((Path(__file__).parent / "data" / "mlperf_v51_llama31_8b.yaml").read_text())
    for case in (c for c in cases if "ngpu72" in c["id"]):
        for key in ("grad_bucket_size", "bucket_size"):
            other = {**case, "parallelism": {k: v for k, v in case["parallelism"].items() if k != "ddp_bucket_size"} | {key: 5e8}}
            assert case_inputs(other, "x")["plan"]["grad_bucket_size"] == 5e8
        default = {**case, "parallelism": {k: v for k, v in case["parallelism"].items() if k != "ddp_bucket_size"}}
        slower = run_case(default, 0).predicted_step_time_s / run_case(case, 0).predicted_step_time_s
        assert 1.05 < slower < 1.15


def test_mlperf_v51_llama31_405b_in_nvfp4():
    """MLPerf v5.1's Llama 3.1 405B in NVFP4 on 512 to 5120 GB200s and 512 GB300s, held out: the
    known miss, bounded so a change shows. GB200 is predicted 26-28% slow at every scale, as
    Megatron-Bridge's GB200 NVFP4 rows are (+15% to +27%): the measured step is 1.43x faster a
    sequence than v5.0's FP8 one on the same layout, where the GEMM kernel fitted on B300's NVFP4
    GEMMs gives 1.04x. GB300 within 12%. The scale trend holds: within 3 points from 512 to 5120."""
    rows = {r.id: r for r in validate(Path(__file__).parent / "data" / "mlperf_v51_llama31_405b.yaml")}
    assert len(rows) == 4 and all(r.error is None for r in rows.values())
    gb200 = [rows[f"mlperf51_{s}_llama31_405b"].relative_error for s in ("tyche_ngpu512", "hsg_ngpu2560", "hsg_ngpu5120")]
    assert all(0.20 < e < 0.35 for e in gb200) and max(gb200) - min(gb200) < 0.03
    assert abs(rows["mlperf51_theia_ngpu512_llama31_405b"].relative_error) <= 0.12


def test_llama3_405b_on_8k_and_16k_h100s():
    """The Llama 3 paper's 405B pre-training at 8,192 and 16,384 H100s (Table 4; Meta's RoCE
    cluster, whose 1:7 oversubscription between pods of 3,072 GPUs its data-parallel rings cross
    without meeting the bound), held out: -10% and -2%. From 8K to 16K GPUs the measured
    throughput per GPU falls 7% (430 to 400 TFLOP/s) as each pipeline gets half the micro-batches;
    the predicted one falls 15%."""
    rows = validate(Path(__file__).parent / "data" / "llama3_herd.yaml")
    assert len(rows) == 2 and all(r.error is None and r.fits and abs(r.relative_error) <= 0.12 for r in rows)
    small, large = sorted(rows, key=lambda r: r.measured_step_time_s)[::-1]
    # the GPU-seconds a batch takes, 16K over 8K GPUs: the TFLOP/s ratio inverted
    measured, predicted = (2 * large.measured_step_time_s / small.measured_step_time_s,
                           2 * large.predicted_step_time_s / small.predicted_step_time_s)
    assert measured == pytest.approx(430 / 400, rel=1e-3)
    assert 1.0 < predicted and predicted == pytest.approx(measured, rel=RATIO_TOLERANCE)
