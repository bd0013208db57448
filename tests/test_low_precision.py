"""FP8/FP4 training as Transformer Engine runs it: quantized saved inputs and cached weight copies."""

import pytest

from meshplan import api, catalog
from meshplan.errors import MeshplanError
from meshplan.parallel.program import build_program
from meshplan.parallel.quantize import cast_bytes_per_element


def _layer_saved(precision: str, tp: int, sp: bool, recompute: str = "selective") -> float:
    s = api.scenario("gpt3-175b", "dgx-h100", num_devices=tp, tp=tp, micro_batch_size=1, global_batch_size=1,
                     seq_len=2048, sequence_parallel=sp, recompute=recompute, flash_attention=False, precision=precision)
    return build_program(s).kinds["dense_layer"].saved_bytes


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_fp8_keeps_the_gemm_inputs_in_one_byte(tp):
    """Korthikanti et al. 2022 Table 2 with the four GEMM inputs (QKV 2sbh and FC1 2sbh in the
    sequence-parallel region; projection 2sbh and FC2 8sbh in the tensor-parallel one) kept in
    FP8: 34·sbh/t becomes 27·sbh/t with sequence parallelism, 10 + 24/t becomes 8 + 19/t without."""
    sbh = 2048 * 1 * 12288
    assert _layer_saved("fp8", tp, sp=False) == pytest.approx(sbh * (8 + 19 / tp), rel=1e-12)
    assert _layer_saved("bf16", tp, sp=False) == pytest.approx(sbh * (10 + 24 / tp), rel=1e-12)
    if tp > 1:
        assert _layer_saved("fp8", tp, sp=True) == pytest.approx(sbh * 27 / tp, rel=1e-12)
    # full recompute keeps only the layer input, in 16 bits
    assert _layer_saved("fp8", tp, sp=False, recompute="full") == _layer_saved("bf16", tp, sp=False, recompute="full")


def test_fp8_caches_two_one_byte_copies_of_each_gemm_weight():
    """Row- and column-wise FP8 copies of every decoder GEMM weight; the embedding, output layer
    and norms stay 16-bit and have none."""
    model = catalog.model("llama3-8b")
    h, v = model.hidden_size, model.vocab_size
    norms = model.num_layers * 2 * h + h
    gemm_params = model.num_params - 2 * v * h - norms
    fp8 = api.estimate("llama3-8b", "dgx-h100", num_devices=8, tp=1, global_batch_size=8, precision="fp8").memory
    bf16 = api.estimate("llama3-8b", "dgx-h100", num_devices=8, tp=1, global_batch_size=8, precision="bf16").memory
    assert fp8.low_precision_weights_bytes == pytest.approx(2.0 * gemm_params, rel=1e-9)
    assert bf16.low_precision_weights_bytes == 0.0
    assert fp8.weights_bytes == bf16.weights_bytes
    assert fp8.activations_bytes < bf16.activations_bytes


def test_fsdp_quantizes_only_the_gathered_layers():
    kw = dict(num_devices=8, tp=1, global_batch_size=8, precision="fp8", recompute="full")
    sharded = api.estimate("llama3-8b", "dgx-h100", zero_stage=3, **kw).memory
    replicated = api.estimate("llama3-8b", "dgx-h100", zero_stage=1, **kw).memory
    model = catalog.model("llama3-8b")
    layer_gemm = (model.num_params - 2 * model.vocab_size * model.hidden_size) / model.num_layers - 2 * model.hidden_size
    assert sharded.low_precision_weights_bytes == pytest.approx(2.0 * 2 * layer_gemm, rel=1e-3)
    assert replicated.low_precision_weights_bytes > 10 * sharded.low_precision_weights_bytes


def test_fp8_params_store_the_gemm_weights_in_one_byte():
    """With FP8 primary weights the 16-bit copy of each GEMM weight is gone and only the
    column-wise copy is extra: 16-bit edge weights + 1 byte + 1 byte per GEMM weight."""
    model = catalog.model("llama3-8b")
    edges = 2 * model.vocab_size * model.hidden_size + model.num_layers * 2 * model.hidden_size + model.hidden_size
    gemm_params = model.num_params - edges
    kw = dict(num_devices=8, tp=1, global_batch_size=8, precision="fp8")
    own = api.estimate("llama3-8b", "dgx-h100", fp8_params=True, **kw).memory
    assert own.weights_bytes == pytest.approx(2.0 * edges + gemm_params, rel=1e-9)
    assert own.low_precision_weights_bytes == pytest.approx(gemm_params, rel=1e-9)
    assert api.estimate("llama3-8b", "dgx-h100", framework="nemo", **kw).memory.weights_bytes == own.weights_bytes
    bf16 = api.estimate("llama3-8b", "dgx-h100", num_devices=8, tp=1, global_batch_size=8, fp8_params=True).memory
    assert bf16.weights_bytes == pytest.approx(2.0 * model.num_params, rel=1e-9)  # nothing to keep in FP8


def test_fp8_params_are_all_gathered_in_one_byte():
    """Megatron-Core's fp8_param_gather and torchtitan's FSDP float8 all-gather move the FP8 GEMM
    weights at one byte: the distributed optimizer's all-gather shrinks by their 16-bit second
    byte, the edge weights stay 16-bit, and the gradients' reduce-scatter is unchanged."""
    model = catalog.model("llama3-8b")
    edges = 2 * model.vocab_size * model.hidden_size + model.num_layers * 2 * model.hidden_size + model.hidden_size
    kw = dict(num_devices=8, tp=1, global_batch_size=8, precision="fp8", zero_stage=1, grad_bucket_size=10**12)

    def comms(**extra) -> dict:
        program = build_program(api.scenario("llama3-8b", "dgx-h100", **kw, **extra))
        return {c.kind: c.bytes * c.count for c in program.dp_comms}

    bf16, fp8 = comms(), comms(fp8_params=True)
    assert bf16["all_gather"] == pytest.approx(2.0 * model.num_params, rel=1e-9)
    assert fp8["all_gather"] == pytest.approx(2.0 * edges + (model.num_params - edges), rel=1e-9)
    assert fp8["reduce_scatter"] == bf16["reduce_scatter"]


def test_nvfp4_without_its_hadamard_transform_casts_as_current_scaling():
    """NVTE_NVFP4_DISABLE_RHT=1 (Plan.fp4_hadamard off): the per-tensor amax is the tensor's own
    and the column-wise copy needs no transform, so a cast moves current scaling's bytes, 2 fewer
    per element than NVFP4 with the transform; a case says it as fp4_hadamard or nvfp4_disable_rht."""
    from meshplan.io.case_inputs import case_inputs
    from meshplan.specs.plan import Plan

    plan = Plan(precision="fp4", fp4_hadamard=False)
    assert plan.quant_scaling == "nvfp4_plain" and Plan(precision="fp4").quant_scaling == "nvfp4"
    for fused in (False, True):
        assert cast_bytes_per_element("fp4", "nvfp4_plain", fused) == cast_bytes_per_element("fp4", "current", fused)
    assert cast_bytes_per_element("fp4", "nvfp4", False) - cast_bytes_per_element("fp4", "nvfp4_plain", False) == 2.0
    case = {"model": {"arch": "dense", "num_layers": 2, "hidden_size": 1024, "num_attention_heads": 8, "ffn_hidden_size": 4096,
                      "vocab_size": 32000}, "hardware": {"cluster": "gb200-nvl72", "num_devices": 4},
            "batch": {"global_batch_sequences": 4, "micro_batch_size": 1, "seq_len": 2048}, "precision": "nvfp4"}
    for key, value in (("fp4_hadamard", False), ("fp4_hadamard", "off"), ("nvfp4_disable_rht", 1), ("nvfp4_disable_rht", "1")):
        assert case_inputs({**case, "parallelism": {key: value}}, "x")["plan"]["fp4_hadamard"] is False
    assert case_inputs({**case, "parallelism": {"nvfp4_disable_rht": 0}}, "x")["plan"]["fp4_hadamard"] is True
    assert "fp4_hadamard" not in case_inputs({**case, "parallelism": {}}, "x")["plan"]
    with pytest.raises(MeshplanError, match="nvfp4_disable_rht"):
        case_inputs({**case, "parallelism": {"nvfp4_disable_rht": "sometimes"}}, "x")


def test_fp8_plans_keep_the_output_layer_gemm_in_16_bits():
    """The logits GEMM of an FP8 plan takes as long as in a bf16 plan; a decoder GEMM is faster."""
    from meshplan.costs.costed import cost_program

    def costed(precision):
        s = api.scenario("llama3-8b", "dgx-h100", num_devices=8, tp=1, global_batch_size=8, precision=precision)
        return cost_program(build_program(s))

    fp8, bf16 = costed("fp8"), costed("bf16")
    assert fp8.roles[0].edge_ops["logits"].forward_s == pytest.approx(bf16.roles[0].edge_ops["logits"].forward_s, rel=1e-12)
    assert fp8.kinds["dense_layer"].ops["mlp_up"].forward_s < 0.8 * bf16.kinds["dense_layer"].ops["mlp_up"].forward_s


@pytest.mark.parametrize(("precision", "scaling", "fused", "expected"), [
    ("fp8", "delayed", False, 4.0),  # read 2 bytes, write a row-wise and a column-wise byte
    ("fp8", "delayed", True, 1.0),  # the norm writes 1 byte instead of 2; the transpose reads 1, writes 1
    ("fp8", "block", True, 1.0),
    ("fp8", "current", True, 4.0),  # the norm's 16-bit output is cast in a pass of its own
    ("fp8", "current", False, 6.0),  # an amax pass first
    ("fp4", "delayed", False, 3.0),
    ("fp4", "delayed", True, 0.0),  # writing half a byte saves more than the transpose costs
    ("fp4", "nvfp4", False, 7.0),  # both amaxes in one read, then a row-wise and a Hadamard column-wise cast
    ("fp4", "nvfp4", True, 7.0),  # a norm cannot give the transform's amax: nothing fuses
    ("bf16", "delayed", False, 0.0),
])
def test_cast_bytes_per_element(precision, scaling, fused, expected):
    assert cast_bytes_per_element(precision, scaling, fused) == expected


def _kind(precision: str, scaling: str = "delayed"):
    s = api.scenario("llama3-8b", "dgx-h100", num_devices=1, micro_batch_size=1, global_batch_size=1, seq_len=1024,
                     precision=precision, fp8_scaling=scaling)
    return {op.op.name: op for op in build_program(s).kinds["dense_layer"].ops}


def test_each_fp8_gemm_casts_its_input_and_its_output_gradient():
    """Llama 3 8B, 1024 tokens: QKV's input comes out of the norm (fused: 1 byte an element) and
    its gradient out of attention (4 bytes); the projection's input out of attention (4); the
    gated up projection's gradient out of SwiGLU's backward (fused, 1); the down projection's
    input out of SwiGLU (1) and its gradient off the residual (4)."""
    t, h, f, qkv = 1024, 4096, 14336, 4096 + 2 * 1024
    ops = _kind("fp8")
    assert ops["qkv"].cast_bytes == (t * h * 1.0, t * qkv * 4.0)
    assert ops["proj"].cast_bytes == (t * h * 4.0, t * h * 4.0)
    assert ops["mlp_up"].cast_bytes == (t * h * 1.0, t * 2 * f * 1.0)
    assert ops["mlp_down"].cast_bytes == (t * f * 1.0, t * h * 4.0)
    assert all(op.cast_bytes == (0.0, 0.0) for op in _kind("bf16").values())


def test_fp4_plans_scale_as_nvfp4_whatever_the_fp8_recipe():
    """Transformer Engine trains FP4 with NVFP4 only: megatron-core's FP8 current scaling does not
    apply to an FP4 plan; plain block scales (MXFP4) cast in one pass and cost less."""
    def step(**fields):
        return api.estimate("llama3-8b", "dgx-b200", num_devices=8, global_batch_size=8, seq_len=4096,
                            precision="fp4", **fields)

    nvfp4 = step()
    assert api.scenario("llama3-8b", "dgx-b200", num_devices=8, precision="fp4", framework="megatron-core").plan.quant_scaling == "nvfp4"
    assert step(framework="megatron-core", fp8_scaling="delayed").step_time_s == step(framework="megatron-core").step_time_s
    assert step(fp4_scaling="block").step_time_s < nvfp4.step_time_s
    assert step(fp4_scaling="nvfp4").step_time_s == nvfp4.step_time_s


def test_casts_cost_time_and_current_scaling_costs_more():
    def step(scaling):
        return api.estimate("llama3-8b", "dgx-h100", num_devices=8, global_batch_size=8, seq_len=4096,
                            precision="fp8", fp8_scaling=scaling)

    delayed, current = step("delayed"), step("current")
    bf16 = api.estimate("llama3-8b", "dgx-h100", num_devices=8, global_batch_size=8, seq_len=4096, precision="bf16")
    memory = delayed.serialized_by_op_s["memory_bound"]  # casts are counted with the GEMMs they feed
    assert memory == pytest.approx(bf16.serialized_by_op_s["memory_bound"], rel=1e-9)
    assert delayed.step_time_s < current.step_time_s < bf16.step_time_s
