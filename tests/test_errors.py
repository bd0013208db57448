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
from edits import mutate

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
    ("flag-not-an-int", [*GPT3, "--tp", "abc"], "--tp", ["got 'abc'", "a whole number"]),
    ("flag-fraction", [*GPT3, "--tp", "8", "--tp=1.5"], "--tp", ["got '1.5'", "a whole number"]),
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


def _spec(kind: str, id: str, **changes) -> dict:
    """Catalog entry ``id`` as a mapping, with ``changes`` at paths written with double
    underscores ("moe__top_k", "levels__1__size")."""
    from meshplan import catalog

    data = (catalog.cluster if kind == "cluster" else catalog.model)(id).model_dump(mode="json")
    for path, value in changes.items():
        data = mutate(data, tuple(int(p) if p.isdigit() else p for p in path.split("__")), value)
    return data


#: checks across a spec's fields name the field that breaks them, not the whole spec (which
#: they printed before: "model: got {'arch': 'dense', 'id': ..."), and the value it has
CROSS_FIELD = [
    ("model", {"id": "llama3-70b", "num_kv_heads": 3}, "model.num_kv_heads", 3),
    ("model", {"id": "llama3-70b", "hidden_size": 8200}, "model.hidden_size", 8200),
    ("model", {"id": "llama3-70b", "arch": "moe"}, "model.moe", None),
    ("model", {"id": "deepseek-v3", "arch": "dense"}, "model.arch", "dense"),
    ("model", {"id": "deepseek-v3", "moe__top_k": 300}, "model.moe.top_k", 300),
    ("model", {"id": "deepseek-v3", "moe__first_dense_layers": 99}, "model.moe.first_dense_layers", 99),
    ("model", {"id": "deepseek-v3", "ffn_hidden_size": None}, "model.ffn_hidden_size", None),
    ("cluster", {"id": "dgx-h100", "levels__0__size": None}, "cluster.levels.0.size", None),
    ("cluster", {"id": "dgx-h100", "levels__1__size": 12}, "cluster.levels.1.size", 12),
    ("cluster", {"id": "dgx-h100", "levels__0__group_domains": 4}, "cluster.levels.0.group_domains", 4),
    ("cluster", {"id": "tpu-v4-pod", "levels__0__torus_dims": [4, 4]}, "cluster.levels.0.torus_dims", (4, 4)),
    ("cluster", {"id": "dgx-h100", "device__sources": {}}, "cluster.device.sources", []),
]


@pytest.mark.parametrize(("kind", "changes", "field", "value"), CROSS_FIELD)
def test_cross_field_checks_name_the_field(kind, changes, field, value):
    inputs = {"model": "llama3-70b", "cluster": "dgx-h100", kind: _spec(kind, **changes)}
    with pytest.raises(MeshplanError) as caught:
        meshplan.estimate(**inputs, num_devices=64, tp=8)
    assert (caught.value.field, caught.value.value) == (field, value)
    assert "{" not in str(caught.value)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("num_layers", [], "model.num_layers: got []; a whole number"),
    ("num_layers", 3.7, "model.num_layers: got 3.7; a whole number"),
    ("num_layers", -1, "model.num_layers: got -1; at least 1"),
    ("num_layers", float("nan"), "model.num_layers: got nan; a finite number"),
    ("ffn_type", "relu3", "model.ffn_type: got 'relu3'; one of gelu, relu, squared_relu, swiglu, geglu"),
    ("moe", [], "model.moe: got []; a mapping"),
    ("tied_embeddings", "maybe", "model.tied_embeddings: got 'maybe'; true or false"),
])
def test_type_errors_say_what_is_valid_in_plain_words(field, value, message):
    """pydantic's "Input should be a valid integer" / "greater than or equal to 1" read as what
    would be valid, as meshplan's own checks do."""
    with pytest.raises(MeshplanError) as caught:
        meshplan.estimate(_spec("model", id="llama3-8b", **{field: value}), "dgx-h100", num_devices=8)
    assert str(caught.value) == message


def test_an_empty_list_of_values_to_search_says_one_entry(monkeypatch, capsys):
    line = error_line(monkeypatch, capsys, "search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8",
                      "--set", "space.tp=[]")
    assert line == "error: space.tp: got []; at least 1 entry"


def test_a_validation_case_names_the_model_field(monkeypatch, capsys, tmp_path):
    case = yaml.safe_load((Path(__file__).resolve().parent / "data" / "torchtitan_h100.yaml").read_text())[0]
    case["model"]["num_kv_heads"] = 3
    path = tmp_path / "cases.yaml"
    path.write_text(yaml.safe_dump([case]))
    code, out, _ = run_cli(monkeypatch, capsys, "validate", str(path), "--json")
    assert code == 0  # the case is reported, the others would still be scored
    assert json.loads(out)[0]["error"] == f"{case['id']}.model.num_kv_heads: got 3; a divisor of num_attention_heads (32)"


SMALL_SPACE = {"tp": [1, 2], "pp": [1], "micro_batch_size": [1], "virtual_pipeline_stages": [1], "recompute": ["none"],
               "zero_stage": [1], "sequence_parallel": [False]}


@pytest.mark.parametrize(("function", "kwargs", "field"), [
    ("estimate", {"model": 123}, "model"),
    ("estimate", {"cluster": 5}, "cluster"),
    ("estimate", {"plan": "tp=8"}, "plan"),
    ("estimate", {"plan": [1, 2]}, "plan"),
    ("estimate", {"profile": 5}, "--profile"),
    ("search", {"plan": 3}, "plan"),
    ("search", {"progress": "yes"}, "progress"),
    ("search", {"reference": [8, 1]}, "reference"),
    ("search", {"reference": {"tp": "eight"}}, "reference.tp"),
    ("search", {"store": 3}, "store"),
    ("search", {"store": ""}, "store"),
])
def test_api_arguments_of_the_wrong_kind_name_the_argument(tmp_path, monkeypatch, function, kwargs, field):
    """A notebook user's wrong argument is a MeshplanError naming it, never a TypeError from inside."""
    monkeypatch.chdir(tmp_path)  # a store that was written would land here
    base = {"model": "llama3-8b", "cluster": "dgx-h100", "num_devices": 8, "global_batch_size": 8}
    if function == "search":
        base["space"] = SMALL_SPACE
    with pytest.raises(MeshplanError) as caught:
        getattr(meshplan, function)(**{**base, **kwargs})
    assert caught.value.field == field
    assert not list(tmp_path.iterdir())


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


# --- issue 7 reproducers: each was a traceback, an internal error or a silent wrong answer -------

LLAMA8 = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--tp", "8"]
SEARCH8 = ["search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--executor", "serial",
           "--set", "space.pp=[1]", "--set", "space.micro_batch_size=[1]", "--set", "space.virtual_pipeline_stages=[1]"]

REPRODUCERS = [
    ("space-empty-list", [*SEARCH8, "--set", "space.tp=[]"], "space.tp", ["[]", "at least 1"]),
    ("space-zero", [*SEARCH8, "--set", "space.tp=[0]"], "space.tp", ["0"]),
    ("space-not-a-list", [*SEARCH8, "--set", "space.tp=foo"], "space.tp", ["foo", "list"]),
    ("space-zero-stage-4", [*SEARCH8, "--set", "space.zero_stage=[4]"], "space.zero_stage", ["4", "3"]),
    ("search-plan-field-it-searches", [*SEARCH8, "--set", "plan.tp=8"], "plan.tp", ["space.tp"]),
    ("search-dp-fixed", [*SEARCH8, "--set", "plan.dp=8"], "plan.dp", ["device count"]),
    ("serving-search-ignored-space", [*SEARCH8, "--task", "inference", "--batch", "8"], "space.micro_batch_size",
     ["tp, pp"]),
    ("dlrm-search-space", ["search", "--model", "dlrm-a", "--cluster", "zionex-a100", "--devices", "128",
                           "--global-batch", "65536", "--set", "space.tp=[1]"], "space.tp", ["DLRM"]),
    ("estimate-devices-0", [*LLAMA8[:-2], "--devices", "0"], "num_devices", ["0"]),
    ("estimate-devices-0-strategy", ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "0",
                                     "--strategy", "transformer=(tp,ddp)"], "num_devices", ["0"]),
    ("search-devices-0", [*SEARCH8[:5], "--devices", "0", "--executor", "serial"], "num_devices", ["0"]),
    ("search-devices-negative", [*SEARCH8[:5], "--devices", "-8"], "num_devices", ["-8"]),
    ("nan-global-batch", [*LLAMA8, "--set", "plan.global_batch_size=.nan"], "plan.global_batch_size", ["nan"]),
    ("inf-train-tokens-set", [*LLAMA8, "--set", "task.train_tokens=.inf"], "task.train_tokens", ["inf", "finite"]),
    ("inf-train-tokens-flag", [*LLAMA8, "--train-tokens", "inf"], "task.train_tokens", ["inf", "finite"]),
    ("nan-train-tokens-flag", [*LLAMA8, "--train-tokens", "nan"], "task.train_tokens", ["nan"]),
    ("huge-count", [*LLAMA8, "--set", "plan.global_batch_size=" + "9" * 400], "plan.global_batch_size", ["9007199254740992"]),
    ("workers-zero", [*SEARCH8, "--executor", "local", "--workers", "0"], "--workers", ["0", "between 1"]),
    ("workers-negative", [*SEARCH8, "--executor", "local", "--workers", "-1"], "--workers", ["-1"]),
    ("workers-huge", [*SEARCH8, "--executor", "local", "--workers", "1000000"], "--workers", ["1000000"]),
    ("workers-with-serial", [*SEARCH8, "--workers", "2"], "--workers", ["--executor local"]),
    ("executor-unknown", [*SEARCH8, "--executor", "threads"], "--executor", ["threads", "serial"]),
    ("top-zero", [*SEARCH8, "--top", "0"], "top", ["0", "at least 1"]),
    ("top-negative", [*SEARCH8, "--top", "-3"], "top", ["-3"]),
    ("batch-with-training", [*LLAMA8, "--batch", "4"], "task.batch_size", ["4", "inference"]),
    ("prompt-len-with-training", [*LLAMA8, "--prompt-len", "128"], "task.prompt_len", ["inference"]),
    ("output-len-with-finetune", [*LLAMA8, "--task", "finetune", "--output-len", "8"], "task.output_len", ["inference"]),
    ("frozen-layers-without-finetune", [*LLAMA8, "--frozen-layers", "4"], "task.frozen_layers", ["finetune"]),
    ("train-tokens-with-inference", [*LLAMA8, "--task", "inference", "--train-tokens", "1e9"], "task.train_tokens",
     ["inference"]),
    ("dlrm-train-tokens", ["estimate", "--model", "dlrm-a", "--cluster", "zionex-a100", "--devices", "128",
                           "--global-batch", "65536", "--train-tokens", "1e9"], "task.train_tokens", ["DLRM"]),
    ("flag-and-set-disagree", [*LLAMA8[:-2], "--tp", "4", "--set", "plan.tp=8"], "--set plan.tp", ["8", "4"]),
    ("devices-flag-and-set-disagree", [*LLAMA8, "--set", "devices=16"], "--set devices", ["16", "8"]),
    ("cluster-flag-and-set", [*LLAMA8, "--set", "cluster.levels=[]"], "--set cluster", ["dgx-h100"]),
    ("strategy-contradicts-tp", [*LLAMA8[:-2], "--strategy", "transformer=(tp,ddp)", "--tp", "4"], "plan.tp",
     ["4", "tp=8"]),
    ("trace-too-many-micro-batches", [*LLAMA8, "--global-batch", "10000000", "--trace", "/tmp/never-written.json"],
     "--trace", ["10000000"]),
]


@pytest.mark.parametrize(("args", "field", "words"), [c[1:] for c in (*FLAG_CASES, *REPRODUCERS)],
                         ids=[c[0] for c in (*FLAG_CASES, *REPRODUCERS)])
def test_bad_flags(monkeypatch, capsys, args, field, words):
    """Each bad flag (and each reproducer of issue 7) is one error line naming the field."""
    line = error_line(monkeypatch, capsys, *args)
    assert field in line
    for word in words:
        assert word in line


@pytest.mark.parametrize("content", [bytes(range(256)), b"\x00" * 64, "model: x\n".encode("utf-16")],
                         ids=["binary", "nul", "utf-16"])
@pytest.mark.parametrize("use", ["config-yaml", "config-json", "model", "validate"])
def test_binary_files_name_the_file(monkeypatch, capsys, tmp_path, content, use):
    path = tmp_path / ("config.json" if use in ("model", "config-json") else "input.yaml")
    path.write_bytes(content)
    args = {
        "config-yaml": ["estimate", "--config", str(path)],
        "config-json": ["estimate", "--config", str(path)],
        "model": ["estimate", "--model", str(path), "--cluster", "dgx-h100"],
        "validate": ["validate", str(path)],
    }[use]
    line = error_line(monkeypatch, capsys, *args)
    assert str(path) in line
    assert "UTF-8" in line or "malformed" in line or "JSON" in line


@pytest.mark.parametrize("text", ["[" * 100_000, "{" * 100_000, "a: " + "{b: " * 50_000, '{"a": ' * 50_000,
                                  "[" * 65 + "]" * 65], ids=["brackets", "braces", "flow-mappings", "json-objects", "65-deep"])
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_deeply_nested_files_are_one_error(monkeypatch, capsys, tmp_path, text, suffix):
    """libyaml's composer used to crash the interpreter (segfault) at 100k nested '['; json raised RecursionError."""
    path = tmp_path / f"run{suffix}"
    path.write_text(text)
    line = error_line(monkeypatch, capsys, "estimate", "--config", str(path))
    assert str(path) in line
    assert "nest" in line or "malformed" in line


def test_deeply_nested_set_value(monkeypatch, capsys):
    line = error_line(monkeypatch, capsys, *LLAMA8, "--set", "plan.tp=" + "[" * 100_000)
    assert "--set plan.tp" in line
    assert "nest" in line


def test_deeply_nested_hf_config(monkeypatch, capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[" * 100_000)
    line = error_line(monkeypatch, capsys, "estimate", "--model", str(path), "--cluster", "dgx-h100")
    assert "path" in line and "nest" in line


def test_deeply_nested_validation_file(monkeypatch, capsys, tmp_path):
    path = tmp_path / "cases.yaml"
    path.write_text("- " * 20_000 + "x\n")
    line = error_line(monkeypatch, capsys, "validate", str(path))
    assert str(path) in line


def test_error_line_escapes_newlines_in_keys(monkeypatch, capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text('"a\\nb": 1\n')
    line = error_line(monkeypatch, capsys, "estimate", "--config", str(config))
    assert "a\\nb" in line


# --- stores -------------------------------------------------------------------------------------

STORE_SEARCH = [*SEARCH8, "--set", "space.tp=[2,8]", "--set", "space.recompute=[full]", "--set", "space.zero_stage=[0]",
                "--set", "space.sequence_parallel=[false]"]


def test_store_path_that_is_a_file(monkeypatch, capsys, tmp_path):
    path = tmp_path / "store"
    path.write_text("not a folder")
    line = error_line(monkeypatch, capsys, *STORE_SEARCH, "--store", str(path))
    assert "--store" in line and str(path) in line


def test_store_path_inside_a_file(monkeypatch, capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    line = error_line(monkeypatch, capsys, *STORE_SEARCH, "--store", str(tmp_path / "file" / "store"))
    assert "--store" in line


@pytest.mark.parametrize("damage", ["manifest", "part"])
def test_damaged_store(monkeypatch, capsys, tmp_path, damage):
    store = tmp_path / "store"
    code, _, err = run_cli(monkeypatch, capsys, *STORE_SEARCH, "--store", str(store))
    assert code == 0, err
    target = store / ("search.json" if damage == "manifest" else "plans-00000.parquet")
    target.write_bytes(b"\x00garbage\xff")
    line = error_line(monkeypatch, capsys, *STORE_SEARCH, "--store", str(store))
    assert "--store" in line and target.name in line
    if damage == "part":
        line = error_line(monkeypatch, capsys, "results", "query", str(store), "select count(*) from plans")
        assert "results" in line


@pytest.mark.parametrize("name", ["it's", 'say "hi"', "with space", "a[1]*?", "x'); select 42; --"])
def test_store_names_are_never_pasted_into_sql(monkeypatch, capsys, tmp_path, name):
    store = tmp_path / name
    code, _, err = run_cli(monkeypatch, capsys, *STORE_SEARCH, "--store", str(store))
    assert code == 0, err
    code, out, err = run_cli(monkeypatch, capsys, "results", "query", str(store), "select count(*) as n from plans", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["n"] > 0


def test_results_query_empty_sql(monkeypatch, capsys, tmp_path):
    store = tmp_path / "store"
    run_cli(monkeypatch, capsys, *STORE_SEARCH, "--store", str(store))
    line = error_line(monkeypatch, capsys, "results", "query", str(store), " ")
    assert "sql" in line


def test_results_json_has_no_nan(monkeypatch, capsys, tmp_path):
    store = tmp_path / "store"
    run_cli(monkeypatch, capsys, *STORE_SEARCH, "--store", str(store))
    code, out, _ = run_cli(monkeypatch, capsys, "results", "query", str(store), "select 'nan'::double x, 1/0 y", "--json")
    assert code == 0
    assert json.loads(out) == [{"x": None, "y": None}]


# --- exit 0 means finite, non-negative numbers --------------------------------------------------


def test_huge_batch_has_no_negative_exposed_time(monkeypatch, capsys):
    """Float cancellation made exposed dp time -0.01 s at 1e15 sequences per step."""
    code, out, err = run_cli(monkeypatch, capsys, *LLAMA8, "--global-batch", "1000000000000000", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert all(v >= 0 for v in result["breakdown"]["exposed_comm_s"].values())


def test_search_json_when_every_plan_fits_is_finite(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, *SEARCH8, "--set", "space.tp=[8]", "--set", "space.recompute=[full]", "--json")
    assert code == 0, err
    assert json.loads(out)["leanest_infeasible_bytes"] is None


def test_flag_and_set_that_agree_are_fine(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, *LLAMA8, "--set", "plan.tp=8", "--set", "devices=8", "--json")
    assert code == 0, err


def test_flag_overrides_the_config_file(monkeypatch, capsys, tmp_path):
    config = write(tmp_path / "run.yaml", {"model": "llama3-8b", "cluster": "dgx-h100", "devices": 16, "plan": {"tp": 4}})
    code, out, err = run_cli(monkeypatch, capsys, "estimate", "--config", config, "--devices", "8", "--tp", "8", "--json")
    assert code == 0, err
    assert json.loads(out)["num_devices"] == 8


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("field", ["bytes_per_s", "latency_s", "efficiency"])
def test_non_finite_cluster_numbers(monkeypatch, capsys, tmp_path, value, field):
    cluster = custom_cluster("300 GB/s")
    cluster["levels"][0][field] = value
    config = write(tmp_path / "run.yaml", {"model": "gpt3-175b", "devices": 16, "cluster": cluster, "plan": {"tp": 8}})
    line = error_line(monkeypatch, capsys, "estimate", "--config", config)
    assert f"cluster.levels.0.{field}" in line


@pytest.mark.parametrize("field", ["hbm_bytes", "tdp_w"])
def test_non_finite_device_numbers(monkeypatch, capsys, tmp_path, field):
    from meshplan import catalog

    device = catalog.device("a100-sxm4-80gb").model_dump(mode="json")
    device[field] = float("inf")
    cluster = dict(custom_cluster("300 GB/s"), device=device)
    config = write(tmp_path / "run.yaml", {"model": "gpt3-175b", "devices": 16, "cluster": cluster, "plan": {"tp": 8}})
    line = error_line(monkeypatch, capsys, "estimate", "--config", config)
    assert f"cluster.device.{field}" in line
    assert "inf" in line
