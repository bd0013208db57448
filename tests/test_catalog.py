"""The built-in catalog: every entry loads, every number names a source, published totals hold.

Parameter totals are the ones the model papers publish (GPT-3 Table 2.1, Megatron SC21 Table 1,
LLaMA Table 2, the Llama 2 and Llama 3 model cards / safetensors totals). meshplan counts weights
its own way (biases and norms included, no learned position embeddings), so the tolerance is 2%.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import meshplan
from meshplan import catalog
from meshplan.specs import Cluster, Device, TransformerModel

SCHEMA_MD = Path(__file__).resolve().parents[2] / "shared" / "validation" / "SCHEMA.md"

DEVICE_NUMBERS = ("peak_flop_per_s", "hbm_bytes", "hbm_bytes_per_s", "sram_bytes", "tdp_w")
LEVEL_NUMBERS = ("size", "bytes_per_s", "latency_s", "efficiency", "energy_per_bit_j")

# the cluster ids SCHEMA.md promises, in case the shared folder is not checked out beside the repo
SCHEMA_CLUSTER_IDS = (
    "dgx-a100-40gb",
    "dgx-a100-80gb",
    "zionex-a100",
    "dgx-h100",
    "dgx-h800",
    "dgx-h200",
    "dgx-b200",
    "gb200-nvl72",
    "gb300-nvl72",
    "tpu-v4-pod",
)

PUBLISHED_PARAMS = {
    "gpt3-175b": 175.0e9,  # Brown et al. 2020, Table 2.1
    "gpt2": 124.44e6,  # openai-community/gpt2 safetensors total (its 1024 x 768 positions included)
    "gpt2-xl": 1557.6e6,  # openai-community/gpt2-xl safetensors total
    "phi-2": 2779.7e6,  # microsoft/phi-2 safetensors total
    "megatron-1t": 1008.0e9,  # Narayanan et al. SC21, Table 1
    "transformer-1t": 1008.0e9,  # COMET §5.1: Megatron's 1T configuration
    "llama-65b": 65.2e9,  # Touvron et al. 2023, Table 2
    "llama2-70b": 68.98e9,  # meta-llama/Llama-2-70b-hf safetensors total
    "llama3-8b": 8.03e9,  # meta-llama/Meta-Llama-3-8B safetensors total
    "llama3-70b": 70.6e9,  # meta-llama/Meta-Llama-3-70B safetensors total
    "llama3-405b": 405.9e9,  # meta-llama/Llama-3.1-405B safetensors total
}


def schema_cluster_ids() -> set[str]:
    if not SCHEMA_MD.exists():
        return set(SCHEMA_CLUSTER_IDS)
    rows = re.findall(r"^\|\s*`([a-z0-9-]+)`\s*\|", SCHEMA_MD.read_text(), flags=re.MULTILINE)
    return set(rows)


# --- every entry loads ------------------------------------------------------------------------


@pytest.mark.parametrize("device_id", catalog.device_ids())
def test_device_loads(device_id):
    device = catalog.device(device_id)
    assert isinstance(device, Device)
    assert device.id == device_id
    assert device.peak_flop_per_s


@pytest.mark.parametrize("cluster_id", catalog.cluster_ids())
def test_cluster_loads(cluster_id):
    cluster = catalog.cluster(cluster_id)
    assert isinstance(cluster, Cluster)
    assert cluster.id == cluster_id
    assert cluster.device.id in catalog.device_ids()


@pytest.mark.parametrize("model_id", catalog.model_ids())
def test_model_loads(model_id):
    model = catalog.model(model_id)
    assert isinstance(model, TransformerModel)
    assert model.id == model_id


def test_schema_cluster_ids_exist():
    expected = schema_cluster_ids()
    assert expected >= set(SCHEMA_CLUSTER_IDS)  # the table was parsed, not silently empty
    assert expected <= set(catalog.cluster_ids())


# --- every number names a source --------------------------------------------------------------


@pytest.mark.parametrize("device_id", catalog.device_ids())
def test_device_numbers_have_sources(device_id):
    raw = catalog.entry("devices", device_id)
    sources = raw.get("sources") or {}
    assert sources, f"{device_id} has no sources"
    for field in DEVICE_NUMBERS:
        assert field in raw, f"{device_id} lacks {field}"
        assert sources.get(field, "").strip(), f"{device_id}.{field} has no source"


@pytest.mark.parametrize("cluster_id", catalog.cluster_ids())
def test_cluster_numbers_have_sources(cluster_id):
    raw = catalog.entry("clusters", cluster_id)
    sources = raw.get("sources") or {}
    assert sources, f"{cluster_id} has no sources"
    for level in raw["levels"]:
        for field in LEVEL_NUMBERS:
            if field in level:
                key = f"levels.{level['name']}.{field}"
                assert sources.get(key, "").strip(), f"{cluster_id}: {key} has no source"
    if "max_devices" in raw:
        assert sources.get("max_devices", "").strip(), f"{cluster_id}.max_devices has no source"


@pytest.mark.parametrize("model_id", catalog.model_ids())
def test_model_has_sources(model_id):
    sources = catalog.entry("models", model_id).get("sources") or {}
    assert sources.get("architecture", "").strip(), f"{model_id} has no architecture source"


# --- published totals and spot values ---------------------------------------------------------


@pytest.mark.parametrize("model_id", sorted(PUBLISHED_PARAMS))
def test_params_match_published_total(model_id):
    assert catalog.model(model_id).num_params == pytest.approx(PUBLISHED_PARAMS[model_id], rel=0.02)


def test_h100_dense_peaks():
    h100 = catalog.device("h100-sxm5-80gb")
    assert h100.peak("bf16") == pytest.approx(989e12, rel=0.01)  # dense, not the 1,979 sparse figure
    assert h100.peak("fp8") == pytest.approx(1979e12, rel=0.01)
    assert h100.hbm_bytes_per_s == pytest.approx(3.35e12, rel=0.01)


def test_gb200_runs_at_b200s_sustained_peak_and_reports_mfu_against_its_datasheet():
    """Measured: the same recipes on 8 GB200 and 8 B200 take the same time (devices.yaml,
    sustained_peak_fraction). Kernels are timed at B200's peaks; the datasheet stays the MFU base."""
    gb200, b200 = catalog.device("gb200"), catalog.device("b200")
    assert gb200.peak("fp8") == pytest.approx(5e15)  # the datasheet
    for precision in ("bf16", "fp8", "fp4"):
        assert gb200.sustained_peak(precision) == pytest.approx(b200.peak(precision))
        assert b200.sustained_peak(precision) == b200.peak(precision)
    plan = dict(model="llama3-8b", num_devices=8, tp=1, micro_batch_size=2, global_batch_size=128,
                seq_len=8192, precision="fp8", framework="megatron-core")
    on_gb200 = meshplan.estimate(cluster="gb200-nvl72", **plan)
    on_b200 = meshplan.estimate(cluster="dgx-b200", **plan)
    # same die, same clock: within the 1.2x power headroom GB200 has over B200 (1200 vs 1000 W)
    assert on_b200.step_time_s / 1.1 < on_gb200.step_time_s <= on_b200.step_time_s * 1.001
    assert on_gb200.mfu == pytest.approx(on_gb200.model_flop_per_step / 8 / on_gb200.step_time_s / 5e15, rel=1e-6)


def test_a_sustained_share_below_the_datasheet_needs_a_source():
    raw = dict(catalog.entry("devices", "gb200"), id="gb200")
    assert Device.model_validate(raw).sustained_peak_fraction == 0.9
    raw["sources"] = {k: v for k, v in raw["sources"].items() if k != "sustained_peak_fraction"}
    with pytest.raises(ValueError, match="sustained_peak_fraction"):
        Device.model_validate(raw)


def test_tpu_v4_has_bf16_but_no_fp8():
    tpu = catalog.device("tpu-v4")
    assert tpu.peak("bf16") == pytest.approx(275e12, rel=0.01)
    assert "fp8" not in tpu.peak_flop_per_s
    assert tpu.hbm_bytes == 32 * 2**30


def test_a100_40gb_memory():
    a100 = catalog.device("a100-sxm4-40gb")
    assert a100.hbm_bytes == 40 * 2**30
    assert a100.hbm_bytes_per_s == pytest.approx(1555e9)


@pytest.mark.parametrize("device_id", catalog.device_ids())
def test_peaks_are_dense_and_consistent(device_id):
    """Tensor-core peaks scale 2x per halving of precision (tf32 -> bf16 -> fp8); fp16 == bf16.

    A sparse figure slipped in for one precision would break the ratio.
    """
    peaks = catalog.device(device_id).peak_flop_per_s
    if "fp16" in peaks:
        assert peaks["fp16"] == pytest.approx(peaks["bf16"], rel=0.01)
    if "tf32" in peaks:
        assert peaks["bf16"] == pytest.approx(2 * peaks["tf32"], rel=0.01)
    if "fp8" in peaks:
        assert peaks["fp8"] == pytest.approx(2 * peaks["bf16"], rel=0.01)
    if "fp4" in peaks:
        assert peaks["fp4"] >= peaks["fp8"]


def test_dgx_h100_network():
    levels = catalog.cluster("dgx-h100").levels
    assert levels[0].size == 8
    assert levels[0].bytes_per_s == pytest.approx(450e9)
    assert levels[-1].bytes_per_s == pytest.approx(50e9)  # 400 Gb/s NDR per GPU


def test_dgx_h800_nvlink_is_cut():
    assert catalog.cluster("dgx-h800").levels[0].bytes_per_s == pytest.approx(200e9)


def test_nvl72_domains():
    for cluster_id, scale_out in (("gb200-nvl72", 50e9), ("gb300-nvl72", 100e9)):
        levels = catalog.cluster(cluster_id).levels
        assert levels[0].size == 72
        assert levels[0].bytes_per_s == pytest.approx(900e9)
        assert levels[-1].bytes_per_s == pytest.approx(scale_out)


def test_tpu_v4_pod_is_a_torus_of_cubes_and_pods_join_over_the_datacenter_network():
    cluster = catalog.cluster("tpu-v4-pod")
    assert [lvl.size for lvl in cluster.levels] == [64, 4096, None]
    assert all(lvl.topology == "torus-3d" for lvl in cluster.levels[:2])
    # PaLM (Chowdhery et al. 2022, Sec. 4): 81 Tb/s from the 768 hosts of a pod, 4 chips each
    assert cluster.levels[2].bytes_per_s == pytest.approx(81e12 / 8 / (768 * 4), rel=0.01)


def test_zionex_matches_madmax_table3():
    cluster = catalog.cluster("zionex-a100")
    assert cluster.device.id == "a100-sxm4-40gb"
    # MAD Max Table 3: 38.4 TB/s intra-node and 25.6 Tb/s inter-node, unidirectional, over 128 GPUs
    assert 128 * cluster.levels[0].bytes_per_s == pytest.approx(38.4e12)
    assert 128 * cluster.levels[-1].bytes_per_s * 8 == pytest.approx(25.6e12)


@pytest.mark.parametrize("cluster_id", catalog.cluster_ids())
def test_max_devices_fills_whole_domains(cluster_id):
    cluster = catalog.cluster(cluster_id)
    if cluster.max_devices is None:
        return
    for level in cluster.levels:
        if level.size is not None:
            assert cluster.max_devices % level.size == 0, (cluster_id, level.name)
