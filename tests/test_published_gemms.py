"""GEMM kernel models against published GEMM measurements (tests/data/published_gemms.yaml): the
blackwell profile's on NVIDIA's B300 layer GEMMs they are fitted on and on vLLM's B200 GEMMs, held
out; the hopper profile's on NVIDIA's H200 NVL layer GEMMs, held out; the ampere profile's (fitted
on the public A100 runs) on NVIDIA's A100 GEMMs, held out."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

import meshplan
from meshplan import catalog
from meshplan.costs.compute import Roofline
from meshplan.specs.device import BYTES_PER_ELEMENT

ROOT = Path(__file__).resolve().parents[1]
DATA = yaml.safe_load((ROOT / "tests" / "data" / "published_gemms.yaml").read_text())
_spec = importlib.util.spec_from_file_location("fit_blackwell_gemm", ROOT / "benchmarks" / "fit_blackwell_gemm.py")
fit_blackwell_gemm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fit_blackwell_gemm)

KERNELS = catalog.efficiency("blackwell").kernels


def test_the_catalog_holds_what_the_fit_gives():
    for key, g in fit_blackwell_gemm.fit().items():
        assert KERNELS.gemm[key] == g, key


@pytest.mark.parametrize("key", ["bf16", "fp8", "fp8_block", "fp4"])
def test_b300_layer_gemms_per_pass_within_7_percent(key):
    """The fit matches each precision's layer total; each pass on its own stays within 7% (the
    largest today: per-tensor FP8's forward, 6.2% slow; the model has no forward/backward asymmetry)."""
    fit = DATA["fit"]
    device = fit["device"]
    precision = key.split("_")[0]
    chip = fit_blackwell_gemm.chip_of(device, precision)
    shapes = fit_blackwell_gemm.pass_shapes(fit["tokens"], fit["gemms"])
    model = fit_blackwell_gemm.layer_ms(KERNELS.gemm[key], chip, BYTES_PER_ELEMENT[precision], shapes)
    for p, measured in fit["ms"][key].items():
        assert model[p] == pytest.approx(measured, rel=0.07), (p, model[p], measured)
    assert sum(model.values()) == pytest.approx(sum(fit["ms"][key].values()), rel=0.005)


def _held_out(precision: str) -> list[tuple[int, float, float]]:
    h = DATA["held_out"]
    roof = Roofline.of(catalog.device(h["device"]), catalog.efficiency("blackwell"), precision)
    out = []
    for m, measured in zip(h["m"], h["tflop_per_s"][precision]):
        seconds = float(roof.matmul_s(m, h["k"], h["n"], BYTES_PER_ELEMENT[precision]))
        out.append((m, 2.0 * m * h["k"] * h["n"] / seconds / 1e12, measured))
    return out


def test_b200_bf16_gemms_held_out_within_10_percent():
    """vLLM's B200 cuBLAS bf16 GEMMs, 1.3-1.4 PFLOP/s from M 1K to 16K: within 8.2% today."""
    for m, model, measured in _held_out("bf16"):
        assert model == pytest.approx(measured, rel=0.10), m


def test_b200_nvfp4_gemms_held_out_within_15_percent():
    """vLLM's B200 NVFP4 GEMMs (CUTLASS, operands quantized beforehand), 2.9-3.9 PFLOP/s: within
    14% today, the model below at the largest M. While fp4 ran bf16's kernel at the fp4 peak the
    model gave about 6 PFLOP/s."""
    for m, model, measured in _held_out("fp4"):
        assert model == pytest.approx(measured, rel=0.15), m


def test_mxfp8_gemms_run_their_own_kernel_on_blackwell_only():
    """A plan scaling FP8 per block (MXFP8) runs Blackwell's block-scaled kernel, 5% below per-tensor
    FP8 as NVIDIA's B300 measurement has it; Hopper has no such kernel and times both alike."""
    for device, slower in (("b200", True), ("h100-sxm5-80gb", False)):
        d = catalog.device(device)
        profile = catalog.efficiency(d.efficiency)
        block = Roofline.of(d, profile, "fp8", scaling="block").matmul_s(16384, 8192, 8192, 1.0)
        tensor = Roofline.of(d, profile, "fp8", scaling="current").matmul_s(16384, 8192, 8192, 1.0)
        assert bool(block > tensor * 1.03) is slower, device
    plan = dict(tp=1, pp=1, micro_batch_size=1, global_batch_size=8, seq_len=4096, precision="fp8")
    mx = meshplan.estimate("llama3-8b", "dgx-b200", {**plan, "fp8_scaling": "block"}, 8)
    delayed = meshplan.estimate("llama3-8b", "dgx-b200", {**plan, "fp8_scaling": "delayed"}, 8)
    assert mx.step_time_s > delayed.step_time_s


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_h200_nvl_layer_gemms_held_out_on_the_hopper_kernels(precision):
    """The H100-fitted Hopper kernels on another GH100 part at lower clocks: bf16 within 3% of the
    layer total (2% today), per-tensor FP8 within 12% (9% slow today: this layer's GEMMs have K
    4096, where the fit's own large H100 FP8 GEMMs run at a median 0.91 of the time it gives)."""
    h = DATA["hopper_held_out"]
    device = h["device"]
    chip = fit_blackwell_gemm.chip_of(device, precision)
    shapes = fit_blackwell_gemm.pass_shapes(DATA["fit"]["tokens"], DATA["fit"]["gemms"])
    kernel = catalog.efficiency("hopper").kernels.gemm[precision]
    model = sum(fit_blackwell_gemm.layer_ms(kernel, chip, BYTES_PER_ELEMENT[precision], shapes).values())
    measured = sum(h["ms"][precision].values())
    assert model == pytest.approx(measured, rel={"bf16": 0.03, "fp8": 0.12}[precision])


def test_the_ampere_fit_times_nvidias_a100_gemms_at_sustained_clocks():
    """The Ampere GEMM kernel is fitted on the public A100 training runs, so at the clocks a
    sustained step holds; NVIDIA's measured A100 GEMMs (aiconfigurator, 256 layer-sized shapes) ran
    in short bursts. The model takes 1.12x their time at the median, what the H100 loses sustained
    (a 8192^3 GEMM at 0.91 of its burst speed: 1.10x), and the spread is narrow (p10-p90 within
    1.05-1.18): its tiles and waves follow the shapes, a clock apart."""
    import csv

    held = DATA["ampere_held_out"]
    with (ROOT / "tests" / "data" / held["file"]).open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 256
    device = catalog.device(held["device"])
    roof = Roofline.of(device, catalog.efficiency(device.efficiency), "bf16")
    ratios = sorted(float(roof.matmul_s(float(r["m"]), float(r["k"]), float(r["n"]), 2.0)) / (float(r["ms"]) * 1e-3) for r in rows)
    median, p10, p90 = ratios[len(ratios) // 2], ratios[len(ratios) // 10], ratios[9 * len(ratios) // 10]
    assert median == pytest.approx(1.0 / held["hopper_sustained_over_burst"], rel=0.04)
    assert 1.05 < p10 and p90 < 1.18


_cdna3_spec = importlib.util.spec_from_file_location("fit_cdna3_gemm", ROOT / "benchmarks" / "fit_cdna3_gemm.py")
fit_cdna3_gemm = importlib.util.module_from_spec(_cdna3_spec)
_cdna3_spec.loader.exec_module(fit_cdna3_gemm)


def test_the_cdna3_catalog_holds_what_its_fit_gives():
    kernels = catalog.efficiency("cdna3").kernels
    for precision, g in fit_cdna3_gemm.fit().items():
        assert kernels.gemm[precision] == g, precision


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_mi300x_gemms_of_training_size_within_11_percent(precision):
    """The cdna3 GEMMs on the MI300X measurements they are fitted on: the bf16 8192^3 GEMM to the
    fit's rounding, each FP8 shape of 1e11 flop or more within 11% (8192^3 and 6144x12288x12288
    run 10-11% faster than the model, 4096^3 and the largest cubes 4-5% slower). Hopper's own
    fractions had put both precisions' 8192^3 GEMM 21-41% fast on this device."""
    data = DATA["cdna3_fit"]
    chip = fit_cdna3_gemm.chip_of(data["device"], precision)
    rows = [r for r in data[precision]["m_n_k_tflop_per_s"] if 2.0 * r[0] * r[1] * r[2] >= fit_cdna3_gemm.MIN_FLOP]
    assert len(rows) == {"bf16": 1, "fp8": 6}[precision]
    kernel = catalog.efficiency("cdna3").kernels.gemm[precision]
    for ratio in fit_cdna3_gemm.ratios(kernel, chip, rows, BYTES_PER_ELEMENT[precision]):
        assert ratio == pytest.approx(1.0, abs={"bf16": 0.002, "fp8": 0.11}[precision])
