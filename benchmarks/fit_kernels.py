"""Fit a device family's kernel models (GEMM, FP8 GEMM, attention, memory-bound kernels, and the
host's dispatch where whole layers were measured) on measured kernels, and print the profile's
``kernels:`` block.

    python benchmarks/fit_kernels.py tests/data/h100-sxm --device h100-sxm5-80gb

The data are the CSV files `meshplan calibrate` writes (tests/data/h100-sxm/README.md); the fit
is meshplan.calibrate.fit_kernels (its docstring says how), the one `meshplan calibrate` runs
for its profile. The printed YAML goes into src/meshplan/catalog/efficiency.yaml by hand, with
the errors. Needs scipy (the calibrate extra).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from meshplan import catalog
from meshplan.calibrate.fit_kernels import error_summary, fit_kernels


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", type=Path)
    parser.add_argument("--device", default="h100-sxm5-80gb")
    args = parser.parse_args()
    fit = fit_kernels(args.data, catalog.device(args.device))
    print(f"# isolated-call overhead: compute {fit.compute_overhead_s * 1e6:.2f} us, memory {fit.memory_overhead_s * 1e6:.2f} us")
    for kind, errors in fit.errors.items():
        print(f"# {kind}: {error_summary(errors)}")
    gemms, attention, memory_kernels = fit.kernels.gemm, fit.kernels.attention, fit.kernels.memory

    us = lambda s: f"{s * 1e6:.2f} us"  # noqa: E731
    print("  kernels:")
    print("    gemm:")
    for precision, g in gemms.items():
        print(f"      {precision}: {g.catalog_line()}")
    print("    attention:")
    print(f"      block_q: {attention.block_q}")
    for name, p in (("forward", attention.forward), ("backward", attention.backward)):
        print(f"      {name}: {{sm_fraction: {p.sm_fraction:.4f}, prologue_kv: {p.prologue_kv:.1f}, wave_quantization: {p.wave_quantization:.3f}, "
              f"q_passes: {p.q_passes:.3f}, kv_passes: {p.kv_passes:.3f}, softmax_dims: {p.softmax_dims:.1f}, launch_s: {us(p.launch_s)}, isolated_floor_s: {us(p.isolated_floor_s)}, isolated_overhead_s: {us(p.isolated_overhead_s)}}}")
    print("    memory:")
    print("      classes:")
    for name, c in memory_kernels.classes.items():
        print(f"        {name}: {{fraction: {c.fraction:.4f}, launch_s: {us(c.launch_s)}}}")
    print(f"      isolated_floor_s: {us(memory_kernels.isolated_floor_s)}")
    print(f"      isolated_overhead_s: {us(memory_kernels.isolated_overhead_s)}")
    host = fit.kernels.host
    if host is not None:
        print(f"    host: {{forward_s: {us(host.forward_s)}, backward_s: {us(host.backward_s)}}}  # {host.source}")


if __name__ == "__main__":
    main()
