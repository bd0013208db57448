"""MLPerf Training DLRM-DCNv2 runs (tests/data/mlperf_dlrm.yaml, benchmarks/import_mlperf_dlrm.py).

NVIDIA's HugeCTR submissions of v4.0, v4.1 and v5.0 on one DGX H100, H200, B200 and two GB200
trays (8 GPUs, global batch 55,296) and on 64 and 128 H100s and 64 GB200s (135,168): each step
time the median over a directory's logs of each log's median block between two evaluations.

- MLPerf's multi-hot keys are uniform over each table (materialize_synthetic_multihot_dataset.py
  --multi_hot_distribution_type uniform), so the backward's sparse update writes back almost
  every row it read, with its row-wise Adagrad state (DLRMModel.update_bytes): twice the forward's
  bytes, where MAD Max's artifact costs the update as the lookup.
- The cases name HugeCTR (``framework: hugectr``): across nodes it exchanges the pooled
  embeddings hierarchically (train.py: CommunicationStrategy.Hierarchical when num_nodes > 1),
  in fp16 under mixed precision (HugeCTR/src/pybind/model.cpp: the embedding collection's
  emb_type and wgrad_type are Half with use_mixed_precision), and all-reduces every dense
  gradient at once (CreateSolver grouped_all_reduce=True). With TorchRec's flat all-to-all over
  all 128 GPUs and an all-reduce per layer the multi-node runs were 50% to 2.1x slow; now 15% to
  19% fast.
- Every run is predicted fast, by 0.26 to 0.76 ms a step (H100 0.51 ms, H200 0.73, B200 0.74 on
  one node; 15% on H100 to 35% on B200, 47% on 64 GB200s): a cost of the step that does not
  shrink with the device, which the model does not have. A known miss.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
import yaml

import meshplan
from meshplan.io.validation_cases import validate
from meshplan.parallel.strategy import build_strategy_program
from meshplan.specs.base import build
from meshplan.specs.dlrm import DLRMModel

CASES = Path(__file__).parent / "data" / "mlperf_dlrm.yaml"


@pytest.fixture(scope="module")
def scored():
    cases = {c["id"]: c for c in yaml.safe_load(CASES.read_text())}
    return [(r, cases[r.id]) for r in validate(CASES)]


def test_every_run_is_scored_and_cites_its_logs(scored):
    assert len(scored) == 10
    for result, case in scored:
        assert result.error is None and result.fits, result
        assert "github.com/mlcommons/training_results_v" in case["source"]
        per_log = [float(t) for t in case["target_basis"].split("per log: ")[1].rstrip(" ms)").split(", ")]
        assert case["measured"]["step_time_s"] * 1e3 == pytest.approx(statistics.median(per_log), abs=1e-3)


def test_h100_runs_across_nodes_within_20_percent(scored):
    multi = [(r, c) for r, c in scored if c["hardware"]["cluster"] == "dgx-h100" and c["hardware"]["num_devices"] > 8]
    assert len(multi) == 4
    for result, case in multi:
        assert abs(result.relative_error) < 0.20, result.id


def _tasks(framework: str, devices: int = 128):
    e = meshplan.estimate("mlperf-dlrm-dcnv2", "dgx-h100", num_devices=devices, global_batch_size=135168,
                          precision="fp16", strategy="embedding=(mp) dense=(ddp)", framework=framework)
    program = build_strategy_program(meshplan.api.scenario("mlperf-dlrm-dcnv2", "dgx-h100", {
        "global_batch_size": 135168, "precision": "fp16", "strategy": "embedding=(mp) dense=(ddp)", "framework": framework},
        devices))
    return e, {t.name: t for t in program.tasks}


def test_hugectr_exchanges_between_nodes_hierarchically_in_fp16_and_reduces_gradients_once():
    """128 H100s: HugeCTR's forward exchange goes to the same rail's GPU of each of the 16 nodes,
    then inside the node (8); backward the reverse; each carries the fp16 pooled vectors, half the
    fp32 tables' bytes TorchRec's one all-to-all over 128 GPUs moves. Its dense gradients are one
    all-reduce; TorchRec's are PyTorch DDP's buckets (the first 1 MiB, then 25 MiB), together all of them."""
    hugectr, h = _tasks("hugectr")
    torchrec, t = _tasks("torchrec")
    flat = t["emb:a2a_f"].comm
    rail, node = h["emb:a2a_f:rail"].comm, h["emb:a2a_f:node"].comm
    assert (flat.span.size, rail.span.size, node.span.size) == (128, 16, 8)
    assert rail.bytes == node.bytes == pytest.approx(flat.bytes / 2)
    assert h["emb:a2a_f:node"].deps == ("emb:a2a_f:rail",) and h["emb:a2a_b:rail"].deps == ("emb:a2a_b:node",)
    reduces = [task.comm for task in h.values() if task.comm and task.comm.kind == "all_reduce"]
    buckets = [task.comm for task in t.values() if task.comm and task.comm.kind == "all_reduce"]
    assert len(reduces) == 1 and len(buckets) > 2
    assert sum(c.bytes for c in buckets) == pytest.approx(reduces[0].bytes)
    assert buckets[0].bytes >= 1024**2 and all(c.bytes >= 25 * 1024**2 for c in buckets[1:-1])
    assert hugectr.iteration_s < 0.5 * torchrec.iteration_s


def test_uniform_keys_update_each_distinct_row_with_its_state():
    """Two tables of 10 and 1000 rows, 2 and 1 keys a sample, dim 4, fp32 rows, 100 samples:
    10 (1 - e^-20) + 1000 (1 - e^-0.1) distinct rows; each read and written with its state (row-wise
    Adagrad: 4 bytes a row; Adagrad: 4 a weight; SGD none), and a gradient read per lookup."""
    base = dict(embedding_dim=4, table_rows=[10, 1000], multi_hot_sizes=[2, 1], bottom_mlp=[4], top_mlp=[1],
                num_dense_features=2, interaction="cat", bytes_per_emb_param=4)
    distinct = 10 * (1 - math.exp(-20)) + 1000 * (1 - math.exp(-0.1))
    for optimizer, row in (("rowwise_adagrad", 16 + 4), ("adagrad", 16 + 16), ("sgd", 16)):
        m = build(DLRMModel, {**base, "embedding_optimizer": optimizer}, "model")
        assert m.keys == "uniform"
        assert m.distinct_rows(100) == pytest.approx(distinct)
        assert m.update_bytes(100, 2.0) == pytest.approx(2 * row * distinct + 100 * 3 * 4 * 2.0)
    unknown = build(DLRMModel, {**base, "key_distribution": "unknown"}, "model")
    assert unknown.update_bytes(100, 2.0) == pytest.approx(100 * unknown.lookup_bytes_per_sample)
    one_hot = build(DLRMModel, {**base, "multi_hot_sizes": [1, 1]}, "model")
    assert one_hot.keys == "unknown"  # one-hot Criteo's real keys repeat; MAD Max's assumption
