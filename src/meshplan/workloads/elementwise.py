"""The memory-bound ops of a decoder layer as fused kernels or eager PyTorch run them: norms,
rotary embeddings, the FFN's activation, residual adds, autocast's casts and the loss, each with
the bytes its kernels move (hand-counted, and checked against PyTorch's dispatcher in
tests/test_fusion.py) and what the host issues for it (Op.launches). meshplan.workloads.transformer
places them in a layer."""

from __future__ import annotations

from dataclasses import replace

from meshplan.specs.model import TransformerModel
from meshplan.workloads.ops import Op, Saved

MASK_BYTES = 1.0  # dropout masks are stored as bytes (Korthikanti et al. 2022, Sec. 4.1)
OPMATH_BYTES = 4.0  # PyTorch computes 16-bit elementwise math in fp32 (at::opmath_type)
#: what the host issues for an eager RMSNorm (8 kernels: float, pow, mean, add, rsqrt, mul,
#: type_as, the weight's mul) and eager rotary embeddings (6: float, the complex mul and type_as,
#: for the queries and for the keys), in the lowered ops the host's dispatch is fitted per
#: (specs.kernels.HostDispatch): the harness's layer (calibrate.kernels.layer_row) runs 15 kernels
#: over its 10 lowered ops, 1.5 an op (Op.launches)
EAGER_RMSNORM_LAUNCHES = round(8 / 1.5)
EAGER_ROTARY_LAUNCHES = round(6 / 1.5)
#: and for an eager gelu_new: its eight ops, and under autocast the cast up and down besides (activation_op)
EAGER_GELU_NEW_LAUNCHES = round(8 / 1.5)
EAGER_AUTOCAST_GELU_NEW_LAUNCHES = round(10 / 1.5)


def norm_op(name: str, tokens: float, width: float, act_bytes: float, model: TransformerModel, eager: bool, shard: str = "sp",
            keep: bool = True) -> Op:
    """A norm over ``tokens`` rows of ``width``. Fused (Transformer Engine, Apex, Megatron's
    kernels, torch.compile; PyTorch's own LayerNorm kernel): one pass reading the input and
    writing the output, keeping the input. An RMSNorm that runs eager as the reference Llama code
    writes it (Meta's llama and torchtitan's RMSNorm, Hugging Face's LlamaRMSNorm, PyTorch's
    composite rms_norm before its fused kernel) is eight kernels in fp32 opmath, six of them over
    the whole tensor (the epsilon's add and the rsqrt touch a value per row): the cast up, the
    square, the mean, the scaling, the cast down and the weight, moving 28 + 4a bytes per value
    of a-byte activations (36 in bf16); autograd's backward through them moves 76 + 8a (92):
    the weight's two products and reduction (6a), the two casts back (2a + 8), the scaling's two
    products and reduction (24), the mean's expansion (4), the square's three passes (28) and the
    sum of the input's two gradients (12). It keeps the fp32 input and the cast-down output.
    ``keep``: the norm keeps what its backward reads (the latent norms of multi-head latent
    attention are counted with the projections they feed)."""
    a, values = act_bytes, tokens * width
    params = (2.0 if model.norm == "layernorm" else 1.0) * width
    if not (eager and model.norm == "rmsnorm"):
        saved = (Saved(f"{name}_in", a * values, shard),) if keep else ()
        return Op(name, "elementwise", shard, flop=5.0 * values, bytes=2.0 * a * values, params=params, saved=saved, memory_class="norm")
    casts = a != OPMATH_BYTES  # fp32 activations need no casts
    forward = 28.0 + (4.0 * a if casts else 0.0)
    backward = 76.0 + (8.0 * a if casts else 4.0 * a)
    saved = (Saved(f"{name}_in", (OPMATH_BYTES + a) * values, shard),) if keep else ()
    return Op(name, "elementwise", shard, flop=5.0 * values, bytes=forward * values, params=params, saved=saved,
              memory_class="copy", backward_scale=backward / forward, launches=EAGER_RMSNORM_LAUNCHES)


#: HBM bytes per value of casting an fp32 tensor to 16 bits, and its gradient back (4 + 2)
AUTOCAST_CAST_BYTES = 6.0
#: what summing a second gradient into an fp32 tensor's moves over a 16-bit one's (12 - 6)
FP32_GRAD_ADD_EXTRA_BYTES = 6.0


def autocast_casts_op(name: str, tokens: float, width: float, consumers: int) -> Op:
    """Under autocast over fp32 weights (``fp32_stream``: Hugging Face Trainer's bf16=True
    without FSDP or ZeRO, Lightning's bf16-mixed) the residual stream and the norms stay fp32,
    and each linear that reads a norm's output casts it to 16 bits itself: ``consumers`` casts of
    4 + 2 bytes a value (autocast caches only leaf tensors' casts, the weights'), each cast back
    in the backward (2 + 4), and the fp32 gradients of the consumers summed, 6 bytes more a value
    for each after the first than 16-bit ones. Each linear keeps its own 16-bit copy for its
    weight gradient: consumers - 1 more than one input. The host issues them within the linears'
    calls (no dispatch of their own: Op.launches 0). tests/test_fusion.py counts a Llama and a
    GPT-2 layer with PyTorch's dispatcher."""
    values = tokens * width
    forward = AUTOCAST_CAST_BYTES * consumers
    backward = AUTOCAST_CAST_BYTES * consumers + FP32_GRAD_ADD_EXTRA_BYTES * (consumers - 1)
    saved = (Saved(f"{name}_copies", 2.0 * (consumers - 1) * values, "sp"),) if consumers > 1 else ()
    return Op(name, "elementwise", "sp", bytes=forward * values, backward_scale=backward / forward, saved=saved, launches=0)


def residual_op(name: str, tokens: float, width: float, act_bytes: float, fp32_stream: bool) -> Op:
    """The residual add (and its dropout's mask, Megatron's layout). In an fp32 stream the add
    reads the fp32 stream and the block's 16-bit output and writes fp32 (4 more bytes a value
    forward), and its backward casts the gradient down for the block (4 + 2) and sums the
    stream's two fp32 gradients (6 more than 16-bit ones): 12 more."""
    x, mask = tokens * width * act_bytes, tokens * width * MASK_BYTES
    forward, backward = 3.0 * x + mask, 2.0 * (3.0 * x + mask)
    if fp32_stream:
        forward += 4.0 * tokens * width
        backward += (AUTOCAST_CAST_BYTES + FP32_GRAD_ADD_EXTRA_BYTES) * tokens * width
    return Op(name, "elementwise", "sp", flop=2.0 * tokens * width, bytes=forward, backward_scale=backward / forward,
              saved=(Saved(f"dropout_mask_{name.removeprefix('residual_')}", mask, "sp"),))


def standalone_casts(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """Eager ops write 16-bit outputs: nothing quantizes a low-precision GEMM's input or output
    gradient as it writes it (parallel.quantize: a standalone cast)."""
    return tuple(replace(op, input_fused=False, grad_fused=False) if op.kind == "matmul" else op for op in ops)


def rotary_op(tokens: float, width: float, act_bytes: float, eager: bool) -> Op:
    """Rotary position embeddings (Su et al. 2021) on ``width`` query and key columns. Fused
    (Transformer Engine's fused_apply_rotary_pos_emb, Megatron-Core's apply_rope_fusion,
    torch.compile): one pass reading and writing them, forward and backward alike. Eager as
    Meta's llama and torchtitan write it: the cast to fp32, the complex product and the cast
    back, 16 + 2a bytes per value of a-byte activations both ways (Hugging Face's rotate_half
    form, in 16 bits, dispatches 20 forward and 28 backward: about as much). Nothing large is
    kept: the angles need no gradient. tests/test_fusion.py counts both as PyTorch dispatches
    them."""
    per_value = 2.0 * act_bytes if not eager else 16.0 + 2.0 * act_bytes
    return Op("rotary", "elementwise", "tp", flop=6.0 * tokens * width, bytes=per_value * tokens * width, backward_scale=1.0,
              launches=EAGER_ROTARY_LAUNCHES if eager else 1)


def activation_op(model: TransformerModel, prefix: str, tokens: float, f: float, act_bytes: float, eager: bool,
                  autocast: bool = True) -> Op:
    """The FFN's activation over ``tokens`` rows of ``f``. One kernel (a library's, or fused with
    its neighbours): it reads the up projection's output (both halves of a gated FFN) and writes
    f values, keeping its input. Hugging Face's gelu_new run eager is GPT-2's tanh approximation
    op by op, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (transformers NewGELUActivation): eight
    kernels of a-byte values moving 18a bytes a value forward, 28a backward (the products' two
    sides, tanh's backward, pow's three kernels, the sums of x's three gradients), keeping x,
    tanh's output, 1 + tanh and 0.5·x (4a). Under ``autocast`` over 16-bit activations (fp32
    weights, Trainer's bf16=True) the pow runs in fp32 (CUDA autocast's fp32 list), so its input
    is cast up and every op after it writes fp32, and the down projection casts the result back:
    ten kernels moving 6a + 64 bytes (76 in bf16), 13a + 92 backward (118) with the casts'
    gradients, keeping 12 + a (tests/test_fusion.py counts each as PyTorch dispatches them)."""
    a, values = act_bytes, tokens * f
    up_width = (model.ffn_matrices - 1) * f
    if not (eager and model.activation_function == "gelu_new"):
        return Op(f"{prefix}_activation", "elementwise", "tp", flop=8.0 * values, bytes=(up_width + f) * tokens * a,
                  saved=(Saved(f"{prefix}_activation_in", up_width * tokens * a, "tp"),),
                  memory_class="gated_activation" if model.ffn_matrices == 3 else "activation")
    if autocast and a != OPMATH_BYTES:
        forward, backward, kept, launches = 6.0 * a + 64.0, 13.0 * a + 92.0, 3.0 * OPMATH_BYTES + a, EAGER_AUTOCAST_GELU_NEW_LAUNCHES
    else:
        forward, backward, kept, launches = 18.0 * a, 28.0 * a, 4.0 * a, EAGER_GELU_NEW_LAUNCHES
    return Op(f"{prefix}_activation", "elementwise", "tp", flop=8.0 * values, bytes=forward * values,
              saved=(Saved(f"{prefix}_activation_in", kept * values, "tp"),), memory_class="copy",
              backward_scale=backward / forward, launches=launches)


#: bytes per logit that PyTorch's cross-entropy backward holds beside the fp32 log-softmax it
#: kept: nll_loss's backward writes the fp32 gradient of the log-softmax, which stays while the
#: log-softmax's backward writes the fp32 gradient of the logits (4 + 4); then, under autocast,
#: that gradient's 16-bit cast beside it (4 + 2) (torch/nn/functional.py cross_entropy:
#: log_softmax then nll_loss; aten _log_softmax_backward_data writes a new tensor)
EAGER_LOSS_GRAD_BYTES = 8.0


def cross_entropy_op(tokens: float, vocab: float, act_bytes: float, fused: bool, eager: bool = False) -> Op:
    """The loss over the vocabulary shard. Unfused (PyTorch's cross_entropy under autocast): the
    logits cast to fp32 and kept, log-softmax written and read, three fp32 passes over the logits
    (Korthikanti: 4·s·b·v/t bytes kept), at softmax's bandwidth; ``eager`` (the model's own code
    calls F.cross_entropy), its backward's gradients held beside them (EAGER_LOSS_GRAD_BYTES).
    Fused (flash-attn's xentropy kernel, llm-foundry's default loss; Megatron-Core's
    cross-entropy fusion): one pass reading the 16-bit logits, which are what it keeps, and a
    backward that reads them and writes their gradient, streaming as a copy."""
    if fused:
        return Op("cross_entropy", "elementwise", "tp", flop=5.0 * tokens * vocab, bytes=tokens * vocab * act_bytes,
                  saved=(Saved("logits", act_bytes * tokens * vocab, "tp"),), memory_class="copy")
    transient = (Saved("logits_grad", EAGER_LOSS_GRAD_BYTES * tokens * vocab, "tp"),) if eager else ()
    return Op("cross_entropy", "elementwise", "tp", flop=5.0 * tokens * vocab, bytes=3.0 * tokens * vocab * 4.0,
              saved=(Saved("logits_fp32", 4.0 * tokens * vocab, "tp"),), transient=transient, memory_class="softmax")
