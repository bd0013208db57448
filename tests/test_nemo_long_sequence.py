"""NeMo's published long-sequence runs with context parallelism (tests/data/nemo_long_sequence.yaml):
Llama 2 7B on DGX H100 and Llama 3 8B on DGX B200, 4K to 1M tokens per sequence, CP 1 to 32.
Predicted, not fitted."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from meshplan.io.validation_cases import validate

DATA = Path(__file__).parent / "data" / "nemo_long_sequence.yaml"


def _nemo_llama_flops(case: dict) -> float:
    """NeMo's model FLOPs of one step for its llama2 and llama3 families (nemo/utils/flops_formulas.py),
    written out here apart from the file's numbers."""
    m, b = case["model"], case["batch"]
    hs, layers, s = m["hidden_size"], m["num_layers"], b["seq_len"]
    per = (12 + 12 * m["num_kv_heads"] / m["num_attention_heads"] + 18 * m["ffn_hidden_size"] / hs
           + 12 * s / hs + 6 * m["vocab_size"] / (layers * hs))
    return b["global_batch_sequences"] * s * layers * hs * hs * per


def _cases() -> list[dict]:
    return yaml.safe_load(DATA.read_text())


def test_step_times_are_the_tables_tflops_through_nemos_formula():
    cases = _cases()
    assert len(cases) == 17
    for c in cases:
        p, gpus = c["parallelism"], c["hardware"]["num_devices"]
        assert p["tp"] * p["pp"] * p["dp"] * p["cp"] == gpus, c["id"]
        implied = _nemo_llama_flops(c) / (c["measured"]["tflops_per_gpu"] * 1e12 * gpus)
        assert c["measured"]["step_time_s"] == pytest.approx(implied, rel=1e-6), c["id"]


@pytest.fixture(scope="module")
def errors() -> dict[str, dict[str, float]]:
    results = validate(DATA)
    assert all(r.error is None for r in results), [r.error for r in results if r.error]
    out: dict[str, dict[str, float]] = {}
    for r in results:
        out.setdefault(r.group, {})[r.id] = r.relative_error
    return out


def test_h100_from_4k_to_1m_tokens(errors):
    """Llama 2 7B on H100 (NeMo 24.03.01): median 1.6%, every row within 10.8% today; the 512K
    and 1M rows (CP 16 and 32 across nodes) are the slow ones, +10.8% and +8.4% (+9.3% and +6.8%
    before each of the ring's 16 and 32 steps was costed as an attention call of its own)."""
    h100 = errors["nemo_long_sequence_h100"]
    assert len(h100) == 9
    assert statistics.median(abs(e) for e in h100.values()) <= 0.05, h100
    assert max(abs(e) for e in h100.values()) <= 0.12, h100


def test_b200_known_miss_stays_bounded(errors):
    """Llama 3 8B on B200 (NeMo 25.04.rc2): the rows from 8K to 128K run 6-12% slower than
    predicted; the same 8K layout measured 6% faster in Megatron-Bridge 25.11 (micro-batch 2,
    benchmarks/data/megatron_bridge_tables.yaml), where the model is within 1%. The 512K and 1M
    rows are within 7%. Median 7.5%, largest 12.2% today (10.5% and 19.1% before Blackwell's
    attention paid twice Hopper's flop for each exponential)."""
    b200 = errors["nemo_long_sequence_b200"]
    assert len(b200) == 8
    assert statistics.median(abs(e) for e in b200.values()) <= 0.10, b200
    assert max(abs(e) for e in b200.values()) <= 0.15, b200
    assert all(b200[f"nemo_longseq_b200_{k}k"] < 0 for k in (8, 16, 32, 64, 128)), b200
    assert all(abs(b200[f"nemo_longseq_b200_{k}k"]) <= 0.10 for k in (512, 1024)), b200
