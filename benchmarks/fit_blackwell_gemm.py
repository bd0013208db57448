"""Fit the blackwell profile's GEMM kernels on NVIDIA's measured B300 GEMMs and print them.

    python benchmarks/fit_blackwell_gemm.py

The data (tests/data/published_gemms.yaml) are per-pass sums of a layer's GEMMs, one sum per
precision and pass, timed by Transformer Engine's GEMM benchmark on an HGX B300. Too few shapes
to fit tiles, prologues and waves, so each kernel keeps Hopper's (bf16's for bf16, fp8's for the
rest: the fitted H100 kernels of catalog/efficiency.yaml) and only its fraction of the per-SM peak
is fitted: the one that makes the layer's twelve GEMMs take their measured total (bisection). The
printed lines go into the blackwell profile's kernels by hand.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from meshplan import catalog
from meshplan.costs.kernels import Chip, gemm_s
from meshplan.specs.device import BYTES_PER_ELEMENT
from meshplan.specs.kernels import GemmKernel

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "published_gemms.yaml"
PASSES = ("fprop", "dgrad", "wgrad")


def pass_shapes(tokens: int, gemms: list[list[int]]) -> dict[str, list[tuple[int, int, int]]]:
    """(m, k, n) of each GEMM of each pass: fprop tokens x K x N, dgrad tokens x N x K, wgrad
    K x tokens x N (the source's own convention)."""
    return {"fprop": [(tokens, k, n) for k, n in gemms],
            "dgrad": [(tokens, n, k) for k, n in gemms],
            "wgrad": [(k, tokens, n) for k, n in gemms]}


def chip_of(device: dict, precision: str) -> Chip:
    """The data's device in ``precision`` (its dense peak in that precision)."""
    return Chip(device["peak_flop_per_s"][precision], device["sm_count"], device["hbm_bytes_per_s"], device["sram_bytes"])


def layer_ms(kernel, chip: Chip, element_bytes: float, shapes) -> dict[str, float]:
    return {p: 1e3 * sum(float(gemm_s(m, k, n, element_bytes, kernel, chip)) for m, k, n in shapes[p]) for p in PASSES}


def fit(data: dict | None = None) -> dict[str, GemmKernel]:
    """The fitted GemmKernel per key of the data's ``ms`` (bf16, fp8, fp8_block, fp4)."""
    data = data or yaml.safe_load(DATA.read_text())["fit"]
    device = data["device"]
    shapes = pass_shapes(data["tokens"], data["gemms"])
    hopper = catalog.efficiency("hopper").kernels
    out = {}
    for key, measured in data["ms"].items():
        precision = key.split("_")[0]
        chip = chip_of(device, precision)
        base = hopper.gemm_of("bf16" if precision == "bf16" else "fp8")
        target = sum(measured.values())
        low, high = 0.01, 2.0
        for _ in range(60):
            mid = (low + high) / 2
            total = sum(layer_ms(base.model_copy(update={"sm_fraction": mid}), chip, BYTES_PER_ELEMENT[precision], shapes).values())
            low, high = (mid, high) if total > target else (low, mid)
        out[key] = base.model_copy(update={"sm_fraction": round((low + high) / 2, 4)})
    return out


def main() -> None:
    data = yaml.safe_load(DATA.read_text())["fit"]
    shapes = pass_shapes(data["tokens"], data["gemms"])
    for key, g in fit(data).items():
        precision = key.split("_")[0]
        model = layer_ms(g, chip_of(data["device"], precision), BYTES_PER_ELEMENT[precision], shapes)
        print(f"# {key}: " + ", ".join(f"{p} {model[p]:.3f} ms (measured {data['ms'][key][p]:.3f})" for p in PASSES))
        print(f"      {key}: {g.catalog_line()}")


if __name__ == "__main__":
    main()
