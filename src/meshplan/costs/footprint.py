"""The footprint a task asks for: facility overhead, the grid's carbon intensity and the price of
a device-hour, resolved once per estimate into the plain dict ``Estimate.footprint`` carries."""

from __future__ import annotations

from meshplan.costs.grid import region_intensity
from meshplan.costs.tco import tco_price
from meshplan.errors import MeshplanError


def footprint(task, cluster, num_devices: int, has_power: bool) -> dict:
    """``pue``, ``grid_kg_co2e_per_kwh`` (with ``grid_region`` and ``grid_source`` saying where it
    comes from), ``price_per_device_hour`` and, for the TCO, ``tco`` (costs.tco.Price.as_dict)."""
    out = {"pue": task.pue, "grid_kg_co2e_per_kwh": task.grid_kg_co2e_per_kwh,
           "price_per_device_hour": task.price_per_device_hour}
    if task.grid_kg_co2e_per_kwh is not None:
        out["grid_source"] = "given by the task (grid_kg_co2e_per_kwh)"
    if task.grid_region is not None:
        grid = region_intensity(task.grid_region)
        out.update(grid_kg_co2e_per_kwh=grid.kg_co2e_per_kwh, grid_region=grid.region, grid_source=grid.source)
    if task.tco:
        if not has_power:
            raise MeshplanError("task.tco", True, f"needs a power model for {cluster.device.id} "
                                "(the TCO charges the energy): its efficiency profile's power: block")
        out["tco"] = tco_price(cluster, num_devices, task.pue, task.lifetime_years,
                               task.electricity_usd_per_kwh).as_dict()
    return out
