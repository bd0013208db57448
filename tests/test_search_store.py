"""Stored searches: Parquet rows, resume after an interruption, DuckDB queries; executors agree."""

from __future__ import annotations

import json

import pytest
from cli_runner import run_cli

from meshplan import api
from meshplan.errors import MeshplanError
from meshplan.explore.search import ROW_COLUMNS, ROW_TYPES, plan_row

JOB = dict(model="gpt3-175b", cluster="dgx-a100-80gb", num_devices=64, global_batch_size=512,
           space={"tp": [2, 4, 8], "pp": [4, 8, 16], "recompute": ["none", "full"]}, top=5)


def _times(result):
    return [row["step_time_s"] for row in result.top]


def test_rows_have_stable_typed_columns():
    row = plan_row(api.estimate("gpt3-175b", "dgx-a100-80gb", num_devices=64, tp=8, pp=8, global_batch_size=64))
    assert tuple(row) == ROW_COLUMNS
    assert set(ROW_TYPES) == set(ROW_COLUMNS)


def test_interrupted_search_resumes_without_redoing_work(tmp_path):
    fresh = api.search(**JOB)
    calls = []

    def interrupt(done, total):
        calls.append(done)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        api.search(**JOB, store=str(tmp_path), progress=interrupt)
    kept = len(list(tmp_path.glob("plans-*.parquet")))
    assert kept >= 1  # finished rows were written before the interruption propagated

    resumed = api.search(**JOB, store=str(tmp_path))
    assert resumed.reused > 0
    assert _times(resumed) == pytest.approx(_times(fresh), rel=1e-12)
    again = api.search(**JOB, store=str(tmp_path))
    assert again.reused == again.evaluated  # nothing left to evaluate


def test_a_store_refuses_a_different_search(tmp_path):
    api.search(**JOB, store=str(tmp_path))
    with pytest.raises(MeshplanError) as err:
        api.search(**{**JOB, "num_devices": 128}, store=str(tmp_path))
    assert err.value.field == "--store"


def test_results_query_over_the_store(tmp_path, monkeypatch, capsys):
    result = api.search(**JOB, store=str(tmp_path))
    code, out, err = run_cli(
        monkeypatch, capsys, "results", "query", str(tmp_path),
        "select tp, pp, dp, step_time_s from plans where fits order by step_time_s limit 3", "--json",
    )
    assert code == 0, err
    rows = json.loads(out)
    assert [r["step_time_s"] for r in rows] == pytest.approx(_times(result)[:3])
    code, _, err = run_cli(monkeypatch, capsys, "results", "query", str(tmp_path), "select nope from plans")
    assert code == 2 and "error: query" in err


def test_search_result_as_arrow_and_pandas():
    result = api.search(**JOB)
    assert result.to_arrow().num_rows == len(result.top)
    assert list(result.to_pandas()["step_time_s"]) == _times(result)


def test_local_processes_give_the_same_plans():
    assert _times(api.search(**JOB, executor="local", workers=2)) == pytest.approx(_times(api.search(**JOB)), rel=1e-12)


def test_ray_gives_the_same_plans():
    pytest.importorskip("ray")
    import ray

    try:
        ray_result = api.search(**JOB, executor="ray")
    finally:
        ray.shutdown()
    assert _times(ray_result) == pytest.approx(_times(api.search(**JOB)), rel=1e-12)
