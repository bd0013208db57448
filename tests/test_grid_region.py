"""Grid carbon intensity by region, read from codecarbon's data (the carbon extra)."""

import json
import sys
from importlib import util
from pathlib import Path

import pytest

from cli_runner import run_cli
from meshplan import api
from meshplan.costs import grid
from meshplan.errors import MeshplanError
from meshplan.specs import Task
from meshplan.specs.base import build

ESTIMATE = dict(num_devices=8, tp=1, global_batch_size=64)


def codecarbon_data() -> Path:
    pytest.importorskip("codecarbon")
    return Path(next(iter(util.find_spec("codecarbon").submodule_search_locations))) / "data"


def test_a_country_reads_the_dataset_value():
    raw = json.loads((codecarbon_data() / "private_infra" / "global_energy_mix.json").read_text())
    for code in ("FRA", "USA", "DEU"):
        found = grid.region_intensity(code.lower())
        assert found.kg_co2e_per_kwh == raw[code]["carbon_intensity"] / 1000.0
        assert str(raw[code]["year"]) in found.source and "global_energy_mix.json" in found.source


def test_a_cloud_region_reads_the_dataset_value():
    lines = (codecarbon_data() / "cloud" / "impact.csv").read_text(encoding="utf-8-sig").splitlines()
    header = lines[0].split(",")
    row = dict(zip(header, next(line for line in lines if ",europe-west1," in line).split(",")))
    found = grid.region_intensity("gcp:europe-west1")
    assert found.kg_co2e_per_kwh == float(row["impact"]) / 1000.0 and found.region == "gcp:europe-west1"


def test_the_lookup_does_not_import_codecarbon():
    codecarbon_data()
    before = {name for name in sys.modules if name.startswith("codecarbon")}
    grid._countries.cache_clear()
    grid.region_intensity("FRA")
    assert {name for name in sys.modules if name.startswith("codecarbon")} == before


def test_estimate_emissions_use_the_region_and_say_so():
    codecarbon_data()
    task = {"train_tokens": 1e12, "grid_region": "FRA"}
    by_region = api.estimate("llama3-8b", "dgx-h100", **ESTIMATE, task=task)
    kg = grid.region_intensity("FRA").kg_co2e_per_kwh
    by_number = api.estimate("llama3-8b", "dgx-h100", **ESTIMATE, task={"train_tokens": 1e12, "grid_kg_co2e_per_kwh": kg})
    assert by_region.co2e_to_train_kg(1e12) == pytest.approx(by_number.co2e_to_train_kg(1e12), rel=1e-12)
    assert by_region.footprint["grid_region"] == "FRA" and "France" in by_region.footprint["grid_source"]


@pytest.mark.parametrize("region,near", [("FRX", "FRA"), ("gcp:europe-west99", "gcp:europe-west")])
def test_an_unknown_region_names_close_ones(region, near):
    codecarbon_data()
    with pytest.raises(MeshplanError, match="task.grid_region") as err:
        api.estimate("llama3-8b", "dgx-h100", **ESTIMATE, task={"train_tokens": 1e12, "grid_region": region})
    assert near in str(err.value)


def test_a_region_and_a_number_together_are_refused():
    with pytest.raises(MeshplanError, match="task.grid_region.*not both"):
        build(Task, {"grid_region": "FRA", "grid_kg_co2e_per_kwh": 0.1}, "task")


def test_without_the_extra_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setattr(grid.util, "find_spec", lambda name: None)
    grid._data_dir.cache_clear()
    grid._countries.cache_clear()
    try:
        with pytest.raises(MeshplanError, match=r"pip install meshplan\[carbon\]"):
            grid.region_intensity("FRA")
    finally:
        grid._data_dir.cache_clear()
        grid._countries.cache_clear()


def test_cli_grid_region(monkeypatch, capsys):
    codecarbon_data()
    args = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--tp", "1",
            "--global-batch", "64", "--zero", "3", "--recompute", "full", "--train-tokens", "1e12",
            "--grid-region", "USA", "--json"]
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    result = json.loads(out)
    assert result["footprint"]["grid_region"] == "USA"
    assert result["co2e_to_train_kg"] == pytest.approx(
        result["energy_to_train_j"] / 3.6e6 * grid.region_intensity("USA").kg_co2e_per_kwh, rel=1e-12)
    code, out, err = run_cli(monkeypatch, capsys, *args[:-3], "--grid-region", "Atlantis")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and lines[0].startswith("error: task.grid_region")
