"""Fuzz the CLI with generated inputs (hypothesis): every run ends in exit 0, 2 or 130, never a
traceback or an internal error; exit 2 is one line that starts with ``error:``; exit 0 prints only
finite numbers, none negative where the quantity cannot be. 2,500 examples per run, derandomized
so CI is reproducible."""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_runner import run_cli

HF = Path(__file__).parent / "fixtures" / "hf"
CASES = Path(__file__).resolve().parents[2] / "shared" / "validation" / "public-cases.yaml"
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: keys whose values may be negative (errors; the runner-up's per-component differences from the
#: best plan, components_s); everything else numeric must be >= 0
SIGNED = {"relative_error", "components_s"}

numbers = st.one_of(
    st.integers(-3, 3), st.integers(0, 10**6), st.sampled_from([0, 1, 2, 4, 8, 16, 64, 1536, 2**40, -1]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["nan", "inf", "-inf", "1e400", "8.5", "0x10", ""]),
)
words = st.one_of(st.text(max_size=12), st.sampled_from(["gpt3-175b", "llama3-8b", "mixtral-8x7b", "dlrm-a", "dgx-h100",
                                                         "tpu-v4-pod", "none", "full", "fp8", "1f1b", "gpipe"]))
values = st.one_of(numbers, words, st.booleans(), st.none(), st.lists(st.integers(-2, 16), max_size=4))


def check(code: int, out: str, err: str) -> None:
    assert code in (0, 2, 130), (code, err)
    assert "Traceback" not in err and "internal error" not in err, err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), err
    if code == 0 and out.lstrip().startswith(("{", "[")):
        _finite(json.loads(out), "")


def _finite(value, key: str) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _finite(v, key if key in SIGNED else k)
    elif isinstance(value, list):
        for v in value:
            _finite(v, key)
    elif isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)):
        assert math.isfinite(value), (key, value)
        assert key in SIGNED or value >= -1e-12, (key, value)


def _text(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip() if not isinstance(value, str) else value


ESTIMATE_FLAGS = ["--devices", "--tp", "--pp", "--dp", "--cp", "--ep", "--global-batch", "--micro-batch", "--seq-len",
                  "--vpp", "--zero", "--schedule", "--recompute", "--precision", "--train-tokens", "--task",
                  "--frozen-layers", "--batch", "--prompt-len", "--output-len", "--strategy"]
PLAN_KEYS = ["tp", "pp", "dp", "cp", "ep", "expert_tp", "micro_batch_size", "global_batch_size", "seq_len",
             "virtual_pipeline_stages", "first_stage_layers", "last_stage_layers", "zero_stage", "zero_shard_size",
             "recompute", "precision", "schedule", "sequence_parallel", "order", "flash_attention", "bogus"]


@settings(max_examples=900, **SETTINGS)
@given(model=st.sampled_from(["gpt3-175b", "llama3-8b", "mixtral-8x7b", "deepseek-v3", "dlrm-a", "nope"]),
       flags=st.lists(st.tuples(st.sampled_from(ESTIMATE_FLAGS), values), max_size=4),
       sets=st.lists(st.tuples(st.sampled_from(["plan", "task", "cluster", "devices", "model"]),
                               st.sampled_from(PLAN_KEYS + ["kind", "train_tokens", "batch_size"]), values), max_size=3))
def test_estimate_flags_and_overrides(monkeypatch, capsys, model, flags, sets):
    args = ["estimate", "--model", model, "--cluster", "dgx-h100", "--devices", "64", "--json"]
    for flag, value in flags:
        args += [flag, _text(value)]
    for section, key, value in sets:
        args += ["--set", f"{section}.{key}={_text(value)}" if section in ("plan", "task") else f"{section}={_text(value)}"]
    check(*run_cli(monkeypatch, capsys, *args))


@settings(max_examples=500, **SETTINGS)
@given(config=st.one_of(values, st.dictionaries(st.sampled_from(["model", "cluster", "devices", "plan", "task", "space", "x"]),
                                                st.one_of(values, st.dictionaries(st.sampled_from(PLAN_KEYS), values, max_size=3)),
                                                max_size=5)),
       as_json=st.booleans(), raw=st.sampled_from([None, b"\xff\xfe\x00bad", b"[" * 5000, b"a: [", b"{\"plan\": "]))
def test_run_config_files(monkeypatch, capsys, tmp_path_factory, config, as_json, raw):
    path = tmp_path_factory.mktemp("cfg") / ("run.json" if as_json else "run.yaml")
    if raw is not None:
        path.write_bytes(raw)
    else:
        path.write_text(json.dumps(config, default=str) if as_json else yaml.safe_dump(config))
    check(*run_cli(monkeypatch, capsys, "estimate", "--config", str(path), "--json"))


HF_KEYS = ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
           "vocab_size", "head_dim", "model_type", "num_local_experts", "num_experts_per_tok", "max_position_embeddings",
           "hidden_act", "tie_word_embeddings", "n_routed_experts", "moe_intermediate_size", "first_k_dense_replace"]


@settings(max_examples=500, **SETTINGS)
@given(fixture=st.sampled_from(sorted(p.name for p in HF.iterdir() if p.name != "malformed")),
       changes=st.dictionaries(st.sampled_from(HF_KEYS), st.one_of(values, st.just("__delete__")), max_size=3))
def test_hf_configs(monkeypatch, capsys, tmp_path_factory, fixture, changes):
    config = json.loads((HF / fixture / "config.json").read_text())
    for key, value in changes.items():
        if value == "__delete__":
            config.pop(key, None)
        else:
            config[key] = value
    path = tmp_path_factory.mktemp("hf") / "config.json"
    path.write_text(json.dumps(config, default=str))
    check(*run_cli(monkeypatch, capsys, "estimate", "--model", str(path), "--cluster", "dgx-h100", "--devices", "8",
                   "--tp", "1", "--json"))


CASE_PATHS = ["id", "group", "model", "model.arch", "model.num_layers", "model.hidden_size", "model.num_attention_heads",
              "model.num_kv_heads", "model.ffn_hidden_size", "model.ffn_type", "model.moe", "model.interaction",
              "hardware", "hardware.cluster", "hardware.num_devices", "hardware.devices_per_node", "parallelism",
              "parallelism.tp", "parallelism.pp", "parallelism.dp", "parallelism.ep", "parallelism.virtual_pipeline_stages",
              "parallelism.activation_recompute", "batch", "batch.global_batch_sequences", "batch.micro_batch_size",
              "batch.seq_len", "batch.global_batch_samples", "precision", "measured", "measured.step_time_s"]


def _cases() -> list[dict]:
    return yaml.safe_load(CASES.read_text()) if CASES.is_file() else []


@settings(max_examples=500, **SETTINGS)
@given(index=st.integers(0, 62), changes=st.lists(st.tuples(st.sampled_from(CASE_PATHS), values), max_size=3),
       wrap=st.sampled_from(["list", "mapping", "scalar"]))
def test_validation_case_files(monkeypatch, capsys, tmp_path_factory, index, changes, wrap):
    cases = _cases()
    case = json.loads(json.dumps(cases[index % len(cases)])) if cases else {"id": "x"}
    for path, value in changes:
        node = case
        keys = path.split(".")
        for key in keys[:-1]:
            node = node.setdefault(key, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node[keys[-1]] = value
    data = {"list": [case], "mapping": case, "scalar": 3}[wrap]
    path = tmp_path_factory.mktemp("cases") / "cases.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(path), "--json")
    check(code, out, err)
    if wrap == "list":
        assert code == 0  # a bad case is reported in the output; the file still validates


@settings(max_examples=100, **SETTINGS)
@given(manifest=st.one_of(st.none(), st.binary(max_size=40), st.just(b"{}"), st.just(b"[1, 2]")),
       part=st.one_of(st.none(), st.binary(max_size=40)),
       kind=st.sampled_from(["folder", "file", "nested-in-file"]))
def test_stores(monkeypatch, capsys, tmp_path_factory, manifest, part, kind):
    root = tmp_path_factory.mktemp("store")
    store = root / "s"
    if kind == "folder":
        store.mkdir()
        if manifest is not None:
            (store / "search.json").write_bytes(manifest)
        if part is not None:
            (store / "plans-00000.parquet").write_bytes(part)
    else:
        store.write_bytes(b"x")
        store = store / "inner" if kind == "nested-in-file" else store
    search = ["search", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--devices", "64", "--global-batch", "64",
              "--executor", "serial", "--set", "space.tp=[8]", "--set", "space.pp=[8]", "--store", str(store), "--json"]
    check(*run_cli(monkeypatch, capsys, *search))
    check(*run_cli(monkeypatch, capsys, "results", "query", str(store), "select count(*) as n from plans", "--json"))
