"""Search returns exactly what brute force returns, and beats or matches published plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run_cli

from meshplan import api, catalog
from meshplan.errors import MeshplanError
from meshplan.explore.bound import lower_bounds
from meshplan.explore.search import brute_force, search
from meshplan.explore.space import SearchSpace, expand
from meshplan.io.validation_cases import case_inputs, load_cases
from meshplan.specs import Plan

CASES = Path(__file__).resolve().parents[2] / "shared" / "validation" / "public-cases.yaml"

SMALL_SPACES = [
    # (model, cluster, devices, base plan, space)
    ("gpt3-175b", "dgx-a100-80gb", 64, {"global_batch_size": 512}, {"pp": [4, 8, 16], "micro_batch_size": [1, 2]}),
    ("llama3-8b", "dgx-h100", 16, {"global_batch_size": 64, "seq_len": 4096}, {"zero_stage": [0, 1, 3]}),
    ("llama2-70b", "dgx-a100-80gb", 128, {"global_batch_size": 256}, {"tp": [2, 4, 8], "pp": [2, 4, 8], "recompute": ["none", "full"]}),
    ("megatron-1t", "dgx-a100-80gb", 512, {"global_batch_size": 512, "precision": "fp16"}, {"tp": [8], "micro_batch_size": [1]}),
    ("llama3-70b", "dgx-h100", 64, {"global_batch_size": 128, "seq_len": 8192}, {"virtual_pipeline_stages": [1, 2, 5], "sequence_parallel": [True]}),
    ("gpt3-175b", "dgx-a100-40gb", 256, {"global_batch_size": 1024, "flash_attention": False}, {"tp": [4, 8], "pp": [8, 16]}),
]


def _key(row):
    return tuple(row[k] for k in ("tp", "pp", "dp", "micro_batch_size", "virtual_pipeline_stages", "recompute", "zero_stage", "sequence_parallel"))


@pytest.mark.parametrize("model_id,cluster_id,devices,base,space", SMALL_SPACES)
def test_search_equals_brute_force(model_id, cluster_id, devices, base, space):
    model, cluster = catalog.model(model_id), catalog.cluster(cluster_id)
    space = SearchSpace(**space)
    result = search(model, cluster, devices, Plan(**base), space, top_k=10)
    exact = brute_force(model, cluster, devices, Plan(**base), space)
    assert [r["step_time_s"] for r in result.top] == pytest.approx([r["step_time_s"] for r in exact[:10]], rel=1e-12)
    assert _key(result.top[0]) == _key(exact[0])
    assert result.evaluated <= result.candidates


@pytest.mark.parametrize("model_id,cluster_id,devices,base,space", SMALL_SPACES)
def test_bound_never_exceeds_the_exact_step_time(model_id, cluster_id, devices, base, space):
    candidates = expand(SearchSpace(**space), catalog.model(model_id), catalog.cluster(cluster_id), devices, Plan(**base))
    bounds = lower_bounds(candidates.scenarios)
    for bound, scenario in zip(bounds, candidates.scenarios):
        assert bound <= api.estimate_scenario(scenario).step_time_s * (1 + 1e-12)


def test_search_prunes_most_of_a_large_space():
    model, cluster = catalog.model("gpt3-175b"), catalog.cluster("dgx-a100-80gb")
    result = search(model, cluster, 4096, Plan(global_batch_size=2048), top_k=10)
    assert result.evaluated < result.candidates / 2
    assert result.best["step_time_s"] > 0 and result.best["fits"]


def test_nothing_fits_names_the_constraint():
    model, cluster = catalog.model("megatron-1t"), catalog.cluster("dgx-a100-80gb")
    with pytest.raises(MeshplanError) as err:
        api.search(model, cluster, 8, global_batch_size=8)
    assert err.value.field == "memory"
    assert "devices" in err.value.hint
    # the need and the capacity in one unit (GiB), so that they compare at a glance
    need_gib = float(err.value.value.split()[0].replace(",", ""))
    assert err.value.value.split()[1] == "GiB" and 1000 < need_gib < 3000
    assert "80.0 GiB" in err.value.valid


def test_search_cli_json(monkeypatch, capsys):
    code, out, err = run_cli(
        monkeypatch, capsys, "search", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--devices", "64",
        "--global-batch", "512", "--top", "3", "--set", "space.tp=[4,8]", "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    assert len(result["top"]) == 3
    assert {row["tp"] for row in result["top"]} <= {4, 8}
    times = [row["step_time_s"] for row in result["top"]]
    assert times == sorted(times)


#: the groups the Ampere profile is fitted on (tests/test_validation.py)
FITTED_GROUPS = ("megatron_sc21", "korthikanti_2022")


def _published_cases():
    if not CASES.is_file():
        return []
    return [c for c in load_cases(CASES) if (c.get("model") or {}).get("arch", "dense") == "dense"]


@pytest.mark.skipif(not CASES.is_file(), reason="shared/validation is not beside the repo")
@pytest.mark.parametrize("case", _published_cases(), ids=lambda c: c["id"])
def test_search_matches_or_beats_the_published_plan(case):
    inputs = case_inputs(case, case["id"])
    plan = inputs["plan"]
    searched = ("tp", "pp", "micro_batch_size", "virtual_pipeline_stages", "recompute", "zero_stage", "sequence_parallel")
    reference = {k: plan[k] for k in searched}
    base = {k: v for k, v in plan.items() if k not in (*searched, "dp", "cp", "ep")}
    space = SearchSpace(
        tp=sorted({1, 2, 4, 8, plan["tp"]}),
        pp=sorted({1, 2, 4, 8, 16, 32, 64, plan["pp"]}),
        micro_batch_size=sorted({1, 2, 4, plan["micro_batch_size"]}),
        virtual_pipeline_stages=sorted({1, 2, 3, plan["virtual_pipeline_stages"]}),
        recompute=["none", "selective", "full"],
        zero_stage=[0, 1, 3],
    )
    result = api.search(inputs["model"], inputs["cluster"], inputs["num_devices"], base, space, top=1, reference=reference)
    assert result.reference is not None and result.best["fits"]
    if case["group"] in FITTED_GROUPS:  # the memory model is fitted on these: the published plan fits
        assert result.reference["fits"]
    if result.reference["fits"]:
        assert result.reference_rank is not None and result.reference_rank >= 1
        assert result.best["step_time_s"] <= result.reference["step_time_s"] * (1 + 1e-12)
    else:  # a plan that does not fit has no rank
        assert result.reference_rank is None


@pytest.mark.parametrize("model_id,cluster_id,devices,base,space", SMALL_SPACES[:3])
def test_memory_front_equals_brute_force(model_id, cluster_id, devices, base, space):
    from meshplan.explore.pareto import memory_front

    model, cluster = catalog.model(model_id), catalog.cluster(cluster_id)
    rows = brute_force(model, cluster, devices, Plan(**base), SearchSpace(**space))
    expected, fastest = [], float("inf")
    for row in sorted(rows, key=lambda r: (r["memory_bytes"], r["step_time_s"])):
        if row["step_time_s"] < fastest:
            fastest = row["step_time_s"]
            if expected and expected[-1]["memory_bytes"] == row["memory_bytes"]:
                expected.pop()
            expected.append(row)
    front = memory_front(model, cluster, devices, Plan(**base), SearchSpace(**space))
    assert [(r["memory_bytes"], r["step_time_s"]) for r in front] == [(r["memory_bytes"], r["step_time_s"]) for r in expected]


def test_devices_front_gets_faster_with_more_devices():
    fronts = api.pareto("gpt3-175b", "dgx-a100-80gb", 256, global_batch_size=512, space={"tp": [8], "pp": [4, 8, 16]})
    devices = [r["num_devices"] for r in fronts["devices"]]
    times = [r["step_time_s"] for r in fronts["devices"]]
    assert devices == sorted(devices) and devices[-1] == 256
    assert times == sorted(times, reverse=True)
    best_256 = api.search("gpt3-175b", "dgx-a100-80gb", 256, global_batch_size=512, space={"tp": [8], "pp": [4, 8, 16]}, top=1)
    assert times[-1] == pytest.approx(best_256.best["step_time_s"])


def test_runner_up_explanation_accounts_for_the_gap():
    from meshplan.explore.pareto import COMPONENTS, why_slower

    result = api.search("gpt3-175b", "dgx-a100-80gb", 64, global_batch_size=512, top=2)
    why = why_slower(result.top[0], result.top[1])
    assert why["slower_by_s"] >= 0 and why["changed"]
    # the step time is the sum of its components, so their differences add up to the gap
    gap = sum(why["components_s"][c] for c in COMPONENTS)
    assert gap == pytest.approx(why["slower_by_s"], rel=1e-6, abs=1e-9)


def test_batch_too_small_for_the_devices_names_the_constraint(monkeypatch, capsys):
    code, _, err = run_cli(
        monkeypatch, capsys, "search", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--devices", "4096",
        "--global-batch", "4", "--set", "space.tp=[8]", "--set", "space.pp=[8]",
    )
    assert code == 2
    line = [l for l in err.splitlines() if l.startswith("error:")][0]
    assert "global_batch_size" in line and "no plan of the space" in line
