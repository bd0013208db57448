"""Fuzzing the CLI: malformed and odd-but-valid inputs, run in-process through ``meshplan.cli.main``.

Every run must end in one of two ways (issue 7, scope item 4):

- exit 0, and with ``--json`` only finite numbers, none negative where the quantity cannot be;
- exit 2 with exactly one stderr line, starting with ``error:``.

Never a traceback, never ``internal error:`` (exit 1). The examples are derandomized so CI is
reproducible; set ``MESHPLAN_FUZZ_SCALE=20`` to run twenty times as many random examples while
hunting for bugs (a failure prints the reproducing example).
"""

from __future__ import annotations

import json
import math
import os
import string
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_runner import run_cli
from edits import mutate, paths

SCALE = float(os.environ.get("MESHPLAN_FUZZ_SCALE", "1"))
HF = Path(__file__).resolve().parent / "fixtures" / "hf"
CASES = Path(__file__).resolve().parents[2] / "shared" / "validation" / "public-cases.yaml"


def fuzz(examples: int):
    """Hypothesis settings: deterministic in CI, ``examples`` times MESHPLAN_FUZZ_SCALE locally."""
    return settings(
        max_examples=max(1, int(examples * SCALE)),
        deadline=None,
        derandomize=SCALE == 1,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                               HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


# --- what every run must satisfy --------------------------------------------------------------

#: values that may be negative: a prediction's signed error, a runner-up's per-component deltas
SIGNED_KEYS = ("relative_error",)
SIGNED_UNDER = ("components_s",)


def numbers(data, path=""):
    """(path, number) for every number in parsed JSON."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from numbers(value, f"{path}.{key}")
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from numbers(value, f"{path}[{index}]")
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        yield path, data


def strict_json(text: str):
    def reject(constant):
        raise AssertionError(f"{constant} in JSON output")

    return json.loads(text, parse_constant=reject)


def check_output(out: str) -> None:
    data = strict_json(out)
    for path, value in numbers(data):
        assert math.isfinite(value), f"{path} = {value}"
        signed = path.rsplit(".", 1)[-1] in SIGNED_KEYS or any(f".{k}." in path for k in SIGNED_UNDER)
        if not signed:
            assert value >= 0, f"{path} = {value}"


def check_run(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    started = time.perf_counter()
    code, out, err = run_cli(monkeypatch, capsys, *args)
    elapsed = time.perf_counter() - started
    assert "Traceback" not in err, err
    assert "internal error" not in err, err
    assert code in (0, 2), (code, err)
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith("error:"), err
    if "--json" in args and "--help" not in args and (code == 0 or out.strip()):
        check_output(out)  # exit 2 may follow a full result (a plan that does not fit)
    assert elapsed < 30, f"{elapsed:.1f} s for {args}"
    return code, out, err


# --- value generators -------------------------------------------------------------------------

SMALL = st.sampled_from(["1", "2", "4", "8"])
ODD_INT = st.sampled_from(["0", "-1", "-8", "3", "5", "7", "16", "64", "1536", "100000", "9007199254740993",
                           "999999999999999999999999", "1e3", "1.5", "nan", "inf", "-inf", "", " ", "abc", "0x10", "８"])
INT_TEXT = st.one_of(SMALL, SMALL, ODD_INT, st.integers(-(10**6), 10**20).map(str))
FLOAT_TEXT = st.one_of(
    st.sampled_from(["1e9", "3e11", "15e12", "0", "-5", "nan", "inf", "-inf", "1e308", "1e-300", "1e400", "x"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
JUNK = st.text(alphabet=string.printable + "ü€\u200b", max_size=12)

#: YAML texts for --set values: numbers, specials, lists, mappings, malformed
YAML_VALUE = st.one_of(
    st.sampled_from([
        "8", "1", "0", "-4", "1.5", ".nan", ".inf", "-.inf", "1e400", "1e20", "null", "~", "true", "[]", "[0]",
        "[1,2]", "[1, 2, 4, 8]", "[foo]", "[1, .nan]", "{}", "{a: 1}", "foo", "'8'", "[", "{", "]", ": x", "- 1",
        "!!binary aGk=", "2024-01-01", "&a [*a]", "*b", "[[[[[[1]]]]]]", "1_000", "0o17", "!!python/name:os.system",
        "full", "selective", "gpipe", "1f1b", "bf16", "fp8", "inference", "finetune", "pretrain", "flash1", "flash4",
        "[" * 200, "{a: " * 100,
    ]),
    INT_TEXT,
    JUNK,
)

PLAN_KEYS = ["tp", "pp", "dp", "cp", "ep", "micro_batch_size", "global_batch_size", "seq_len", "virtual_pipeline_stages",
             "schedule", "zero_stage", "recompute", "precision", "sequence_parallel", "strategy", "first_stage_layers",
             "last_stage_layers", "zero_shard_size", "order", "flash_attention", "attention_kernel", "zero3_live_params", "fused_loss", "grad_reduce_precision", "tpp"]
TASK_KEYS = ["kind", "train_tokens", "frozen_layers", "freeze_embedding", "batch_size", "prompt_len", "output_len", "epochs"]
SPACE_KEYS = ["tp", "pp", "cp", "ep", "micro_batch_size", "virtual_pipeline_stages", "schedule", "recompute",
              "zero_stage", "sequence_parallel", "dp", "tpp"]
SET_KEY = st.one_of(
    st.sampled_from([f"plan.{k}" for k in PLAN_KEYS]),
    st.sampled_from([f"task.{k}" for k in TASK_KEYS]),
    st.sampled_from([f"space.{k}" for k in SPACE_KEYS]),
    st.sampled_from(["devices", "model", "cluster", "plan", "task", "space", "cluster.levels", "cluster.device",
                     "model.num_layers", "plan.tp.x", "foo", "", ".", "plan.", "=", "devices.x"]),
    JUNK,
)
SET_ARG = st.one_of(st.tuples(SET_KEY, YAML_VALUE).map(lambda kv: f"{kv[0]}={kv[1]}"), JUNK)

MODELS = ["llama3-8b", "gpt3-175b", "mixtral-8x7b", "llama3-70b", "dlrm-a", str(HF / "llama3-8b" / "config.json"),
          str(HF / "gpt2"), str(HF / "malformed" / "config.json"), "llama3-8", "", "/no/such/config.json"]
CLUSTERS = ["dgx-h100", "dgx-a100-80gb", "zionex-a100", "dgx-a100", ""]

INT_FLAGS = ["--devices", "--tp", "--pp", "--dp", "--cp", "--ep", "--global-batch", "--micro-batch", "--seq-len", "--vpp",
             "--zero", "--frozen-layers", "--batch", "--prompt-len", "--output-len"]
CHOICE_FLAGS = {
    "--schedule": ["1f1b", "gpipe", "zb"],
    "--recompute": ["none", "selective", "full", "most"],
    "--precision": ["bf16", "fp16", "fp8", "fp32", "fp4", "int3", "tf32"],
    "--task": ["pretrain", "finetune", "inference", "serve"],
    "--strategy": ["transformer=(tp,ddp)", "transformer=(ddp)", "embedding=(mp) dense=(tp,ddp)", "dense=(mp)",
                   "transformer=(fsdp)", "transformer=(tp,fsdp)", "(", "x=y"],
}


@st.composite
def flag(draw):
    kind = draw(st.sampled_from(["int", "int", "int", "choice", "float", "bool", "set"]))
    if kind == "int":
        return [draw(st.sampled_from(INT_FLAGS)), draw(INT_TEXT)]
    if kind == "choice":
        name = draw(st.sampled_from(sorted(CHOICE_FLAGS)))
        return [name, draw(st.one_of(st.sampled_from(CHOICE_FLAGS[name]), JUNK))]
    if kind == "float":
        return ["--train-tokens", draw(FLOAT_TEXT)]
    if kind == "bool":
        return [draw(st.sampled_from(["--sequence-parallel", "--no-sequence-parallel"]))]
    return ["--set", draw(SET_ARG)]


def flatten(parts: list[list[str]]) -> list[str]:
    return [token for part in parts for token in part]


# --- estimate: flags and --set ----------------------------------------------------------------


@fuzz(700)
@given(
    model=st.sampled_from(MODELS),
    cluster=st.sampled_from(CLUSTERS),
    devices=st.one_of(SMALL, st.sampled_from(["16", "64", "128", "0", "-8"])),
    flags=st.lists(flag(), max_size=5),
    as_json=st.booleans(),
)
def test_estimate_flags(monkeypatch, capsys, model, cluster, devices, flags, as_json):
    args = ["estimate", "--model", model, "--cluster", cluster, "--devices", devices, *flatten(flags)]
    check_run(monkeypatch, capsys, *args, *(["--json"] if as_json else []))


@fuzz(150)
@given(
    tp=SMALL, pp=st.sampled_from(["1", "2", "4"]), vpp=st.sampled_from(["1", "2"]), schedule=st.sampled_from(["1f1b", "gpipe"]),
    global_batch=st.sampled_from(["8", "64", "1024", "100000000"]),
)
def test_estimate_with_trace(monkeypatch, capsys, tmp_path, tp, pp, vpp, schedule, global_batch):
    trace = tmp_path / "t.json"
    args = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--tp", tp, "--pp", pp, "--vpp", vpp,
            "--schedule", schedule, "--global-batch", global_batch, "--devices", str(int(tp) * int(pp) * 2),
            "--trace", str(trace), "--json"]
    code, _, _ = check_run(monkeypatch, capsys, *args)
    if code == 0:
        check_output(trace.read_text())


# --- search: tiny spaces, serial ---------------------------------------------------------------

NARROW = ["--set", "space.pp=[1,2]", "--set", "space.micro_batch_size=[1]", "--set", "space.virtual_pipeline_stages=[1]",
          "--set", "space.recompute=[full]", "--set", "space.zero_stage=[0,1]"]
SPACE_LIST = st.one_of(
    st.lists(st.sampled_from(["1", "2", "4", "8", "0", "-1", "3", "1.5", ".nan", "x", "full", "gpipe", "true", "null"]),
             max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
    YAML_VALUE,
)


@st.composite
def search_flag(draw):
    kind = draw(st.sampled_from(["space", "space", "top", "workers", "executor", "objective", "plan", "misc", "set"]))
    if kind == "space":
        return ["--set", f"space.{draw(st.sampled_from(SPACE_KEYS))}={draw(SPACE_LIST)}"]
    if kind == "top":
        return ["--top", draw(INT_TEXT)]
    if kind == "workers":  # never a valid count: a valid one would start worker processes
        return ["--executor", "local", "--workers", draw(st.sampled_from(["0", "-1", "-100", "100000", "10000000000", "x", "1.5"]))]
    if kind == "executor":
        return ["--executor", draw(st.sampled_from(["serial", "SERIAL", "threads", "", "local "]))]
    if kind == "objective":
        return ["--objective", draw(st.sampled_from(["time", "memory", "", "TIME"]))]
    if kind == "plan":
        return [draw(st.sampled_from(["--global-batch", "--seq-len"])), draw(INT_TEXT)]
    if kind == "misc":
        return draw(st.sampled_from([["--precision", "fp8"], ["--precision", "fp4x"], ["--task", "inference", "--batch", "8"],
                                     ["--task", "inference"], ["--batch", "8"], ["--prompt-len", "0"], ["--task", "finetune"],
                                     ["--pareto"], ["--workers", "2"]]))
    return ["--set", draw(SET_ARG)]


@fuzz(250)
@given(
    model=st.sampled_from(["llama3-8b", "llama3-8b", "mixtral-8x7b", "gpt3-175b", str(HF / "gpt2")]),
    devices=st.sampled_from(["1", "2", "8", "16", "0", "-4", "3", "1e2", "x"]),
    flags=st.lists(search_flag(), max_size=4),
    as_json=st.booleans(),
)
def test_search_flags(monkeypatch, capsys, model, devices, flags, as_json):
    args = ["search", "--model", model, "--cluster", "dgx-h100", "--devices", devices, "--executor", "serial", *NARROW,
            *flatten(flags)]
    check_run(monkeypatch, capsys, *args, *(["--json"] if as_json else []))


@fuzz(12)
@given(flags=st.lists(st.sampled_from([["--top", "0"], ["--top", "1"], ["--set", "space.tp=[1]"], ["--set", "plan.strategy=x"],
                                       ["--global-batch", "65536"], ["--global-batch", "7"], ["--task", "inference"],
                                       ["--pareto"]]), max_size=2))
def test_search_dlrm(monkeypatch, capsys, flags):
    args = ["search", "--model", "dlrm-a", "--cluster", "zionex-a100", "--devices", "128", "--json", *flatten(flags)]
    check_run(monkeypatch, capsys, *args)


# --- run configs: random mappings, valid configs with one field broken --------------------------

SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.sampled_from([0, 1, 8, -1, 2**53 + 1, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["8", "bf16", "dgx-h100", "llama3-8b", "300 GB/s", "2 us"]),
    JUNK,
)
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.one_of(JUNK, st.sampled_from(PLAN_KEYS)), inner, max_size=3)),
                     max_leaves=8)
VALID_CONFIG = {"model": "llama3-8b", "cluster": "dgx-h100", "devices": 8,
                "plan": {"tp": 8, "global_batch_size": 16, "recompute": "full"}, "task": {"train_tokens": 1e12}}
CLUSTER_MAPPING = {"id": "mine", "name": "mine", "device": "h100-sxm5-80gb",
                   "levels": [{"name": "nvlink", "size": 8, "bytes_per_s": "450 GB/s", "latency_s": "3 us"},
                              {"name": "ib", "bytes_per_s": "50 GB/s", "latency_s": "10 us"}]}
MODEL_MAPPING = {"id": "tiny", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "ffn_hidden_size": 1024,
                 "vocab_size": 1000, "seq_len": 512}


def dump(data, suffix: str) -> str:
    if suffix == ".json":
        return json.dumps(data)  # NaN and Infinity are written as the JSON extension Python reads
    return yaml.safe_dump(data, allow_unicode=True)


def can_dump(data) -> bool:
    try:
        json.dumps(data)
        return True
    except (TypeError, ValueError, OverflowError):
        return False


@st.composite
def broken_config(draw):
    base = draw(st.sampled_from([VALID_CONFIG, {**VALID_CONFIG, "cluster": CLUSTER_MAPPING},
                                 {**VALID_CONFIG, "model": MODEL_MAPPING, "plan": {"tp": 2}}]))
    if draw(st.booleans()):
        return draw(st.one_of(VALUE, st.dictionaries(st.sampled_from(list(VALID_CONFIG) + ["space", "x"]), VALUE, max_size=4)))
    path = draw(st.sampled_from(list(paths(base))))
    delete = bool(path) and draw(st.booleans())
    return mutate(base, path, draw(VALUE), delete=delete)


@fuzz(400)
@given(config=broken_config(), suffix=st.sampled_from([".yaml", ".json"]), flags=st.lists(flag(), max_size=2),
       as_json=st.booleans())
def test_config_files(monkeypatch, capsys, tmp_path, config, suffix, flags, as_json):
    try:
        text = dump(config, suffix)
    except (TypeError, ValueError, OverflowError, yaml.YAMLError):
        text = repr(config)
    path = tmp_path / f"run{suffix}"
    path.write_text(text, encoding="utf-8")
    check_run(monkeypatch, capsys, "estimate", "--config", str(path), *flatten(flags), *(["--json"] if as_json else []))


# --- files that are not YAML or JSON at all: binary, deep, huge numbers ------------------------

RAW = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"\xff\xfe\x00\x00", b"\x00" * 50, "plan: {tp: 8}\n".encode("utf-16"), b"[" * 100_000,
                     b"{" * 100_000, b"{a: " * 50_000, b'{"a": ' * 50_000, b"- " * 10_000 + b"x", b"a: &a [*a]\n",
                     b"[1e999999]", b"model: llama3-8b\ndevices: 1e999\n", b"{\"model\": NaN}", b"\xef\xbb\xbfmodel: x\n",
                     b"%YAML 9.9\n---\n", b"--- a\n--- b\n", b"!!python/object:os.system ls\n", b"? [a, b]\n: c\n"]),
    st.integers(1, 2000).map(lambda n: ("[" * n + "]" * n).encode()),
    st.integers(1, 2000).map(lambda n: ("a:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, n % 300 + 2))).encode()),
)


@fuzz(200)
@given(raw=RAW, suffix=st.sampled_from([".yaml", ".json", ".yml", ""]),
       use=st.sampled_from(["config", "config", "model", "validate", "search-config"]))
def test_raw_files(monkeypatch, capsys, tmp_path, raw, suffix, use):
    path = tmp_path / f"input{suffix}"
    if use == "model":
        path = tmp_path / "config.json"
    path.write_bytes(raw)
    if use == "config":
        args = ["estimate", "--config", str(path), "--json"]
    elif use == "search-config":
        args = ["search", "--config", str(path), "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8",
                "--executor", "serial", *NARROW, "--json"]
    elif use == "model":
        args = ["estimate", "--model", str(path), "--cluster", "dgx-h100", "--devices", "8", "--json"]
    else:
        args = ["validate", str(path), "--json"]
    check_run(monkeypatch, capsys, *args)


# --- HuggingFace config.json files, mutated ------------------------------------------------------

HF_CONFIGS = {p.parent.name: json.loads(p.read_text()) for p in sorted(HF.glob("*/config.json")) if p.parent.name != "malformed"}
HF_VALUE = st.one_of(st.sampled_from([0, -1, 1, 2, 3, 7, 10**30, 2**53 + 1, 1e300, 1.5, 4096.0, "x", "4096", None, [], {}, True,
                                      float("nan"), float("inf"), "silu", "gelu", "relu", "llama", "gpt2", "mixtral"]), SCALAR)


@st.composite
def hf_config(draw):
    name = draw(st.sampled_from(sorted(HF_CONFIGS)))
    config = dict(HF_CONFIGS[name])
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.one_of(st.sampled_from(sorted(config)), JUNK))
        if draw(st.integers(0, 3)) == 0:
            config.pop(key, None)
        else:
            config[key] = draw(HF_VALUE)
    return name, config


@fuzz(300)
@given(named=hf_config(), tp=st.sampled_from(["1", "2", "8"]), task=st.sampled_from([[], ["--task", "inference", "--batch", "8"]]))
def test_hf_configs(monkeypatch, capsys, tmp_path, named, tp, task):
    name, config = named
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    try:
        text = json.dumps(config)
    except (ValueError, OverflowError):
        text = "{}"
    (folder / "config.json").write_text(text)
    check_run(monkeypatch, capsys, "estimate", "--model", str(folder / "config.json"), "--cluster", "dgx-h100",
              "--devices", "8", "--tp", tp, "--global-batch", "8", "--seq-len", "1024", *task, "--json")


# --- validation cases, mutated --------------------------------------------------------------------

PUBLIC_CASES = yaml.safe_load(CASES.read_text()) if CASES.is_file() else []


@st.composite
def broken_case(draw):
    case = draw(st.sampled_from(PUBLIC_CASES))
    for _ in range(draw(st.integers(1, 2))):
        path = draw(st.sampled_from([p for p in paths(case) if p]))
        delete = draw(st.integers(0, 3)) == 0
        case = mutate(case, path, draw(HF_VALUE), delete=delete)
    return case


@pytest.mark.skipif(not PUBLIC_CASES, reason="shared/validation/public-cases.yaml is not here")
@fuzz(250)
@given(case=broken_case(), more=st.booleans())
def test_validation_cases(monkeypatch, capsys, tmp_path, case, more):
    """A bad case is reported for that case, never for the file (exit 0), naming what is wrong, not
    as an internal error; the cases it scores have finite numbers."""
    cases = [case, PUBLIC_CASES[0]] if more else [case]
    path = tmp_path / "cases.yaml"
    path.write_text(dump(cases, ".yaml") if can_dump(cases) else "[]")
    code, out, err = check_run(monkeypatch, capsys, "validate", str(path), "--json")
    assert code == 0, err
    assert "internal error" not in out, out


# --- stored results, damaged, drawn by meshplan report ------------------------------------------

@pytest.fixture(scope="module")
def stored_results(tmp_path_factory):
    pytest.importorskip("plotly")
    from report_inputs import write_inputs

    paths_ = write_inputs(tmp_path_factory.mktemp("stored"))
    return {name: json.loads(paths_[name].read_text()) for name in
            ("estimate", "trace", "search", "validation", "inference", "dlrm")}


@fuzz(120)
@given(data=st.data(), value=HF_VALUE)
def test_damaged_report_inputs(monkeypatch, capsys, tmp_path, stored_results, data, value):
    """A stored estimate, search, validation or trace with one value changed or removed draws a
    report or is refused in one line, never an internal error."""
    kind = data.draw(st.sampled_from(sorted(stored_results)))
    original = stored_results[kind]
    path = data.draw(st.sampled_from([p for p in paths(original) if p]))
    damaged = mutate(original, path, value, delete=data.draw(st.integers(0, 3)) == 0 and isinstance(path[-1], str))
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    target = folder / f"{kind}.json"
    target.write_text(json.dumps(damaged) if can_dump(damaged) else "{}")
    if kind == "trace":
        (folder / "estimate.json").write_text(json.dumps(stored_results["estimate"]))
        check_run(monkeypatch, capsys, "report", str(folder / "estimate.json"), "--trace", str(target),
                  "--out", str(folder / "r.html"))
    else:
        check_run(monkeypatch, capsys, "report", str(target), "--out", str(folder / "r.html"))


# --- stores ----------------------------------------------------------------------------------------

STORE_SEARCH = ["search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--executor", "serial",
                "--set", "space.tp=[2,8]", "--set", "space.pp=[1]", "--set", "space.micro_batch_size=[1]",
                "--set", "space.virtual_pipeline_stages=[1]", "--set", "space.recompute=[full]", "--set", "space.zero_stage=[0]",
                "--set", "space.sequence_parallel=[false]", "--json"]
STORE_NAMES = ["plain", "with space", "it's", 'say "hi"', "a[1]*?", "semi;colon", "--dash", "ünï", "') ; drop table x; --",
               "x'); select 1; --"]
SQL = ["select count(*) n from plans", "select tp, pp, step_time_s from plans order by 3 limit 5", "select * from plans",
       "select avg(step_time_s) from plans", "select 1", "select nope from plans", "drop view plans", "", ";", "select 'nan'::double",
       "select 1/0", "pragma version"]


@fuzz(60)
@given(name=st.sampled_from(STORE_NAMES), damage=st.sampled_from(["none", "none", "manifest", "part", "part-empty",
                                                                    "file", "inside-file", "manifest-dir", "other-search"]),
       junk=st.binary(max_size=64), sql=st.sampled_from(SQL), resume=st.booleans())
def test_stores(monkeypatch, capsys, tmp_path, name, damage, junk, sql, resume):
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    store = root / name
    if damage == "file":
        store.write_bytes(junk)
    elif damage == "inside-file":
        (root / "f").write_bytes(junk)
        store = root / "f" / name
    elif damage != "none":
        check_run(monkeypatch, capsys, *STORE_SEARCH, "--store", str(store))
        if damage == "manifest":
            (store / "search.json").write_bytes(junk)
        elif damage == "manifest-dir":
            (store / "search.json").unlink()
            (store / "search.json").mkdir()
        elif damage == "part":
            (store / "plans-00000.parquet").write_bytes(junk)
        elif damage == "part-empty":
            (store / "plans-00001.parquet").write_bytes(b"")
        elif damage == "other-search":
            check_run(monkeypatch, capsys, *STORE_SEARCH, "--store", str(store), "--set", "space.tp=[1]")
    if resume or damage != "none":
        check_run(monkeypatch, capsys, *STORE_SEARCH, "--store", str(store))
    check_run(monkeypatch, capsys, "results", "query", str(store), sql, "--json")
    check_run(monkeypatch, capsys, "results", "query", str(store), sql)


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root may write read-only folders")
def test_read_only_store(monkeypatch, capsys, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        code, _, err = check_run(monkeypatch, capsys, *STORE_SEARCH, "--store", str(folder / "store"))
    finally:
        folder.chmod(0o755)
    assert code == 2
    assert "--store" in err


# --- any words on the command line ---------------------------------------------------------------

WORDS = ["estimate", "search", "validate", "catalog", "list", "show", "results", "query", "devices", "clusters", "models",
         "h100-sxm5-80gb", "dgx-h100", "llama3-8b", "dlrm-a", "--json", "--model", "--cluster", "--devices", "--tp", "8",
         "--set", "plan.tp=2", "--config", "--help", "--store", "--top", "0", "-1", "--", "-", "nan", "/dev/null", "/",
         "collective", "all_reduce", "all_to_all", "--sizes", "1K:8G", "--nccl-tests", "--algorithm", "nvls"]


@fuzz(300)
@given(words=st.lists(st.one_of(st.sampled_from(WORDS), JUNK), max_size=6))
def test_any_words(monkeypatch, capsys, words):
    check_run(monkeypatch, capsys, *words)


@fuzz(60)
@given(item=st.one_of(st.sampled_from(["h100-sxm5-80gb", "dgx-h100", "llama3-8b", "dlrm-a", "zionex-a100", "mlperf-dlrm-dcnv2"]), JUNK),
       kind=st.one_of(st.sampled_from(["devices", "clusters", "models", "gpus"]), JUNK))
def test_catalog(monkeypatch, capsys, item, kind):
    check_run(monkeypatch, capsys, "catalog", "show", item)
    check_run(monkeypatch, capsys, "catalog", "list", kind)
