"""Power-capped clocks (meshplan.costs.power) against the H100 power measurements."""

import csv
from pathlib import Path

import pytest

from meshplan import api, catalog
from meshplan.costs import costed
from meshplan.costs.compute import Roofline
from meshplan.costs.power import backward_energy_work, capped_scale, dynamic_energy_j, executed_attention_fraction, op_work
from meshplan.parallel.program import build_program

DATA = Path(__file__).parent / "data" / "h100-sxm"
H100 = catalog.device("h100-sxm5-80gb")
POWER = catalog.efficiency("hopper").power


def _sustained(workload: str) -> dict:
    return next(r for r in csv.DictReader((DATA / "power.csv").open()) if r["workload"] == workload)


@pytest.mark.parametrize("workload, burst_tflops", [
    # burst rates: the 8192^3 rows of shared/calibration/h100-sxm/gemm_bf16.csv and gemm_fp8.csv
    ("gemm_bf16_8192", 738.3),
    ("gemm_fp8_8192", 1252.5),
])
def test_the_cap_brings_a_burst_gemm_down_to_its_sustained_rate(workload, burst_tflops):
    """15 s of back-to-back 8192^3 GEMMs sit at the 700 W cap and run slower than a burst: the
    model's capped rate is within 5% of the measured one (672 and 1206 TFLOP/s)."""
    row = _sustained(workload)
    flop, hbm = float(row["flop"]), float(row["bytes"])
    precision = "fp8" if "fp8" in workload else "bf16"
    burst_s = flop / (burst_tflops * 1e12)
    scale = capped_scale(POWER, H100.tdp_w, dynamic_energy_j(POWER, {precision: flop}, hbm), burst_s)
    assert scale > 1.0
    assert burst_tflops / scale == pytest.approx(float(row["tflop_per_s"]), rel=0.05)


def test_streaming_hbm_stays_under_the_cap():
    row = _sustained("hbm_copy_1GiB")
    seconds, moved = float(row["seconds"]), float(row["bytes"])
    assert capped_scale(POWER, H100.tdp_w, dynamic_energy_j(POWER, {}, moved), seconds) == 1.0
    drawn = POWER.idle_w + dynamic_energy_j(POWER, {}, moved) / seconds
    assert drawn == pytest.approx(float(row["avg_power_w"]), rel=0.02)


def test_capped_steps_are_slower_and_decoding_is_not(monkeypatch):
    """Work that would draw more than the TDP runs longer, by exactly its energy over the
    headroom; a bandwidth-bound decode step stays under the cap and does not change. The H100
    profile's training steps sit just under its cap (about 600 of 700 W), so a device whose
    flop cost twice as much energy stands for one above it."""
    train = dict(model="llama3-8b", cluster="dgx-h100", num_devices=8, tp=1, global_batch_size=8, precision="bf16")
    serve = dict(model="llama3-8b", cluster="dgx-h100", num_devices=1, task={"kind": "inference", "batch_size": 1,
                                                                              "prompt_len": 128, "output_len": 64})
    hopper = catalog.efficiency("hopper")
    hungry = hopper.model_copy(update={"power": POWER.model_copy(
        update={"joules_per_flop": {p: 2.0 * j for p, j in POWER.joules_per_flop.items()}})})
    uncapped = hopper.model_copy(update={"power": None})
    profiles = {"hungry": hungry, "uncapped": uncapped}
    results = {}
    for name, profile in profiles.items():
        monkeypatch.setattr(costed.catalog, "efficiency", lambda profile_id, p=profile: p)
        results[name] = (api.estimate(**train).step_time_s, api.estimate(**serve).tpot_s)
    assert results["hungry"][0] > results["uncapped"][0] * 1.2
    assert results["hungry"][1] == pytest.approx(results["uncapped"][1], rel=1e-9)


def test_a_tdp_below_idle_power_is_refused():
    device = H100.model_dump()
    device.update(id="toy", tdp_w=50)
    cluster = catalog.cluster("dgx-h100").model_dump()
    cluster.update(id="toy-cluster", device=device)
    with pytest.raises(Exception, match="tdp_w"):
        api.estimate("llama3-8b", cluster, num_devices=8, tp=1, global_batch_size=8)


def test_causal_flash_attention_draws_for_the_half_it_computes():
    """Attention's flop count is the whole score square (Megatron's convention); a causal flash
    kernel computes the blocks below the diagonal, about half, and its backward 2.5 forwards'
    worth (it recomputes the scores). At FlashAttention-3's speed, a 16K causal call on a 700 W
    H100 draws about 75 + 600 TFLOP/s x 0.835 pJ = 576 W: under the cap, so not slowed; counted
    on the full square it would have been slowed by a third or more."""
    plan = dict(tp=1, dp=1, micro_batch_size=1, global_batch_size=1, seq_len=16384)
    program = build_program(api.scenario("llama3-8b", "dgx-h100", plan, 1))
    attention = next(o for o in program.kinds["dense_layer"].ops if o.op.name == "attention")
    assert executed_attention_fraction(attention) == pytest.approx((16384 + 128) / 2 / 16384)
    assert op_work(attention, "bf16", 2.0).flop == pytest.approx(attention.flop * (16384 + 128) / 2 / 16384)
    assert backward_energy_work(attention) == 2.5
    costed_program = costed.cost_program(program)
    times = costed_program.kinds["dense_layer"].ops["attention"]
    uncapped = costed.op_times(attention, Roofline.of(H100, catalog.efficiency("hopper"), "bf16"), 2.0)
    assert times.forward_s == pytest.approx(uncapped.forward_s) and times.backward_s == pytest.approx(uncapped.backward_s)
    # unfused attention computes the whole square
    unfused = build_program(api.scenario("llama3-8b", "dgx-h100", {**plan, "flash_attention": False}, 1))
    plain = next(o for o in unfused.kinds["dense_layer"].ops if o.op.name == "attention")
    assert executed_attention_fraction(plain) == 1.0 and backward_energy_work(plain) == 2.0
