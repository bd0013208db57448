"""Inputs that used to crash or be silently ignored: each is now one error line and exit 2."""

from __future__ import annotations

import pytest

from cli_runner import run_cli

GPT3 = ["--model", "gpt3-175b", "--cluster", "dgx-a100-80gb"]
SEARCH = ["search", *GPT3, "--devices", "64", "--global-batch", "64", "--executor", "serial"]


def one_error(code: int, err: str, field: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}"), err


@pytest.mark.parametrize(("args", "field"), [
    (["estimate", *GPT3, "--devices", "0"], "num_devices"),  # 0 is not "unset"
    ([*SEARCH, "--set", "space.tp=[]"], "space.tp"),
    ([*SEARCH, "--set", "space.zero_stage=[7]"], "space.zero_stage"),
    (["estimate", *GPT3, "--devices", "8", "--tp", "8", "--batch", "4"], "task"),  # serving field, training task
    (["estimate", *GPT3, "--devices", "8", "--tp", "8", "--frozen-layers", "4"], "task"),
    (["estimate", *GPT3, "--devices", "8", "--tp", "8", "--task", "inference", "--train-tokens", "1e12"], "task"),
    (["estimate", *GPT3, "--devices", "8", "--tp", "8", "--set", "plan.tp=4"], "--set plan.tp"),
    (["estimate", *GPT3, "--devices", "8", "--tp", "8", "--set", "devices=16"], "--set devices"),
    ([*SEARCH, "--seq-len", "2048", "--set", "plan.seq_len=4096"], "--set plan.seq_len"),
])
def test_bad_or_ignored_input(monkeypatch, capsys, args, field):
    code, _, err = run_cli(monkeypatch, capsys, *args)
    one_error(code, err, field)


def test_a_flag_and_an_agreeing_set_are_fine(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "estimate", *GPT3, "--devices", "64", "--tp", "8", "--pp", "8",
                           "--set", "plan.tp=8", "--global-batch", "64", "--recompute", "full")
    assert code == 0, err


def test_store_paths_and_corrupt_stores(monkeypatch, capsys, tmp_path):
    pytest.importorskip("pyarrow")
    pytest.importorskip("duckdb")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    one_error(*run_cli(monkeypatch, capsys, *SEARCH, "--store", str(a_file))[::2], "--store")
    quoted = tmp_path / "it's a \"store\""
    code, _, err = run_cli(monkeypatch, capsys, *SEARCH, "--set", "space.tp=[8]", "--store", str(quoted))
    assert code == 0, err
    code, out, err = run_cli(monkeypatch, capsys, "results", "query", str(quoted), "select count(*) as n from plans", "--json")
    assert code == 0 and '"n": ' in out, err  # the path never enters the SQL
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "search.json").write_text("{not json")
    one_error(*run_cli(monkeypatch, capsys, *SEARCH, "--store", str(corrupt))[::2], "--store")
    broken_part = quoted / "plans-00000.parquet"
    broken_part.write_bytes(b"junk")
    one_error(*run_cli(monkeypatch, capsys, *SEARCH, "--set", "space.tp=[8]", "--store", str(quoted))[::2], "--store")
    one_error(*run_cli(monkeypatch, capsys, "results", "query", str(quoted), "select 1")[::2], "results")


@pytest.mark.parametrize("text", ["a: " + "[" * 100000, "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 300))])
def test_pathologically_deep_yaml_is_refused_before_parsing(monkeypatch, capsys, tmp_path, text):
    """libyaml's C parser would crash the process (a segfault, no exception) on the first one."""
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    for args in (("estimate", "--config", str(path)), ("validate", str(path))):
        one_error(*run_cli(monkeypatch, capsys, *args)[::2], str(path))


def test_binary_files_are_one_error_line(monkeypatch, capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe\x00\x01binary")
    one_error(*run_cli(monkeypatch, capsys, "estimate", "--model", str(path), "--cluster", "dgx-h100")[::2], "path")
    one_error(*run_cli(monkeypatch, capsys, "validate", str(path))[::2], str(path))


@pytest.mark.parametrize("assignment", ["task.train_tokens=.inf", "task.train_tokens=.nan", "plan.seq_len=.inf"])
def test_infinite_numbers_are_refused(monkeypatch, capsys, assignment):
    code, _, err = run_cli(monkeypatch, capsys, "estimate", *GPT3, "--devices", "64", "--tp", "8", "--pp", "8",
                           "--global-batch", "64", "--set", assignment)
    one_error(code, err, assignment.split("=")[0])


def test_a_missing_file_says_so_once(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(tmp_path / "nope.yaml"))
    one_error(code, err, "file")
    assert err.count("no such file") == 1 and "valid file path" not in err
