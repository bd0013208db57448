"""Fit the tpu profile's GEMM kernel on MaxText's published TPU v4 runs and print it.

    python benchmarks/fit_tpu_gemm.py

No TPU kernel is measured in public, so the tpu profile keeps Hopper's tiles, prologue and waves
(catalog/efficiency.yaml) and only the bf16 GEMM's fraction of the per-MXU peak is fitted: the one
that makes the single-slice runs of tests/data/maxtext_tpu_v4.yaml (22B on 64 chips, 52B on 192,
each one slice of a pod's torus) take their measured step time on average (bisection on the mean
relative error). The multi-slice runs, whose slices the schema cannot place on the data-center
network, and PaLM 540B on 6144 chips (Chowdhery et al. 2022) are held out and printed beside it.
The printed line goes into the tpu profile's kernels by hand.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import yaml

from meshplan import catalog
from meshplan.io.validation_cases import run_case
from meshplan.specs.profile import Profile

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "maxtext_tpu_v4.yaml"
PALM = {
    "id": "palm_540b_6144", "group": "palm",
    "source": "Chowdhery et al. 2022 (PaLM), Sec. 4 and Table 3: 238.3K tokens/s, 2048 x 2048 tokens a step",
    "model": {"arch": "dense", "num_layers": 118, "hidden_size": 18432, "num_attention_heads": 48, "num_kv_heads": 1,
              "head_dim": 256, "ffn_hidden_size": 73728, "ffn_type": "swiglu", "vocab_size": 256000, "tied_embeddings": True},
    "hardware": {"cluster": "tpu-v4-pod", "num_devices": 6144},
    "parallelism": {"tp": 12, "pp": 1, "dp": 512, "zero_stage": 3, "activation_recompute": "full"},
    "batch": {"global_batch_sequences": 2048, "micro_batch_size": 4, "seq_len": 2048},
    "precision": "bf16",
    "measured": {"step_time_s": 2048 * 2048 / 238.3e3},
}


def profile(sm_fraction: float) -> Profile:
    """The catalog's tpu profile with its bf16 GEMM at ``sm_fraction``."""
    efficiency = catalog.efficiency("tpu")
    gemm = efficiency.kernels.gemm_of("bf16").model_copy(update={"sm_fraction": sm_fraction})
    kernels = efficiency.kernels.model_copy(update={"gemm": {"bf16": gemm}})
    return Profile(device="tpu-v4", efficiency=efficiency.model_copy(update={"kernels": kernels}))


def errors(sm_fraction: float, cases: list[dict]) -> dict[str, float]:
    measured = profile(sm_fraction)
    return {r.id: r.relative_error for r in (run_case(case, i, measured) for i, case in enumerate(cases))}


def single_slice(cases: list[dict]) -> list[dict]:
    """The runs on one slice (1x v4-128, 1x v4-384)."""
    return [c for c in cases if "_1x" in c["id"]]


def fit(cases: list[dict]) -> float:
    """The bf16 GEMM's sm_fraction at which the single-slice runs' mean relative error is 0."""
    fitted = single_slice(cases)
    low, high = 0.3, 1.0
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (mid, high) if statistics.mean(errors(mid, fitted).values()) > 0 else (low, mid)
    return round((low + high) / 2, 4)


def main() -> None:
    cases = yaml.safe_load(DATA.read_text())
    value = fit(cases)
    fitted = {c["id"] for c in single_slice(cases)}
    for case, e in errors(value, [*cases, PALM]).items():
        print(f"# {case:22s} {e:+7.1%}{'  (fit)' if case in fitted else ''}")
    g = profile(value).efficiency.kernels.gemm_of("bf16")
    print(f"      bf16: {g.catalog_line()}")


if __name__ == "__main__":
    main()
