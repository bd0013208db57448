"""Dot-product attention in FP8 (Plan.fp8_attention: Transformer Engine's fp8_dpa, NeMo's and
MLPerf's FP8_DPA, Megatron-Bridge's fp8_dot_product_attention): the fused kernel at the FP8 peak
with its exponentials no faster (costs.compute.fp8_attention_kernel)."""

import pytest

from meshplan import api, catalog
from meshplan.costs.compute import Roofline, attention_precision
from meshplan.costs.kernels import AttentionShape
from meshplan.errors import MeshplanError
from meshplan.explore.bound import lower_bounds
from meshplan.io.case_inputs import case_inputs

from cli_runner import run_cli


def _attention_s(device_id: str, head_dim: int, fp8: bool, backward: bool = False) -> float:
    """One large causal attention call (8 sequences of 8192 tokens, 32 heads): compute-bound."""
    device = catalog.device(device_id)
    roof = Roofline.of(device, catalog.efficiency(device.efficiency), "fp8", fp8_attention=fp8)
    shape = AttentionShape(batch=8, heads=32, kv_heads=8, seq=8192, kv=8192, qk_dim=head_dim, v_dim=head_dim,
                           causal=True, flash=True)
    return float(roof.attention_op_s(shape, 0.0, 0.0, backward))


@pytest.mark.parametrize("head_dim, speedup", [(64, 4 / 3), (128, 1.5), (256, 1.5)])
def test_fp8_attention_on_hopper_doubles_the_matmuls_but_not_the_exponentials(head_dim, speedup):
    """H100's fitted forward exponential costs 128 head dimensions (softmax_dims, for d_qk + d_v
    of 256) at the 16-bit peak, and twice that at the FP8 peak: (256 + 128) / ((256 + 256) / 2) =
    1.5x for heads of 128 and up, near FlashAttention-3's best FP8 and FP16 forwards (1.2 PFLOP/s
    against 740 TFLOP/s, 1.6x); at d = 64 the exponential is a larger share, 1.33x. The launch
    and the extra passes over Q and K/V are why the ratios are not exact."""
    ratio = _attention_s("h100-sxm5-80gb", head_dim, False) / _attention_s("h100-sxm5-80gb", head_dim, True)
    assert ratio == pytest.approx(speedup, rel=0.03)


def test_fp8_attention_gains_less_on_blackwell_whose_exponentials_already_bind():
    """Blackwell's tensor cores do twice Hopper's flop per clock on as many exponential units,
    so its exponential already costs 256 head dimensions forward: FP8 gains (256 + 256) /
    ((256 + 512) / 2) = 1.33x at head dimension 128, against Hopper's 1.5x."""
    ratio = _attention_s("b200", 128, False) / _attention_s("b200", 128, True)
    assert ratio == pytest.approx(4 / 3, rel=0.03)
    backward = _attention_s("b200", 128, False, True) / _attention_s("b200", 128, True, True)
    assert 1.3 < backward < 2.0


def test_attention_stays_in_16_bits_unless_fp8_attention_is_asked_for():
    assert attention_precision("fp8") == attention_precision("fp4") == "bf16"
    assert attention_precision("fp8", True) == attention_precision("fp4", True) == "fp8"
    assert attention_precision("bf16", True) == "bf16"
    plan = dict(tp=1, micro_batch_size=1, global_batch_size=8, seq_len=8192, precision="fp8")
    base = api.estimate("llama3-8b", "dgx-h100", num_devices=8, plan=plan)
    fp8 = api.estimate("llama3-8b", "dgx-h100", num_devices=8, plan=dict(plan, fp8_attention=True))
    assert fp8.serialized_by_op_s["attention"] < 0.8 * base.serialized_by_op_s["attention"]
    assert fp8.serialized_by_op_s["gemm"] == base.serialized_by_op_s["gemm"]
    assert fp8.step_time_s < base.step_time_s


@pytest.mark.parametrize("plan, field", [
    (dict(precision="bf16", fp8_attention=True), "fp8_attention"),
    (dict(precision="fp8", fp8_attention=True, flash_attention=False), "fp8_attention"),
])
def test_fp8_attention_needs_low_precision_training_and_a_fused_kernel(plan, field):
    with pytest.raises(MeshplanError) as raised:
        api.estimate("llama3-8b", "dgx-h100", num_devices=8, plan=dict(tp=1, global_batch_size=8, **plan))
    assert raised.value.field.endswith(field)


@pytest.mark.parametrize("key, value, expected", [
    ("fp8_attention", True, True), ("fp8_dpa", 1, True), ("fp8_dpa", "True", True), ("fp8_dpa", "0", False),
    ("fp8_dot_product_attention", "yes", True), ("fp8_dot_product_attention", False, False),
])
def test_cases_name_fp8_attention_as_frameworks_do(key, value, expected):
    case = {
        "id": "x", "model": {"name": "llama3-8b", "arch": "dense", "num_layers": 32, "hidden_size": 4096,
                             "num_attention_heads": 32, "num_kv_heads": 8, "ffn_hidden_size": 14336,
                             "ffn_type": "swiglu", "vocab_size": 128256},
        "hardware": {"cluster": "dgx-h100", "num_devices": 8},
        "parallelism": {"tp": 1, key: value},
        "batch": {"global_batch_sequences": 8, "micro_batch_size": 1, "seq_len": 8192},
        "precision": "fp8",
    }
    assert case_inputs(case, "case")["plan"]["fp8_attention"] is expected


def test_the_search_bound_takes_fp8_attention_too():
    """The lower bound times attention through the same roofline, so it stays below the estimate."""
    s = api.scenario("llama3-8b", "dgx-h100", num_devices=8, tp=1, micro_batch_size=1, global_batch_size=8,
                     seq_len=8192, precision="fp8", fp8_attention=True)
    assert lower_bounds([s])[0] <= api.estimate("llama3-8b", "dgx-h100", num_devices=8, plan=s.plan.model_dump()).step_time_s


def test_the_estimate_command_takes_fp8_attention(monkeypatch, capsys):
    args = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--precision", "fp8",
            "--global-batch", "8", "--micro-batch", "1", "--seq-len", "4096", "--zero", "3"]
    code, out, _ = run_cli(monkeypatch, capsys, *args, "--fp8-attention")
    assert code == 0 and "(attention fp8)" in out
    code, _, err = run_cli(monkeypatch, capsys, *args[:7], "--fp8-attention")
    assert code == 2 and err.startswith("error: plan.fp8_attention") and "fp8 or fp4" in err


@pytest.mark.parametrize("precision", ["fp8", "fp4"])
def test_fp8_attention_keeps_its_queries_keys_and_values_in_one_byte(precision):
    """Transformer Engine's FP8 attention saves the FP8 Q, K and V it ran on for its backward:
    a layer keeps t·(d_q + 2·d_kv) bytes fewer, under NVFP4 GEMMs too (attention runs in FP8,
    not FP4)."""
    from meshplan.parallel.program import build_program

    model = catalog.model("llama3-8b")
    tokens, q, kv = 8192, model.hidden_size, model.kv_heads * model.dim_per_head

    def saved(fp8: bool) -> float:
        s = api.scenario("llama3-8b", "gb200-nvl72", num_devices=8, tp=1, micro_batch_size=1, global_batch_size=8,
                         seq_len=tokens, precision=precision, fp8_attention=fp8)
        return build_program(s).kinds["dense_layer"].saved_bytes

    assert saved(False) - saved(True) == pytest.approx(tokens * (q + 2 * kv), rel=1e-12)
