"""Search speed on this machine: the issue's three jobs, each with the full default space.

    python benchmarks/bench_search.py

Prints, per job: points in the space, valid plans, plans evaluated exactly, plans per second
(exact evaluations / wall time), wall time, and PASS/FAIL against the target. Exits 0.
"""

from __future__ import annotations

import time

from meshplan import api
from meshplan.explore.space import SearchSpace

#: tp, pp, dp (implied), micro-batch, virtual stages, recompute, ZeRO stage, sequence parallel
SPACE = SearchSpace(
    tp=[1, 2, 4, 8],
    pp=[1, 2, 4, 8, 16, 32, 64],
    micro_batch_size=[1, 2, 4, 8],
    virtual_pipeline_stages=[1, 2, 3, 4, 6, 8],
    recompute=["none", "selective", "full"],
    zero_stage=[0, 1, 2, 3],
    sequence_parallel=[False, True],
    schedule=["1f1b", "gpipe"],
)

JOBS = [
    # (model, cluster, devices, global batch, target seconds)
    ("gpt3-175b", "dgx-a100-80gb", 64, 1536, 10.0),
    ("gpt3-175b", "dgx-a100-80gb", 4096, 1536, 30.0),
    ("megatron-1t", "dgx-a100-80gb", 3072, 3072, 30.0),
]


def main() -> None:
    for model, cluster, devices, batch, target in JOBS:
        start = time.perf_counter()
        result = api.search(model, cluster, devices, global_batch_size=batch, space=SPACE, top=10)
        wall = time.perf_counter() - start
        best = result.best
        print(
            f"{model} on {devices} x {cluster}, batch {batch}: space {result.space_size} points, "
            f"{result.candidates} valid, {result.evaluated} evaluated exactly, "
            f"{result.evaluated / wall:,.0f} plans/s, {wall:.2f} s (target <= {target:.0f} s) "
            f"{'PASS' if wall <= target else 'FAIL'}; best tp={best['tp']} pp={best['pp']} dp={best['dp']} "
            f"mb={best['micro_batch_size']} vpp={best['virtual_pipeline_stages']} {best['recompute']} "
            f"zero={best['zero_stage']} sp={best['sequence_parallel']}: {best['step_time_s']:.3f} s"
        )


if __name__ == "__main__":
    main()
