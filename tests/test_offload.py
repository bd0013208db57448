"""Optimizer CPU offload (Plan.optimizer_offload; meshplan.costs.offload): memory moved to the host
by hand, the optimizer phase's parts by hand, energy components summing to the total, offload
never making a device-bound step faster, a model that fits only with offload (COMET's expanded
memory, ZeRO-Offload's single-GPU training), the errors, the CLI and search."""

from __future__ import annotations

import json

import pytest

from cli_runner import run_cli
from meshplan import api, catalog
from meshplan.costs.offload import CPU_ADAM_BYTES_PER_PARAM
from meshplan.errors import MeshplanError
from meshplan.explore.space import SearchSpace, expand
from meshplan.specs.plan import Plan

#: Llama 3 8B on one DGX H100 node: dp 8 over the distributed optimizer, 1/8 of the model each
RUN = dict(model="llama3-8b", cluster="dgx-h100", num_devices=8, tp=1, zero_stage=1, global_batch_size=8, recompute="full")


def _estimate(fraction: float, **overrides):
    return api.estimate(**{**RUN, **overrides}, optimizer_offload=fraction)


@pytest.fixture(scope="module")
def runs():
    return {f: _estimate(f) for f in (0.0, 0.5, 1.0)}


def _params_per_device(e) -> float:
    return e.trainable_params / 8  # ZeRO-1 over dp 8


def test_offload_moves_exactly_the_optimizer_state_to_the_host(runs):
    """Mixed-precision Adam keeps 12 bytes per parameter (ZeRO Sec. 3.1); offloading all of it
    takes exactly those bytes out of HBM and puts them in host memory, with a 4-byte fp32
    gradient copy per parameter beside them; nothing else changes."""
    none, half, full = runs[0.0].memory, runs[0.5].memory, runs[1.0].memory
    params = _params_per_device(runs[0.0])
    assert none.optimizer_bytes == pytest.approx(12.0 * params, rel=1e-12)
    assert none.host_optimizer_bytes == none.host_gradients_bytes == 0.0
    assert full.optimizer_bytes == 0.0
    assert full.host_optimizer_bytes == pytest.approx(none.optimizer_bytes, rel=1e-12)
    assert full.host_gradients_bytes == pytest.approx(4.0 * params, rel=1e-12)
    assert none.total_bytes - full.total_bytes == pytest.approx(none.optimizer_bytes, rel=1e-12)
    assert half.optimizer_bytes == pytest.approx(none.optimizer_bytes / 2, rel=1e-12)
    assert half.host_optimizer_bytes == pytest.approx(none.optimizer_bytes / 2, rel=1e-12)
    for name in ("weights_bytes", "gradients_bytes", "activations_bytes", "comm_buffers_bytes"):
        assert getattr(full, name) == getattr(none, name)
    # each device's share of the node's 2 TB (DGX H100 datasheet) over its 8 GPUs
    assert full.host_capacity_bytes == pytest.approx(2e12 / 8)


def test_optimizer_phase_parts_by_hand(runs):
    """D2H of fp32 gradients and H2D of bf16 weights at 50 GB/s (PCIe 5.0 x16), the CPU Adam's
    28 bytes per parameter at 1/8 of the node's 614.4 GB/s; with everything offloaded nothing is
    left for the GPU, and the phase is their sum (HybridDeviceOptimizer.step)."""
    full = runs[1.0]
    params = _params_per_device(full)
    parts = full.offload_s
    assert parts["gpu_s"] == 0.0
    assert parts["d2h_s"] == pytest.approx(params * 4.0 / 50e9, rel=1e-12)
    assert parts["h2d_s"] == pytest.approx(params * 2.0 / 50e9, rel=1e-12)
    assert parts["cpu_s"] == pytest.approx(params * CPU_ADAM_BYTES_PER_PARAM / (614.4e9 / 8), rel=1e-12)
    assert full.breakdown.optimizer_s == pytest.approx(parts["d2h_s"] + parts["cpu_s"] + parts["h2d_s"], rel=1e-12)
    # the optimizer phase follows the pipeline: the step grows by exactly the phase's growth
    none = runs[0.0]
    assert none.offload_s == {}
    grown = full.breakdown.optimizer_s - none.breakdown.optimizer_s
    assert full.step_time_s - none.step_time_s == pytest.approx(grown, rel=1e-9)
    # half offloaded: the GPU's half runs beside the copy and the CPU step
    half = runs[0.5].offload_s
    assert half["total_s"] == pytest.approx(max(half["gpu_s"], half["d2h_s"] + half["cpu_s"]) + half["h2d_s"], rel=1e-12)
    assert half["cpu_s"] == pytest.approx(parts["cpu_s"] / 2, rel=1e-12)


def test_offload_energy_by_hand_and_components_sum(runs):
    """Host link bytes at 6.5 pJ/bit (PCIe), host DRAM bytes (CPU Adam plus both copies' ends) at
    20 pJ/bit, for all 8 devices; the components still sum to the total."""
    full = runs[1.0]
    params = _params_per_device(full)
    link = params * (4.0 + 2.0)
    dram = params * CPU_ADAM_BYTES_PER_PARAM + link
    expected = 8 * 8.0 * (link * 6.5e-12 + dram * 20e-12)
    for e in runs.values():
        en = e.energy
        parts = en.compute_j + en.memory_j + sum(en.links_j.values()) + en.static_j + en.host_j + en.offload_j
        assert en.total_j == pytest.approx(parts, rel=1e-12)
        assert en.as_dict()["offload_j"] == en.offload_j
    assert full.energy.offload_j == pytest.approx(expected, rel=1e-12)
    assert runs[0.0].energy.offload_j == 0.0


@pytest.mark.parametrize("cluster", ["dgx-a100-80gb", "dgx-h100", "gb200-nvl72"])
def test_offload_never_makes_the_step_faster(cluster):
    """A step whose optimizer runs on the device gets no faster by moving part of it to the host:
    the copies back alone cost more per parameter than the GPU's Adam (2 bytes over the host
    link against 30 bytes through HBM) on every catalog host."""
    base = _estimate(0.0, cluster=cluster)
    for fraction in (0.05, 0.25, 0.5, 1.0):
        assert _estimate(fraction, cluster=cluster).step_time_s >= base.step_time_s


def test_a_model_that_fits_only_with_offload():
    """COMET's expanded memory / ZeRO-Offload's single-GPU case: Llama 3 8B on one H100 80GB
    needs 18 bytes per parameter (bf16 weights, fp32 gradients, 12 bytes of Adam state), 144 GB:
    it does not fit; with the Adam state in the host's DRAM (plus its fp32 gradient copy, 16
    bytes per parameter there) it does, and the host holds it."""
    run = dict(model="llama3-8b", cluster="dgx-h100", num_devices=1, zero_stage=1, global_batch_size=1, recompute="full")
    without = api.estimate(**run)
    assert not without.fits
    offloaded = api.estimate(**run, optimizer_offload=1.0)
    assert offloaded.fits and offloaded.memory.host_fits
    assert offloaded.memory.host_total_bytes == pytest.approx(16.0 * offloaded.trainable_params, rel=1e-12)
    # a one-device job has its node's host to itself: all its DRAM and all its bandwidth
    assert offloaded.memory.host_capacity_bytes == pytest.approx(2e12)
    cpu_s = offloaded.trainable_params * CPU_ADAM_BYTES_PER_PARAM / 614.4e9
    assert offloaded.offload_s["cpu_s"] == pytest.approx(cpu_s, rel=1e-12)


def test_host_memory_too_small_is_reported():
    """Llama 3 70B over one DGX A100 40GB node offloads 70B/8 x 16 bytes = 140 GB per device, more
    than its 1 TB / 8 = 125 GB share: the plan does not fit and a warning says host memory."""
    e = api.estimate("llama3-70b", "dgx-a100-40gb", num_devices=8, tp=8, zero_stage=1, global_batch_size=1,
                     recompute="full", optimizer_offload=1.0)
    assert not e.memory.host_fits and not e.fits
    assert any("host memory" in w for w in e.warnings)


@pytest.mark.parametrize("overrides, field", [
    ({"optimizer_offload": 1.5}, "plan.optimizer_offload"),
    ({"optimizer_offload": -0.1}, "plan.optimizer_offload"),
    ({"optimizer_offload": "half"}, "plan.optimizer_offload"),
    ({"optimizer_offload": True}, "plan.optimizer_offload"),
    ({"optimizer_offload": 0.5, "zero_stage": 0}, "plan.optimizer_offload"),
    ({"optimizer_offload": 0.5, "cluster": "grand-teton-h100"}, "plan.optimizer_offload"),
])
def test_bad_offload_inputs_name_the_field(overrides, field):
    run = {**RUN, **overrides}
    with pytest.raises(MeshplanError) as err:
        api.estimate(**run)
    assert err.value.field == field


def test_offload_errors_say_what_is_valid():
    with pytest.raises(MeshplanError, match="zero_stage >= 1"):
        api.estimate(**{**RUN, "zero_stage": 0}, optimizer_offload=0.5)
    with pytest.raises(MeshplanError, match="cluster.host"):
        api.estimate(**{**RUN, "cluster": "grand-teton-h100"}, optimizer_offload=0.5)
    with pytest.raises(MeshplanError, match="training only"):
        api.estimate("llama3-8b", "dgx-h100", num_devices=8, tp=8, zero_stage=1, optimizer_offload=0.5,
                     task={"kind": "inference", "batch_size": 1})


def test_offload_zero_changes_nothing():
    assert _estimate(0.0).to_dict() == api.estimate(**RUN).to_dict()


def test_cli_estimate_optimizer_offload(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "estimate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                           "--devices", "8", "--tp", "1", "--zero", "1", "--global-batch", "8", "--recompute", "full",
                           "--optimizer-offload", "0.5", "--json")
    result = json.loads(out)
    assert result["offload_s"]["fraction"] == 0.5
    assert result["memory"]["host_optimizer_bytes"] == pytest.approx(result["memory"]["optimizer_bytes"], rel=1e-12)
    assert result["breakdown"]["optimizer_s"] == pytest.approx(result["offload_s"]["total_s"], rel=1e-12)
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--model", "llama3-8b", "--cluster", "dgx-h100",
                           "--devices", "8", "--optimizer-offload", "0.5")
    assert code != 0 and "optimizer_offload" in err


def test_search_keeps_a_fixed_offload():
    """The search does not vary the offload, but keeps the one it is given: every candidate
    offloads, ZeRO-0 points (no distributed optimizer) are rejected by name, and dp 1 points get
    the distributed optimizer they need."""
    model, cluster = catalog.model("llama3-8b"), catalog.cluster("dgx-h100")
    space = SearchSpace(tp=[1, 8], pp=[1], micro_batch_size=[1], virtual_pipeline_stages=[1], recompute=["full"],
                        zero_stage=[0, 1], sequence_parallel=[False])
    found = expand(space, model, cluster, 8, Plan(global_batch_size=8, optimizer_offload=0.5))
    assert found.scenarios
    assert all(s.plan.optimizer_offload == 0.5 and s.plan.zero_stage >= 1 for s in found.scenarios)
    assert found.rejected["plan.optimizer_offload"] >= 1
    assert any(s.plan.dp == 1 for s in found.scenarios)


@pytest.mark.parametrize("cluster_id", [c for c in catalog.cluster_ids() if catalog.entry("clusters", c).get("host")])
def test_host_numbers_have_sources(cluster_id):
    raw = catalog.entry("clusters", cluster_id)
    for field in raw["host"]:
        assert raw["sources"].get(f"host.{field}", "").strip(), f"{cluster_id}: host.{field} has no source"
