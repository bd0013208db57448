"""Searching by energy, EDP and cost: exact against brute force, with bounds that never exceed."""

import pytest

from meshplan import api, catalog
from meshplan.errors import MeshplanError
from meshplan.explore.bound import energy_lower_bounds, lower_bounds
from meshplan.explore.pareto import energy_front
from meshplan.explore.search import brute_force, search
from meshplan.explore.space import SearchSpace, expand
from meshplan.specs import Plan, Task

SPACES = [
    ("llama3-8b", "dgx-h100", 16, {"global_batch_size": 64, "seq_len": 4096}, {"zero_stage": [0, 1, 3]}),
    ("llama2-70b", "dgx-a100-80gb", 64, {"global_batch_size": 128}, {"tp": [2, 4, 8], "pp": [2, 4], "recompute": ["none", "full"]}),
]


@pytest.mark.parametrize("model_id,cluster_id,devices,base,space", SPACES)
def test_energy_bound_never_exceeds_the_exact_energy(model_id, cluster_id, devices, base, space):
    scenarios = expand(SearchSpace(**space), catalog.model(model_id), catalog.cluster(cluster_id), devices, Plan(**base)).scenarios
    bounds = energy_lower_bounds(scenarios, lower_bounds(scenarios))
    for bound, scenario in zip(bounds, scenarios):
        assert bound <= api.estimate_scenario(scenario).energy.total_j * (1 + 1e-12)


@pytest.mark.parametrize("objective", ["energy", "edp", "cost"])
@pytest.mark.parametrize("model_id,cluster_id,devices,base,space", SPACES)
def test_search_by_objective_equals_brute_force(objective, model_id, cluster_id, devices, base, space):
    model, cluster = catalog.model(model_id), catalog.cluster(cluster_id)
    task = Task(price_per_device_hour=2.0)
    column = {"energy": "energy_j", "edp": "edp_js", "cost": "cost_per_step"}[objective]
    result = search(model, cluster, devices, Plan(**base), SearchSpace(**space), top_k=5, task=task, objective=objective)
    exact = brute_force(model, cluster, devices, Plan(**base), SearchSpace(**space), task=task, objective=objective)
    assert [r[column] for r in result.top] == pytest.approx([r[column] for r in exact[:5]], rel=1e-12)
    assert result.evaluated <= result.candidates


@pytest.mark.parametrize("model_id,cluster_id,devices,base,space", SPACES[:1])
def test_energy_front_equals_brute_force(model_id, cluster_id, devices, base, space):
    model, cluster = catalog.model(model_id), catalog.cluster(cluster_id)
    rows = brute_force(model, cluster, devices, Plan(**base), SearchSpace(**space))
    expected, least = [], float("inf")
    for row in sorted(rows, key=lambda r: (r["step_time_s"], r["energy_j"])):
        if row["energy_j"] < least:
            least = row["energy_j"]
            expected.append(row)
    front = energy_front(model, cluster, devices, Plan(**base), SearchSpace(**space))
    assert [(r["step_time_s"], r["energy_j"]) for r in front] == pytest.approx(
        [(r["step_time_s"], r["energy_j"]) for r in expected], rel=1e-12)


def test_objectives_that_cannot_rank_are_refused():
    with pytest.raises(MeshplanError, match="price per device-hour"):
        api.search("llama3-8b", "dgx-h100", 8, global_batch_size=8, objective="cost")
    with pytest.raises(MeshplanError, match="one of time, energy, edp, cost"):
        api.search("llama3-8b", "dgx-h100", 8, global_batch_size=8, objective="carbon")
    with pytest.raises(MeshplanError, match="rank by time"):
        api.search("llama3-8b", "dgx-h100", 8, task={"kind": "inference"}, objective="energy")
