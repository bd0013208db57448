"""Activation CPU offload (Plan.activation_offload_layers; Megatron-Core cpu_offloading_num_layers):
the waits by hand, the memory moved to the host by hand, offload never making a step faster or a
device fuller, the copies' energy, Megatron-Core's restrictions as errors, the validation case key
and the Megatron-Bridge recipes that use it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cli_runner import run_cli
from meshplan import api, catalog
from meshplan.costs.costed import cost_program, offload_waits
from meshplan.io.recipes import recipe_switches
from meshplan.io.validation_cases import case_inputs
from meshplan.parallel.program import build_program

#: Llama 3 8B on one GB200 (NVLink-C2C to its Grace), no communication: the step is the sum of
#: its passes, so the waits add up exactly
ONE = dict(model="llama3-8b", cluster="gb200-nvl72", num_devices=1, micro_batch_size=4, global_batch_size=8, seq_len=8192,
           precision="bf16")


def _costed(**overrides):
    return cost_program(build_program(api.scenario(**{**ONE, **overrides})))


def test_a_copy_hides_behind_one_layers_pass_and_the_rest_stalls():
    assert offload_waits(3.0, 2.0, 5.0) == (1.0, 0.0)
    assert offload_waits(1.0, 2.0, 5.0) == (0.0, 0.0)
    assert offload_waits(7.0, 2.0, 5.0) == (5.0, 2.0)


def test_waits_by_hand_on_one_device():
    """Each offloaded layer's activations cross the 225 GB/s C2C link out and back: the copy
    waits what one layer's forward (backward) does not cover, on every micro-batch."""
    base, off = _costed(), _costed(activation_offload_layers=12)
    layer, offloaded = base.kinds["dense_layer"], off.kinds["dense_layer offloaded"]
    saved = off.program.kinds["dense_layer offloaded"].saved_bytes
    assert saved == base.program.kinds["dense_layer"].saved_bytes
    copy_s = saved / 225e9
    assert copy_s > layer.forward_s  # the forward cannot hide it; the backward can
    assert offloaded.offload_forward_s == pytest.approx(copy_s - layer.forward_s, rel=1e-12)
    assert offloaded.offload_backward_s == max(0.0, copy_s - layer.backward_s)
    assert offloaded.forward_s == pytest.approx(layer.forward_s + offloaded.offload_forward_s, rel=1e-12)
    assert [(k, n) for k, n, _ in off.program.roles[0].layer_counts] == [("dense_layer", 20), ("dense_layer offloaded", 12)]
    slow = api.estimate(**ONE, activation_offload_layers=12)
    fast = api.estimate(**ONE)
    waits = 2 * 12 * (offloaded.offload_forward_s + offloaded.offload_backward_s)  # 2 micro-batches
    assert slow.step_time_s - fast.step_time_s == pytest.approx(waits, rel=1e-9)
    assert slow.serialized_by_op_s["activation_offload"] == pytest.approx(waits, rel=1e-9)
    assert slow.serialized_by_op_s["memory_bound"] == pytest.approx(fast.serialized_by_op_s["memory_bound"], rel=1e-9)


def test_offload_moves_the_layers_activations_to_the_host():
    """12 of 32 layers' activations go to host memory; one stays in flight on the device."""
    fast, slow = api.estimate(**ONE), api.estimate(**ONE, activation_offload_layers=12)
    saved = build_program(api.scenario(**ONE)).kinds["dense_layer"].saved_bytes
    assert fast.memory.activations_bytes - slow.memory.activations_bytes == pytest.approx(11 * saved, rel=1e-12)
    assert slow.memory.host_activations_bytes == pytest.approx(12 * saved, rel=1e-12)
    assert fast.memory.host_activations_bytes == 0.0
    assert slow.memory.host_capacity_bytes == pytest.approx(960e9)  # a tray's two Grace, for the one GPU in use
    # the copies' energy: out and back each micro-batch, over C2C and through LPDDR5X
    assert slow.energy.offload_j == pytest.approx(8 * 2 * 2 * 12 * saved * (1.3e-12 + 2.5e-12), rel=1e-9)


@pytest.mark.parametrize("layers", [1, 5, 31])
def test_offload_never_makes_a_step_faster_or_a_device_fuller(layers):
    fast, slow = api.estimate(**ONE), api.estimate(**ONE, activation_offload_layers=layers)
    assert slow.step_time_s >= fast.step_time_s
    assert slow.memory.total_bytes <= fast.memory.total_bytes


def test_the_recipe_that_fits_only_with_offload():
    """Megatron-Bridge's Llama 3 70B FP8 recipe on GB200 (Megatron-FSDP, micro-batch 2 at 8K)
    offloads 40 of 80 layers: without them its activations overflow the 186 GB."""
    plan = dict(model="llama3-70b", cluster="gb200-nvl72", num_devices=64, tp=1, zero_stage=3, micro_batch_size=2,
                global_batch_size=256, seq_len=8192, precision="fp8", framework="megatron-core")
    assert not api.estimate(**plan).fits
    assert api.estimate(**plan, activation_offload_layers=40).fits


@pytest.mark.parametrize(("changes", "says"), [
    ({"activation_offload_layers": 32}, "fewer than the model's 32 layers"),
    ({"activation_offload_layers": 4, "pp": 2, "num_devices": 2}, "needs pp 1"),
    ({"activation_offload_layers": 4, "recompute": "full"}, "needs recompute none"),
    ({"activation_offload_layers": 4, "cuda_graphs": "full"}, "needs cuda_graphs none"),
    ({"activation_offload_layers": 4, "cluster": "tpu-v4-pod", "precision": "bf16"}, "states no host"),
])
def test_megatron_cores_restrictions_are_errors(changes, says):
    with pytest.raises(Exception) as err:
        api.estimate(**{**ONE, **changes})
    assert "plan.activation_offload_layers" in str(err.value) and says in str(err.value)


def test_cli_flag_and_errors(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "estimate", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--devices", "1",
                             "--micro-batch", "4", "--global-batch", "8", "--seq-len", "8192", "--activation-offload", "31")
    assert code == 0, err
    assert "activation offload" in out and "offloaded activations" in out
    code, out, err = run_cli(monkeypatch, capsys, "estimate", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--devices", "2",
                             "--pp", "2", "--global-batch", "8", "--activation-offload", "4")
    assert code == 2 and "error: plan.activation_offload_layers: got 4; needs pp 1" in err


def test_a_case_says_it_in_megatron_cores_words():
    case = {"id": "c", "model": {"arch": "dense", "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                                 "num_kv_heads": 8, "ffn_hidden_size": 14336, "ffn_type": "swiglu", "vocab_size": 128256},
            "hardware": {"cluster": "gb200-nvl72", "num_devices": 1},
            "parallelism": {"cpu_offloading_num_layers": 12},
            "batch": {"global_batch_sequences": 8, "micro_batch_size": 4, "seq_len": 8192}}
    assert case_inputs(case, "c")["plan"]["activation_offload_layers"] == 12
    case["parallelism"] = {"activation_offload_layers": 7}
    assert case_inputs(case, "c")["plan"]["activation_offload_layers"] == 7


def test_bridge_tables_take_the_llama_70b_recipes_offload():
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("import_bridge_tables", root / "benchmarks" / "import_bridge_tables.py")
    importer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(importer)
    models = {"Llama 3 70B": {"arch": "dense", "name": "Llama 3 70B", "hidden_size": 8192}}
    row = {"Model": "LLAMA3_70B", "System": "DGX-GB200", "#-GPUs": "64", "Precision": "FP8", "GBS": "256", "MBS": "2",
           "Sequence Length": "8192", "FSDP": "64", "TP": "1", "PP": "1", "CP": "1", "VP": "n/a", "EP": "n/a",
           "Tokens / sec / GPU": "4224"}
    # the table's case takes the recipe's offload from catalog/recipes.yaml when it is read
    def offloaded(**changes):
        case = importer.case("26.04.01", {**row, **changes}, models, "abc")
        return recipe_switches(case)[0].get("cpu_offloading_num_layers")

    assert offloaded() == 40 and offloaded(System="DGX-GB300") == 20
    for changes in ({"Precision": "MXFP8"}, {"PP": "4"}):
        assert offloaded(**changes) is None
    assert catalog.cluster("gb300-nvl72").host.link_bytes_per_s == pytest.approx(225e9)
    # B200's recipe (5 layers over PCIe Gen5) runs on a cluster that states its hosts
    b200 = api.estimate("llama3-70b", "dgx-b200", num_devices=64, tp=1, zero_stage=3, global_batch_size=128, seq_len=8192,
                        precision="fp8", activation_offload_layers=5)
    assert b200.memory.host_activations_bytes > 0 and catalog.cluster("dgx-b200").host.link_bytes_per_s == pytest.approx(50e9)
