"""A grid's carbon intensity by region, read from the data codecarbon ships (the ``carbon`` extra).

Two kinds of region, both from codecarbon's package data (mlco2/codecarbon):

- a country, by its ISO 3166-1 alpha-3 code ("FRA", "USA"): ``carbon_intensity`` (g CO2e per
  kWh) of ``data/private_infra/global_energy_mix.json``, with the year it describes;
- a cloud region, "provider:region" ("gcp:europe-west1"): ``impact`` (g CO2e per kWh) of
  ``data/cloud/impact.csv``, with the source that file names for it.

Only the data files are read: codecarbon's modules (its emissions tracker starts hardware probes)
are never imported, so the core of meshplan does not need the extra.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from functools import cache
from importlib import metadata, util
from pathlib import Path

from meshplan.errors import MeshplanError, closest

FIELD = "task.grid_region"
COUNTRY_FILE = "data/private_infra/global_energy_mix.json"
CLOUD_FILE = "data/cloud/impact.csv"


@dataclass(frozen=True)
class GridIntensity:
    region: str  # as the dataset spells it: "FRA", "gcp:europe-west1"
    kg_co2e_per_kwh: float
    source: str  # the dataset, its file and what it says the number describes


@cache
def _data_dir() -> Path:
    """codecarbon's package folder, found without importing it."""
    spec = util.find_spec("codecarbon")
    if spec is None or not spec.submodule_search_locations:
        raise MeshplanError(FIELD, None, "needs codecarbon's grid data: pip install meshplan[carbon]")
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def _version() -> str:
    try:
        return metadata.version("codecarbon")
    except metadata.PackageNotFoundError:
        return "unknown version"


@cache
def _countries() -> dict[str, GridIntensity]:
    raw = json.loads((_data_dir() / COUNTRY_FILE).read_text(encoding="utf-8"))
    out = {}
    for code, entry in raw.items():
        value = entry.get("carbon_intensity")
        if value is None:
            continue
        source = (f"codecarbon {_version()} {COUNTRY_FILE}: {entry.get('country_name', code)}, "
                  f"year {entry.get('year', '?')}, {value} g CO2e/kWh")
        out[code.upper()] = GridIntensity(code.upper(), float(value) / 1000.0, source)
    return out


@cache
def _cloud_regions() -> dict[str, GridIntensity]:
    text = (_data_dir() / CLOUD_FILE).read_text(encoding="utf-8-sig")
    out = {}
    for row in csv.DictReader(io.StringIO(text)):
        if not row.get("impact"):
            continue
        key = f"{row['provider'].strip().lower()}:{row['region'].strip().lower()}"
        source = (f"codecarbon {_version()} {CLOUD_FILE}: {key} ({row.get('city') or row.get('country_name', '')}), "
                  f"{row['impact']} g CO2e/kWh, from {row.get('source') or 'the provider'}")
        out[key] = GridIntensity(key, float(row["impact"]) / 1000.0, source)
    return out


def region_intensity(region: str) -> GridIntensity:
    """The carbon intensity of ``region``: an ISO alpha-3 country code or "provider:region"."""
    name = str(region).strip()
    if ":" in name:
        regions = _cloud_regions()
        providers = sorted({key.split(":")[0] for key in regions})
        return _lookup(regions, name.lower(), region, f"a cloud region of codecarbon's {CLOUD_FILE} as provider:region "
                       f"(providers: {', '.join(providers)}), or an ISO alpha-3 country code")
    countries = _countries()
    return _lookup(countries, name.upper(), region, f"an ISO 3166-1 alpha-3 country code of codecarbon's {COUNTRY_FILE} "
                   f"({len(countries)} countries, e.g. FRA, USA, DEU), or provider:region")


def _lookup(table: dict[str, GridIntensity], key: str, region, valid: str) -> GridIntensity:
    found = table.get(key)
    if found is None:
        near = closest(key, table)
        raise MeshplanError(FIELD, region, valid, hint=f"did you mean {', '.join(near)}?" if near else None)
    return found
