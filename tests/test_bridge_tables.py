"""Megatron-Bridge's published performance tables as validation cases
(benchmarks/import_bridge_tables.py, benchmarks/data/megatron_bridge_tables.yaml)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from meshplan.io.validation_cases import summarize, validate

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "benchmarks" / "data" / "megatron_bridge_tables.yaml"

_spec = importlib.util.spec_from_file_location("import_bridge_tables", ROOT / "benchmarks" / "import_bridge_tables.py")
importer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(importer)

MODELS = {
    "Llama 3 70B": {"arch": "dense", "name": "Llama 3 70B", "hidden_size": 8192},
    "Qwen3-30B-A3B": {"arch": "moe", "name": "Qwen3-30B-A3B", "hidden_size": 2048},
}

SNIPPET = """
## 26.04 NeMo Container

### Pre-Training Performance

#### Model: LLAMA3_70B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-GB200 | 64 | FP8-CS (FP8-MX) | 256 | 2 | 8192 | 64 (0) | 1 | 1 | 1 | n/a | n/a | 4224 (3712) | 1892 |
| DGX-B300 | 64 | FP8 | 256 | 1 | 8192 | 0 | 1 | 4 | 1 | 5 | n/a | 4000 | 1800 |

- a note between tables

#### System: DGX-H100

| Model | #-GPUs | Precision | GBS | MBS | Sequence Length | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|-------|--------|-----------|-----|-----|-----------------|----|----|----|----|----|-----------------------|-------------------------|
| Qwen3_30B_a3B | 16 | FP8 | 1024 | 1 | 4096 | 1 | 1 | 1 | n/a | 16 | 8960[^note] | 206 |
| Qwen3_30B_a3B (tokendrop) | 16 | FP8 | 1024 | 1 | 4096 | 1 | 1 | 1 | n/a | 16 | 9000 | 206 |

### LoRA Performance

#### Model: LLAMA3_70B

| System | #-GPUs | Precision | GBS | MBS | Sequence Length | TP | PP | CP | VP | EP | Tokens / sec / GPU | Model TFLOP / sec / GPU |
|--------|--------|-----------|-----|-----|-----------------|----|----|----|----|----|-----------------------|-------------------------|
| DGX-GB200 | 8 | FP8 | 32 | 1 | 4096 | 1 | 2 | 1 | 20 | n/a | 6206 | 1731 |
"""


def _cases(text: str) -> list[dict]:
    out = []
    for container, section, row in importer.table_rows(text):
        if section == "Pre-Training Performance":
            c = importer.case(container, row, MODELS, "abc123")
            if c is not None:
                out.append(c)
    return out


def test_rows_become_cases_with_the_published_step_time():
    llama, qwen = _cases(SNIPPET)
    # GBS x sequence / (tokens/s/GPU x GPUs); the first of "4224 (3712)" is the row's own value
    assert llama["measured"]["step_time_s"] == pytest.approx(256 * 8192 / (4224 * 64), rel=1e-6)
    assert llama["hardware"] == {"cluster": "gb200-nvl72", "num_devices": 64, "devices_per_node": 4}
    assert llama["precision"] == "fp8-cs"
    assert llama["parallelism"]["zero_stage"] == 3  # FSDP 64
    assert llama["parallelism"]["dp"] == 64 and llama["parallelism"]["virtual_pipeline_stages"] == 1
    assert llama["group"] == "mbridge_tables_gb200_dense"
    assert llama["source"].endswith("(commit abc123), NeMo container 26.04")
    # a System-titled table names the model per row; the footnote mark is dropped
    assert qwen["model"]["name"] == "Qwen3-30B-A3B" and qwen["parallelism"]["ep"] == 16
    assert qwen["measured"]["tokens_per_s_per_gpu"] == 8960
    assert qwen["parallelism"]["zero_stage"] == 1 and qwen["group"] == "mbridge_tables_h100_moe"


def test_rows_keep_their_precision_word_and_no_recipe_switches():
    """The case's precision is the table's own ("FP8-CS", "MXFP8": meshplan.io.case_inputs reads
    the scaling recipe from it); the switches the release's recipe set are not written into the
    case but taken from catalog/recipes.yaml when it is scored (tests/test_recipes.py)."""
    row = {"Model": "Qwen3_30B_a3B", "System": "DGX-GB200", "#-GPUs": "8", "Precision": "MXFP8", "GBS": "512",
           "MBS": "4", "Sequence Length": "4096", "TP": "1", "PP": "1", "CP": "1", "VP": "n/a", "EP": "8",
           "Tokens / sec / GPU": "40000"}
    graphed = importer.case("26.06", row, MODELS, "abc")
    assert graphed["precision"] == "mxfp8"
    assert set(graphed["parallelism"]) == {"tp", "pp", "cp", "dp", "ep", "sequence_parallel", "virtual_pipeline_stages",
                                           "zero_stage", "activation_recompute"}
    assert importer.case("26.06", {**row, "Precision": "NVFP4"}, MODELS, "abc")["precision"] == "nvfp4"
    assert importer.case("26.06", {**row, "Precision": "FP16"}, MODELS, "abc") is None


def test_rows_outside_the_model_are_skipped():
    ids = [c["id"] for c in _cases(SNIPPET)]
    # DGX-B300 (no catalog cluster), the token-dropping run and the LoRA table are left out
    assert len(ids) == 2
    assert not any("b300" in i or "8gpu" in i for i in ids)


@pytest.fixture(scope="module")
def results():
    return validate(TABLES)


def test_every_table_case_is_scored(results):
    cases = yaml.safe_load(TABLES.read_text())
    assert len(results) == len(cases) > 150
    assert [r.id for r in results if r.error] == []
    assert all(r.predicted_step_time_s > 0 for r in results)
    groups = summarize(results)
    assert {"mbridge_tables_h100_dense", "mbridge_tables_gb200_moe", "mbridge_tables_gb300_dense"} <= set(groups)
    assert sum(g["cases"] for g in groups.values()) == len(cases)
