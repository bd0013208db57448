"""Bad input gets one clear message naming the field, the value and what is valid; exit code 2.

Every case runs through the real CLI entry point (``meshplan.cli.main``) and checks that stderr
holds exactly one ``error:`` line, that it names the field and the key words of what is wrong,
and that no traceback leaks out. The Python API raises the same ``MeshplanError`` with the field
as an attribute.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

import meshplan
from meshplan.cli import main
from meshplan.errors import MeshplanError
from cli_runner import run_cli

HF_MALFORMED = Path(__file__).resolve().parent / "fixtures" / "hf" / "malformed" / "config.json"

GPT3 = ["estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb"]
GPT3_1536 = [*GPT3, "--devices", "1536", "--tp", "8", "--pp", "16"]

A100_LEVELS = [
    {"name": "nvlink", "size": 8, "bytes_per_s": "300 GB/s", "latency_s": "5 us"},
    {"name": "ib", "bytes_per_s": "200 Gb/s", "latency_s": "10 us"},
]


def custom_cluster(nvlink_bytes_per_s: object) -> dict:
    levels = [dict(A100_LEVELS[0], bytes_per_s=nvlink_bytes_per_s), A100_LEVELS[1]]
    return {"id": "my-a100", "name": "my A100 cluster", "device": "a100-sxm4-80gb", "levels": levels}


def error_line(monkeypatch, capsys, *args: str) -> str:
    """The single ``error:`` line of a run that must fail as bad input."""
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert "Traceback" not in err
    assert "internal error" not in err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def write(path: Path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


# (id, CLI arguments, field the message must name, other words it must contain)
FLAG_CASES = [
    ("unknown-model", ["estimate", "--model", "gpt3-175", "--cluster", "dgx-a100-80gb"], "model", ["gpt3-175"]),
    ("unknown-cluster", ["estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100"], "cluster", ["dgx-a100"]),
    ("no-model", ["estimate", "--cluster", "dgx-a100-80gb"], "model", ["--model"]),
    ("no-cluster", ["estimate", "--model", "gpt3-175b"], "cluster", ["--cluster"]),
    ("degrees-vs-devices", [*GPT3_1536, "--dp", "10"], "plan.dp", ["10", "1536", "12"]),
    ("devices-not-multiple", [*GPT3, "--devices", "100", "--tp", "8"], "num_devices", ["100", "tp*cp*pp"]),
    ("too-many-devices", [*GPT3, "--devices", "100000", "--tp", "8"], "num_devices", ["100000", "4096"]),
    ("heads-vs-tp", [*GPT3, "--devices", "5", "--tp", "5"], "plan.tp", ["5", "num_attention_heads", "96"]),
    ("layers-vs-pp", [*GPT3, "--devices", "128", "--pp", "128"], "plan.pp", ["128", "layers", "96"]),
    (
        "batch-vs-micro-batch",
        [*GPT3_1536, "--global-batch", "1000", "--micro-batch", "1"],
        "plan.global_batch_size",
        ["1000", "micro_batch_size", "12"],
    ),
    ("zero-tp", [*GPT3, "--devices", "8", "--tp", "0"], "plan.tp", ["0", "1"]),
    ("negative-devices", [*GPT3, "--devices", "-8", "--tp", "8"], "num_devices", ["-8"]),
    ("zero-micro-batch", [*GPT3_1536, "--micro-batch", "0"], "plan.micro_batch_size", ["0", "1"]),
    ("zero-vpp", [*GPT3_1536, "--vpp", "0"], "plan.virtual_pipeline_stages", ["0"]),
    ("bad-recompute", [*GPT3_1536, "--recompute", "most"], "plan.recompute", ["most", "selective", "full"]),
    ("bad-precision", [*GPT3_1536, "--precision", "int3"], "plan.precision", ["int3", "bf16"]),
    ("zero-stage-4", [*GPT3_1536, "--zero", "4"], "plan.zero_stage", ["4", "3"]),
    ("negative-train-tokens", [*GPT3_1536, "--train-tokens", "-5"], "task.train_tokens", ["-5", "0"]),
    ("set-unknown-plan-field", [*GPT3_1536, "--set", "plan.tpp=3"], "plan.tpp", ["unknown"]),
    ("set-unknown-key", [*GPT3_1536, "--set", "foo=3"], "--set", ["foo", "plan"]),
    ("set-without-value", [*GPT3_1536, "--set", "plan.tp"], "--set", ["plan.tp", "KEY=VALUE"]),
    ("set-devices-not-a-number", [*GPT3, "--tp", "8", "--set", "devices=abc"], "num_devices", ["abc"]),
    ("set-devices-fraction", [*GPT3, "--tp", "8", "--set", "devices=1.5"], "num_devices", ["1.5"]),
    ("set-plan-not-a-mapping", [*GPT3_1536, "--set", "plan=3"], "plan", ["3", "mapping"]),
    ("set-task-not-a-mapping", [*GPT3_1536, "--set", "task=3"], "task", ["3", "mapping"]),
    ("flag-not-an-int", [*GPT3, "--tp", "abc"], "--tp", ["integer"]),
    ("unknown-flag", [*GPT3, "--tpp", "8"], "--tpp", []),
    ("unknown-command", ["estimat"], "estimat", []),
    ("missing-config-file", [*GPT3_1536, "--config", "/no/such/run.yaml"], "/no/such/run.yaml", ["no such file"]),
    ("trace-into-missing-folder", [*GPT3_1536, "--trace", "/no/such/dir/t.json"], "--trace", ["/no/such/dir"]),
    ("hf-config-missing", ["estimate", "--model", "/no/such/config.json", "--cluster", "dgx-h100"], "config.json", []),
    ("hf-config-malformed", ["estimate", "--model", str(HF_MALFORMED), "--cluster", "dgx-h100"], "config.json", ["line"]),
    ("catalog-show-unknown", ["catalog", "show", "h100"], "id", ["h100", "h100-sxm5-80gb"]),
    ("catalog-list-unknown-kind", ["catalog", "list", "gpus"], "kind", ["gpus", "devices"]),
    ("validate-missing-file", ["validate", "/no/such/cases.yaml"], "/no/such/cases.yaml", ["no such file"]),
]


@pytest.mark.parametrize(("args", "field", "words"), [c[1:] for c in FLAG_CASES], ids=[c[0] for c in FLAG_CASES])
def test_bad_flags(monkeypatch, capsys, args, field, words):
    line = error_line(monkeypatch, capsys, *args)
    assert field in line
    for word in words:
        assert word in line


def test_unknown_model_suggests_the_closest_id(monkeypatch, capsys):
    line = error_line(monkeypatch, capsys, "estimate", "--model", "gpt3-175", "--cluster", "dgx-a100-80gb")
    assert "did you mean" in line
    assert "gpt3-175b" in line.split("did you mean", 1)[1]


def test_unknown_cluster_suggests_both_a100_sizes(monkeypatch, capsys):
    line = error_line(monkeypatch, capsys, "estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100")
    suggested = line.split("did you mean", 1)[1]
    assert "dgx-a100-40gb" in suggested
    assert "dgx-a100-80gb" in suggested


# --- run configs ------------------------------------------------------------------------------


def test_malformed_yaml_config_names_file_and_line(monkeypatch, capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("model: gpt3-175b\ncluster: dgx-a100-80gb\nplan:\n  tp: 8\n  pp: [16\n")
    line = error_line(monkeypatch, capsys, "estimate", "--config", str(config))
    assert "run.yaml" in line
    assert "line" in line
    assert "YAML" in line


def test_malformed_json_config_names_file_and_line(monkeypatch, capsys, tmp_path):
    config = tmp_path / "run.json"
    config.write_text('{\n  "model": "gpt3-175b",\n  "plan": {"tp": 8,}\n}\n')
    line = error_line(monkeypatch, capsys, "estimate", "--config", str(config))
    assert "run.json" in line
    assert "line 3" in line
    assert "JSON" in line


def test_config_that_is_not_a_mapping(monkeypatch, capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("- gpt3-175b\n- dgx-a100-80gb\n")
    line = error_line(monkeypatch, capsys, "estimate", "--config", str(config))
    assert "run.yaml" in line
    assert "mapping" in line


def test_negative_micro_batch_in_config(monkeypatch, capsys, tmp_path):
    config = write(
        tmp_path / "run.yaml",
        {"model": "gpt3-175b", "cluster": "dgx-a100-80gb", "devices": 1536,
         "plan": {"tp": 8, "pp": 16, "micro_batch_size": -1}},
    )
    line = error_line(monkeypatch, capsys, "estimate", "--config", config)
    assert "plan.micro_batch_size" in line
    assert "-1" in line


def test_unknown_top_level_key_in_config(monkeypatch, capsys, tmp_path):
    config = write(tmp_path / "run.yaml", {"model": "gpt3-175b", "clustr": "dgx-a100-80gb"})
    line = error_line(monkeypatch, capsys, "estimate", "--config", config)
    assert "clustr" in line
    assert "cluster" in line.split("clustr", 1)[1]  # the valid keys are listed


def test_unknown_plan_field_in_config(monkeypatch, capsys, tmp_path):
    config = write(
        tmp_path / "run.yaml",
        {"model": "gpt3-175b", "cluster": "dgx-a100-80gb", "devices": 1536, "plan": {"tpp": 8, "pp": 16}},
    )
    line = error_line(monkeypatch, capsys, "estimate", "--config", config)
    assert "plan.tpp" in line
    assert "unknown" in line


def test_set_override_with_bad_plan_field_on_top_of_config(monkeypatch, capsys, tmp_path):
    config = write(
        tmp_path / "run.yaml",
        {"model": "gpt3-175b", "cluster": "dgx-a100-80gb", "devices": 1536, "plan": {"tp": 8, "pp": 16}},
    )
    line = error_line(monkeypatch, capsys, "estimate", "--config", config, "--set", "plan.schedul=gpipe")
    assert "plan.schedul" in line


@pytest.mark.parametrize("bandwidth", ["900", "900 GB", "fast"])
def test_cluster_bandwidth_without_a_valid_unit_in_config(monkeypatch, capsys, tmp_path, bandwidth):
    config = write(
        tmp_path / "run.yaml",
        {"model": "gpt3-175b", "devices": 16, "cluster": custom_cluster(bandwidth), "plan": {"tp": 8}},
    )
    line = error_line(monkeypatch, capsys, "estimate", "--config", config)
    assert "cluster.levels.0.bytes_per_s" in line
    assert bandwidth in line
    assert "GB/s" in line  # says what a valid bandwidth looks like


def test_cluster_mapping_with_unknown_device_in_config(monkeypatch, capsys, tmp_path):
    cluster = dict(custom_cluster("300 GB/s"), device="a100-sxm9")
    config = write(tmp_path / "run.yaml", {"model": "gpt3-175b", "devices": 16, "cluster": cluster, "plan": {"tp": 8}})
    line = error_line(monkeypatch, capsys, "estimate", "--config", config)
    assert "device" in line
    assert "a100-sxm9" in line
    assert "a100-sxm4-80gb" in line


def test_malformed_validation_file(monkeypatch, capsys, tmp_path):
    cases = tmp_path / "cases.yaml"
    cases.write_text("- id: a\n  model: {num_layers: [1\n")
    line = error_line(monkeypatch, capsys, "validate", str(cases))
    assert "cases.yaml" in line
    assert "line" in line


# --- the Python API raises the same error, with the field as an attribute ---------------------


def test_api_rejects_bandwidth_without_units():
    with pytest.raises(MeshplanError) as caught:
        meshplan.estimate("gpt3-175b", cluster=custom_cluster("900"), num_devices=16, tp=8)
    assert caught.value.field == "cluster.levels.0.bytes_per_s"
    assert caught.value.value == "900"
    assert "unit" in caught.value.valid


def test_api_accepts_bandwidth_with_units():
    result = meshplan.estimate("gpt3-175b", cluster=custom_cluster("300 GB/s"), num_devices=16, tp=8)
    assert result.step_time_s > 0


@pytest.mark.parametrize(
    ("kwargs", "field", "value"),
    [
        ({"num_devices": 5, "tp": 5}, "plan.tp", 5),
        ({"num_devices": 128, "pp": 128}, "plan.pp", 128),
        ({"num_devices": 1536, "tp": 8, "pp": 16, "dp": 10}, "plan.dp", 10),
        ({"num_devices": 1536, "tp": 8, "pp": 16, "global_batch_size": 1000}, "plan.global_batch_size", 1000),
        ({"num_devices": 8, "tp": 0}, "plan.tp", 0),
        ({"num_devices": -8}, "num_devices", -8),
        ({"num_devices": "many"}, "num_devices", "many"),
        ({"num_devices": 8, "tpp": 8}, "plan.tpp", 8),
    ],
)
def test_api_error_fields(kwargs, field, value):
    with pytest.raises(MeshplanError) as caught:
        meshplan.estimate("gpt3-175b", "dgx-a100-80gb", **kwargs)
    assert caught.value.field == field
    assert caught.value.value == value


def test_error_is_a_value_error():
    """Callers that catch ValueError keep working."""
    with pytest.raises(ValueError):
        meshplan.estimate("gpt3-175", "dgx-a100-80gb")


def test_json_output_is_not_mixed_with_errors(monkeypatch, capsys):
    """A failing --json run prints nothing on stdout, so a pipe into a JSON reader sees no output."""
    monkeypatch.setattr(sys, "argv", ["meshplan", *GPT3_1536, "--dp", "10", "--json"])
    with pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    assert exit_.value.code == 2
    assert out == ""
    with pytest.raises(json.JSONDecodeError):
        json.loads(err)
