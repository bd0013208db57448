"""A bigger batch is never faster (issue 7, item 6): at the same plan, more sequences take at least
as long, for serving (TTFT, TPOT, request latency) and for a training step. Kernel time is
monotone in kernel size (meshplan.costs.efficiency), which is what makes these hold."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import meshplan
from meshplan import catalog
from meshplan.costs.efficiency import achieved_fraction
from meshplan.errors import MeshplanError
from test_properties import PROPERTY, REL, custom_models, estimate, scenarios

SERVING_MODELS = ("llama3-8b", "llama3-70b", "llama2-70b", "gpt3-175b", "mixtral-8x7b", "deepseek-v3")
SERVING_CLUSTERS = ("dgx-h100", "dgx-a100-80gb")


def test_kernel_time_never_falls_as_the_kernel_grows():
    """flop / achieved fraction (time at a fixed peak) is non-decreasing in flop, for every
    profile and op kind of the catalog, on a fine grid that falls between the table points."""
    flop = np.logspace(6, 15, 4000)
    for name in ("ampere", "hopper", "blackwell", "cdna3", "tpu"):
        profile = catalog.efficiency(name)
        for curve in (profile.matmul, profile.attention):
            time = flop / achieved_fraction(curve, flop)
            assert np.all(np.diff(time) >= -REL * time[1:]), name
            # unchanged at the table points, and never above the table's interpolation
            for size, fraction in curve.points:
                assert achieved_fraction(curve, size) <= fraction + 1e-12


def test_llama3_70b_decode_is_not_faster_at_batch_4_than_at_2():
    """The case that showed it: TPOT fell from batch 2 to batch 4 (small attention kernels on a
    steep efficiency curve)."""
    tpot = []
    for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        task = dict(kind="inference", batch_size=batch, prompt_len=2048, output_len=512)
        tpot.append(meshplan.estimate("llama3-70b", "dgx-h100", tp=8, num_devices=8, task=task).tpot_s)
    assert tpot == sorted(tpot)


@st.composite
def serving_cases(draw):
    model = draw(st.one_of(st.sampled_from(SERVING_MODELS).map(catalog.model), custom_models()))
    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if model.num_attention_heads % t == 0 and model.ffn_hidden_size % t == 0]))
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if model.num_layers % p == 0]))
    dp = draw(st.sampled_from([1, 2]))
    plan = {"tp": tp, "pp": pp, "dp": dp, "precision": draw(st.sampled_from(["bf16", "fp8"]))}
    batch = dp * draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32, 64]))
    bigger = batch + dp * draw(st.sampled_from([1, 2, 4, 16, 64]))
    lengths = {"prompt_len": draw(st.sampled_from([1, 16, 128, 2048, 8192])), "output_len": draw(st.sampled_from([1, 8, 512]))}
    cluster = draw(st.sampled_from(SERVING_CLUSTERS))
    return model, cluster, plan, batch, bigger, lengths


def serve(model, cluster, plan, batch, lengths):
    task = {"kind": "inference", "batch_size": batch, **lengths}
    try:
        return meshplan.estimate(model, cluster, plan, num_devices=plan["tp"] * plan["pp"] * plan["dp"], task=task)
    except MeshplanError:
        assume(False)


@PROPERTY
@given(case=serving_cases())
def test_a_bigger_serving_batch_is_never_faster_per_request(case):
    model, cluster, plan, batch, bigger, lengths = case
    small, large = serve(model, cluster, plan, batch, lengths), serve(model, cluster, plan, bigger, lengths)
    assert large.ttft_s >= small.ttft_s * (1 - REL)
    assert large.tpot_s >= small.tpot_s * (1 - REL)
    assert large.request_s >= small.request_s * (1 - REL)


@PROPERTY
@given(drawn=scenarios(), factor=st.sampled_from([2, 3, 4]))
def test_a_bigger_global_batch_is_never_a_shorter_step(drawn, factor):
    """More micro-batches of the same size through the same plan."""
    model, cluster, plan = drawn
    small = estimate(model, cluster, plan)
    large = estimate(model, cluster, {**plan, "global_batch_size": plan["global_batch_size"] * factor})
    assert large.step_time_s >= small.step_time_s * (1 - REL)


@PROPERTY
@given(drawn=scenarios(), factor=st.sampled_from([2, 4]))
def test_a_bigger_micro_batch_is_never_a_shorter_step(drawn, factor):
    """The same number of micro-batches, each ``factor`` times bigger: every micro-batch's forward
    and backward take at least as long, and so does the step. (At a fixed global batch a bigger
    micro-batch means fewer of them, which may rightly be faster.)"""
    model, cluster, plan = drawn
    small = estimate(model, cluster, plan)
    large = estimate(model, cluster, {**plan, "micro_batch_size": plan["micro_batch_size"] * factor,
                                       "global_batch_size": plan["global_batch_size"] * factor})
    for a, b in zip(small.roles, large.roles):
        assert b.forward_s >= a.forward_s * (1 - REL)
        assert b.backward_s >= a.backward_s * (1 - REL)
    assert large.step_time_s >= small.step_time_s * (1 - REL)
