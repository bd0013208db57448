"""Sustained power in `meshplan calibrate`: power.csv written under an energy counter (a fake one
on this CPU), the power model fitted on it (the catalog's Hopper figures from the shipped H100
file), and a profile whose measured power changes the energy `estimate --profile` gives."""

from __future__ import annotations

import csv
import json
import shutil
import sys
import time
from pathlib import Path

import pytest
import yaml

from cli_runner import run_cli
from meshplan import catalog
from meshplan.calibrate.fit_power import fit_power, power_model, predicted_w
from meshplan.calibrate.power import Reading, size_label
from meshplan.calibrate.run import make_request, measure_power, write_profile
from meshplan.calibrate.table import COLUMNS, read_rows
from meshplan.io.profile import load_profile
from meshplan.specs.device import PowerModel

SHIPPED = Path(__file__).resolve().parent / "data" / "h100-sxm"
HOPPER = catalog.efficiency("hopper").power
JOB = ("--model", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--tp", "8", "--global-batch", "8", "--json")
#: the fake counter's watts by workload kind
WATTS = {"idle": 50.0, "gemm": 300.0, "hbm": 200.0, "l2": 150.0}


class FakeMeter:
    """Deterministic joules: the workload kind's watts times the seconds between start and stop."""

    def __init__(self, watts: dict[str, float]):
        self.watts, self.started, self.closed = watts, [], False

    def start(self, workload: str) -> None:
        self.started.append(workload)
        self.t0 = time.perf_counter()

    def stop(self) -> Reading:
        seconds = time.perf_counter() - self.t0
        return Reading(self.watts[self.started[-1].split("_")[0]] * seconds, 123.5, 1410.0)

    def close(self) -> None:
        self.closed = True


def _request(out: Path, seconds: float = 0.2):
    request, _ = make_request(out, None, "1", "a100-sxm4-80gb", "cpu", quick=True, power_seconds=seconds)
    return request


def test_the_fit_of_the_shipped_h100_power_is_the_catalogs_hopper_model():
    """benchmarks/fit_power.py fitted the catalog's figures on this file; the package's fit gives
    them to the catalog's rounding (3 significant digits), and every row within 10%."""
    rows = read_rows(SHIPPED / "power.csv")
    fit = fit_power(rows)
    assert fit.idle_w == pytest.approx(HOPPER.idle_w, abs=0.05)
    for precision in ("bf16", "fp8"):
        assert fit.joules_per_flop[precision] == pytest.approx(HOPPER.joules_per_flop[precision], rel=2e-3)
    assert fit.joules_per_hbm_byte == pytest.approx(HOPPER.joules_per_hbm_byte, rel=1e-3)
    assert fit.joules_per_l2_byte == pytest.approx(HOPPER.joules_per_l2_byte, rel=1e-3)
    assert set(fit.measured_w) == {r["workload"] for r in rows}
    for row in rows:
        assert predicted_w(fit, row) == pytest.approx(float(row["avg_power_w"]), rel=0.10), row["workload"]
    assert fit.max_abs_error < 0.10


def test_the_profile_power_block_is_the_catalogs_within_rounding():
    block, note = power_model(read_rows(SHIPPED / "power.csv"), "test")
    model = PowerModel(**block)
    assert note["fitted"] and "every row within" in note["summary"]
    assert model.idle_w == HOPPER.idle_w and model.cap_clocks == HOPPER.cap_clocks
    assert set(model.joules_per_flop) == set(HOPPER.joules_per_flop)  # fp16 at bf16's figure, as the catalog
    for precision, joules in HOPPER.joules_per_flop.items():
        assert model.joules_per_flop[precision] == pytest.approx(joules, rel=2e-3)
    assert model.joules_per_hbm_byte == pytest.approx(HOPPER.joules_per_hbm_byte, rel=1e-3)


def _synthetic_rows(idle: float, per_flop: dict[str, float], per_byte: float, per_l2_byte: float) -> list[dict]:
    """power.csv rows drawn exactly by the model (flop and bytes per second as on an H100)."""
    work = {"gemm_bf16_8192": ("bf16", 670e12, 245e9), "gemm_bf16_2048": ("bf16", 580e12, 850e9),
            "gemm_fp8_8192": ("fp8", 1200e12, 295e9), "hbm_copy_1GiB": ("bf16", 0.0, 3.0e12),
            "hbm_add_1GiB": ("bf16", 0.5e12, 3.05e12)}
    rows = [{"workload": "idle", "seconds": "10", "avg_power_w": str(idle), "flop": "", "bytes": ""}]
    for name, (precision, flop_s, byte_s) in work.items():
        w = idle + per_flop[precision] * flop_s + per_byte * byte_s
        rows.append({"workload": name, "seconds": "10", "avg_power_w": repr(w), "flop": repr(10 * flop_s), "bytes": repr(10 * byte_s)})
    rows.append({"workload": "l2_copy_16MiB", "seconds": "10", "avg_power_w": repr(idle + per_l2_byte * 3.4e12),
                 "flop": "0", "bytes": repr(10 * 3.4e12)})
    return rows


def test_the_fit_recovers_the_model_that_drew_the_rows():
    rows = _synthetic_rows(60.0, {"bf16": 0.9e-12, "fp8": 0.5e-12}, 120e-12, 80e-12)
    fit = fit_power(rows)
    assert fit.idle_w == pytest.approx(60.0)
    assert fit.joules_per_flop == pytest.approx({"bf16": 0.9e-12, "fp8": 0.5e-12}, rel=1e-9)
    assert fit.joules_per_hbm_byte == pytest.approx(120e-12, rel=1e-9)
    assert fit.joules_per_l2_byte == pytest.approx(80e-12, rel=1e-9)
    assert fit.max_abs_error < 1e-9


def test_rows_that_cannot_give_a_model_give_a_reason_instead():
    rows = _synthetic_rows(60.0, {"bf16": 0.9e-12, "fp8": 0.5e-12}, 120e-12, 80e-12)
    block, note = power_model([r for r in rows if r["workload"] != "idle"], "test")
    assert block is None and not note["fitted"] and "idle" in note["reason"]
    hbm_below_idle = [{**r, "avg_power_w": "10"} if r["workload"].startswith("hbm") else r for r in rows]
    block, note = power_model(hbm_below_idle, "test")
    assert block is None and "non-positive" in note["reason"]


def test_calibrate_writes_the_shipped_power_columns_under_a_meter(tmp_path):
    """On this CPU with a fake counter: the shared file's columns and workloads (no FP8 on a CPU),
    watts as the counter drew them, the work of every call counted; a rerun measures nothing."""
    meter = FakeMeter(WATTS)
    ticks = []
    notes = measure_power(_request(tmp_path), lambda done, total: ticks.append((done, total)), meter)
    assert notes == [] and not meter.closed  # a meter passed in is the caller's to close
    header = (tmp_path / "power.csv").read_text().splitlines()[0]
    assert tuple(header.split(",")) == COLUMNS["power.csv"] == tuple((SHIPPED / "power.csv").read_text().splitlines()[0].split(","))
    rows = {r["workload"]: r for r in csv.DictReader((tmp_path / "power.csv").open())}
    assert list(rows) == meter.started == ["idle", "gemm_bf16_64", "gemm_bf16_32", "hbm_copy_1MiB", "hbm_add_1MiB", "l2_copy_64KiB"]
    for name, r in rows.items():
        seconds, energy = float(r["seconds"]), float(r["energy_j"])
        assert seconds >= 0.2
        assert float(r["avg_power_w"]) == pytest.approx(energy / seconds, rel=5e-3)  # of the rounded cells
        assert float(r["avg_power_w"]) == pytest.approx(WATTS[name.split("_")[0]], rel=0.03)  # the meter brackets the timed run
        assert (float(r["sampled_power_w_median"]), float(r["sm_mhz_median"])) == (123.5, 1410.0)
    assert rows["idle"]["calls"] == "0" and rows["idle"]["flop"] == rows["idle"]["bytes"] == ""
    for n in (32, 64):
        r = rows[f"gemm_bf16_{n}"]
        calls = int(r["calls"])
        assert calls > 0 and int(r["flop"]) == calls * 2 * n ** 3 and int(r["bytes"]) == calls * 3 * 2 * n * n
        assert float(r["tflop_per_s"]) == pytest.approx(int(r["flop"]) / float(r["seconds"]) / 1e12, rel=5e-3)
    mib = 1 << 20
    assert int(rows["hbm_copy_1MiB"]["bytes"]) == int(rows["hbm_copy_1MiB"]["calls"]) * 2 * mib
    assert int(rows["hbm_add_1MiB"]["bytes"]) == int(rows["hbm_add_1MiB"]["calls"]) * 3 * mib
    assert int(rows["hbm_add_1MiB"]["flop"]) == int(rows["hbm_add_1MiB"]["calls"]) * mib // 2  # one add per bf16 element
    assert ticks[-1][0] == ticks[-1][1] and all(a[0] <= b[0] for a, b in zip(ticks, ticks[1:]))
    again = FakeMeter(WATTS)
    assert measure_power(_request(tmp_path), None, again) == [] and again.started == []


def test_without_an_nvidia_gpu_power_is_skipped_with_one_note(tmp_path):
    (tmp_path / "env.json").write_text(json.dumps({"notes": ["earlier"]}))
    notes = measure_power(_request(tmp_path))
    assert len(notes) == 1 and notes[0].startswith("power not measured") and "CPU" in notes[0]
    assert not (tmp_path / "power.csv").exists()
    assert json.loads((tmp_path / "env.json").read_text())["notes"] == ["earlier", notes[0]]
    meter = FakeMeter(WATTS)
    assert measure_power(_request(tmp_path, seconds=0), None, meter) == ["power not measured: --power-seconds 0"]
    assert meter.started == []


def test_a_bad_power_duration_is_one_error_line(tmp_path, monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "calibrate", "--out", str(tmp_path), "--quick", "--on", "cpu",
                           "--device", "a100-sxm4-80gb", "--power-seconds", "-1")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--power-seconds" in err


def test_size_labels_are_the_shared_files():
    assert (size_label(1 << 30), size_label(16 << 20), size_label(64 << 10), size_label(1000)) == ("1GiB", "16MiB", "64KiB", "1000B")


@pytest.fixture(scope="module")
def profiles(tmp_path_factory) -> dict[str, Path]:
    """Profiles fitted on the shipped H100 files: as measured, and with a power.csv whose idle
    draws 1.5x and whose work draws 2x the power above idle (the kernels' times unchanged)."""
    root = tmp_path_factory.mktemp("power-profiles")
    scaled = root / "scaled"
    shutil.copytree(SHIPPED, scaled)
    rows = read_rows(SHIPPED / "power.csv")
    idle = next(float(r["avg_power_w"]) for r in rows if r["workload"] == "idle")
    with (scaled / "power.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS["power.csv"], lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({**r, "avg_power_w": f"{1.5 * idle + 2.0 * (float(r['avg_power_w']) - idle):.4f}"})
    device = catalog.device("h100-sxm5-80gb")
    out = {"measured": root / "measured.yaml", "scaled": root / "scaled.yaml"}
    write_profile(SHIPPED, device, out["measured"])
    write_profile(scaled, device, out["scaled"])
    return out


def _energy(monkeypatch, capsys, *extra) -> dict:
    code, out, err = run_cli(monkeypatch, capsys, "estimate", *JOB, *extra)
    assert code == 0, err
    return json.loads(out)


def test_a_measured_profile_carries_the_power_it_measured(profiles):
    profile = load_profile(profiles["measured"])
    power = profile.efficiency.power
    assert power is not None and profile.fit["power"]["fitted"]
    assert power.joules_per_flop["bf16"] == pytest.approx(HOPPER.joules_per_flop["bf16"], rel=2e-3)
    assert "power.csv" in power.source and "power:" in profile.efficiency.source
    assert yaml.safe_load(profiles["measured"].read_text())["efficiency"]["power"]["idle_w"] == 75.3


def test_estimate_with_a_profile_charges_its_measured_energy(profiles, monkeypatch, capsys):
    """The shipped H100 power is the catalog's Hopper model: the estimate's energy is the
    catalog's to within the kernels' fit. A card drawing 2x the power above idle costs exactly
    2x the compute and HBM energy (more than the TDP: it also runs at a lower clock), and its
    idle power is 1.5x over every second of the step."""
    catalog_energy = _energy(monkeypatch, capsys)["energy"]
    measured = _energy(monkeypatch, capsys, "--profile", str(profiles["measured"]))
    scaled = _energy(monkeypatch, capsys, "--profile", str(profiles["scaled"]))
    assert measured["energy"]["compute_j"] == pytest.approx(catalog_energy["compute_j"], rel=2e-3)
    assert measured["energy"]["memory_j"] == pytest.approx(catalog_energy["memory_j"], rel=2e-3)
    assert measured["energy"]["total_j"] == pytest.approx(catalog_energy["total_j"], rel=0.05)
    assert scaled["energy"]["compute_j"] == pytest.approx(2.0 * measured["energy"]["compute_j"], rel=2e-3)
    assert scaled["energy"]["memory_j"] == pytest.approx(2.0 * measured["energy"]["memory_j"], rel=2e-3)
    for result, idle in ((measured, HOPPER.idle_w), (scaled, 1.5 * HOPPER.idle_w)):
        assert result["energy"]["static_j"] == pytest.approx(idle * 8 * result["step_time_s"], rel=2e-3)
    assert scaled["step_time_s"] >= measured["step_time_s"]
    assert scaled["energy"]["average_device_w"] <= scaled["energy"]["tdp_w"] + 1e-6


class FakeNvml:
    """pynvml's calls the meter makes: a counter that gains 250 J per second of wall time."""

    NVML_CLOCK_SM = 1
    NVMLError = RuntimeError

    def __init__(self):
        self.t0, self.shut = time.perf_counter(), False

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return int(250e3 * (time.perf_counter() - self.t0)) + 10_000_000  # mJ since the driver loaded

    def nvmlDeviceGetPowerUsage(self, handle):
        return 251_500  # mW

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == self.NVML_CLOCK_SM
        return 1755

    def nvmlShutdown(self):
        self.shut = True


def test_the_nvml_meter_reads_the_counter_in_joules_and_samples_watts_and_clock():
    from meshplan.calibrate.power import NvmlMeter

    nvml = FakeNvml()
    meter = NvmlMeter(nvml, handle=None)
    meter.start("gemm_bf16_8192")
    started = time.perf_counter()
    time.sleep(0.3)
    seconds = time.perf_counter() - started
    reading = meter.stop()
    assert reading.energy_j == pytest.approx(250.0 * seconds, rel=0.05)
    assert (reading.power_w_median, reading.sm_mhz_median) == (251.5, 1755.0)
    meter.close()
    assert nvml.shut


def test_a_gpu_without_a_readable_nvml_is_a_note(monkeypatch):
    from types import SimpleNamespace

    from meshplan.calibrate.power import open_meter

    gpu = SimpleNamespace(type="cuda", index=0)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    meter, note = open_meter(gpu)
    assert meter is None and "nvidia-ml-py" in note and "meshplan[calibrate]" in note
    broken = SimpleNamespace(NVMLError=RuntimeError, nvmlInit=lambda: (_ for _ in ()).throw(RuntimeError("NVML Shared Library Not Found")))
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    meter, note = open_meter(gpu)
    assert meter is None and note.startswith("power not measured") and "Library Not Found" in note


def test_a_counter_that_fails_mid_run_stops_power_with_a_note(tmp_path):
    from meshplan.calibrate.power import MeterError

    class Failing(FakeMeter):
        def stop(self):
            if self.started[-1].startswith("gemm"):
                raise MeterError("NVML's energy counter could not be read (GPU is lost)")
            return super().stop()

    notes = measure_power(_request(tmp_path, seconds=0.05), None, Failing(WATTS))
    assert notes == ["power measurement stopped at gemm_bf16_64: NVML's energy counter could not be read (GPU is lost)"]
    assert [r["workload"] for r in read_rows(tmp_path / "power.csv")] == ["idle"]
