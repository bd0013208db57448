"""Trade-offs around the best plan: Pareto fronts and why the runner-up loses.

Both fronts are exact. Step time vs memory: plans are taken in order of memory per device
(cheap: no costing), and a plan can join the front only if it is faster than every plan that
needs less memory; its lower bound screens out most plans before any costing. Step time vs
devices: the best plan at each device count from the full count down by halves.
"""

from __future__ import annotations

import numpy as np

from meshplan.costs.costed import cost_program
from meshplan.errors import MeshplanError
from meshplan.explore.bound import lower_bounds
from meshplan.explore.search import PLAN_COLUMNS, plan_row, search
from meshplan.explore.space import SearchSpace, expand
from meshplan.parallel.program import build_program
from meshplan.timeline.step import step_estimate

#: the parts of a step time that the breakdown columns of a row hold
COMPONENTS = ("compute_s", "bubble_s", "optimizer_s", "exposed_tp_s", "exposed_cp_s", "exposed_ep_s", "exposed_pp_s", "exposed_dp_s")


def memory_front(model, cluster, num_devices, base, space: SearchSpace | None = None, task=None) -> list[dict]:
    """Plans that fit and that no other plan beats on both step time and memory per device,
    least memory first."""
    scenarios = expand(space or SearchSpace(), model, cluster, num_devices, base, task).scenarios
    programs = [build_program(s) for s in scenarios]
    memory = np.array([max(r.memory.total_bytes for r in p.roles) for p in programs])
    fits = np.array([all(r.memory.fits for r in p.roles) for p in programs], dtype=bool)
    bounds = lower_bounds(scenarios)
    front: list[dict] = []
    fastest = np.inf
    for index in np.lexsort((bounds, memory)):
        if not fits[index] or bounds[index] >= fastest:
            continue
        row = plan_row(step_estimate(cost_program(programs[index])))
        if row["step_time_s"] < fastest:
            fastest = row["step_time_s"]
            if front and front[-1]["memory_bytes"] == row["memory_bytes"]:
                front.pop()  # same memory, now faster
            front.append(row)
    return front


def devices_front(model, cluster, num_devices, base, space: SearchSpace | None = None, task=None) -> list[dict]:
    """The best plan at num_devices, num_devices/2, ... while something fits; only counts whose
    best plan is faster than at every smaller count are kept (fewest devices first)."""
    best_per_count = []
    count = num_devices
    while count >= 1:
        try:
            result = search(model, cluster, count, base, space, top_k=1, task=task)
        except MeshplanError:
            break
        if not result.top:
            break
        best_per_count.append(result.top[0])
        if count % 2:
            break
        count //= 2
    front, fastest = [], np.inf
    for row in sorted(best_per_count, key=lambda r: r["num_devices"]):
        if row["step_time_s"] < fastest:
            fastest = row["step_time_s"]
            front.append(row)
    return front


def why_slower(best: dict, other: dict) -> dict:
    """How ``other`` differs from ``best``: the plan knobs that changed and, per component of the
    step time, how many seconds more (positive) or less it spends; largest difference first."""
    changed = {k: (best[k], other[k]) for k in PLAN_COLUMNS if best[k] != other[k]}
    deltas = {c: (other[c] or 0.0) - (best[c] or 0.0) for c in COMPONENTS}
    ordered = dict(sorted(deltas.items(), key=lambda item: -abs(item[1])))
    return {"slower_by_s": other["step_time_s"] - best["step_time_s"], "changed": changed, "components_s": ordered}
