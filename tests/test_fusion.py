"""Fused or eager norms and rotary embeddings (Plan.fusion; workloads.elementwise.norm_op and
rotary_op): what each moves, hand-counted, and what it does to a step."""

from __future__ import annotations

import copy

import pytest

import meshplan
from meshplan.costs.costed import cost_program
from meshplan.errors import MeshplanError
from meshplan.specs.base import build
from meshplan.io.validation_cases import run_case
from meshplan.parallel.program import build_program
from meshplan.specs.model import TransformerModel
from meshplan.workloads.ops import backward_work
from meshplan.workloads.transformer import lower

LLAMA = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=176, ffn_type="swiglu",
             vocab_size=128)
GPT = dict(LLAMA, num_kv_heads=4, ffn_type="gelu")
T, H, Q, KV = 3 * 16, 64, 64, 32  # tokens (micro-batch 3 x 16), hidden, query and key widths


def _ops(model: dict, eager: bool, act_bytes: float = 2.0) -> dict:
    graph = lower(TransformerModel(**model), 3, 16, act_bytes, eager=eager)
    return {op.name: op for op in graph.blocks[0].ops} | {op.name: op for op in graph.tail.ops}


def test_a_gated_ffn_model_has_rmsnorm_and_rotary_embeddings_by_default():
    llama, gpt = TransformerModel(**LLAMA), TransformerModel(**GPT)
    assert (llama.norm, llama.rotary) == ("rmsnorm", True)
    assert (gpt.norm, gpt.rotary) == ("layernorm", False)
    given = TransformerModel(**LLAMA, norm="layernorm", rotary=False)
    assert (given.norm, given.rotary) == ("layernorm", False)


def test_a_fused_norm_reads_and_writes_once_and_keeps_its_input():
    norm = _ops(LLAMA, eager=False)["norm_attn"]
    assert norm.bytes == 2 * 2.0 * T * H and backward_work(norm) == 2.0
    assert [s.bytes for s in norm.saved] == [2.0 * T * H]


def test_an_eager_rmsnorm_moves_what_its_kernels_move():
    """bf16: cast up 2+4, square 4+4, mean 4, scale 4+4, cast down 4+2, weight 2+2 = 36 bytes a
    value; backward 92; it keeps the fp32 input and the bf16 output before the weight."""
    ops = _ops(LLAMA, eager=True)
    for name in ("norm_attn", "norm_mlp", "norm_final"):
        assert ops[name].bytes == 36.0 * T * H
        assert ops[name].bytes * backward_work(ops[name]) == pytest.approx(92.0 * T * H)
        assert [s.bytes for s in ops[name].saved] == [6.0 * T * H]


def test_an_eager_rmsnorm_in_fp32_has_no_casts():
    norm = _ops(LLAMA, eager=True, act_bytes=4.0)["norm_attn"]
    assert norm.bytes == 28.0 * T * H
    assert norm.bytes * backward_work(norm) == pytest.approx(92.0 * T * H)


def test_layernorm_runs_one_kernel_eager_or_fused():
    assert _ops(GPT, eager=True)["norm_attn"] == _ops(GPT, eager=False)["norm_attn"]


GPT2 = dict(GPT, activation_function="gelu_new")
F = GPT["ffn_hidden_size"]


def test_an_eager_gelu_new_moves_what_its_kernels_move():
    """GPT-2's gelu_new op by op under autocast: the cast up 2+4, pow 8, scale 8, add 2+4+4,
    scale 8, tanh 8, 1 + 8, 0.5·x 2+2, product 2+4+4, the down projection's cast 4+2 = 76 bytes
    a value; backward 118; it keeps the fp32 pow input, tanh's output, 1 + tanh and 0.5·x
    (3 x 4 + 2). In fp32: 72 and 112, the same 16 kept. Fused, or a gelu FFN: one kernel."""
    eager = _ops(GPT2, eager=True)["mlp_activation"]
    assert eager.bytes == 76.0 * T * F and eager.bytes * backward_work(eager) == pytest.approx(118.0 * T * F)
    assert [s.bytes for s in eager.saved] == [14.0 * T * F] and eager.launches == 7
    fp32 = _ops(GPT2, eager=True, act_bytes=4.0)["mlp_activation"]
    assert fp32.bytes == 72.0 * T * F and fp32.bytes * backward_work(fp32) == pytest.approx(112.0 * T * F)
    assert [s.bytes for s in fp32.saved] == [16.0 * T * F]
    # a bf16 model, no autocast (bf16-true training, serving): eight bf16 kernels, 36 and 56
    native = lower(TransformerModel(**GPT2), 3, 16, 2.0, eager=True, autocast=False).blocks[0].ops
    native = next(op for op in native if op.name == "mlp_activation")
    assert native.bytes == 36.0 * T * F and native.bytes * backward_work(native) == pytest.approx(56.0 * T * F)
    assert [s.bytes for s in native.saved] == [8.0 * T * F] and native.launches == 5
    one_kernel = _ops(GPT, eager=False)["mlp_activation"]
    assert _ops(GPT2, eager=False)["mlp_activation"] == _ops(GPT, eager=True)["mlp_activation"] == one_kernel
    assert one_kernel.bytes == 4.0 * T * F and [s.bytes for s in one_kernel.saved] == [2.0 * T * F]


def test_a_bf16_true_run_and_serving_run_gelu_new_without_autocast():
    """The plan says which: fp32 Adam state (a master copy) means autocast over fp32 weights; a
    bf16-true model's state and serving's weights are the 16-bit tensors the kernels read."""
    plan = dict(tp=1, dp=1, micro_batch_size=4, global_batch_size=4, seq_len=1024, fusion="eager")

    def activation(plan, task=None):
        from meshplan.parallel.program import Phase
        scenario = meshplan.api.scenario("gpt2", "dgx-h100", plan, 1, task)
        phase = Phase("prefill", 1024, 1024) if task else None
        kind = next(iter(build_program(scenario, phase).kinds.values()))
        return next(op.op for op in kind.ops if op.op.name == "mlp_activation")

    tokens, f = 4 * 1024, 3072
    assert activation(plan).bytes == 76.0 * tokens * f
    assert activation({**plan, "optimizer_state": "bf16", "grad_reduce_precision": "bf16"}).bytes == 36.0 * tokens * f
    assert activation(plan, {"kind": "inference", "batch_size": 1, "prompt_len": 1024, "output_len": 8}).bytes == 36.0 * 1024 * f


@pytest.mark.parametrize("ffn_type, activation", [("swiglu", "gelu_new"), ("gelu", "silu"), ("relu", "gelu")])
def test_an_activation_of_another_ffn_is_refused(ffn_type, activation):
    with pytest.raises(MeshplanError) as err:
        build(TransformerModel, {**GPT, "ffn_type": ffn_type, "activation_function": activation}, "model")
    assert err.value.field == "model.activation_function" and ffn_type in err.value.valid


def test_rotary_embeddings_rotate_the_queries_and_keys():
    """Fused: 2 + 2 bytes a value; eager (the fp32 complex product between two casts): 20; the
    backward moves what the forward does."""
    fused, eager = _ops(LLAMA, eager=False)["rotary"], _ops(LLAMA, eager=True)["rotary"]
    assert fused.bytes == 4.0 * T * (Q + KV) and eager.bytes == 20.0 * T * (Q + KV)
    assert backward_work(fused) == backward_work(eager) == 1.0
    assert fused.shard == "tp" and not fused.saved
    assert "rotary" not in _ops(GPT, eager=True)


def test_eager_ops_take_the_host_several_dispatches():
    """An eager RMSNorm issues 8 kernels and eager rotary embeddings 6, where the host's dispatch
    is fitted per lowered op of 1.5 kernels: 5 and 4 ops' worth; fused ops one."""
    fused, eager = _ops(LLAMA, eager=False), _ops(LLAMA, eager=True)
    assert (eager["norm_attn"].launches, eager["rotary"].launches) == (5, 4)
    assert {op.launches for op in fused.values()} == {1}


def test_a_host_bound_eager_layer_waits_for_its_extra_dispatches():
    """Llama 3 8B at tp 8 and 2048 tokens is held to its host's dispatch (HostDispatch): eager,
    its two norms and rotary embeddings take 5 + 5 + 4 ops' dispatches for 3, each way."""
    host = meshplan.catalog.efficiency("hopper").kernels.host
    plan = dict(tp=8, dp=1, micro_batch_size=1, global_batch_size=1, seq_len=2048)
    layer = {f: cost_program(build_program(meshplan.api.scenario("llama3-8b", "dgx-h100", plan, 8, fusion=f))).kinds["dense_layer"]
             for f in ("fused", "eager")}
    assert layer["eager"].forward_s - layer["fused"].forward_s == pytest.approx(11 * host.forward_s, rel=0.05)
    assert layer["eager"].backward_s - layer["fused"].backward_s == pytest.approx(11 * host.backward_s, rel=0.05)


def test_eager_ops_leave_fp8_casts_standalone():
    """A fused norm or activation writes the next GEMM's input already quantized; eager ones
    write 16 bits, so every cast is its own pass (parallel.quantize)."""
    fused, eager = _ops(LLAMA, eager=False), _ops(LLAMA, eager=True)
    assert fused["qkv"].input_fused and fused["mlp_up"].grad_fused
    assert not any(op.input_fused or op.grad_fused for op in eager.values())


def test_rotary_sits_between_the_qkv_projection_and_attention():
    names = list(_ops(LLAMA, eager=False))
    assert names.index("qkv") + 1 == names.index("rotary") == names.index("attention") - 1


def test_latent_attention_rotates_its_decoupled_part():
    """DeepSeek-V3: 128 query heads' 64 rotary columns and the one shared rotary key."""
    model = meshplan.catalog.model("deepseek-v3")
    ops = {op.name: op for op in lower(model, 1, 16, 2.0).blocks[0].ops}
    assert ops["rotary"].bytes == 4.0 * 16 * (128 + 1) * 64


PLAN = dict(tp=2, dp=4, micro_batch_size=2, global_batch_size=64, seq_len=2048)


@pytest.mark.parametrize("model, plan", [
    ("llama3-8b", PLAN),
    ("llama3-8b", {**PLAN, "recompute": "full"}),
    ("llama3-8b", {**PLAN, "tp": 1, "dp": 8, "zero_stage": 3, "recompute": "selective", "framework": "torchtitan"}),
    ("mixtral-8x7b", {**PLAN, "ep": 4, "dp": 4}),
    ("deepseek-v3", {**PLAN, "tp": 1, "pp": 8, "dp": 8, "ep": 8, "global_batch_size": 256}),
])
def test_eager_is_slower_and_a_gpt_model_does_not_notice(model, plan):
    fused = meshplan.estimate(model, "dgx-h100", plan, 8 * plan.get("pp", 1), fusion="fused")
    eager = meshplan.estimate(model, "dgx-h100", plan, 8 * plan.get("pp", 1), fusion="eager")
    assert eager.step_time_s > fused.step_time_s
    assert eager.memory.activations_bytes >= fused.memory.activations_bytes
    gpt = dict(plan, framework=None, ep=1)
    same = [meshplan.estimate("gpt3-175b", "dgx-h100", gpt, 8 * plan.get("pp", 1), fusion=f).step_time_s for f in ("fused", "eager")]
    assert same[0] == same[1]


def test_framework_presets_say_how_their_runs_fuse():
    """PyTorch FSDP trainers and Composer run the model eager; torchtitan's published runs
    compile it; Megatron-Core fuses with Transformer Engine."""
    fusion = {name: meshplan.api.scenario("llama3-8b", "dgx-h100", PLAN, 8, framework=name).plan.fusion
              for name in ("pytorch-fsdp", "llm-foundry", "torchtitan", "megatron-core", "nemo", "deepspeed")}
    assert fusion == {"pytorch-fsdp": "eager", "llm-foundry": "eager", "torchtitan": "fused", "megatron-core": "fused",
                      "nemo": "fused", "deepspeed": "fused"}
    assert meshplan.api.scenario("llama3-8b", "dgx-h100", PLAN, 8, framework="torchtitan", fusion="eager").plan.fusion == "eager"
    # and their attention is SDPA's FlashAttention-2, as torchtitan's
    assert meshplan.api.scenario("llama3-8b", "dgx-h100", PLAN, 8, framework="pytorch-fsdp").plan.attention_kernel == "flash2"


CASE = {
    "id": "tt", "group": "g", "source": "test",
    "model": {"name": "Llama 3.1 8B", "arch": "dense", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
              "num_kv_heads": 8, "ffn_hidden_size": 14336, "ffn_type": "swiglu", "vocab_size": 128256},
    "hardware": {"cluster": "dgx-h100", "num_devices": 8},
    "parallelism": {"tp": 1, "pp": 1, "dp": 8, "zero_stage": 3, "activation_recompute": "selective"},
    "batch": {"global_batch_sequences": 16, "micro_batch_size": 2, "seq_len": 8192},
    "precision": "bf16", "framework": "torchtitan",
    "measured": {"step_time_s": 2.8},
}


def _case(**changes) -> dict:
    out = copy.deepcopy(CASE)
    for key, value in changes.items():
        section, _, field = key.rpartition("__")
        (out[section] if section else out)[field] = value
    return out


@pytest.mark.parametrize("changes, slower", [
    ({"compiled": False}, True), ({"compiled": True}, False), ({"torch_compile": "no"}, True),
    ({"parallelism__compile": "off"}, True), ({"fusion": "eager"}, True), ({"parallelism__fusion": "Fused"}, False),
    ({"framework": "torchtitan (torch.compile)"}, False), ({"framework": "torchtitan, eager"}, True),
    ({"framework": "torchtitan without torch.compile"}, True), ({"framework": "torchtitan + no compile"}, True),
])
def test_a_case_may_say_whether_torch_compile_ran(changes, slower):
    base = run_case(_case(), 0)
    run = run_case(_case(**changes), 0)
    assert base.error is None and run.error is None
    assert (run.predicted_step_time_s > base.predicted_step_time_s) == slower


@pytest.mark.parametrize("changes, field", [({"compiled": "sometimes"}, "tt.compiled"), ({"fusion": "partly"}, "fusion")])
def test_a_bad_compile_switch_is_refused_naming_its_field(changes, field):
    result = run_case(_case(**changes), 0)
    assert result.predicted_step_time_s is None and field in result.error


@pytest.mark.parametrize("framework, preset", [
    ("torchtitan (torch.compile)", "torchtitan"), ("FSDP2 + torch.compile", "pytorch-fsdp"),
    ("PyTorch FSDP (HSDP)", "pytorch-fsdp"), ("Megatron-LM (core r0.9)", "megatron-lm"), ("DeepSpeed 0.9.2, ZeRO-1", "deepspeed"),
    ("Hugging Face Trainer", "pytorch-fsdp"), ("PyTorch Lightning 2.4 (bf16-mixed)", "pytorch-fsdp"),
])
def test_a_qualified_framework_name_still_picks_its_preset(framework, preset):
    from meshplan.io.case_inputs import framework_name

    assert framework_name(framework) == preset


def _dispatched_bytes(fn, x) -> tuple[float, float]:
    """Bytes per value of ``x`` that PyTorch's eager kernels read and write for ``fn(x)`` and its
    backward, counted as the dispatcher sees them: each op's tensor inputs and outputs once, a
    broadcast input at its own size, views free."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def size(t) -> int:
        return min(t.numel(), t.untyped_storage().nbytes() // t.element_size()) * t.element_size()

    class Count(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func._schema.returns or not any(r.alias_info for r in func._schema.returns):  # views move nothing
                tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
                self.total += sum(size(t) for t in tensors)
            return out

    y = fn(x)
    grad = torch.randn_like(y)
    with Count() as forward:
        y = fn(x)
    with Count() as backward:
        y.backward(grad)
    return forward.total / x.numel(), backward.total / x.numel()


def test_the_eager_counts_are_what_pytorch_dispatches():
    """torchtitan's RMSNorm and rotary embeddings (models/llama at 6b03ffa3, the reference Llama
    code) run on the CPU under a dispatch mode that counts every kernel's tensors: 36 and 92 bytes
    per bf16 value for the norm, 20 each way for the rotary embedding (its angles, shared by the
    heads, read once per position)."""
    torch = pytest.importorskip("torch")
    x = torch.randn(64, 1024, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.ones(1024, dtype=torch.bfloat16, requires_grad=True)

    def rmsnorm(x):
        up = x.float()
        return (up * torch.rsqrt(up.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * weight

    forward, backward = _dispatched_bytes(rmsnorm, x)
    assert forward == pytest.approx(36.0, abs=0.5) and backward == pytest.approx(92.0, abs=0.5)

    q = torch.randn(1, 64, 32, 128, dtype=torch.bfloat16, requires_grad=True)  # 32 heads of 128
    angles = torch.polar(torch.ones(64, 64), torch.randn(64, 64)).view(1, 64, 1, 64)

    def rotary(q):
        pairs = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * angles).flatten(3).type_as(q)

    forward, backward = _dispatched_bytes(rotary, q)
    assert forward == pytest.approx(20.0, abs=0.5) and backward == pytest.approx(20.0, abs=0.5)


def test_gelu_new_counts_are_what_pytorch_dispatches():
    """transformers' NewGELUActivation on the CPU under the counting dispatch mode: under CUDA
    autocast its pow runs in fp32 (the cast written out here, as autocast inserts it) and the
    next linear layer casts the fp32 result back to bf16: 76 bytes a value forward, 118 backward;
    a bf16 model without autocast, 36 and 56; in fp32, 72 and 112."""
    torch = pytest.importorskip("torch")
    import math

    def gelu_new(x, autocast):
        cubed = torch.pow(x.float() if autocast else x, 3.0)
        y = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * cubed)))
        return y.to(x.dtype)

    for dtype, autocast, expected in ((torch.bfloat16, True, (76.0, 118.0)), (torch.bfloat16, False, (36.0, 56.0)),
                                      (torch.float32, False, (72.0, 112.0))):
        x = torch.randn(64, 1024, dtype=dtype, requires_grad=True)
        forward, backward = _dispatched_bytes(lambda v: gelu_new(v, autocast), x)
        assert (forward, backward) == pytest.approx(expected, abs=0.5)


def _layer_bytes(layer, params: dict, hidden, fp32_weights: bool):
    """Bytes per hidden value that PyTorch's eager kernels other than GEMMs move in ``layer`` and
    its backward, apart from the weights' casts (bytes per weight): a bf16 model, or an fp32 one
    under CPU autocast to bf16 (whose lists put linear in bf16 and the norms' math in fp32, as
    CUDA's do), counted as _dispatched_bytes counts."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    dtype = torch.float32 if fp32_weights else torch.bfloat16
    weights = {name: torch.randn(*shape, dtype=dtype, requires_grad=True) for name, shape in params.items()}
    shapes = {w.shape for w in weights.values() if w.dim() == 2}

    class Count(TorchDispatchMode):
        values = weight = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func)
            views = func._schema.returns and any(r.alias_info for r in func._schema.returns)
            if not views and not name.startswith(("aten.mm", "aten.addmm", "aten.detach", "aten._unsafe_view", "aten.clone",
                                                  "aten.zeros", "aten.empty", "aten.new_empty")):
                tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
                moved = sum(t.numel() * t.element_size() for t in tensors)
                if name.startswith("aten._to_copy") and tensors[0].shape in shapes:
                    self.weight += moved
                else:
                    self.values += moved
            return out

    x = torch.randn(*hidden, dtype=dtype, requires_grad=True)

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=fp32_weights):
            return layer(x, weights)

    grad = torch.randn_like(run())
    with Count() as forward:
        y = run()
    with Count() as backward:
        y.backward(grad)
    n, w = x.numel(), sum(t.numel() for t in weights.values() if t.dim() == 2)
    return forward.values / n, backward.values / n, forward.weight / w, backward.weight / w


class _Core:
    """The attention kernel, not counted: the queries through, no gradient work."""

    @staticmethod
    def apply(q, k, v):
        torch = pytest.importorskip("torch")

        class Core(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                ctx.shapes = (k.shape, v.shape, k.dtype)
                return q.detach().clone()

            @staticmethod
            def backward(ctx, g):
                k_shape, v_shape, dtype = ctx.shapes
                return g, torch.zeros(k_shape, dtype=dtype), torch.zeros(v_shape, dtype=dtype)

        return Core.apply(q, k, v)


def _hf_llama_layer(x, w):
    """transformers' LlamaDecoderLayer, eager: its RMSNorm, separate q, k, v, gate and up projections."""
    import torch.nn.functional as F

    def norm(h, weight):
        dtype = h.dtype
        h = h.float()
        return weight * (h * (h.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()).to(dtype)

    h = norm(x, w["n1"])
    attn = _Core.apply(F.linear(h, w["q"]), F.linear(h, w["k"]), F.linear(h, w["v"]))
    x = x + F.linear(attn, w["o"])
    h = norm(x, w["n2"])
    return x + F.linear(F.silu(F.linear(h, w["g"])) * F.linear(h, w["u"]), w["d"])


def _hf_gpt2_layer(x, w):
    """transformers' GPT2Block: LayerNorm kernels, one fused c_attn, a plain FFN (GELU as one kernel)."""
    import torch.nn.functional as F

    h = F.layer_norm(x, x.shape[-1:], w["n1"], w["b1"])
    q, k, v = F.linear(h, w["qkv"]).chunk(3, -1)
    x = x + F.linear(_Core.apply(q, k, v), w["o"])
    h = F.layer_norm(x, x.shape[-1:], w["n2"], w["b2"])
    return x + F.linear(F.gelu(F.linear(h, w["up"])), w["d"])


def _stream_extra(model: dict, b: int, s: int) -> tuple[float, float]:
    """What meshplan's fp32 stream adds to a decoder layer's memory-bound ops, bytes per hidden value."""
    def moved(fp32_stream):
        ops = [op for op in lower(TransformerModel(**model), b, s, 2.0, eager=True, fp32_stream=fp32_stream).blocks[0].ops
               if op.kind == "elementwise"]
        return sum(op.bytes for op in ops), sum(op.bytes * backward_work(op) for op in ops)
    (f32, b32), (f16, b16) = moved(True), moved(False)
    values = b * s * model["hidden_size"]
    return (f32 - f16) / values, (b32 - b16) / values


def test_autocast_over_fp32_weights_keeps_the_residual_stream_fp32():
    """Hugging Face's Llama and GPT-2 layers counted by PyTorch's dispatcher, a bf16 model against
    the fp32 model under autocast: its norms take fp32 input, each projection casts a norm's
    output (Llama's five, GPT-2's two), the residual adds read and write fp32 and cast the
    block's gradient, the fp32 gradients of a shared input are summed; Llama 22 bytes a hidden
    value more forward and 72 backward, as meshplan's fp32 stream adds them. GPT-2's LayerNorm
    kernel moves 6 bytes a value more backward in fp32, where meshplan's fused norm moves twice
    its forward's 4: 4 more over its two norms. Every weight is cast each forward, 6 bytes, and
    its gradient back, 6."""
    llama_shapes = dict(n1=(96,), q=(96, 96), k=(48, 96), v=(48, 96), o=(96, 96), n2=(96,), g=(160, 96), u=(160, 96), d=(96, 160))
    gpt2_shapes = dict(n1=(96,), b1=(96,), qkv=(288, 96), o=(96, 96), n2=(96,), b2=(96,), up=(384, 96), d=(96, 384))
    for layer, shapes, model, (forward, backward) in (
        (_hf_llama_layer, llama_shapes, dict(LLAMA, hidden_size=96, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=160), (22.0, 72.0)),
        (_hf_gpt2_layer, gpt2_shapes, dict(GPT, hidden_size=96, num_attention_heads=4, num_kv_heads=4, ffn_hidden_size=384), (28.0, 48.0)),
    ):
        bf16 = _layer_bytes(layer, shapes, (4, 32, 96), fp32_weights=False)
        fp32 = _layer_bytes(layer, shapes, (4, 32, 96), fp32_weights=True)
        # (and the norms' own weights and their gradients' reductions: tenths of a byte at this width)
        assert (fp32[0] - bf16[0], fp32[1] - bf16[1]) == pytest.approx((forward, backward), abs=0.25)
        assert fp32[2:] == pytest.approx((6.0, 6.0)) and bf16[2:] == (0.0, 0.0)
        modelled = _stream_extra(model, 4, 32)
        assert modelled == pytest.approx((forward, backward + (4.0 if layer is _hf_gpt2_layer else 0.0)))


def test_a_single_gpu_autocast_step_casts_its_weights_each_forward():
    """Hugging Face's Trainer on one GPU (bf16=True): each GEMM's weight cast each forward and its
    gradient back (6 and 6 bytes a weight), the fp32 stream's ops in every layer; a bf16 model,
    or FSDP's gathered 16-bit copies, neither."""
    plan = dict(num_devices=1, global_batch_size=4, micro_batch_size=4, seq_len=2048, framework="huggingface")
    kinds = build_program(meshplan.api.scenario("llama3-8b", "dgx-h100", **plan)).kinds
    ops = {op.op.name: op for op in kinds["dense_layer"].ops}
    weight = ops["qkv"].k * ops["qkv"].n  # the projections' weights, biases aside
    assert ops["qkv"].cast_bytes == (6.0 * weight, 6.0 * weight)
    assert {"norm_attn_casts", "norm_mlp_casts"} <= set(ops)
    for other in (dict(plan, optimizer_state="bf16"), dict(plan, num_devices=8, global_batch_size=32, zero_stage=3)):
        ops = {op.op.name: op for op in build_program(meshplan.api.scenario("llama3-8b", "dgx-h100", **other)).kinds["dense_layer"].ops}
        assert ops["qkv"].cast_bytes == (0.0, 0.0) and "norm_attn_casts" not in ops
