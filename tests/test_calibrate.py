"""`meshplan calibrate`: measures on this CPU at tiny sizes (collectives over two gloo ranks),
writes the shipped H100 files' columns, resumes, and fits a profile that `--profile` uses."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from cli_runner import run_cli
from meshplan import api, catalog
from meshplan.calibrate.collectives import bus_factor
from meshplan.calibrate.fit import fit_profile
from meshplan.calibrate.shapes import model_gemms
from meshplan.calibrate.table import COLUMNS, KEY_COLUMNS
from meshplan.io.profile import load_profile

REPO = Path(__file__).resolve().parents[1]
H100 = REPO.parent / "shared" / "calibration" / "h100-sxm"
needs_h100 = pytest.mark.skipif(not H100.is_dir(), reason="shared/calibration is not checked out beside the repo")
KERNEL_FILES = ("gemm_bf16.csv", "attention.csv", "memory_ops.csv", "layer.csv")
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
        "max_position_embeddings": 128, "hidden_act": "silu"}
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1"}
JOB = ("--model", "llama3-8b", "--cluster", "dgx-a100-80gb", "--devices", "8", "--tp", "8", "--global-batch", "8", "--json")


def _args(out: Path, model: Path) -> list[str]:
    return ["calibrate", "--out", str(out), "--quick", "--device", "a100-sxm4-80gb", "--model", str(model), "--tp", "1,2"]


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny")
    (folder / "config.json").write_text(json.dumps(TINY))
    return folder / "config.json"


@pytest.fixture(scope="module")
def measured(tmp_path_factory, tiny_model) -> Path:
    """One quick calibration on this CPU: kernels, then collectives over two gloo ranks."""
    out = tmp_path_factory.mktemp("calibration")
    for launcher in ([], [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]):
        command = [*launcher, "-m", "meshplan", *_args(out, tiny_model)] if launcher else \
            [sys.executable, "-m", "meshplan", *_args(out, tiny_model)]
        done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_kernel_files_have_the_shipped_columns_and_positive_times(measured):
    for name in KERNEL_FILES:
        header = (measured / name).read_text().splitlines()[0]
        assert tuple(header.split(",")) == COLUMNS[name]
        if H100.is_dir():
            assert header == (H100 / name).read_text().splitlines()[0]
        rows = _rows(measured / name)
        assert rows
        for row in rows:
            times = [float(row[c]) for c in ("time_s", "fwd_s", "fwd_bwd_s") if c in row]
            assert times and all(t > 0 for t in times)
    layers = _rows(measured / "layer.csv")  # the probe and the model's layer on its --quick rank
    assert [r["model"] == "probe" for r in layers] == [True, False] and layers[1]["tp"] == "2"
    assert all(float(r["fwd_bwd_s"]) > float(r["fwd_s"]) for r in layers)
    gemms = _rows(measured / "gemm_bf16.csv")
    assert {r["pass"] for r in gemms} == {"fwd", "dgrad", "wgrad"}
    assert {r["tp"] for r in gemms if r["model"] != "square"} == {"2"}  # --quick: the largest degree only
    env = json.loads((measured / "env.json").read_text())
    assert env["torch"] and any("fp8" in note for note in env["notes"])  # no FP8 on a CPU: said, not hidden
    assert any(note.startswith("power not measured") for note in env["notes"]) and not (measured / "power.csv").exists()


def test_collectives_over_two_gloo_ranks(measured):
    rows = _rows(measured / "collectives.csv")
    assert {r["collective"] for r in rows} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    for r in rows:
        assert (r["ranks"], r["nodes"]) == ("2", "1") and float(r["time_s"]) > 0
        algbw = int(r["bytes"]) / float(r["time_s"]) / 1e9
        assert float(r["algbw"]) == pytest.approx(algbw, rel=1e-3)
        assert float(r["busbw"]) == pytest.approx(algbw * bus_factor(r["collective"], 2), rel=1e-3)
    level = load_profile(measured / "profile.yaml").network[0]
    assert level.level == 0 and level.bus_bytes_per_s > 0


def test_gemms_beside_all_gathers_over_two_gloo_ranks_are_measured_but_not_fitted(measured, tmp_path, monkeypatch, capsys):
    """overlap.csv under torchrun: a loop of square GEMMs alone and beside all-gathers. On a CPU
    the row is written (its covered and slowdown are numbers) but the profile keeps the
    catalog's overlap_slowdown: gloo's threads share the host's cores, not a GPU's SMs."""
    (row,) = _rows(measured / "overlap.csv")
    assert tuple((measured / "overlap.csv").read_text().splitlines()[0].split(",")) == COLUMNS["overlap.csv"]
    assert (row["on"], row["ranks"], row["nodes"], row["gemm"]) == ("cpu", "2", "1", "128x128x128 fp32")
    assert int(row["bytes"]) == 1 << 20 and float(row["covered"]) in (0.0, 1.0)
    assert all(float(row[c]) > 0 for c in ("gemm_alone_s", "gemm_beside_s", "collective_s"))
    assert math.isfinite(float(row["slowdown"]))
    profile = yaml.safe_load((measured / "profile.yaml").read_text())
    assert profile["fit"]["overlap"] == {"fitted": False, "reason": "measured on a CPU: gloo's threads share its cores, not a GPU's SMs"}
    assert profile["efficiency"]["overlap_slowdown"] == catalog.efficiency("ampere").overlap_slowdown
    code, _, err = run_cli(monkeypatch, capsys, "calibrate", "--out", str(measured), "--fit-only", "--device", "a100-sxm4-80gb",
                           "--profile-out", str(tmp_path / "profile.yaml"))
    assert code == 0 and "note: overlap_slowdown kept from the catalog (measured on a CPU" in err


def test_gpu_overlap_rows_set_the_profiles_overlap_slowdown(measured, tmp_path):
    """Rows measured on GPUs whose collectives lasted the GEMM loop give the profile its
    overlap_slowdown, their median (none below 0); rows that did not last it are left out."""
    import shutil

    folder = tmp_path / "gpu"
    shutil.copytree(measured, folder)
    header = ",".join(COLUMNS["overlap.csv"])
    rows = [("cuda", 8, 1, 67108864, "8192x8192x8192 bf16", 0.03, 0.039, 2e-4, "1.000", "0.3000"),
            ("cuda", 8, 1, 268435456, "8192x8192x8192 bf16", 0.03, 0.042, 8e-4, "0.990", "0.4000"),
            ("cuda", 16, 2, 67108864, "8192x8192x8192 bf16", 0.03, 0.029, 9e-4, "1.000", "-0.0300"),
            ("cuda", 16, 2, 268435456, "8192x8192x8192 bf16", 0.03, 0.06, 3e-3, "0.400", "0.9000")]
    (folder / "overlap.csv").write_text("\n".join([header, *(",".join(map(str, r)) for r in rows)]) + "\n")
    profile = fit_profile(folder, catalog.device("a100-sxm4-80gb"))
    assert profile["efficiency"]["overlap_slowdown"] == pytest.approx(0.3)  # median of 0.3, 0.4 and 0
    assert profile["fit"]["overlap"]["fitted"] and profile["fit"]["overlap"]["rows"] == 3
    assert "overlap_slowdown 0.300" in profile["efficiency"]["source"]
    assert "lookup, size_flop_per_byte kept" in profile["efficiency"]["source"]
    (folder / "overlap.csv").write_text("\n".join([header, ",".join(map(str, rows[-1]))]) + "\n")
    profile = fit_profile(folder, catalog.device("a100-sxm4-80gb"))
    assert not profile["fit"]["overlap"]["fitted"] and "95%" in profile["fit"]["overlap"]["reason"]
    assert profile["efficiency"]["overlap_slowdown"] == catalog.efficiency("ampere").overlap_slowdown


def test_bus_bandwidth_factors_are_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == bus_factor("all_to_all", 8) == pytest.approx(7 / 8)
    assert bus_factor("send_recv", 8) == 1.0


def test_profile_round_trips_through_estimate(measured, monkeypatch, capsys):
    """A CPU is far slower than the A100 the profile is fitted for: the step takes longer."""
    profile = measured / "profile.yaml"
    assert load_profile(profile).device == "a100-sxm4-80gb"
    code, out, _ = run_cli(monkeypatch, capsys, "estimate", *JOB)
    assert code == 0
    code, slow, err = run_cli(monkeypatch, capsys, "estimate", *JOB, "--profile", str(profile))
    assert code == 0, err
    assert json.loads(slow)["step_time_s"] > 10 * json.loads(out)["step_time_s"]
    fast = api.estimate("llama3-8b", "dgx-a100-80gb", num_devices=8, tp=8, global_batch_size=8).step_time_s
    assert api.estimate("llama3-8b", "dgx-a100-80gb", num_devices=8, tp=8, global_batch_size=8,
                        profile=str(profile)).step_time_s == pytest.approx(json.loads(slow)["step_time_s"])
    assert fast == pytest.approx(json.loads(out)["step_time_s"])


def test_search_takes_a_profile(measured):
    kwargs = dict(global_batch_size=8, space={"tp": [4, 8]}, top=1)
    base = api.search("llama3-8b", "dgx-a100-80gb", 8, **kwargs).top[0]["step_time_s"]
    slow = api.search("llama3-8b", "dgx-a100-80gb", 8, profile=str(measured / "profile.yaml"), **kwargs).top[0]["step_time_s"]
    assert slow > 10 * base


def test_a_rerun_measures_only_what_is_missing(measured, tiny_model, tmp_path, monkeypatch, capsys):
    """Rows already written are kept as they are; a last line cut short is measured again."""
    out = tmp_path / "cut"
    out.mkdir()
    for name in KERNEL_FILES:
        lines = (measured / name).read_text().splitlines(keepends=True)
        kept = lines[: 1 + (len(lines) - 1) // 2]
        (out / name).write_text("".join(kept) + lines[len(kept)][:5])  # half the rows and a torn line
    code, _, err = run_cli(monkeypatch, capsys, *_args(out, tiny_model))
    assert code == 0, err
    for name in KERNEL_FILES:
        before, after = _rows(measured / name), _rows(out / name)
        key = lambda r: tuple(list(r.values())[: KEY_COLUMNS[name]])  # noqa: E731
        assert sorted(map(key, after)) == sorted(map(key, before))  # every row once, none twice
        half = (len(before) + 1) // 2 if len(before) % 2 else len(before) // 2
        assert after[:half] == before[:half]  # the rows that were there are not measured again


def test_ctrl_c_exits_130_and_the_rerun_resumes(tiny_model, tmp_path, monkeypatch, capsys):
    out = tmp_path / "interrupted"
    proc = subprocess.Popen([sys.executable, "-m", "meshplan", *_args(out, tiny_model)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    gemms = out / "gemm_bf16.csv"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if gemms.exists() and len(gemms.read_text().splitlines()) >= 3:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted"
    first = _rows(gemms)
    assert not (out / "profile.yaml").exists()
    code, _, err = run_cli(monkeypatch, capsys, *_args(out, tiny_model))
    assert code == 0, err
    assert _rows(gemms)[: len(first)] == first and (out / "profile.yaml").exists()


def test_without_torch_one_error_line_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    code, _, err = run_cli(monkeypatch, capsys, "calibrate", "--out", str(tmp_path), "--quick", "--device", "h100-sxm5-80gb")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "meshplan[calibrate]" in err


@pytest.mark.parametrize(("edit", "field"), [
    (lambda p: p["efficiency"].update(memory=1.5), "efficiency.memory"),
    (lambda p: p["efficiency"]["matmul"].update(points=[[1e9, 0.5], [1e8, 0.4]]), "efficiency.matmul"),
    (lambda p: p.update(devise="x"), "devise"),
    (lambda p: p["network"][0].update(bus_bytes_per_s=-1), "network.0.bus_bytes_per_s"),
])
def test_a_bad_profile_is_one_error_line_naming_the_field(measured, tmp_path, monkeypatch, capsys, edit, field):
    profile = yaml.safe_load((measured / "profile.yaml").read_text())
    edit(profile)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(profile))
    for verb in (("estimate", *JOB), ("search", "--model", "llama3-8b", "--cluster", "dgx-a100-80gb", "--devices", "8",
                                      "--global-batch", "8", "--executor", "serial")):
        code, _, err = run_cli(monkeypatch, capsys, *verb, "--profile", str(bad))
        assert code == 2 and len(err.strip().splitlines()) == 1 and f"{bad}: {field}" in err, err


def test_validate_applies_a_profile_to_the_cases_on_its_device(measured, tmp_path):
    from meshplan.io.validation_cases import validate

    case = {"id": "c", "group": "g", "model": {"arch": "dense", "num_layers": 2, "hidden_size": 1024,
            "num_attention_heads": 16, "ffn_hidden_size": 4096, "vocab_size": 32000},
            "hardware": {"cluster": "dgx-a100-80gb", "num_devices": 8}, "parallelism": {"tp": 8},
            "batch": {"global_batch_sequences": 8, "micro_batch_size": 1, "seq_len": 1024},
            "precision": "bf16", "measured": {"step_time_s": 1.0}}
    cases = tmp_path / "cases.yaml"
    cases.write_text(yaml.safe_dump([case]))
    profile = yaml.safe_load((measured / "profile.yaml").read_text())
    base = validate(cases)[0].predicted_step_time_s
    assert base is not None, validate(cases)[0].error
    assert validate(cases, profile=str(measured / "profile.yaml"))[0].predicted_step_time_s > 10 * base
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**profile, "device": "h100-sxm5-80gb"}))
    assert validate(cases, profile=str(other))[0].predicted_step_time_s == pytest.approx(base)


@needs_h100
def test_model_shapes_are_the_shipped_h100_shapes():
    """The shipped file's llama3-8b/70b rows are the GEMMs calibrate derives from the catalog models."""
    shipped = _rows(H100 / "gemm_bf16.csv")
    for model_id in ("llama3-8b", "llama3-70b"):
        rows = [r for r in shipped if r["model"] == model_id]
        tps = tuple(sorted({int(r["tp"]) for r in rows}))
        tokens = tuple(sorted({int(r["tokens"]) for r in rows}))
        ours = {tuple(str(v) for v in (g.tp, g.tokens, g.gemm, g.pass_, g.m, g.n, g.k))
                for g in model_gemms(catalog.model(model_id), tps, tokens)}
        assert ours == {(r["tp"], r["tokens"], r["gemm"], r["pass"], r["m"], r["n"], r["k"]) for r in rows}


@needs_h100
def test_layer_cases_are_the_model_on_each_rank_and_the_probe():
    from meshplan.calibrate.shapes import FULL, layer_cases

    cases = layer_cases(catalog.model("llama3-8b"), (1, 8), FULL)
    assert cases[0].model == "probe" and cases[0].params < 5e6  # microseconds of kernels
    rank8 = [c for c in cases if c.tp == 8]
    assert [c.seq for c in rank8] == [2048, 4096]
    assert (rank8[0].heads, rank8[0].kv_heads, rank8[0].ffn, rank8[0].gated) == (4, 1, 1792, True)
    assert rank8[0].params == 27271168  # the H100 file's llama3-8b layer at tp 8 (layer_params)
    assert [c.model for c in layer_cases(catalog.model("deepseek-v3"), (1,), FULL)] == ["probe"]  # MoE and MLA: the probe only


def test_the_fit_of_the_shipped_h100_data():
    """Large GEMMs (>= 1e11 flop) ran at 0.44-0.78 of the bf16 peak; the fitted curve sits inside
    that range there, and predicts the measured GEMM times to a median 10%."""
    profile = fit_profile(H100, catalog.device("h100-sxm5-80gb"))
    efficiency = load_profile(profile).efficiency
    rows = _rows(H100 / "gemm_bf16.csv")
    flop = np.array([2.0 * float(r["m"]) * float(r["n"]) * float(r["k"]) for r in rows])
    achieved = flop / np.array([float(r["time_s"]) for r in rows]) / 989.4e12
    large = achieved[flop >= 1e11]
    for size, fraction in efficiency.matmul.points:
        if size >= 1e11:
            assert large.min() <= fraction <= large.max()
    assert profile["fit"]["matmul"]["median_abs_error"] < 0.10
    assert 0.5 < efficiency.memory <= 1.0  # a streaming copy moved 2.97 of 3.35 TB/s
    assert "NVIDIA H100" in efficiency.source
    # its decoder layers give the host's dispatch, as the catalog's Hopper profile has it
    assert efficiency.kernels.host.forward_s == pytest.approx(catalog.efficiency("hopper").kernels.host.forward_s, rel=1e-3)
    assert efficiency.kernels.host.backward_s == pytest.approx(catalog.efficiency("hopper").kernels.host.backward_s, rel=1e-3)


def _synthetic(folder: Path, device, e_max: float, f_half: float, memory: float, overhead: float, noise=None) -> None:
    """Rows timed exactly by the profile's own model (optionally scaled by ``noise``)."""
    from meshplan.calibrate.table import Table

    rng = np.random.default_rng(0)
    scale = (lambda: 1.0) if noise is None else (lambda: float(rng.uniform(1 - noise, 1 + noise)))
    peak, ridge = device.peak("bf16"), catalog.efficiency(device.efficiency).size_flop_per_byte
    curve = lambda size: e_max / (1 + f_half / size)  # noqa: E731
    gemms = Table(folder, "gemm_bf16.csv")
    for s in (256, 512, 1024, 2048, 4096, 8192):
        flop = 2.0 * s ** 3
        t = (overhead + flop / (peak * curve(max(flop, 6.0 * s * s * ridge)))) * scale()
        gemms.append(("square", 1, s, "square", "fwd", s, s, s, t, ""))
    attention = Table(folder, "attention.csv")
    for seq in (1024, 4096, 16384):
        b, heads, d = 16384 // seq, 16, 128
        flop, traffic = 4.0 * b * seq * seq * heads * d, 2.0 * b * seq * d * 4 * heads
        fwd = overhead + flop / (peak * curve(max(flop, traffic * ridge)))
        bwd = overhead + 2 * flop / (peak * curve(max(2 * flop, 2 * traffic * ridge)))
        attention.append((heads, heads, d, b, seq, True, fwd * scale(), (fwd + bwd) * scale(), "", "", ""))
    ops = Table(folder, "memory_ops.csv")
    for n in (1 << 20, 1 << 24, 1 << 28):
        ops.append(("copy", n, "bf16", 4 * n, (overhead + 4 * n / (memory * device.hbm_bytes_per_s)) * scale(), ""))


def test_the_fit_recovers_the_profile_that_timed_the_rows(tmp_path):
    device = catalog.device("h100-sxm5-80gb")
    _synthetic(tmp_path, device, e_max=0.62, f_half=3e9, memory=0.8, overhead=6e-6)
    fit = fit_profile(tmp_path, device)["fit"]
    assert fit["matmul"]["e_max"] == pytest.approx(0.62, rel=1e-6) and fit["matmul"]["f_half"] == pytest.approx(3e9, rel=1e-6)
    assert fit["attention"]["e_max"] == pytest.approx(0.62, rel=1e-6)
    assert fit["memory"]["memory"] == pytest.approx(0.8, rel=1e-6)
    assert fit["memory"]["kernel_overhead_s"] == pytest.approx(6e-6, rel=1e-6)


def test_the_fit_of_noisy_tiny_kernels_still_gives_a_valid_profile(tmp_path):
    """Timings far noisier than the signal (a busy CPU at --quick sizes) still fit: rates > 0."""
    device = catalog.device("a100-sxm4-80gb")
    _synthetic(tmp_path, device, e_max=1e-5, f_half=1e3, memory=0.002, overhead=1e-3, noise=0.9)
    profile = load_profile(fit_profile(tmp_path, device))
    assert all(0 < fraction <= 1 for _, fraction in profile.efficiency.matmul.points)


SHIPPED = REPO / "tests" / "data" / "h100-sxm"


@pytest.fixture(scope="module")
def shipped_profile(tmp_path_factory) -> Path:
    """The profile `meshplan calibrate` fits on the shipped H100 kernels, written as YAML."""
    from meshplan.calibrate.run import write_profile

    path = tmp_path_factory.mktemp("shipped") / "profile.yaml"
    write_profile(SHIPPED, catalog.device("h100-sxm5-80gb"), path)
    return path


def test_the_fitted_kernel_models_predict_the_shipped_gemms(shipped_profile):
    """As tests/test_kernels_h100.py compares the catalog's Hopper models: each isolated call is
    max(floor, kernel time + the harness's overhead); median |error| <= 5%, p90 <= 15%."""
    from meshplan.costs.kernels import Chip, gemm_s

    profile = load_profile(shipped_profile)
    kernels = profile.efficiency.kernels
    assert kernels is not None and profile.efficiency.matmul.points  # the curves stay beside the kernels
    assert load_profile(shipped_profile).fit["kernels"]["fitted"]
    device = catalog.device("h100-sxm5-80gb")
    for precision, element_bytes in (("bf16", 2.0), ("fp8", 1.0)):
        rows = _rows(SHIPPED / f"gemm_{precision}.csv")
        m, n, k = (np.array([float(r[c]) for r in rows]) for c in ("m", "n", "k"))
        g = kernels.gemm_of(precision)
        c = Chip(device.peak(precision), device.sm_count, device.hbm_bytes_per_s, device.sram_bytes)
        predicted = np.maximum(g.isolated_floor_s, gemm_s(m, k, n, element_bytes, g, c) + g.isolated_overhead_s)
        errors = np.abs(predicted / np.array([float(r["time_s"]) for r in rows]) - 1.0)
        assert np.median(errors) <= 0.05 and np.percentile(errors, 90) <= 0.15, precision
    assert g.isolated_overhead_s > 0  # power.csv gave the harness's overhead


def test_the_fitted_kernel_profile_round_trips_through_estimate(shipped_profile, monkeypatch, capsys):
    """The measured kernels are the catalog Hopper's own data: the estimate moves by little."""
    job = ("--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--tp", "8", "--global-batch", "8", "--json")
    code, base, _ = run_cli(monkeypatch, capsys, "estimate", *job)
    assert code == 0
    code, fitted, err = run_cli(monkeypatch, capsys, "estimate", *job, "--profile", str(shipped_profile))
    assert code == 0, err
    assert json.loads(fitted)["step_time_s"] == pytest.approx(json.loads(base)["step_time_s"], rel=0.05)
    curves = yaml.safe_load(shipped_profile.read_text())
    del curves["efficiency"]["kernels"]
    assert api.estimate("llama3-8b", "dgx-h100", num_devices=8, tp=8, global_batch_size=8,
                        profile=curves).step_time_s != pytest.approx(json.loads(fitted)["step_time_s"], rel=1e-6)


def test_a_quick_run_falls_back_to_the_curves_and_says_so(measured):
    profile = yaml.safe_load((measured / "profile.yaml").read_text())
    assert "kernels" not in profile["efficiency"]
    assert profile["fit"]["kernels"]["fitted"] is False and "too few rows" in profile["fit"]["kernels"]["reason"]
    assert "no kernel models fitted" in profile["efficiency"]["source"]


@pytest.mark.parametrize("unheld_s, held_calls, expected_s", [
    (30e-6, 1, 6e-6),  # dispatch-bound: timed again behind the hold, and that time kept
    (400e-6, 0, 400e-6),  # a long kernel keeps ahead of its dispatch: never held (burst clocks)
])
def test_a_short_kernel_is_timed_again_queued_behind_a_hold(monkeypatch, unheld_s, held_calls, expected_s):
    from types import SimpleNamespace

    import torch

    from meshplan.calibrate import timing

    calls = []

    def events_s(run, inputs, device, repeats, hold_cycles):
        calls.append(hold_cycles)
        return 6e-6 if hold_cycles else unheld_s

    monkeypatch.setattr(timing, "_events_s", events_s)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None, raising=False)
    cuda = SimpleNamespace(type="cuda")
    assert timing.median_time_s(lambda x: x, [0], cuda, warmup=1, repeats=20) == expected_s
    assert calls == [0] + [timing.HOLD_CYCLES_PER_CALL * 20] * held_calls
    calls.clear()  # whole layers: what the host takes to issue them is measured, never held
    assert timing.median_time_s(lambda x: x, [0], cuda, warmup=1, repeats=20, queued=False) == unheld_s
    assert calls == [0]
