"""CLI smoke tests: each verb runs end to end and its JSON output holds the values it promises.

Most tests call ``meshplan.cli.main`` in-process (fast); two run the installed ``meshplan``
script and ``python -m meshplan.cli`` in a subprocess, as a user would.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli_runner import run_cli

REPO = Path(__file__).resolve().parents[1]
PUBLIC_CASES = REPO.parent / "shared" / "validation" / "public-cases.yaml"
LLAMA3_8B_HF = REPO / "tests" / "fixtures" / "hf" / "llama3-8b" / "config.json"

# GPT-3 175B on 1536 A100s as in Narayanan et al. (SC21) Table 1: tp=8, pp=16, dp=12
GPT3_FLAGS = [
    "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--devices", "1536",
    "--tp", "8", "--pp", "16", "--dp", "12", "--global-batch", "1536", "--micro-batch", "1",
    "--recompute", "full",
]


def run_json(monkeypatch, capsys, *args: str):
    code, out, err = run_cli(monkeypatch, capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def installed_script() -> str | None:
    beside_python = Path(sys.executable).with_name("meshplan")
    if beside_python.is_file():
        return str(beside_python)
    return shutil.which("meshplan")


def test_estimate_json_values(monkeypatch, capsys):
    result = run_json(monkeypatch, capsys, "estimate", *GPT3_FLAGS)
    assert result["step_time_s"] > 0
    assert result["plan"]["dp"] == 12
    assert result["plan"]["tp"] == 8 and result["plan"]["pp"] == 16
    assert result["num_devices"] == 1536
    assert math.isclose(result["breakdown"]["total_s"], result["step_time_s"], rel_tol=1e-9)


def test_config_with_set_override_matches_flags(monkeypatch, capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": "gpt3-175b",
                "cluster": "dgx-a100-80gb",
                "devices": 1536,
                "plan": {
                    "tp": 8, "pp": 16, "global_batch_size": 1536, "micro_batch_size": 1,
                    "recompute": "full",
                },
            }
        )
    )
    from_config = run_json(monkeypatch, capsys, "estimate", "--config", str(config), "--set", "plan.tp=4")
    assert from_config["plan"]["tp"] == 4
    assert from_config["plan"]["dp"] == 1536 // (4 * 16)

    from_flags = run_json(
        monkeypatch, capsys, "estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb",
        "--devices", "1536", "--tp", "4", "--pp", "16", "--global-batch", "1536", "--micro-batch", "1",
        "--recompute", "full",
    )
    assert from_flags == from_config


def test_set_changes_one_field_of_a_catalog_model_or_cluster(monkeypatch, capsys, tmp_path):
    """--set model.seq_len on a config naming a catalog model keeps the rest of the model (before,
    the name gave way to a mapping of the one field, and the run failed on num_layers)."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"model": "gpt2", "cluster": "dgx-h100", "devices": 1}))
    base = run_json(monkeypatch, capsys, "estimate", "--config", str(config))
    longer = run_json(monkeypatch, capsys, "estimate", "--config", str(config), "--set", "model.seq_len=2048")
    assert longer["plan"]["seq_len"] == 2048 and base["plan"]["seq_len"] == 1024
    assert longer["params"] == base["params"] and longer["step_time_s"] > base["step_time_s"]
    slower = run_json(monkeypatch, capsys, "estimate", "--config", str(config), "--set", "cluster.device.hbm_bytes_per_s=1 TB/s")
    assert slower["step_time_s"] > base["step_time_s"]


def test_config_accepts_a_cluster_mapping(monkeypatch, capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model": "gpt3-175b",
                "devices": 1536,
                "cluster": {
                    "id": "my-a100", "name": "my A100 cluster", "device": "a100-sxm4-80gb",
                    "levels": [
                        {"name": "nvlink", "size": 8, "bytes_per_s": "300 GB/s", "latency_s": "5 us"},
                        {"name": "ib", "bytes_per_s": "200 Gb/s", "latency_s": "10 us"},
                    ],
                },
                "plan": {"tp": 8, "pp": 16, "global_batch_size": 1536},
            }
        )
    )
    result = run_json(monkeypatch, capsys, "estimate", "--config", str(config))
    assert result["cluster_id"] == "my-a100"
    assert result["step_time_s"] > 0


def test_trace_events_end_at_the_step_time(monkeypatch, capsys, tmp_path):
    out = tmp_path / "out.json"
    result = run_json(monkeypatch, capsys, "estimate", *GPT3_FLAGS, "--trace", str(out))
    trace = json.loads(out.read_text())
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert spans
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in spans)
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"compute", "tp"} <= threads
    end_s = max(e["ts"] + e["dur"] for e in spans) / 1e6
    assert math.isclose(end_s, result["step_time_s"], rel_tol=0.01)


def test_serving_trace_ends_after_the_decode_steps_it_draws(monkeypatch, capsys, tmp_path):
    """The prefill and the first decode steps, drawn from the scheduled tasks: the last event
    ends at ttft + k x tpot; a marker stands for the other decode steps."""
    out = tmp_path / "serve.json"
    result = run_json(monkeypatch, capsys, "estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--devices", "16",
                      "--tp", "8", "--pp", "2", "--task", "inference", "--batch", "8", "--prompt-len", "512",
                      "--output-len", "64", "--trace", str(out))
    trace = json.loads(out.read_text())
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in spans)
    processes = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert len(processes) == 2  # first and last stage
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"compute", "tp", "pp"} <= threads
    streams = {(e["pid"], e["tid"]) for e in spans}
    assert (1, 5) in streams and (2, 1) in streams  # the first stage's sends, the last stage's tp collectives
    phases = [e["args"]["phase"] for e in spans]
    assert phases[0] == "prefill" and {f"decode step {k}" for k in range(1, 5)} <= set(phases)
    steps = trace["metadata"]["decode_steps_drawn"]
    assert steps == 4
    end_s = max(e["ts"] + e["dur"] for e in spans) / 1e6
    assert math.isclose(end_s, result["ttft_s"] + steps * result["tpot_s"], rel_tol=1e-9)
    prefill_end_s = max(e["ts"] + e["dur"] for e in spans if e["args"]["phase"] == "prefill") / 1e6
    assert math.isclose(prefill_end_s, result["ttft_s"], rel_tol=1e-9)
    (marker,) = [e for e in events if e["ph"] == "i"]
    assert marker["name"].startswith("60 more decode steps")


@pytest.mark.parametrize("schedule, extra", [
    ("gpipe", []), ("1f1b", ["--vpp", "2"]), ("zb-h1", []), ("dualpipe", []),
])
def test_every_schedule_traces_to_the_step_time(monkeypatch, capsys, tmp_path, schedule, extra):
    out = tmp_path / "out.json"
    flags = ["--model", "llama3-8b", "--cluster", "dgx-a100-80gb", "--devices", "8", "--tp", "2", "--pp", "4",
             "--global-batch", "16", "--recompute", "full", "--seq-len", "1024", "--schedule", schedule, *extra]
    result = run_json(monkeypatch, capsys, "estimate", *flags, "--trace", str(out))
    spans = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in spans)
    end_s = max(e["ts"] + e["dur"] for e in spans) / 1e6
    assert math.isclose(end_s, result["step_time_s"], rel_tol=1e-6)


def test_hf_config_path_as_model(monkeypatch, capsys):
    result = run_json(
        monkeypatch, capsys, "estimate", "--model", str(LLAMA3_8B_HF), "--cluster", "dgx-h100", "--tp", "8"
    )
    assert result["num_devices"] == 8
    assert result["plan"]["tp"] == 8
    assert result["step_time_s"] > 0


def test_a_framework_named_as_cases_name_it(monkeypatch, capsys):
    """--framework takes the names a validation case may use (catalog.FRAMEWORK_ALIASES)."""
    flags = ("--model", str(LLAMA3_8B_HF), "--cluster", "dgx-h100", "--devices", "8", "--zero", "3",
             "--global-batch", "16", "--micro-batch", "2", "--seq-len", "2048")
    preset = run_json(monkeypatch, capsys, "estimate", *flags, "--framework", "pytorch-fsdp")
    for other in ("huggingface", "Hugging Face", "fsdp2"):
        named = run_json(monkeypatch, capsys, "estimate", *flags, "--framework", other)
        assert named["plan"]["framework"] == "pytorch-fsdp"
        assert named["step_time_s"] == preset["step_time_s"]
        assert named["plan"]["optimizer_impl"] == "foreach"


@pytest.mark.skipif(not PUBLIC_CASES.is_file(), reason="shared/validation is not checked out beside the repo")
def test_validate_json_reports_every_case(monkeypatch, capsys):
    cases = yaml.safe_load(PUBLIC_CASES.read_text())
    results = run_json(monkeypatch, capsys, "validate", str(PUBLIC_CASES))
    assert isinstance(results, list)
    assert [r["id"] for r in results] == [c["id"] for c in cases]
    for r in results:
        for key in ("id", "group", "measured_step_time_s", "predicted_step_time_s", "relative_error"):
            assert key in r
        if r["error"] is None:
            expected = (r["predicted_step_time_s"] - r["measured_step_time_s"]) / r["measured_step_time_s"]
            assert math.isclose(r["relative_error"], expected, rel_tol=1e-9)
    dlrm = [r for r in results if "dlrm" in r["id"]]
    assert dlrm
    for r in dlrm:  # DLRM cases run (MAD Max default strategy), tests/test_dlrm.py holds their target
        assert r["error"] is None
        assert r["predicted_step_time_s"] > 0 and r["relative_error"] is not None


def test_catalog_list(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "catalog", "list")
    assert code == 0
    ids = {line.strip() for line in out.splitlines()}
    assert {"gpt3-175b", "dgx-h100", "h100-sxm5-80gb"} <= ids


def test_catalog_list_one_kind(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "catalog", "list", "models")
    assert code == 0
    ids = {line.strip() for line in out.splitlines()}
    assert "gpt3-175b" in ids
    assert "dgx-h100" not in ids


def test_catalog_show_device_has_peak_and_sources(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "catalog", "show", "h100-sxm5-80gb")
    assert code == 0
    entry = yaml.safe_load(out)  # the header line is a YAML comment
    assert entry["peak_flop_per_s"]["bf16"]
    assert entry["sources"]["peak_flop_per_s"]


def test_bare_command_prints_help_without_error(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys)
    assert code == 0 and err == ""  # the help is the answer; exit 2 is kept for one error line
    assert "estimate" in out
    assert "Traceback" not in err and "internal error" not in err


def test_installed_script_runs():
    script = installed_script()
    if script is None:
        pytest.skip("the meshplan script is not installed")
    done = subprocess.run([script, "estimate", *GPT3_FLAGS, "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["plan"]["dp"] == 12


def test_installed_script_bad_input_exits_2():
    script = installed_script()
    if script is None:
        pytest.skip("the meshplan script is not installed")
    args = ["estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--devices", "1536", "--tp", "8",
            "--pp", "16", "--dp", "10"]
    done = subprocess.run([script, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "plan.dp" in errors[0]


def test_python_dash_m_runs():
    done = subprocess.run(
        [sys.executable, "-m", "meshplan.cli", "catalog", "list", "clusters"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "dgx-h100" in {line.strip() for line in done.stdout.splitlines()}


def test_plan_that_does_not_fit_prints_the_result_and_exits_2(monkeypatch, capsys):
    """GPT-3 175B on one 8-GPU node: the result and its memory breakdown, then one error line."""
    code, out, err = run_cli(
        monkeypatch, capsys, "estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb",
        "--devices", "8", "--tp", "8", "--global-batch", "8", "--json",
    )
    assert code == 2
    result = json.loads(out)
    assert result["fits"] is False
    assert result["memory"]["total_bytes"] > result["memory"]["capacity_bytes"]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: memory") and "zero" in lines[0]
