"""Fit a device's efficiency profile to the public validation cases, and print the result.

    python benchmarks/calibrate.py ../shared/validation/public-cases.yaml --profile ampere

One profile per device family, fitted once over every dense case that runs on it; no per-case
constants. A profile with kernel models (``kernels:``, meshplan.costs.kernels) keeps their form,
tiles, K prologue, wave quantization, memory-op classes and launch costs and fits only the
main-loop fractions of the per-SM peak (GEMM; flash attention forward and backward, where a
case runs flash attention) and overlap_slowdown. A profile without them fits its curves: each a saturating function of kernel
size, e_max / (1 + f_half / flop) (monotone: bigger kernels never run less efficiently),
tabulated at decades of flop. The loss is the sum of |log(predicted / measured)| (robust to a
few outliers). The printed YAML goes into src/meshplan/catalog/efficiency.yaml by hand, with the
fit's error. Needs scipy (a development tool, not a meshplan dependency).
"""

from __future__ import annotations

import argparse
import copy
import math

from scipy.optimize import minimize

from meshplan import catalog
from meshplan.io.validation_cases import case_inputs, load_cases, run_case
from meshplan.specs.plan import Plan


SIZES = [1e8, 1e9, 1e10, 1e11, 1e12, 1e13]


def curve(e_max: float, f_half: float) -> list[list[float]]:
    return [[size, round(e_max / (1.0 + f_half / size), 4)] for size in SIZES]


def _set_profile(profile: str, matmul, attention, slowdown: float, overhead_s: float) -> None:
    raw = catalog._raw("efficiency")
    raw[profile] = {
        **raw[profile],
        "matmul": {"points": curve(*matmul)},
        "attention": {"points": curve(*attention)},
        "overlap_slowdown": float(slowdown),
        "kernel_overhead_s": float(overhead_s),
    }
    catalog.efficiency.cache_clear()


def _set_kernels(profile: str, gemm: float, forward: float, backward: float, slowdown: float) -> None:
    raw = catalog._raw("efficiency")
    kernels = copy.deepcopy(raw[profile]["kernels"])
    for g in kernels["gemm"].values():
        g["sm_fraction"] = float(gemm)
    kernels["attention"]["forward"]["sm_fraction"] = float(forward)
    kernels["attention"]["backward"]["sm_fraction"] = float(backward)
    raw[profile] = {**raw[profile], "kernels": kernels, "overlap_slowdown": float(slowdown)}
    catalog.efficiency.cache_clear()


def fit_kernels(profile: str, cases) -> None:
    """Fit the kernel models' per-SM fractions and overlap_slowdown of ``profile`` on ``cases``."""
    sig = lambda v: 1.0 / (1.0 + math.exp(-v))  # noqa: E731

    k = catalog.efficiency(profile).kernels
    # flash attention's fractions only where a case runs it (Megatron-LM's runs did not: their
    # preset times attention as unfused GEMMs and softmax); otherwise they stay as given
    flash = any(Plan(**case_inputs(c, c["id"])["plan"]).flash_attention for _, c in cases)
    attention = (k.attention.forward.sm_fraction, k.attention.backward.sm_fraction)

    def unpack(x):
        gemm, *rest, slowdown = (sig(v) for v in x)
        return (gemm, *(rest if flash else attention), slowdown)

    def loss(x):
        _set_kernels(profile, *unpack(x))
        return sum(abs(math.log(r.predicted_step_time_s / r.measured_step_time_s)) for r in (run_case(c, i) for i, c in cases))

    start = [k.gemm_of("bf16").sm_fraction, *(attention if flash else ()), catalog.efficiency(profile).overlap_slowdown]
    best = minimize(loss, [math.log(v / (1.0 - v)) for v in start], method="Nelder-Mead",
                    options={"maxiter": 400, "xatol": 1e-3, "fatol": 1e-4})
    gemm, forward, backward, slowdown = unpack(best.x)
    _set_kernels(profile, gemm, forward, backward, slowdown)
    results = [run_case(c, i) for i, c in cases]
    errors = sorted(abs(r.relative_error) for r in results)
    print(f"# {profile}: {len(results)} cases, median |error| {errors[len(errors) // 2]:.1%}, max {errors[-1]:.1%}")
    print(f"# kernels: gemm sm_fraction {gemm:.4f}; attention forward {forward:.4f}, backward {backward:.4f}; overlap_slowdown {slowdown:.3f}")
    for r in results:
        print(f"  {r.id:45s} {r.relative_error:+.1%}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases")
    parser.add_argument("--profile", default="ampere")
    args = parser.parse_args()

    cases = [
        (i, c) for i, c in enumerate(load_cases(args.cases))
        if (c.get("model") or {}).get("arch", "dense") == "dense"
        and catalog.device(catalog.cluster(c["hardware"]["cluster"]).device.id).efficiency == args.profile
    ]
    if catalog.efficiency(args.profile).kernels is not None:
        fit_kernels(args.profile, cases)
        return
    sig = lambda v: 1.0 / (1.0 + math.exp(-v))  # noqa: E731

    def unpack(x):
        # e_max in (0, 1), f_half in flop (log-parametrized), slowdown 0-1, kernel overhead 2-20 us
        # (a CUDA launch is never free); the HBM fraction is a measured input, not fitted
        return (sig(x[0]), 10 ** x[1]), (sig(x[2]), 10 ** x[3]), sig(x[4]), 2e-6 + 18e-6 * sig(x[5])

    def loss(x):
        _set_profile(args.profile, *unpack(x))
        return sum(abs(math.log(r.predicted_step_time_s / r.measured_step_time_s)) for r in (run_case(c, i) for i, c in cases))

    best = minimize(loss, [1.0, 9.5, 0.0, 9.5, -1.0, -1.0], method="Nelder-Mead", options={"maxiter": 4000, "xatol": 1e-4, "fatol": 1e-5})
    matmul, attention, slowdown, overhead = unpack(best.x)
    _set_profile(args.profile, matmul, attention, slowdown, overhead)
    results = [run_case(c, i) for i, c in cases]
    errors = sorted(abs(r.relative_error) for r in results)
    print(f"# {args.profile}: {len(results)} cases, median |error| {errors[len(errors) // 2]:.1%}, max {errors[-1]:.1%}")
    print(f"# matmul e_max={matmul[0]:.3f} f_half={matmul[1]:.3g}; attention e_max={attention[0]:.3f} f_half={attention[1]:.3g}")
    print(f"  matmul: {{points: {curve(*matmul)}}}")
    print(f"  attention: {{points: {curve(*attention)}}}")
    print(f"  overlap_slowdown: {slowdown:.3f}")
    print(f"  kernel_overhead_s: {overhead * 1e6:.2f} us")
    for r in results:
        print(f"  {r.id:45s} {r.relative_error:+.1%}")


if __name__ == "__main__":
    main()
