"""What a device-hour costs when you own the cluster: capital amortized over its life, plus power.

The system is priced the way DFModel prices one (kosho2013/DFModel, commit 9723bd0d, message
Cost of setup.proto: a unit price per GB of off-chip memory, per link and per switch, beside the
chips), with a node's host share added (CPUs, NICs, NVSwitch baseboard: DFModel has no host).
Every price is in catalog/prices.yaml with its source. Per device:

    capital  = accelerator (its list price less its memory) + memory_gb x memory_usd_per_gb
               + host (node price less its accelerators, per device)
               + links x link_usd + switch ports x switch_port_usd   (the scale-out levels the job spans)
    capital per device-hour = capital / (lifetime_years x 8766 h)
    power per device-hour   = average power over the step x PUE x electricity price

so a step of ``t`` seconds on ``n`` devices drawing ``E`` joules costs
``t·n/3600 · capital_per_device_hour + E·PUE·usd_per_kwh/3.6e6`` (Price.step_cost), the one formula
estimate (Estimate.cost_to_train) and search (explore.objectives) both use.

Network ports per device on each scale-out level the job spans (a level ``k`` joins more than one
domain of level ``k-1``); NVLink and PCIe levels are inside the node's price, ICI links inside the
chip's:
- switch: one link and one switch port;
- fat-tree / rail-optimized: a two-tier folded Clos, 1 + 1/o links and 1 + 2/o switch ports
  (leaf down, leaf up, spine down; o the oversubscription), or one of each while the job fits
  under one leaf (``leaf_domains``);
- ring, torus-2d, torus-3d: degree/2 links (2, 4, 6 ends per device, two ends a link), no switch;
- fully-connected: (domains - 1)/2 links; dragonfly: 1 + taper/2 links and 1 + taper switch ports
  (terminal port, global links at ``global_taper``; local links inside a group left out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache

from pydantic import Field, model_validator

from meshplan import catalog
from meshplan.errors import MeshplanError
from meshplan.specs import Cluster
from meshplan.specs.base import Spec, build

HOURS_PER_YEAR = 8766.0  # 365.25 days
J_PER_KWH = 3.6e6
CAPITAL = ("accelerators", "memory", "host", "network")


class PriceBook(Spec):
    """Prices shared by every cluster (prices.yaml ``defaults``)."""

    lifetime_years: float = Field(gt=0)
    electricity_usd_per_kwh: float = Field(ge=0)
    memory_usd_per_gb: float = Field(ge=0)
    link_usd: float = Field(ge=0)
    switch_port_usd: float = Field(ge=0)
    sources: dict[str, str]


class ClusterPrice(Spec):
    """A cluster's capital prices (prices.yaml ``clusters``): its accelerator, memory included,
    and a whole node with its accelerators."""

    accelerator_usd: float = Field(gt=0)
    node_usd: float = Field(gt=0)
    sources: dict[str, str]

    @model_validator(mode="after")
    def _cited(self) -> "ClusterPrice":
        missing = {"accelerator_usd", "node_usd"} - set(self.sources)
        if missing:
            raise MeshplanError("sources", sorted(self.sources), f"a source for each of accelerator_usd, node_usd; "
                                f"missing {', '.join(sorted(missing))}")
        return self


@dataclass(frozen=True)
class Price:
    """How a run is charged: a rate per device-hour, plus (TCO) its energy at the wall.

    A flat cloud price has only ``per_device_hour``; the TCO splits it into ``capital`` (USD per
    device-hour by component) and charges energy at ``usd_per_j`` (electricity price x PUE).
    """

    per_device_hour: float
    usd_per_j: float = 0.0
    capital: dict[str, float] = field(default_factory=dict)  # USD per device-hour, CAPITAL keys
    lifetime_years: float | None = None
    electricity_usd_per_kwh: float | None = None
    sources: dict[str, str] = field(default_factory=dict)

    def step_cost(self, step_s, num_devices, energy_j):
        """USD of one step of ``step_s`` on ``num_devices`` drawing ``energy_j`` (IT energy, all
        devices); works on numpy arrays as on scalars."""
        return step_s * num_devices / 3600.0 * self.per_device_hour + energy_j * self.usd_per_j

    def as_dict(self) -> dict:
        return {"per_device_hour": self.per_device_hour, "usd_per_j": self.usd_per_j,
                "capital_per_device_hour": dict(self.capital), "lifetime_years": self.lifetime_years,
                "electricity_usd_per_kwh": self.electricity_usd_per_kwh, "sources": dict(self.sources)}


@cache
def price_book() -> PriceBook:
    return build(PriceBook, catalog.prices().get("defaults"), "prices.defaults")


def priced_clusters() -> list[str]:
    return sorted(catalog.prices().get("clusters") or {})


def cluster_price(cluster: Cluster) -> ClusterPrice:
    entry = (catalog.prices().get("clusters") or {}).get(cluster.id)
    if entry is None:
        raise MeshplanError("task.tco", cluster.id, f"a cluster with TCO prices in catalog/prices.yaml: {', '.join(priced_clusters())}",
                            hint="or give a flat --price per device-hour")
    return build(ClusterPrice, entry, f"prices.clusters.{cluster.id}")


def level_ports(level, domains: int) -> tuple[float, float]:
    """(links, switch ports) per device on one scale-out level joining ``domains`` domains."""
    topology = level.topology
    if topology == "switch":
        return 1.0, 1.0
    if topology in ("fat-tree", "rail-optimized"):
        if level.leaf_domains is not None and domains <= level.leaf_domains:
            return 1.0, 1.0
        taper = 1.0 / level.oversubscription
        return 1.0 + taper, 1.0 + 2.0 * taper
    if topology in ("ring", "torus-2d", "torus-3d"):
        return {"ring": 1.0, "torus-2d": 2.0, "torus-3d": 3.0}[topology], 0.0
    if topology == "fully-connected":
        return (domains - 1) / 2.0, 0.0
    return 1.0 + level.global_taper / 2.0, 1.0 + level.global_taper  # dragonfly


def network_ports(cluster: Cluster, num_devices: int) -> tuple[float, float]:
    """(links, switch ports) per device over the scale-out network levels a job of
    ``num_devices`` spans; the scale-up level (NVLink, PCIe) is priced in the node."""
    links = ports = 0.0
    inner = 1
    for index, level in enumerate(cluster.levels):
        link = level.link or ("nvlink" if index == 0 else "network")
        if index > 0 and link == "network" and num_devices > inner:
            more_links, more_ports = level_ports(level, math.ceil(num_devices / inner))
            links += more_links
            ports += more_ports
        inner = level.size or inner
    return links, ports


def capital_per_device(cluster: Cluster, num_devices: int) -> dict[str, float]:
    """USD of capital per device, by component (CAPITAL); the components sum to the total."""
    book, price = price_book(), cluster_price(cluster)
    memory = cluster.device.hbm_bytes / 1e9 * book.memory_usd_per_gb
    if memory > price.accelerator_usd:
        raise MeshplanError(f"prices.clusters.{cluster.id}.accelerator_usd", price.accelerator_usd,
                            f"at least its memory's price ({memory:,.0f} USD at {book.memory_usd_per_gb} USD/GB)")
    per_node = cluster.devices_per_node
    host = (price.node_usd - per_node * price.accelerator_usd) / per_node
    if host < 0:
        raise MeshplanError(f"prices.clusters.{cluster.id}.node_usd", price.node_usd,
                            f"at least its {per_node} accelerators ({per_node * price.accelerator_usd:,.0f} USD)")
    links, ports = network_ports(cluster, num_devices)
    return {"accelerators": price.accelerator_usd - memory, "memory": memory, "host": host,
            "network": links * book.link_usd + ports * book.switch_port_usd}


def tco_price(cluster: Cluster, num_devices: int, pue: float = 1.0, lifetime_years: float | None = None,
              electricity_usd_per_kwh: float | None = None) -> Price:
    """The TCO price of a device-hour of ``cluster`` for a job of ``num_devices`` (module doc)."""
    book = price_book()
    years = lifetime_years if lifetime_years is not None else book.lifetime_years
    electricity = electricity_usd_per_kwh if electricity_usd_per_kwh is not None else book.electricity_usd_per_kwh
    hours = years * HOURS_PER_YEAR
    capital = {name: usd / hours for name, usd in capital_per_device(cluster, num_devices).items()}
    sources = {**book.sources, **cluster_price(cluster).sources}
    if lifetime_years is not None:
        sources["lifetime_years"] = "given by the task"
    if electricity_usd_per_kwh is not None:
        sources["electricity_usd_per_kwh"] = "given by the task"
    return Price(per_device_hour=sum(capital.values()), usd_per_j=electricity * pue / J_PER_KWH, capital=capital,
                 lifetime_years=years, electricity_usd_per_kwh=electricity, sources=sources)


def task_price(task, cluster: Cluster, num_devices: int) -> Price | None:
    """The task's price for a job of ``num_devices`` on ``cluster``: the TCO, a flat price per
    device-hour, or None (no cost asked)."""
    if task is None:
        return None
    if getattr(task, "tco", False):
        return tco_price(cluster, num_devices, task.pue, task.lifetime_years, task.electricity_usd_per_kwh)
    if task.price_per_device_hour is not None:
        return Price(per_device_hour=task.price_per_device_hour)
    return None
