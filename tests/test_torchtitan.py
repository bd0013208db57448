"""torchtitan's training semantics: per-op selective activation checkpointing and FSDP2 kept
gathered under pipeline parallelism (frameworks.yaml, torchtitan; parallel.recompute.op_recompute).

torchtitan's op policy (parallelisms/parallelize_llama.py at commit 6b03ffa3, the Dec 2024
benchmark runs) saves the outputs of matmuls, attention and reduce-scatters, except every
second matmul of a block, and recomputes everything else. Its Llama runs wq, wk, wv, wo, w1, w3,
w2 as separate linears, so wk, wo and w3 are recomputed.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

import meshplan
from meshplan import api
from meshplan.costs.costed import cost_program
from meshplan.io.validation_cases import validate
from meshplan.parallel.program import build_program
from meshplan.timeline.halves import Overlap

H, KV, F, L, T = 4096, 1024, 14336, 32, 2 * 8192  # Llama 3 8B, micro-batch 2 x 8192 tokens
PLAN = dict(tp=1, dp=8, zero_stage=3, recompute="selective", micro_batch_size=2, global_batch_size=16, seq_len=8192)


def _kind(plan: dict, model: str = "llama3-8b", devices: int = 8):
    program = build_program(api.scenario(model, "dgx-h100", plan, devices))
    return program, program.kinds["dense_layer"]


def test_torchtitan_selective_recomputes_every_second_linear_and_the_elementwise_ops():
    _, kind = _kind({**PLAN, "framework": "torchtitan"})
    shares = dict(kind.recompute_ops)
    # wk of the fused wq|wk|wv, all of wo, w3 of the fused w1|w3; w2 (the 7th linear) is kept
    assert shares["qkv"] == pytest.approx(KV / (H + 2 * KV))
    assert shares["proj"] == 1.0
    assert shares["mlp_up"] == 0.5
    assert "mlp_down" not in shares and "attention" not in shares
    for name in ("norm_attn", "residual_attn", "norm_mlp", "mlp_activation", "residual_mlp"):
        assert shares[name] == 1.0


def test_gelu_ffn_recomputes_its_down_projection():
    """Six linears (wq wk wv wo w1 w2): the sixth, w2, is the one recomputed."""
    model = {**meshplan.catalog.model("llama3-8b").model_dump(), "ffn_type": "gelu"}
    program = build_program(api.scenario(model, "dgx-h100", {**PLAN, "framework": "torchtitan"}, 8))
    shares = dict(program.kinds["dense_layer"].recompute_ops)
    assert shares["mlp_down"] == 1.0 and "mlp_up" not in shares


def test_op_policy_keeps_the_input_and_the_saved_outputs():
    """Layer input, wq and wv outputs, attention output and its fp32 log-sum-exp, w1 and w2
    outputs, bf16: 2 bytes each."""
    _, kind = _kind({**PLAN, "framework": "torchtitan"})
    heads = 32
    expected = 2.0 * T * (H + H + KV + H + F + H) + 4.0 * T * heads
    assert kind.saved_bytes == pytest.approx(expected)
    _, none = _kind({**PLAN, "recompute": "none", "framework": "torchtitan"})
    _, full = _kind({**PLAN, "recompute": "full", "framework": "torchtitan"})
    assert full.saved_bytes < kind.saved_bytes < none.saved_bytes


def test_recompute_time_is_the_shares_of_the_forwards():
    program, kind = _kind({**PLAN, "framework": "torchtitan"})
    times = cost_program(program).kinds["dense_layer"]
    expected = sum(share * times.ops[name].forward_s for name, share in kind.recompute_ops)
    assert times.recompute_s == pytest.approx(expected)
    assert 0.0 < times.recompute_s < times.forward_s


def test_op_policy_sits_between_no_and_full_recompute():
    def run(recompute: str, framework: str = "torchtitan"):
        return meshplan.estimate("llama3-8b", "dgx-h100", {**PLAN, "recompute": recompute, "framework": framework}, 8)

    none, op, full = run("none"), run("selective"), run("full")
    assert none.step_time_s < op.step_time_s < full.step_time_s
    assert none.memory.activations_bytes > op.memory.activations_bytes > full.memory.activations_bytes
    # hardware flop adds the recomputed share of each matmul: wk, wo and w3 of every layer
    per_layer = 2.0 * T * H * (KV + H + F)
    micro_batches = 16 / 2
    assert op.hardware_flop_per_step - op.model_flop_per_step == pytest.approx(per_layer * L * micro_batches, rel=1e-9)
    # Megatron's selective recompute re-runs only the attention core: nothing under flash attention
    megatron = run("selective", "megatron-core")
    assert megatron.hardware_flop_per_step == megatron.model_flop_per_step


def test_plan_may_ask_for_the_op_policy_without_the_framework():
    a = meshplan.estimate("llama3-8b", "dgx-h100", {**PLAN, "framework": "torchtitan"}, 8)
    b = meshplan.estimate("llama3-8b", "dgx-h100", {**PLAN, "selective_recompute": "op", "zero3_gather": "per_step_if_pipelined",
                                                    "grad_reduce_precision": "fp32", "overlap_p2p": True,
                                                    "attention_kernel": "flash2", "optimizer_impl": "foreach"}, 8)
    assert a.step_time_s == pytest.approx(b.step_time_s)


PIPELINED = dict(tp=8, pp=8, dp=8, zero_stage=3, recompute="full", micro_batch_size=4, global_batch_size=256, seq_len=8192,
                 sequence_parallel=True, precision="bf16")


def test_fsdp_under_pipeline_parallelism_gathers_once_per_step():
    """torchtitan keeps a stage's weights gathered (reshard_after_forward = not pp_enabled) and
    PyTorch's PipelineStage reduce-scatters after the last backward: ZeRO-1's traffic."""
    titan, _ = _kind({**PIPELINED, "framework": "torchtitan"}, "llama3-405b", 512)
    zero1, _ = _kind({**PIPELINED, "zero_stage": 1, "grad_reduce_precision": "fp32"}, "llama3-405b", 512)
    assert titan.scenario.plan.zero3_per_step
    assert titan.zero3_comms == () and titan.dp_comms == zero1.dp_comms
    assert [r.memory for r in titan.roles] == [r.memory for r in zero1.roles]
    assert not Overlap.of(cost_program(titan)).grad_reduce
    per_micro_batch, _ = _kind({**PIPELINED, "zero3_gather": "per_micro_batch"}, "llama3-405b", 512)
    assert per_micro_batch.zero3_comms and not per_micro_batch.scenario.plan.zero3_per_step


def test_fsdp_without_pipeline_parallelism_still_gathers_per_micro_batch():
    program, _ = _kind({**PLAN, "framework": "torchtitan"})
    assert not program.scenario.plan.zero3_per_step
    assert {c.kind for c in program.zero3_comms} == {"all_gather", "reduce_scatter"}


def test_kept_gathered_fsdp_pipeline_is_faster_than_regathering():
    """Gathering 1/64 of 405B per layer for every one of 32 micro-batches, three times with full
    recompute, costs more than once per step."""
    per_step = meshplan.estimate("llama3-405b", "dgx-h100", {**PIPELINED, "micro_batch_size": 1, "framework": "torchtitan"}, 512)
    per_mb = meshplan.estimate("llama3-405b", "dgx-h100", {**PIPELINED, "micro_batch_size": 1, "framework": "torchtitan",
                                                          "zero3_gather": "per_micro_batch"}, 512)
    assert per_step.step_time_s < per_mb.step_time_s
    assert per_step.breakdown.exposed_comm_s["dp"] < per_mb.breakdown.exposed_comm_s["dp"]


# torchtitan's published Llama 3.1 runs on Grand Teton H100s (tests/data/torchtitan_h100.yaml,
# each row citing its table): the group's median |error| and the rows' spread as measured when the
# two semantics above landed (6.5% median; the 128K and 256K context-parallel rows 31-35% fast),
# then with attention's energy counted on the causal half it computes and the preset's
# FlashAttention-2 (7.7%: the 500 W cap no longer slows attention it does not bind; the 32K and
# 64K rows went from 9% and 6% fast to 16%; the 128K and 256K rows 35-37% fast), then with
# compute slowed beside FSDP's gathers no longer hidden behind the blocking tensor-parallel
# collective that follows it, and paid once beside several collectives (8.8%: the 70B 2D rows
# without async TP 2 points slower, to +4% and +8%; the async-TP ones half a point faster), then
# with Table 1's eager rows running their norms and rotary embeddings op by op and every row
# paying its rotary embeddings (5.3%: the eager rows from -10% and -12% to +2.5% and +0.3%).
CASES = Path(__file__).parent / "data" / "torchtitan_h100.yaml"
GROUP_MEDIAN = 0.06
ROW_LIMIT = 0.20
#: attention at 128K-256K tokens is far slower than modelled (the profile is fitted up to 32K;
#: the runs used Dec 2024's ring attention over FlashAttention-2, merging each step's partial
#: outputs in eager PyTorch)
LONG_CONTEXT = {"tt2412_8b_8gpu_cp4_128k", "tt2412_8b_8gpu_cp8_256k"}


@pytest.fixture(scope="module")
def published():
    return {r.id: r for r in validate(CASES)}


def test_torchtitan_published_runs(published):
    assert len(published) == 22 and all(r.error is None for r in published.values())
    errors = [abs(r.relative_error) for r in published.values()]
    assert statistics.median(errors) <= GROUP_MEDIAN
    for r in published.values():
        if r.id not in LONG_CONTEXT:
            assert abs(r.relative_error) <= ROW_LIMIT, r
    for name in LONG_CONTEXT:  # the known miss: predicted too fast, and bounded, so a change shows
        assert -0.40 < published[name].relative_error < -0.25


def test_torchtitan_schedule_and_fp8_ratios(published):
    """What the tables measure between rows: Interleaved 1F1B 1.28x 1F1B on 405B, Float8 1.28-1.29x
    bf16 on 8B (with compile), each within 10%."""
    def speedup(slow: str, fast: str) -> float:
        return published[slow].predicted_step_time_s / published[fast].predicted_step_time_s

    assert speedup("tt2412_405b_512gpu_1f1b", "tt2412_405b_512gpu_interleaved") == pytest.approx(128 / 100, rel=0.10)
    assert speedup("tt2412_8b_8gpu_fsdp_compile", "tt2412_8b_8gpu_fsdp_fp8") == pytest.approx(8532 / 6667, rel=0.10)
    assert speedup("tt2412_8b_128gpu_fsdp_compile", "tt2412_8b_128gpu_fsdp_fp8") == pytest.approx(8380 / 6514, rel=0.10)


def test_torch_compile_speedup_is_the_fused_norms_and_rotary_embeddings(published):
    """Table 1's eager rows (compiled: false) run torchtitan's RMSNorm and rotary embeddings op by
    op (fusion: eager); torch.compile fuses them. Measured 1.157x (8 GPUs) and 1.162x (128 GPUs);
    the counted bytes give 1.13x, from no fit, within 4%."""
    for gpus, eager, compiled in ((8, 5762, 6667), (128, 5605, 6514)):
        rows = (published[f"tt2412_8b_{gpus}gpu_fsdp_eager"], published[f"tt2412_8b_{gpus}gpu_fsdp_compile"])
        assert rows[0].predicted_step_time_s / rows[1].predicted_step_time_s == pytest.approx(compiled / eager, rel=0.04)


def test_torchtitan_on_h200_hosts():
    """Trainy's Llama 3.1 8B runs on 32 and 64 H200s (float8, FSDP over every GPU), held out: each
    within 8%, and the step from 4 to 8 hosts as measured (TPS/GPU 10938 -> 10753) within 3%."""
    rows = {r.id: r for r in validate(Path(__file__).parent / "data" / "torchtitan_h200.yaml")}
    assert len(rows) == 2 and all(r.error is None and abs(r.relative_error) <= 0.08 for r in rows.values())
    small, large = rows["tt2506_trainy_8b_32h200_fp8"], rows["tt2506_trainy_8b_64h200_fp8"]
    assert large.predicted_step_time_s / small.predicted_step_time_s == pytest.approx(10938 / 10753, rel=0.03)
