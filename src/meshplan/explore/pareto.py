"""Trade-offs around the best plan: Pareto fronts and why the runner-up loses.

The fronts are exact. Step time vs energy per step: see ``energy_front``. Step time vs memory: plans are taken in order of memory per device
(cheap: no costing), and a plan can join the front only if it is faster than every plan that
needs less memory; its lower bound screens out most plans before any costing. Step time vs
devices: the best plan at each device count from the full count down by halves.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from meshplan.costs.costed import cost_program
from meshplan.errors import MeshplanError
from meshplan.explore.bound import energy_lower_bounds, lower_bounds
from meshplan.explore.search import PLAN_COLUMNS, plan_row, search
from meshplan.explore.space import SearchSpace, expand
from meshplan.parallel.program import build_program
from meshplan.timeline.step import step_estimate
from meshplan.units import NOISE, difference

#: called as progress(done, total) while a front is computed
Progress = Callable[[int, int], None]

#: the parts of a step time that the breakdown columns of a row hold
COMPONENTS = ("compute_s", "bubble_s", "optimizer_s", "exposed_tp_s", "exposed_cp_s", "exposed_ep_s", "exposed_pp_s", "exposed_dp_s")


def memory_front(model, cluster, num_devices, base, space: SearchSpace | None = None, task=None,
                 progress: Progress | None = None) -> list[dict]:
    """Plans that fit and that no other plan beats on both step time and memory per device,
    least memory first. ``progress(done, total)`` is called as the plans are considered."""
    scenarios = expand(space or SearchSpace(), model, cluster, num_devices, base, task).scenarios
    programs = [build_program(s) for s in scenarios]
    memory = np.array([max(r.memory.total_bytes for r in p.roles) for p in programs])
    fits = np.array([all(r.memory.fits for r in p.roles) for p in programs], dtype=bool)
    bounds = lower_bounds(scenarios)
    front: list[dict] = []
    fastest = np.inf
    order = np.lexsort((bounds, memory))
    for position, index in enumerate(order, start=1):
        if progress:
            progress(position, len(order))
        if not fits[index] or bounds[index] >= fastest:
            continue
        row = plan_row(step_estimate(cost_program(programs[index])))
        if row["step_time_s"] < fastest:
            fastest = row["step_time_s"]
            if front and front[-1]["memory_bytes"] == row["memory_bytes"]:
                front.pop()  # same memory, now faster
            front.append(row)
    return front


def energy_front(model, cluster, num_devices, base, space: SearchSpace | None = None, task=None,
                 progress: Progress | None = None) -> list[dict]:
    """Plans that fit and that no other plan beats on both step time and energy per step,
    fastest first (empty when the device has no power model).

    Exact: plans are taken in order of their time bound; one whose time and energy bounds are
    both no better than an evaluated plan's exact values is dominated, and is skipped unevaluated.
    """
    scenarios = expand(space or SearchSpace(), model, cluster, num_devices, base, task).scenarios
    time_bounds = lower_bounds(scenarios)
    energy_bounds = energy_lower_bounds(scenarios, time_bounds)
    if energy_bounds is None:
        return []
    evaluated: list[dict] = []
    order = np.lexsort((energy_bounds, time_bounds))
    for position, index in enumerate(order, start=1):
        if progress:
            progress(position, len(order))
        if any(r["step_time_s"] <= time_bounds[index] and r["energy_j"] <= energy_bounds[index] for r in evaluated):
            continue
        program = build_program(scenarios[index])
        if not all(role.memory.fits for role in program.roles):
            continue
        evaluated.append(plan_row(step_estimate(cost_program(program))))
    front, least = [], np.inf
    for row in sorted(evaluated, key=lambda r: (r["step_time_s"], r["energy_j"])):
        if row["energy_j"] < least:
            least = row["energy_j"]
            front.append(row)
    return front


def device_counts(num_devices: int) -> list[int]:
    """num_devices, num_devices/2, ... while the count is even, down to 1."""
    counts = [num_devices]
    while counts[-1] % 2 == 0:
        counts.append(counts[-1] // 2)
    return counts


def devices_front(model, cluster, num_devices, base, space: SearchSpace | None = None, task=None,
                  progress: Progress | None = None) -> list[dict]:
    """The best plan at num_devices, num_devices/2, ... while something fits; only counts whose
    best plan is faster than at every smaller count are kept (fewest devices first).
    ``progress(done, total)`` is called after each device count's search."""
    best_per_count = []
    counts = device_counts(num_devices)
    for done, count in enumerate(counts, start=1):
        if progress:
            progress(done - 1, len(counts))
        try:
            result = search(model, cluster, count, base, space, top_k=1, task=task)
        except MeshplanError:
            break
        if not result.top:
            break
        best_per_count.append(result.top[0])
    if progress:
        progress(len(counts), len(counts))
    front, fastest = [], np.inf
    for row in sorted(best_per_count, key=lambda r: r["num_devices"]):
        if row["step_time_s"] < fastest:
            fastest = row["step_time_s"]
            front.append(row)
    return front


def why_slower(best: dict, other: dict) -> dict:
    """How ``other`` differs from ``best``: the plan knobs that changed and, per component of the
    step time, how many seconds more (positive) or less it spends; largest difference first.
    ``tie`` is true when the two step times are equal within float noise (relative ``NOISE``):
    then ``slower_by_s`` is 0 and neither plan loses."""
    changed = {k: (best[k], other[k]) for k in PLAN_COLUMNS if best[k] != other[k]}
    deltas = {c: difference(other[c] or 0.0, best[c] or 0.0) for c in COMPONENTS}
    ordered = dict(sorted(deltas.items(), key=lambda item: -abs(item[1])))
    slower_by = difference(other["step_time_s"], best["step_time_s"])
    tie = abs(other["step_time_s"] - best["step_time_s"]) <= NOISE * max(abs(best["step_time_s"]), abs(other["step_time_s"]))
    return {"slower_by_s": 0.0 if tie else slower_by, "tie": tie, "changed": changed, "components_s": ordered}
