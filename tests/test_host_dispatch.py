"""The host's dispatch floor (specs.kernels.HostDispatch, costs.host.host_bound): a training
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
from meshplan.costs.costed import OpTimes
from meshplan.costs.host import Issue, host_bound, issue_bound_s
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
    """Two ops of 10 and 30 us forward under 50 us dispatches each: each kernel starts when the
    host issues it, 50 us apart, and holds the stream until the next starts: 50 us each,
    forward and backward (150 us). The weight gradient is not the wait."""
    times = {"a": OpTimes(10e-6, 20e-6, 5e-6), "b": OpTimes(30e-6, 60e-6, 0.0)}
    out = host_bound(times, HOST)
    assert out["a"].forward_s == pytest.approx(50e-6) and out["b"].forward_s == pytest.approx(50e-6)
    assert out["b"].backward_s == pytest.approx(150e-6) and out["a"].backward_s == pytest.approx(150e-6)
    assert sum(t.forward_s for t in out.values()) == pytest.approx(2 * 50e-6)
    assert sum(t.backward_s for t in out.values()) == pytest.approx(2 * 150e-6)
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
    assert forward == pytest.approx(max(sum(t.forward_s for t in times.values()), len(times) * HOST.forward_s), rel=1e-9)
    faster = host_bound({n: OpTimes(t.forward_s / 2, t.backward_s / 2) for n, t in times.items()}, HOST)
    assert sum(t.forward_s for t in faster.values()) <= forward * (1 + 1e-12)
    # where every kernel is shorter than a dispatch, when each op starts is the host's doing
    if all(t.forward_s <= HOST.forward_s for t in times.values()):
        starts = np.cumsum([t.forward_s for t in out.values()])
        assert np.allclose(np.cumsum([t.forward_s for t in faster.values()]), starts, rtol=1e-9, atol=1e-15)


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


def test_issue_bound_is_the_longest_host_prefix_plus_gpu_suffix():
    # host 1, 5, 6 issued by each unit; GPU 6, 3, 2 from each on: max(1 + 6, 5 + 3, 6 + 2)
    assert issue_bound_s([(1.0, 3.0), (4.0, 1.0), (1.0, 2.0)]) == 8.0
    assert issue_bound_s([]) == 0.0


def test_a_gemm_per_local_expert_is_a_dispatch_each():
    """TE's GroupedLinear issues one GEMM per local expert: a layer of an attention op and an
    expert GEMM over 4 local experts costs the host 5 dispatches, not 2."""
    times = {"attention": OpTimes(10e-6, 20e-6), "experts_up": OpTimes(20e-6, 40e-6)}
    out = host_bound(times, HOST, Issue(launches={"experts_up": 4}))
    assert sum(t.forward_s for t in out.values()) == pytest.approx(5 * 50e-6)
    assert sum(t.backward_s for t in out.values()) == pytest.approx(5 * 150e-6)
    # attention holds the stream until the first expert GEMM is issued, 50 us on; the four GEMMs
    # the 200 us their issue takes
    assert out["attention"].forward_s == pytest.approx(50e-6)
    assert out["experts_up"].forward_s == pytest.approx(200e-6)


def test_blocking_all_to_alls_are_gpu_time_the_host_runs_ahead_of():
    times = {"attention": OpTimes(10e-6, 20e-6), "experts_up": OpTimes(20e-6, 40e-6)}
    out = host_bound(times, HOST, Issue(comm_forward_s=60e-6, comm_backward_s=270e-6))
    # forward: 100 us of dispatch against 30 us of kernels and 60 us of all-to-all: attention
    # waits 10 us for the expert GEMM's issue
    assert out["attention"].forward_s == pytest.approx(20e-6) and out["experts_up"].forward_s == pytest.approx(20e-6)
    # backward: 330 us of GPU against 300 of dispatch, no wait
    assert [t.backward_s for t in out.values()] == [t.backward_s for t in times.values()]


def test_a_paired_forward_issues_beside_the_other_micro_batchs_backward():
    """Forward: 100 us of dispatch against 30 us of kernels; backward: 300 us against 440. Alone
    the forward waits 70 us for its host; paired with another micro-batch's backward (one host
    timeline of 400 us against 470 us of GPU) nothing waits."""
    times = {"attention": OpTimes(10e-6, 400e-6), "experts_up": OpTimes(20e-6, 40e-6)}
    alone = host_bound(times, HOST, Issue())
    paired = host_bound(times, HOST, Issue(), paired=True)
    assert sum(t.forward_s for t in alone.values()) == pytest.approx(100e-6)
    assert paired == times


def test_a_sync_costs_the_first_dispatch_after_it_where_the_gpu_is_slower():
    """Forward segment from the sync: two expert GEMMs (50 us host, 100 us GPU each), attention
    (50, 300), router (50, 10): the GPU idles only while the first GEMM is issued, 560 us
    against 510 us with the host running ahead."""
    times = {"attention": OpTimes(300e-6, 0.0), "router": OpTimes(10e-6, 0.0), "experts_up": OpTimes(200e-6, 0.0)}
    experts = ("experts_up", "experts_up")
    ahead = host_bound(times, HOST, Issue(launches={"experts_up": 2}, experts=experts))
    synced = host_bound(times, HOST, Issue(launches={"experts_up": 2}, experts=experts, sync=True))
    assert sum(t.forward_s for t in ahead.values()) == pytest.approx(510e-6)
    assert sum(t.forward_s for t in synced.values()) == pytest.approx(560e-6)


def test_with_a_sync_a_host_bound_part_and_a_gpu_bound_part_add():
    """Eight expert GEMMs of 5 us each cost the host 400 us; attention 400 us of GPU. Running
    ahead the host hides one behind the other (450 us: its 9 dispatches); with a sync before the
    experts they follow each other: 400 us of dispatch, then attention's dispatch and kernel."""
    times = {"attention": OpTimes(400e-6, 0.0), "experts_up": OpTimes(40e-6, 0.0)}
    experts = ("experts_up", "experts_up")
    ahead = host_bound(times, HOST, Issue(launches={"experts_up": 8}, experts=experts))
    synced = host_bound(times, HOST, Issue(launches={"experts_up": 8}, experts=experts, sync=True))
    assert sum(t.forward_s for t in ahead.values()) == pytest.approx(450e-6)
    assert sum(t.forward_s for t in synced.values()) == pytest.approx(400e-6 + 50e-6 + 400e-6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 1e-3), st.integers(1, 8)), min_size=2, max_size=12), st.data())
def test_a_sync_never_shortens_a_forward_and_faster_kernels_never_lengthen_it(ops, data):
    times = {f"op{i}": OpTimes(f, f) for i, (f, _) in enumerate(ops)}
    launches = {f"op{i}": n for i, (_, n) in enumerate(ops)}
    sync = f"op{data.draw(st.integers(0, len(ops) - 1))}"
    comm = data.draw(st.floats(0.0, 1e-3))

    def forward(t, synced):
        issue = Issue(launches=launches, experts=(sync, sync), sync=synced, comm_forward_s=comm)
        return sum(o.forward_s for o in host_bound(t, HOST, issue).values())

    ahead, synced = forward(times, False), forward(times, True)
    kernels = sum(t.forward_s for t in times.values())
    assert ahead == pytest.approx(max(kernels, sum(launches.values()) * HOST.forward_s - comm), rel=1e-12)
    assert synced >= ahead * (1 - 1e-12)
    assert synced <= kernels + comm + sum(launches.values()) * HOST.forward_s + 1e-15  # never more than both in turn
    faster = {n: OpTimes(t.forward_s / 2, t.backward_s / 2) for n, t in times.items()}
    assert forward(faster, True) <= synced * (1 + 1e-12)


QWEN3_30B = {"id": "qwen3-30b-a3b", "arch": "moe", "num_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
             "num_kv_heads": 4, "head_dim": 128, "ffn_type": "swiglu", "vocab_size": 151936,
             "moe": {"num_experts": 128, "top_k": 8, "expert_ffn_hidden_size": 768}}
MOE_RUN = dict(cluster="dgx-h100", num_devices=8, ep=8, global_batch_size=64, micro_batch_size=1, seq_len=4096,
               precision="fp8", zero_stage=1)


def test_megatron_cores_moe_layers_wait_for_their_host_and_full_graphs_do_not():
    """Qwen3-30B-A3B on 8 H100 at micro-batch 1, as Megatron-Core runs it: 16 local experts, a
    GEMM each, and a sync per layer. Its published runs take 9.5 ms per layer and micro-batch
    (Megatron-Bridge 26.04, 16 H100) where its kernels take about half; replaying the iteration
    as CUDA graphs (Plan.cuda_graphs) leaves the kernels alone, and a grouped kernel without the
    sync sits between."""
    def step(**plan):
        return api.estimate(QWEN3_30B, **MOE_RUN, **plan).step_time_s

    megatron = step(framework="megatron-core")
    grouped = step(framework="megatron-core", expert_gemms="grouped", moe_host_sync=False)
    graphs = step(framework="megatron-core", cuda_graphs="full")
    assert megatron > grouped * 1.2
    assert grouped >= graphs
    assert step(framework="megatron-core", moe_host_sync=False) < megatron
    assert step(framework="megatron-core", expert_gemms="grouped") < megatron


def test_a_recompute_rerun_takes_its_kernels_or_its_own_issue():
    """torchtitan's per-op recompute of a small host-bound layer: the re-run issues 7.25 ops'
    worth (norms, activations, residuals, every other linear) at the host's pace, whatever the
    forward's timeline put before each op; a quicker attention (a sliding window) moved that
    share before, and the re-run with it (310 against 396 us)."""
    from meshplan.costs.costed import cost_program
    from meshplan.parallel.program import build_program

    model = dict(num_layers=2, hidden_size=512, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=2048, ffn_type="gelu",
                 vocab_size=1000)
    plan = dict(num_devices=8, tp=2, global_batch_size=16, micro_batch_size=1, seq_len=8192, framework="torchtitan",
                recompute="selective")
    host = catalog.efficiency("hopper").kernels.host
    for window in (None, 128):
        (kind,) = cost_program(build_program(api.scenario(dict(model, sliding_window=window), "dgx-h100", **plan))).kinds.values()
        assert kind.recompute_s == pytest.approx(7.25 * host.forward_s)
