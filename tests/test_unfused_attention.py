"""Attention without flash fusion, as Megatron-LM ran it in SC21 and Korthikanti et al. 2022
(costs.kernels.unfused_attention_s; the megatron-lm and deepspeed presets): batched GEMMs over
the whole score square and memory-bound passes over the scores, and a selective recompute that
re-runs exactly that core."""

from __future__ import annotations

import pytest

from meshplan import api, catalog
from meshplan.costs.compute import Roofline
from meshplan.costs.costed import cost_program
from meshplan.costs.kernels import DROPOUT_MASK_BYTES, gemm_s, memory_op_s, unfused_attention_s
from meshplan.parallel.program import build_program
from meshplan.workloads.ops import AttentionShape

B, A, S, D = 2, 16, 2048, 128


def _shape(causal: bool = True, flash: bool = False) -> AttentionShape:
    return AttentionShape(batch=B, heads=A, kv_heads=A, seq=S, kv=S, qk_dim=D, v_dim=D, causal=causal, flash=flash)


def _roof() -> Roofline:
    d = catalog.device("a100-sxm4-80gb")
    return Roofline.of(d, catalog.efficiency(d.efficiency), "bf16")


def test_unfused_forward_is_two_full_square_gemms_and_three_passes_over_the_scores():
    """S = Q·Kᵀ and O = P·V over all b·a·s² scores (the mask applies after), softmax reading a
    causal row's own keys (half) and writing all of it, dropout reading, writing and keeping a
    byte of mask per score."""
    r = _roof()
    k, g, mem, chip = r.kernels, r.kernels.gemm_of("bf16"), r.kernels.memory, r.attention_chip
    rows, scores = B * A * S, B * A * S * S
    gemms = gemm_s(rows, D, S, 2.0, g, chip) + gemm_s(rows, S, D, 2.0, g, chip)
    passes = (memory_op_s(scores * 1.5 * 2.0, "copy", mem, chip.hbm_bytes_per_s)
              + memory_op_s(scores * (4.0 + DROPOUT_MASK_BYTES), "copy", mem, chip.hbm_bytes_per_s))
    assert unfused_attention_s(_shape(), g, k.memory, 2.0, chip) == pytest.approx(gemms + passes, rel=1e-12)
    # a bidirectional softmax reads every score: the GEMMs do not change, only that read
    extra = memory_op_s(scores * 0.5 * 2.0, "copy", mem, chip.hbm_bytes_per_s) - mem.of("copy").launch_s
    assert unfused_attention_s(_shape(causal=False), g, k.memory, 2.0, chip) == pytest.approx(gemms + passes + extra, rel=1e-12)


def test_unfused_backward_runs_twice_the_forward_gemm_flop():
    r = _roof()
    g, chip = r.kernels.gemm_of("bf16"), r.attention_chip
    no_passes = r.kernels.memory.model_copy(update={"classes": {
        "copy": r.kernels.memory.classes["copy"].model_copy(update={"fraction": 2.0, "launch_s": 0.0})}})
    forward = unfused_attention_s(_shape(), g, no_passes, 2.0, chip)
    backward = unfused_attention_s(_shape(), g, no_passes, 2.0, chip, backward=True)
    # four GEMMs to two, each of the same flop; the forward's S = Q·Kᵀ runs a K loop of one head
    # width (128), the backward's dV and dK one of the sequence, at a higher fraction of the peak
    assert 1.3 < backward / forward < 2.0


def test_unfused_attention_is_slower_than_flash_attention():
    """Twice the causal work and the scores through HBM: slower forward and backward (flash
    attention's backward recomputes the scores, so its lead there is smaller)."""
    r = _roof()
    assert r.attention_op_s(_shape(), 0.0, 0.0, False) > 2.0 * r.attention_op_s(_shape(flash=True), 0.0, 0.0, False)
    assert r.attention_op_s(_shape(), 0.0, 0.0, True) > 1.2 * r.attention_op_s(_shape(flash=True), 0.0, 0.0, True)


def test_megatron_selective_recompute_reruns_the_attention_core():
    """Korthikanti et al. 2022, Sec. 4.2: selective recompute re-runs QKᵀ, softmax, dropout and
    the product with V; under the megatron-lm preset (no flash attention) it costs exactly the
    attention op's forward, where under flash attention it costs nothing."""
    plan = dict(tp=8, micro_batch_size=1, global_batch_size=8, seq_len=2048, sequence_parallel=True, recompute="selective")
    megatron = build_program(api.scenario("gpt3-175b", "dgx-a100-80gb", {**plan, "framework": "megatron-lm"}, 8))
    assert megatron.scenario.plan.flash_attention is False
    assert dict(megatron.kinds["dense_layer"].recompute_ops) == {"attention": 1.0}
    flash = build_program(api.scenario("gpt3-175b", "dgx-a100-80gb", plan, 8))
    assert not dict(flash.kinds["dense_layer"].recompute_ops)


def test_megatron_lm_after_ampere_runs_transformer_engines_fused_attention():
    """The megatron-lm preset's unfused attention is the A100 era's (SC21, Korthikanti 2022): on
    Hopper Megatron-LM runs Transformer Engine's fused attention (catalog.framework_on), unless
    the plan says otherwise, and its one-NIC ZeRO-3 fit (DeepSpeed's of 2021) stays on Ampere."""
    run = dict(num_devices=8, tp=8, global_batch_size=8, seq_len=8192, framework="megatron-lm")
    hopper = api.scenario("llama3-8b", "dgx-h100", **run).plan
    ampere = api.scenario("llama3-8b", "dgx-a100-80gb", **run).plan
    assert hopper.flash_attention and hopper.zero3_network_rails is None
    assert not ampere.flash_attention and ampere.zero3_network_rails == 1
    assert not api.scenario("llama3-8b", "dgx-h100", **run, flash_attention=False).plan.flash_attention
    # and a search starts from the same defaults
    assert api.search_job("llama3-8b", "dgx-h100", 8, framework="megatron-lm")[3].flash_attention


def test_nemo_launcher_runs_flash_attention_2_on_hopper():
    """NeMo's launcher containers 24.01-24.07 set NVTE_FUSED_ATTN=0, so Transformer Engine ran
    the flash-attn package (FlashAttention-2) on Hopper where it prefers cuDNN's fused attention:
    the attention op runs at FlashAttention-2's fraction of the measured kernel (FlashAttention-3
    paper, Fig. 5: 335 against 616 TFLOP/s forward), everything else as NeMo 2.0's preset."""
    run = dict(num_devices=8, tp=1, cp=2, global_batch_size=16, seq_len=8192, precision="fp8")
    launcher = cost_program(build_program(api.scenario("llama3-8b", "dgx-h100", **run, framework="nemo-launcher")))
    recipes = cost_program(build_program(api.scenario("llama3-8b", "dgx-h100", **run, framework="nemo")))
    assert launcher.program.scenario.plan.attention_kernel == "flash2" and recipes.program.scenario.plan.attention_kernel is None
    slow, fast = launcher.kinds["dense_layer"].ops["attention"], recipes.kinds["dense_layer"].ops["attention"]
    # the fractions slow the math, not the kernel's memory traffic
    assert 1.5 < slow.forward_s / fast.forward_s <= 1.0 / 0.544 and 1.5 < slow.backward_s / fast.backward_s <= 1.0 / 0.574
    assert launcher.kinds["dense_layer"].ops["qkv"] == recipes.kinds["dense_layer"].ops["qkv"]
    ampere = api.scenario("llama3-8b", "dgx-a100-80gb", **{**run, "precision": "bf16"}, framework="nemo-launcher").plan
    assert ampere.attention_kernel is None  # Ampere's profile is FlashAttention-2 class already
