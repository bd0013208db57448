"""Output that reads right (issue 7, item 6): titles, grouping, one unit per quantity, no float
noise, and a serialized time that sums everything the step does."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given

import meshplan
from cli_runner import run_cli
from meshplan.report import dlrm_groups, estimate_groups
from meshplan.units import difference, format_bytes, format_devices, format_seconds
from test_properties import PROPERTY, estimate, scenarios

GPT3 = dict(model="gpt3-175b", cluster="dgx-a100-80gb", num_devices=1536, tp=8, pp=16, global_batch_size=1536, recompute="full")
DLRM = dict(model="dlrm-a", cluster="zionex-a100", num_devices=128, strategy="embedding=(mp) dense=(ddp)", global_batch_size=65536)
ZERO3 = dict(model="llama3-8b", cluster="dgx-h100", num_devices=64, tp=2, zero_stage=3, global_batch_size=64, recompute="full")


def _names(rows) -> set[str]:
    return {name.strip() for name, _ in rows}


# --- 1. titles ---


def test_titles_say_devices_of_cluster(monkeypatch, capsys):
    assert format_devices(1536, "dgx-a100-80gb") == "1536 devices of dgx-a100-80gb"
    assert format_devices(1, "dgx-h100") == "1 device of dgx-h100"
    runs = [
        ("estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--devices", "1536", "--tp", "8", "--pp", "16",
         "--global-batch", "1536", "--recompute", "full"),
        ("estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--devices", "8", "--tp", "8", "--task", "inference",
         "--batch", "4", "--prompt-len", "128", "--output-len", "16"),
        ("estimate", "--model", "dlrm-a", "--cluster", "zionex-a100", "--devices", "128", "--strategy", "embedding=(mp) dense=(ddp)",
         "--global-batch", "65536"),
    ]
    for args in runs:
        code, out, _ = run_cli(monkeypatch, capsys, *args)
        assert code == 0
        assert f"{args[6]} devices of {args[4]}" in out
        assert f"{args[6]} x " not in out
    assert "devices of dgx-a100-80gb" in repr(meshplan.estimate(**GPT3))


# --- 2. grouping ---


def test_timings_and_collectives_are_not_under_memory():
    e = meshplan.estimate(**GPT3)
    groups = estimate_groups(e)
    assert list(groups) == ["time", "work", "memory", "energy"]
    time, work, memory, energy = (_names(rows) for rows in groups.values())
    assert {"energy per step", "compute", "idle power"} <= energy
    assert {"step time", "compute", "pipeline bubble", "optimizer"} <= time
    assert {kind.replace("_", " ") for kind in e.serialized_by_op_s} | set(e.collectives) <= work
    assert {"memory per device", "weights", "optimizer state"} <= memory
    assert not memory & (work | time)  # no row of memory reads like a time
    assert not any("serialized" in name for name in memory)

    d = meshplan.estimate(**DLRM)
    d_groups = dlrm_groups(d)
    assert list(d_groups) == ["time", "work", "memory", "energy"]
    assert not any("all-to-all" in name or "hidden" in value for name, value in d_groups["memory"])


# --- 3. one unit family for memory ---


def test_memory_prints_in_gib_as_the_catalog_states_it():
    assert format_bytes(80 * 2**30) == "80 GiB"  # an "80GB" A100: 80 GiB, not "85.9 GB"
    assert format_bytes(81559 * 2**20) == "79.6 GiB"  # H100 80GB as nvidia-smi reports it
    assert format_bytes(2.0 * 2**40, "GiB") == "2,048.0 GiB"
    e = meshplan.estimate(**GPT3)
    memory_values = [value for _, value in estimate_groups(e)["memory"]]
    assert all("iB" in value and " GB" not in value for value in memory_values)
    assert "of 80 GiB" in memory_values[0]


def test_memory_error_states_need_and_capacity_in_gib(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb",
                           "--devices", "8", "--tp", "8", "--global-batch", "8")
    assert code == 2
    assert "GiB per device" in err and "holds 80.0 GiB" in err and " GB" not in err


# --- 4. float noise ---


def test_difference_clamps_noise():
    assert difference(0.1 + 0.2, 0.3) == 0.0
    assert math.copysign(1.0, difference(0.3, 0.1 + 0.2)) == 1.0  # +0.0, not -0.0
    assert difference(1.0, 2.0, floor=0.0) == 0.0
    assert difference(2.0, 1.0) == 1.0
    assert difference(1.0, 2.0) == -1.0
    assert format_seconds(-0.0) == "0 s"


@PROPERTY
@given(drawn=scenarios())
def test_exposed_times_are_never_negative_or_noise(drawn):
    e = estimate(*drawn)
    for axis, t in e.breakdown.exposed_comm_s.items():
        assert t >= 0.0 and math.copysign(1.0, t) == 1.0
        assert t == 0.0 or t > 1e-9 * e.step_time_s, (axis, t)
    for c in e.collectives.values():
        assert 0.0 <= c["hidden_fraction"] <= 1.0
        assert 0.0 <= c["exposed_s"] <= c["serialized_s"]
    text = json.dumps(e.to_dict())
    assert "-0.0," not in text and "-0.0}" not in text


def test_dlrm_exposed_times_are_never_negative():
    d = meshplan.estimate(**DLRM)
    assert d.exposed_comm_s >= 0.0
    for c in d.comm_by_collective.values():
        assert c.exposed_s >= 0.0 and c.hidden_s <= c.total_s


# --- 5. serialized: everything the step does ---


@pytest.mark.parametrize("case", [GPT3, ZERO3], ids=["gpt3-pp", "llama-zero3"])
def test_serialized_sums_all_work_and_the_bubble(case):
    e = meshplan.estimate(**case)
    collectives = sum(c["serialized_s"] for c in e.collectives.values())
    assert e.serialized_s == pytest.approx(sum(e.serialized_by_op_s.values()) + collectives + e.breakdown.bubble_s, rel=1e-9)
    # nothing overlapped is never faster than the step, and the difference is the hidden communication
    hidden = sum(c["serialized_s"] - c["exposed_s"] for c in e.collectives.values())
    assert e.serialized_s >= e.step_time_s * (1 - 1e-9)
    assert e.serialized_s - e.step_time_s == pytest.approx(hidden, rel=1e-6, abs=1e-9 * e.step_time_s)


def test_serialized_includes_zero3_gathers():
    e = meshplan.estimate(**ZERO3)
    assert {"all_gather", "reduce_scatter"} <= set(e.collectives)
    assert e.serialized_s >= e.breakdown.compute_s + e.collectives["all_gather"]["serialized_s"]


def test_dlrm_serialized_sums_every_task():
    d = meshplan.estimate(**DLRM)
    assert d.serialized_s == pytest.approx(sum(t.end_s - t.start_s for t in d.tasks), rel=1e-9)
    assert d.serialized_s == pytest.approx(d.compute_s + d.comm_s, rel=1e-9)
    assert d.iteration_s <= d.serialized_s


# --- 6. progress for the Pareto fronts ---


def test_pareto_reports_progress_to_the_end():
    calls = []
    space = {"tp": [1, 2], "pp": [1, 2], "recompute": ["none", "full"], "micro_batch_size": [1]}
    fronts = meshplan.api.pareto("llama3-8b", "dgx-h100", 8, {"global_batch_size": 64}, space, progress=lambda d, t: calls.append((d, t)))
    assert fronts["memory"] and fronts["devices"]
    done = [d for d, _ in calls]
    assert done == sorted(done) and all(0 <= d <= t for d, t in calls)
    assert calls[-1][0] == calls[-1][1]  # the bar ends full
    assert len({t for _, t in calls}) == 1  # one total for both fronts: the bar never jumps back
    # 8, 4, 2, 1 devices: four searches after the memory front's plans
    assert calls[-1][1] - 4 == max(d for d, _ in calls[:-4])


def test_search_pareto_cli_still_prints_fronts(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8",
                             "--global-batch", "64", "--pareto", "--executor", "serial", "--set", "space.tp=[1,2]", "--set", "space.pp=[1,2]")
    assert code == 0, err
    assert "Pareto front: step time vs memory per device" in out


# --- 7. ties ---


def _row(**changes) -> dict:
    from meshplan.explore.pareto import COMPONENTS
    from meshplan.explore.search import PLAN_COLUMNS

    row = {k: 1 for k in PLAN_COLUMNS} | {c: 0.25 for c in COMPONENTS} | {"step_time_s": 2.0}
    return row | changes


def test_runner_up_with_the_same_step_time_ties():
    from meshplan.explore.pareto import why_slower
    from meshplan.report import runner_up_line

    best = _row(zero_stage=1)
    other = _row(zero_stage=2, step_time_s=2.0 * (1 + 1e-12), compute_s=0.25 + 1e-15)
    why = why_slower(best, other)
    assert why["tie"] and why["slower_by_s"] == 0.0
    assert all(v == 0.0 for v in why["components_s"].values())
    line = runner_up_line(why)
    assert "ties with the best" in line and "slower" not in line

    slower = why_slower(best, _row(zero_stage=3, step_time_s=2.5, exposed_dp_s=0.75))
    assert not slower["tie"] and slower["slower_by_s"] == pytest.approx(0.5)
    assert "slower" in runner_up_line(slower)
