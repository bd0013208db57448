"""Collectives of axes that cross the same network level share its links (issue 9: shared
links): they run on one stream and take turns."""

from __future__ import annotations

import pytest

from meshplan import api
from meshplan.parallel.program import build_program
from meshplan.timeline import halves, passes
from meshplan.timeline.engine import schedule_pass
from meshplan.timeline.links import link_streams
from test_engine import half, no_dp, op, overlap, two_layers


@pytest.mark.parametrize("streams, expected", [((), 12.0), ((("dp", "ep+dp"), ("ep", "ep+dp")), 14.0)])
def test_gathers_and_all_to_all_on_one_link_take_turns(streams, expected):
    """Two MoE layers: dispatch 1 s, experts 3 s, combine 1 s; ZeRO-3 weights gathered one layer
    ahead, 2 s each. Apart: gather 0 [0,2], gather 1 [2,4] on dp; dispatch [2,3], experts [3,6],
    combine [6,7], dispatch [7,8], experts [8,11], combine [11,12]: 12. Sharing one link, the
    first dispatch waits for gather 1: [4,5], experts [5,8], combine [8,9], then [9,10],
    [10,13], [13,14]: 14."""
    layers = two_layers(half("h", [op("e", 3, 6, expert=True)], dispatch_s=1.0))
    p = passes.forward_pass("f", layers, None, None, no_dp(gather_s=2.0), overlap(streams=streams))
    assert schedule_pass(p).time_s == pytest.approx(expected, rel=1e-12)


def _streams(**plan) -> dict[str, str]:
    return dict(link_streams(build_program(api.scenario(**plan))))


def test_axes_share_the_outermost_level_they_cross():
    moe = _streams(model="mixtral-8x7b", cluster="dgx-h100", num_devices=64, tp=2, ep=8, global_batch_size=64)
    assert moe["tp"] == "tp"  # inside NVLink
    assert moe["ep"] == moe["dp"] == "ep+dp"  # both across InfiniBand
    dense = _streams(model="llama3-70b", cluster="dgx-h100", num_devices=64, tp=8, global_batch_size=64)
    assert dense == {"tp": "tp", "dp": "dp"}


def test_the_mesh_order_decides_where_axes_land():
    """tp outermost (order dp-tp-cp-pp) puts tp across nodes and dp inside them."""
    inner = _streams(model="llama3-70b", cluster="dgx-h100", num_devices=16, tp=2, global_batch_size=16)
    outer = _streams(model="llama3-70b", cluster="dgx-h100", num_devices=16, tp=2, global_batch_size=16, order="dp-tp-cp-pp")
    assert inner == {"tp": "tp", "dp": "dp"}
    assert outer == {"tp": "tp", "dp": "dp"}  # dp 8 fills the node: tp pairs cross it
    wide = _streams(model="llama3-70b", cluster="dgx-h100", num_devices=32, tp=4, global_batch_size=32, order="dp-tp-cp-pp")
    assert wide["tp"] == "tp" and wide["dp"] == "dp"


@pytest.mark.parametrize("plan", [
    dict(model="mixtral-8x7b", cluster="dgx-h100", num_devices=64, tp=2, ep=8, global_batch_size=64, zero_stage=3),
    dict(model="mixtral-8x7b", cluster="dgx-h100", num_devices=64, tp=2, ep=8, pp=2, global_batch_size=64,
         framework="megatron-core"),
    dict(model="deepseek-v3", cluster="dgx-h800", num_devices=256, tp=1, pp=8, ep=32, global_batch_size=512,
         schedule="dualpipe", ep_overlap="paired", precision="fp8"),
])
def test_sharing_a_link_never_makes_a_step_faster(plan, monkeypatch):
    shared = api.estimate(**plan).step_time_s
    monkeypatch.setattr(halves, "link_streams", lambda program: ())
    apart = api.estimate(**plan).step_time_s
    assert shared >= apart * (1 - 1e-12)
