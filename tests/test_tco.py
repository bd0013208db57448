"""The TCO price of a device-hour (meshplan.costs.tco): hand-computed values, components that sum
to the total, prices that never fall with more devices or more time, and search by cost exactly
consistent with estimate."""

import json

import pytest

from cli_runner import run_cli
from meshplan import api, catalog
from meshplan.costs.tco import CAPITAL, HOURS_PER_YEAR, network_ports, tco_price
from meshplan.errors import MeshplanError
from meshplan.explore.search import brute_force, search
from meshplan.explore.space import SearchSpace
from meshplan.specs import Plan, Task
from meshplan.specs.base import build

H100 = catalog.cluster("dgx-h100")
FITS = dict(tp=1, global_batch_size=64, zero_stage=3, recompute="full")


def test_dgx_h100_price_by_hand():
    """prices.yaml: H100 25,000 USD, node 310,000, HBM 15 USD/GB, link 1,280, switch port 562.5,
    5 years, 0.0806 USD/kWh; 81,559 MiB of HBM = 85.520809984 GB."""
    memory = 85.520809984 * 15  # 1,282.82 USD
    hours = 5 * 8766
    # 64 devices: 8 nodes under one rail leaf (32 nodes a leaf): one link and one switch port each
    price = tco_price(H100, 64, pue=1.25)
    assert price.capital["memory"] == pytest.approx(memory / hours, rel=1e-12)
    assert price.capital["accelerators"] == pytest.approx((25000 - memory) / hours, rel=1e-12)
    assert price.capital["host"] == pytest.approx((310000 - 8 * 25000) / 8 / hours, rel=1e-12)
    assert price.capital["network"] == pytest.approx((1280 + 562.5) / hours, rel=1e-12)
    assert price.per_device_hour == pytest.approx((25000 + 13750 + 1842.5) / hours, rel=1e-12)  # 0.926 USD
    assert price.usd_per_j == pytest.approx(0.0806 * 1.25 / 3.6e6, rel=1e-12)
    # 512 devices: 64 nodes span the spine: 2 links and 3 switch ports each (non-blocking)
    assert network_ports(H100, 512) == (2.0, 3.0)
    assert tco_price(H100, 512).capital["network"] == pytest.approx((2 * 1280 + 3 * 562.5) / hours, rel=1e-12)
    # one node: no scale-out network at all
    assert network_ports(H100, 8) == (0.0, 0.0)
    # a step of 2 s on 64 devices drawing 50 kJ
    assert price.step_cost(2.0, 64, 5e4) == pytest.approx(2 * 64 / 3600 * price.per_device_hour + 5e4 * 0.0806 * 1.25 / 3.6e6)


def test_overrides_change_only_their_term():
    base, longer = tco_price(H100, 64), tco_price(H100, 64, lifetime_years=10, electricity_usd_per_kwh=0.2)
    assert longer.per_device_hour == pytest.approx(base.per_device_hour / 2, rel=1e-12)
    assert longer.usd_per_j == pytest.approx(0.2 / 3.6e6, rel=1e-12)
    assert longer.sources["lifetime_years"] == "given by the task" and HOURS_PER_YEAR == 8766.0


@pytest.mark.parametrize("devices", [8, 16, 64, 256, 512, 4096])
def test_more_devices_never_cheaper_per_device(devices):
    assert tco_price(H100, devices * 2).per_device_hour >= tco_price(H100, devices).per_device_hour


def test_estimate_cost_is_the_sum_of_its_components_and_grows_with_tokens():
    task = {"train_tokens": 1e12, "tco": True, "pue": 1.2}
    e = api.estimate("llama3-8b", "dgx-h100", num_devices=64, **FITS, task=task)
    tco = e.footprint["tco"]
    parts = e.cost_breakdown_to_train(1e12)
    assert set(parts) == {*CAPITAL, "power"}
    assert sum(parts.values()) == pytest.approx(e.cost_to_train(1e12), rel=1e-12)
    assert sum(tco["capital_per_device_hour"].values()) == pytest.approx(tco["per_device_hour"], rel=1e-12)
    assert e.cost_to_train(1e12) == pytest.approx(
        e.device_hours(1e12) * tco["per_device_hour"] + e.energy_to_train_j(1e12) / 3.6e6 * 0.0806, rel=1e-12)
    assert parts["power"] == pytest.approx(e.energy_to_train_j(1e12) / 3.6e6 * 0.0806, rel=1e-12)
    # per device-hour: capital plus the plan's average power at the wall
    watts = e.energy.total_j / (e.step_time_s * e.num_devices)
    assert e.cost_per_device_hour() == pytest.approx(tco["per_device_hour"] + watts * 1.2 / 1000 * 0.0806, rel=1e-9)
    assert e.cost_to_train(2e12) >= e.cost_to_train(1e12)


def test_search_by_tco_cost_equals_brute_force_and_estimate():
    model = catalog.model("llama3-8b")
    base, space = Plan(global_batch_size=64, seq_len=4096), SearchSpace(zero_stage=[0, 1, 3], recompute=["none", "full"])
    task = Task(tco=True, pue=1.3)
    result = search(model, H100, 16, base, space, top_k=3, task=task, objective="cost")
    exact = brute_force(model, H100, 16, base, space, task=task, objective="cost")
    assert [r["cost_per_step"] for r in result.top] == pytest.approx([r["cost_per_step"] for r in exact[:3]], rel=1e-12)
    best = result.top[0]
    plan = {k: best[k] for k in ("tp", "pp", "dp", "zero_stage", "recompute", "micro_batch_size")}
    e = api.estimate("llama3-8b", "dgx-h100", num_devices=16, global_batch_size=64, seq_len=4096, **plan,
                     task={"train_tokens": 1e10, "tco": True, "pue": 1.3})
    steps = e.time_to_train_s(1e10) / e.step_time_s
    assert best["cost_per_step"] * steps == pytest.approx(e.cost_to_train(1e10), rel=1e-9)


@pytest.mark.parametrize("task,match", [
    ({"tco": True, "price_per_device_hour": 2.0}, "task.tco.*not both"),
    ({"lifetime_years": 4}, "task.lifetime_years.*task.tco"),
    ({"electricity_usd_per_kwh": -1, "tco": True}, "task.electricity_usd_per_kwh"),
    ({"kind": "inference", "tco": True}, "task.tco.*pretrain or finetune"),
])
def test_bad_tco_tasks_are_refused(task, match):
    with pytest.raises(MeshplanError, match=match):
        build(Task, task, "task")


def test_an_unpriced_cluster_names_the_priced_ones():
    with pytest.raises(MeshplanError, match="task.tco.*dgx-h100"):
        api.estimate("llama3-8b", "dgx-a100-80gb", num_devices=8, **FITS, task={"train_tokens": 1e12, "tco": True})


def test_cli_estimate_and_search_with_tco(monkeypatch, capsys):
    flags = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--global-batch", "64"]
    code, out, err = run_cli(monkeypatch, capsys, "estimate", *flags, "--tp", "1", "--zero", "3", "--recompute", "full",
                             "--train-tokens", "1e11", "--tco", "--lifetime-years", "4", "--electricity-price", "0.1", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["footprint"]["tco"]["lifetime_years"] == 4 and result["footprint"]["tco"]["electricity_usd_per_kwh"] == 0.1
    assert sum(result["cost_breakdown_to_train"].values()) == pytest.approx(result["cost_to_train"], rel=1e-12)
    code, out, err = run_cli(monkeypatch, capsys, "search", *flags, "--objective", "cost", "--tco", "--top", "2",
                             "--executor", "serial", "--json")
    assert code == 0, err
    code, out, err = run_cli(monkeypatch, capsys, "estimate", *flags, "--tco", "--price", "2")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and lines[0].startswith("error: task.tco")
