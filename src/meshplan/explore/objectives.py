"""What a search minimizes, per step: time, energy, energy x time (EDP), or cost.

Each objective has an exact value for an evaluated row and a lower bound for an unevaluated
plan (meshplan.explore.bound), so search stays exact for every objective: it stops when the next
bound exceeds the k-th best exact value.

- time: the step time;
- energy: joules of a step over all devices (meshplan.costs.energy);
- edp: energy x step time (the energy-delay product; both bounds are positive, so their product
  bounds it);
- cost: USD of a step at the task's price (meshplan.costs.tco.Price.step_cost): device-hours times
  a flat price per device-hour, or with the TCO its capital per device-hour plus the step's
  energy at the wall times the electricity price, the formula Estimate.cost_to_train uses.
"""

from __future__ import annotations

import numpy as np

from meshplan.costs.tco import Price
from meshplan.errors import MeshplanError
from meshplan.explore.bound import energy_lower_bounds

OBJECTIVES = ("time", "energy", "edp", "cost")

#: the row column each objective reads, and the unit it is printed in
COLUMNS = {"time": "step_time_s", "energy": "energy_j", "edp": "edp_js", "cost": "cost_per_step"}


def check(objective: str, task, has_power: bool) -> None:
    """One clear error for an objective this search cannot rank by."""
    if objective not in OBJECTIVES:
        raise MeshplanError("--objective", objective, f"one of {', '.join(OBJECTIVES)}")
    if objective in ("energy", "edp") and not has_power:
        raise MeshplanError("--objective", objective, "needs a power model for the device (its efficiency profile's power: block)")
    if objective == "cost" and (task is None or (task.price_per_device_hour is None and not task.tco)):
        raise MeshplanError("--objective", objective, "needs a price: --price per device-hour (task.price_per_device_hour) or --tco (task.tco)")
    if objective == "cost" and task.tco and not has_power:
        raise MeshplanError("--objective", objective, "with --tco needs a power model for the device (the TCO charges the energy)")


def value(row: dict, objective: str, price: Price | None = None) -> float:
    """The objective of an evaluated row that fits."""
    if objective == "time":
        return row["step_time_s"]
    if objective == "energy":
        return row["energy_j"]
    if objective == "edp":
        return row["energy_j"] * row["step_time_s"]
    return price.step_cost(row["step_time_s"], row["num_devices"], row["energy_j"] if price.usd_per_j else 0.0)


def annotate(row: dict, objective: str, price: Price | None) -> dict:
    """``row`` with its objective's column (edp and cost are not stored columns)."""
    if objective in ("edp", "cost") and row["fits"]:
        return {**row, COLUMNS[objective]: value(row, objective, price)}
    return row


def bounds(scenarios: list, time_bounds: np.ndarray, objective: str, price: Price | None = None) -> np.ndarray:
    """A lower bound on the objective for each scenario (the cost's energy term bounded by the
    energy bound, so the bound stays below the exact cost)."""
    if objective == "time":
        return time_bounds
    if objective == "cost":
        devices = np.array([s.num_devices for s in scenarios], dtype=float)
        energy = energy_lower_bounds(scenarios, time_bounds) if price.usd_per_j else 0.0
        return price.step_cost(time_bounds, devices, energy)
    energy = energy_lower_bounds(scenarios, time_bounds)
    return energy if objective == "energy" else energy * time_bounds
