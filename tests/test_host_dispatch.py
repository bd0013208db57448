"""The host's dispatch floor (specs.kernels.HostDispatch, costs.costed.host_bound): a training
layer takes no less than its ops take to issue, as the smallest measured H100 decoder layers show
(tests/data/h100-sxm/layer.csv: llama3-8b at tp 8 and 2048 tokens takes 0.546 ms forward and
1.921 ms backward where its kernels take 0.375 and 0.763 ms)."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan import api, catalog
from meshplan.calibrate.fit_kernels import dense_layer_ops, fit_host, read_columns
from meshplan.costs import costed
from meshplan.costs.costed import OpTimes, host_bound
from meshplan.specs.kernels import HostDispatch
from test_kernels_h100 import layer_times_s, rows

DATA = Path(__file__).parent / "data" / "h100-sxm"
HOPPER = catalog.efficiency("hopper")
HOST = HostDispatch(forward_s=50e-6, backward_s=150e-6, source="test")
#: Hopper with kernels only: what an estimate would be if the host always kept ahead
NO_HOST = HOPPER.model_copy(update={"kernels": HOPPER.kernels.model_copy(update={"host": None})})


def test_the_fit_is_the_least_measured_layer_over_its_ops():
    layers = read_columns(DATA / "layer.csv")
    host = fit_host(DATA)
    assert dense_layer_ops() == 10
    assert host.forward_s * 10 == pytest.approx(layers["fwd_s"].min())  # 0.546 ms
    assert host.backward_s * 10 == pytest.approx((layers["fwd_bwd_s"] - layers["fwd_s"]).min())  # 1.615 ms
    # the catalog's Hopper host is that fit, to the printed digits
    assert HOPPER.kernels.host.forward_s == pytest.approx(host.forward_s, rel=1e-3)
    assert HOPPER.kernels.host.backward_s == pytest.approx(host.backward_s, rel=1e-3)


def test_a_folder_without_layers_fits_no_host(tmp_path):
    assert fit_host(tmp_path) is None


def test_a_layer_shorter_than_its_dispatch_takes_the_dispatch():
    times = {"a": OpTimes(10e-6, 20e-6, 5e-6), "b": OpTimes(30e-6, 60e-6, 0.0)}
    out = host_bound(times, HOST)
    assert sum(t.forward_s for t in out.values()) == pytest.approx(2 * 50e-6)
    assert sum(t.backward_s for t in out.values()) == pytest.approx(2 * 150e-6)
    # the forward's wait falls after its last op, the backward's after its last (the first op's
    # input gradient); every other op keeps its time, and the weight gradient is not the wait
    assert out["a"].forward_s == 10e-6 and out["b"].forward_s == pytest.approx(100e-6 - 10e-6)
    assert out["b"].backward_s == 60e-6 and out["a"].backward_s == pytest.approx(300e-6 - 60e-6)
    assert out["a"].weight_s == 5e-6


def test_a_layer_longer_than_its_dispatch_is_left_alone():
    times = {"a": OpTimes(1e-3, 2e-3), "b": OpTimes(1e-3, 2e-3)}
    assert host_bound(times, HOST) is times
    assert host_bound(times, None) is times


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 1e-2), st.floats(0.0, 1e-2)), min_size=1, max_size=25))
def test_the_floor_never_shortens_a_pass_and_faster_kernels_never_lengthen_one(passes):
    times = {f"op{i}": OpTimes(f, b) for i, (f, b) in enumerate(passes)}
    out = host_bound(times, HOST)
    for name, t in times.items():
        assert out[name].forward_s >= t.forward_s and out[name].backward_s >= t.backward_s
    forward = sum(t.forward_s for t in out.values())
    assert forward == pytest.approx(max(sum(t.forward_s for t in times.values()), len(times) * HOST.forward_s), rel=1e-12)
    # every op but the waiting ones is as it was; halving every kernel leaves no op longer than
    # before except the one the wait falls on
    faster = host_bound({n: OpTimes(t.forward_s / 2, t.backward_s / 2) for n, t in times.items()}, HOST)
    assert sum(t.forward_s for t in faster.values()) <= forward * (1 + 1e-12)
    for name in list(times)[:-1]:
        assert faster[name].forward_s <= out[name].forward_s


def test_the_measured_layers_that_wait_for_their_host_are_within_16_percent():
    """llama3-8b and gpt3-13b at tp 4-8 and 2048 tokens: 21-54% short on their kernels alone."""
    host_bound_rows = [r for r in rows("layer.csv") if int(r["tp"]) >= 4 and int(r["seq"]) == 2048
                       and r["model"] in ("llama3-8b", "gpt3-13b")]
    assert len(host_bound_rows) == 4
    for r in host_bound_rows:
        forward, total = layer_times_s(r["model"], int(r["tp"]), int(r["micro_batch"]), int(r["seq"]))
        assert forward == pytest.approx(float(r["fwd_s"]), rel=0.16)
        assert total == pytest.approx(float(r["fwd_bwd_s"]), rel=0.16)


def test_small_training_layers_wait_for_the_host_and_serving_does_not(monkeypatch):
    """A llama3-8b layer at tp 8 and 1024 tokens is host-bound: the step takes longer than its
    kernels. A decode step (CUDA graphs in serving engines) and a TPU (XLA) are left alone."""
    small = dict(model="llama3-8b", cluster="dgx-h100", num_devices=8, tp=8, sequence_parallel=True, seq_len=1024,
                 global_batch_size=8, micro_batch_size=1, precision="bf16")
    serve = dict(model="llama3-8b", cluster="dgx-h100", num_devices=1, task={"kind": "inference", "batch_size": 1,
                                                                              "prompt_len": 128, "output_len": 64})
    assert catalog.efficiency("tpu").kernels.host is None
    assert catalog.efficiency("blackwell").kernels.host == HOPPER.kernels.host
    hosted = (api.estimate(**small).breakdown.compute_s, api.estimate(**serve).tpot_s)
    monkeypatch.setattr(costed.catalog, "efficiency", lambda profile_id: NO_HOST)
    kernels_only = (api.estimate(**small).breakdown.compute_s, api.estimate(**serve).tpot_s)
    assert hosted[0] > kernels_only[0] * 1.2
    assert hosted[1] == pytest.approx(kernels_only[1], rel=1e-12)


def test_block_models_are_timed_without_a_host(monkeypatch):
    """A block model (the rack-scale study's FFN alone, DFModel's einsums) is an analytical
    mapping: its tiny pipeline stages are not held to eager PyTorch's dispatch."""
    block = {**catalog.model("llama3-8b").model_dump(), "id": "ffn-block", "num_layers": 1, "block": "mlp"}
    plan = dict(cluster="dgx-h100", num_devices=32, tp=16, pp=2, global_batch_size=16, micro_batch_size=1,
                sequence_parallel=True, seq_len=2048)
    hosted = api.estimate(block, **plan).breakdown.compute_s
    monkeypatch.setattr(costed.catalog, "efficiency", lambda profile_id: NO_HOST)
    assert api.estimate(block, **plan).breakdown.compute_s == pytest.approx(hosted, rel=1e-12)


def test_the_floor_scales_with_the_ops_a_layer_lowers_to():
    """An MoE layer lowers to more ops than a dense one (router, permutations, experts): its floor
    is theirs, not a dense layer's."""
    host = HOPPER.kernels.host
    dense = np.full(10, 1e-6)
    moe = np.full(14, 1e-6)
    f_dense = host_bound({str(i): OpTimes(t, t) for i, t in enumerate(dense)}, host)
    f_moe = host_bound({str(i): OpTimes(t, t) for i, t in enumerate(moe)}, host)
    assert sum(t.forward_s for t in f_moe.values()) / sum(t.forward_s for t in f_dense.values()) == pytest.approx(1.4)
