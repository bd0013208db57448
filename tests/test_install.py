"""A plain install works: every import is declared, the CLI needs no extra, Ctrl-C exits 130,
and errors survive worker processes."""

from __future__ import annotations

import ast
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ProcessPoolExecutor
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from cli_runner import run_cli
from meshplan import api
from meshplan.errors import MeshplanError

REPO = Path(__file__).resolve().parents[1]


def _imports() -> dict[str, str]:
    found = {}
    for path in (REPO / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "meshplan":
                    found.setdefault(top, str(path))
    return found


def test_every_third_party_import_is_declared_and_click_is_not_used():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!~\[; ]", d, 1)[0].lower() for d in
                meta["dependencies"] + sum(meta["optional-dependencies"].values(), [])}
    dists = packages_distributions()
    imports = _imports()
    assert "click" not in imports  # typer >= 0.20 vendors its own click: a plain install has none
    for top, where in imports.items():
        assert any(d.lower() in declared for d in dists.get(top, [top])), f"{top} ({where}) is not declared"


def test_version_and_short_help(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "--version")
    assert code == 0 and out.split() == ["meshplan", "0.1.0"]
    for args in (("-h",), ("estimate", "-h"), ("catalog", "show", "-h")):
        code, out, _ = run_cli(monkeypatch, capsys, *args)
        assert code == 0 and "Usage" in out


@pytest.mark.parametrize("verb", [
    ("estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--devices", "8", "--tp", "8"),
    ("search", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--devices", "64", "--global-batch", "64"),
])
def test_ctrl_c_exits_130(monkeypatch, capsys, verb):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "estimate_scenario", interrupted)
    monkeypatch.setattr(api, "search", interrupted)
    code, _, err = run_cli(monkeypatch, capsys, *verb)
    assert code == 130 and err.strip() == "interrupted"


def test_sigint_stops_a_local_search_with_130_and_keeps_finished_parts(tmp_path):
    pytest.importorskip("pyarrow")
    store = tmp_path / "store"
    args = [sys.executable, "-m", "meshplan.cli", "search", "--model", "llama3-405b", "--cluster", "dgx-h100",
            "--devices", "16384", "--global-batch", "16384", "--seq-len", "8192", "--executor", "local", "--workers", "2",
            "--set", "space.micro_batch_size=[1,2,4,8,16]", "--set", "space.pp=[1,2,4,8,16,32,64,128]",
            "--set", "space.virtual_pipeline_stages=[1,2,3,4,5,6,7,8]", "--top", "200", "--store", str(store)]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not list(store.glob("plans-*.parquet")) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    if process.poll() is not None:
        pytest.skip("the search finished before it could be interrupted")
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1] == "interrupted"
    assert list(store.glob("plans-*.parquet"))  # finished parts stay for a resume


def test_meshplan_error_survives_pickling_and_worker_processes():
    err = MeshplanError("plan.tp", 3, "must divide 8", hint="try 4")
    back = pickle.loads(pickle.dumps(err))
    assert (back.field, back.value, back.valid, back.hint, str(back)) == (err.field, err.value, err.valid, err.hint, str(err))
    with ProcessPoolExecutor(max_workers=1) as pool:
        with pytest.raises(MeshplanError) as raised:
            pool.submit(api.estimate, "gpt3-175b", "dgx-a100-80gb", num_devices=8, tp=3).result()
    assert raised.value.field == "num_devices" and "tp*cp*pp" in raised.value.valid


def test_missing_extras_name_the_extra(monkeypatch, capsys, tmp_path):
    for module in ("pyarrow", "pyarrow.parquet", "duckdb", "pandas", "ray"):
        monkeypatch.setitem(sys.modules, module, None)
    code, _, err = run_cli(monkeypatch, capsys, "search", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb",
                           "--devices", "64", "--global-batch", "64", "--executor", "serial", "--store", str(tmp_path / "s"))
    assert code == 2 and err.count("\n") == 1 and "meshplan[store]" in err
    code, _, err = run_cli(monkeypatch, capsys, "results", "query", str(tmp_path), "select 1")
    assert code == 2 and err.startswith("error:")
    code, _, err = run_cli(monkeypatch, capsys, "search", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb",
                           "--devices", "64", "--global-batch", "64", "--executor", "ray")
    assert code == 2 and "meshplan[ray]" in err
    result = api.search("gpt3-175b", "dgx-a100-80gb", 64, global_batch_size=64, space={"tp": [8], "pp": [8]})
    with pytest.raises(MeshplanError, match=r"meshplan\[pandas\]"):
        result.to_pandas()


@pytest.mark.parametrize("workers", ["0", "-1", "100000"])
def test_worker_counts_out_of_range(monkeypatch, capsys, workers):
    code, _, err = run_cli(monkeypatch, capsys, "search", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb",
                           "--devices", "64", "--global-batch", "64", "--workers", workers)
    assert code == 2 and err.startswith("error: --workers")
