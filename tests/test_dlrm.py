"""DLRM recommenders (MAD Max, Hsia et al. ISCA 2024): specs, catalog, strategies, estimates.

Published numbers and their tolerances:
- MAD Max Table 2 (model characteristics): parameters, forward FLOPs per sample, sparse lookup
  bytes per sample. Our DLRM-A uses the validation case's fields (801B vs 793B), DLRM-B is derived
  from Table 2 (catalog/dlrm.yaml), so parameters within 2%, FLOPs within 5% (we also count the
  transformer variants' attention scores, which MAD Max's artifact leaves out).
- MAD Max Table 1 (measured training runs of Mudigere et al. ISCA 2022 on 128 A100 ZionEX): DLRM-A
  serialized iteration 67.40 ms, 82.37% of communication exposed, 1.2 MQPS; DLRM-B 3.4 MQPS;
  within 15% (MAD Max's own model is within 3-10% of them). The plan is MAD Max's validation task
  (artifact task_cfgs/val/dlrm_train_val_128.json): tables model-parallel over all 128 GPUs, MLPs
  DDP 128-way, global batch 65,536 (512 per GPU); DLRM-B at Table 2's global batch 256K = 262,144.
  "% communication exposed" is exposed / all communication, as MAD Max's artifact computes it
  (tasks/tasks.py prints "Exposed Communication: 35.99 (75.50 %)" for its 75.46% of Table 1).
- MAD Max Insights 1 and 3 (Sec. 6, Fig. 9): orderings and out-of-memory plans, not values.
"""

from __future__ import annotations

import json

import pytest

import meshplan
from cli_runner import run_cli
from meshplan import catalog
from meshplan.errors import MeshplanError
from meshplan.specs.base import build
from meshplan.specs.dlrm import DLRMModel
from meshplan.specs.strategy import Strategy
from meshplan.workloads.dlrm import lower_dlrm

# --- specs and catalog: MAD Max Table 2 -------------------------------------------------------

TABLE2 = {  # model: (parameters, forward FLOPs per sample, sparse lookup bytes per sample)
    "dlrm-a": (793e9, 638e6, 22.61e6),
    "dlrm-a-transformer": (None, 2.6e9, 22.61e6),
    "dlrm-a-moe": (795e9, 957e6, 22.61e6),
    "dlrm-b": (332e9, 60e6, 13.19e6),
    "dlrm-b-transformer": (None, 2.1e9, 13.19e6),
    "dlrm-b-moe": (333e9, 90e6, 13.19e6),
}


@pytest.mark.parametrize("model_id", sorted(TABLE2))
def test_madmax_table2(model_id):
    params, flop, lookup = TABLE2[model_id]
    m = catalog.model(model_id)
    assert isinstance(m, DLRMModel)
    if params:
        assert m.num_params == pytest.approx(params, rel=0.02)
    assert lower_dlrm(m).forward_flop_per_sample == pytest.approx(flop, rel=0.05)
    # Table 2's lookup bytes are twice the fp16 forward lookup (catalog/dlrm.yaml header): DLRM-A
    # 2 x 4096 x 15 x 94 x 2 B = 23.1 MB vs 22.61 MB
    assert 2 * m.lookup_bytes_per_sample == pytest.approx(lookup, rel=0.025)


def test_dlrm_a_is_the_validation_case_model():
    """The madmax_dlrm case of public-cases.yaml: 4096 x 2.08M x 94, pooling 15, 20 x 3994 MLP layers;
    MAD Max's artifact prints 801.17B parameters and 11.55 MB of lookups per sample."""
    m = catalog.model("dlrm-a")
    assert m.num_params == pytest.approx(801.17e9, rel=1e-4)
    assert m.lookup_bytes_per_sample == pytest.approx(11.55e6, rel=1e-3)
    assert m.embedding_params / m.num_params > 0.9995  # Insight 1: 99.96% of parameters are embeddings


def test_mlperf_dcnv2():
    """MLPerf Training v3.0 DLRM-DCNv2 reference: 26 tables, 204.2M rows x 128 = 26.1B embedding
    weights; interaction input 26 x 128 + 128 = 3456 wide; 214 lookups per sample."""
    m = catalog.model("mlperf-dlrm-dcnv2")
    assert m.tables == 26 and m.total_rows == 204_184_588
    assert m.embedding_params == pytest.approx(26.14e9, rel=1e-3)
    assert m.interaction_in == 3456 and m.interaction_out == 3456
    assert m.lookups_per_sample == 214
    # DCNv2 with 3 low-rank (512) cross layers: 3 x (2 x 3456 x 512 + 3456) weights
    assert m.interaction_params == 3 * (2 * 3456 * 512 + 3456)


@pytest.mark.parametrize("model_id", catalog.dlrm_model_ids())
def test_dlrm_entries_cite_sources(model_id):
    assert catalog.entry("dlrm", model_id)["sources"]["architecture"].strip()


def test_uniform_and_per_table_shapes_do_not_mix():
    with pytest.raises(MeshplanError) as err:
        build(DLRMModel, {"embedding_dim": 8, "num_tables": 4, "table_rows": [10, 10]}, "model")
    assert err.value.field.startswith("model")


def test_interaction_with_layers_parses_and_bad_interaction_names_the_field():
    m = build(DLRMModel, {
        "embedding_dim": 16, "table_rows": [100, 200], "multi_hot_sizes": [1, 2], "bottom_mlp": [32, 16],
        "top_mlp": [64, 1], "num_dense_features": 13, "interaction": "dcnv2 2",
    }, "model")
    assert m.interaction == "dcnv2" and m.interaction_layers == 2
    with pytest.raises(MeshplanError) as err:
        build(DLRMModel, {"embedding_dim": 16, "num_tables": 2, "rows_per_table": 10, "pooling_factor": 1,
                          "bottom_mlp_layers": 1, "top_mlp_layers": 1, "mlp_width": 8, "interaction": "attention"}, "model")
    assert err.value.field == "model.interaction" and err.value.value == "attention"
    assert "dot, cat, dcnv2" in str(err.value)


def test_dot_interaction_needs_bottom_mlp_to_match_embedding_dim():
    with pytest.raises(MeshplanError, match="embedding_dim"):
        build(DLRMModel, {"embedding_dim": 16, "table_rows": [10], "multi_hot_sizes": [1], "bottom_mlp": [32],
                          "top_mlp": [1], "num_dense_features": 4, "interaction": "dot"}, "model")


# --- strategies (MAD Max Sec. 2.2) --------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "embedding=(mp) dense=(tp,ddp)",
    "embedding=mp dense=tp,ddp",
    "dense=(tp, ddp), embedding=(mp,)",
    {"embedding": ["mp"], "dense": ["tp", "ddp"]},
    {"embedding": "mp", "dense": "(tp,ddp)"},
])
def test_strategy_forms_agree(text):
    s = build(Strategy, text, "strategy")
    assert s.embedding == ("mp",) and s.dense == ("tp", "ddp")
    assert s.label == "embedding=(mp) dense=(tp,ddp)"


def test_default_strategy_is_madmax_default():
    s = Strategy()
    assert s.embedding == ("mp",) and s.dense == ("ddp",) and s.of("transformer") == ("ddp",)


@pytest.mark.parametrize("text, field", [
    ("embedding=(mp) dense=(tp,foo)", "strategy.dense"),  # unknown strategy
    ("embedding=(mp) desne=(tp)", "strategy"),  # unknown layer kind
    ("embedding=(mp dense=(tp)", "strategy"),  # malformed
    ("embedding mp", "strategy"),  # malformed
    ("dense=(mp)", "strategy.dense"),  # mp is for embeddings only
    ("dense=(ddp,ddp)", "strategy.dense"),  # one entry per level
    ({"dense": ["tp"], "bogus": ["ddp"]}, "strategy"),
])
def test_strategy_errors_name_the_field(text, field):
    with pytest.raises(MeshplanError) as err:
        build(Strategy, text, "strategy")
    assert err.value.field == field


# --- MAD Max Table 1 ------------------------------------------------------------------------------

ZIONEX = "zionex-a100"
DEFAULT = "embedding=(mp) dense=(ddp)"


def dlrm(model="dlrm-a", strategy=DEFAULT, batch=65536, devices=128, cluster=ZIONEX, **plan):
    return meshplan.estimate(model, cluster, num_devices=devices, strategy=strategy, global_batch_size=batch, **plan)


@pytest.fixture(scope="module")
def dlrm_a():
    return dlrm()


def test_table1_dlrm_a_serialized_iteration(dlrm_a):
    assert dlrm_a.serialized_s == pytest.approx(67.40e-3, rel=0.15)
    assert dlrm_a.serialized_s == pytest.approx(sum(dlrm_a.serialized_by_kind_s.values()))


def test_table1_dlrm_a_communication_exposed(dlrm_a):
    assert dlrm_a.comm_exposed_fraction == pytest.approx(0.8237, rel=0.15)
    assert dlrm_a.exposed_comm_s == pytest.approx(dlrm_a.iteration_s - dlrm_a.compute_s)


def test_table1_dlrm_a_throughput(dlrm_a):
    assert dlrm_a.samples_per_s == pytest.approx(1.2e6, rel=0.15)
    assert dlrm_a.fits


def test_table1_dlrm_b_throughput():
    e = dlrm("dlrm-b", batch=262144)
    assert e.samples_per_s == pytest.approx(3.4e6, rel=0.15)
    assert e.fits


def test_all_to_all_is_blocking_and_gradient_all_reduce_hides(dlrm_a):
    """MAD Max Sec. 4.3, Fig. 6: the embedding all-to-all blocks the top MLP; DDP all-reduces run
    behind backward compute. Fig. 15: the breakdowns add up."""
    a2a, ar = dlrm_a.comm_by_collective["all_to_all"], dlrm_a.comm_by_collective["all_reduce"]
    assert a2a.hidden_s / a2a.total_s < 0.2 < ar.hidden_s / ar.total_s
    for c in dlrm_a.comm_by_collective.values():
        assert c.hidden_s + c.exposed_s == pytest.approx(c.total_s)
        assert sum(c.hidden_behind_s.values()) == pytest.approx(c.hidden_s)
    assert a2a.hidden_behind_s["gemm"] > 0  # the bottom MLP runs beside the forward all-to-all
    assert dlrm_a.compute_s <= dlrm_a.iteration_s <= dlrm_a.serialized_s


def test_readme_example_returns_a_dlrm_estimate():
    e = meshplan.estimate(model="dlrm-a", cluster=ZIONEX, num_devices=128,
                          strategy="embedding=(mp) dense=(tp,ddp)", global_batch_size=65536)
    assert e.strategy == "embedding=(mp) dense=(tp,ddp)"
    assert e.fits and e.samples_per_s > 0
    assert e.comm_by_collective["all_reduce"].total_s > 0  # TP activations and DDP gradients


# --- MAD Max Insights 1 and 3 (Sec. 6, Fig. 9) -----------------------------------------------------


def test_insight1_tp_ddp_beats_the_fsdp_baseline():
    """Fig. 9: ((TP, DDP), (MP)) is 1.14x the FSDP baseline for DLRM-A pre-training."""
    tp_ddp, fsdp = dlrm(strategy="embedding=(mp) dense=(tp,ddp)"), dlrm(strategy="embedding=(mp) dense=(fsdp)")
    assert tp_ddp.fits and fsdp.fits
    assert tp_ddp.samples_per_s > 1.1 * fsdp.samples_per_s


def test_insight1_replicated_embeddings_are_out_of_memory():
    """Insight 1: trillion-parameter tables only fit sharded; replicating them (DDP) is a result
    with fits == False and its memory breakdown, not an exception."""
    e = dlrm(strategy="embedding=(ddp) dense=(ddp)")
    assert not e.fits
    assert e.memory.embedding_weights_bytes == pytest.approx(801.17e9 * 2, rel=1e-3)  # every table, fp16
    assert e.memory.total_bytes == pytest.approx(sum(v for k, v in e.memory.as_dict().items() if k not in ("capacity_bytes", "total_bytes")))
    assert e.warnings


def test_insight1_global_tp_is_far_slower_than_fsdp():
    """Fig. 9: ((TP), (MP)) reaches 0.19x of FSDP: activations all-reduced over RoCE."""
    assert dlrm(strategy="embedding=(mp) dense=(tp)").samples_per_s < 0.5 * dlrm(strategy="embedding=(mp) dense=(fsdp)").samples_per_s


def test_insight3_order_of_hierarchical_strategies_matters():
    """((TP),(DDP)) shards the MLPs over the 8 GPUs of a node and all-reduces activations over NVLink;
    ((DDP),(TP)) shards over the 16 nodes (less memory) and sends activations over RoCE (slower)."""
    inside, outside = dlrm(strategy="embedding=(mp) dense=(tp,ddp)"), dlrm(strategy="embedding=(mp) dense=(ddp,tp)")
    assert outside.memory.dense_weights_bytes == pytest.approx(inside.memory.dense_weights_bytes * 8 / 16)
    assert outside.iteration_s > 2 * inside.iteration_s


def test_variants_cost_throughput():
    """Fig. 11: for pre-training the transformer and MoE variants have lower throughput than DLRM-A."""
    base = dlrm(strategy="embedding=(mp) dense=(tp,ddp)")
    for variant in ("dlrm-a-transformer", "dlrm-a-moe"):
        e = dlrm(variant, strategy="embedding=(mp) dense=(tp,ddp) transformer=(ddp)")
        assert e.fits and e.samples_per_s < base.samples_per_s, variant
    moe = dlrm("dlrm-a-moe")
    assert moe.comm_by_collective["all_to_all"].total_s > base.comm_by_collective["all_to_all"].total_s  # expert dispatch


def test_faster_scale_out_network_is_faster():
    """Insight 6: the blocking all-to-all rides the inter-node network, so faster RoCE speeds DLRM-A up."""
    cluster = catalog.cluster(ZIONEX)
    faster = cluster.model_copy(update={"levels": (cluster.levels[0], cluster.levels[1].model_copy(update={"bytes_per_s": 4 * cluster.levels[1].bytes_per_s}))})
    assert dlrm(cluster=faster).samples_per_s > 1.5 * dlrm().samples_per_s


GRID = [
    ("dlrm-a", "embedding=(mp) dense=(fsdp,ddp)"),
    ("dlrm-a", "embedding=(mp,ddp) dense=(tp,fsdp)"),
    ("dlrm-a-transformer", "embedding=(mp) dense=(tp,ddp) transformer=(fsdp)"),
    ("dlrm-a-moe", "embedding=(mp) dense=(ddp) moe=(tp,ddp)"),
    ("mlperf-dlrm-dcnv2", "embedding=(mp) dense=(tp,ddp)"),
]


def _scaled(cluster_id, hbm=1.0, network=1.0):
    cluster = catalog.cluster(cluster_id)
    device = cluster.device.model_copy(update={"hbm_bytes_per_s": hbm * cluster.device.hbm_bytes_per_s})
    levels = tuple(lvl.model_copy(update={"bytes_per_s": network * lvl.bytes_per_s}) for lvl in cluster.levels)
    return cluster.model_copy(update={"device": device, "levels": levels})


@pytest.mark.parametrize("model_id, strategy", GRID)
def test_invariants_and_more_bandwidth_is_never_slower(model_id, strategy):
    """Streams never beat their busiest one or lose to running everything in a row; the memory
    breakdown adds up; more HBM or network bandwidth never slows an iteration (tasks keep their
    issue order, so every finish time is a max-plus expression of the durations)."""
    e = dlrm(model_id, strategy=strategy)
    assert e.compute_s <= e.iteration_s <= e.serialized_s
    assert e.exposed_comm_s <= e.comm_s
    parts = {k: v for k, v in e.memory.as_dict().items() if k not in ("capacity_bytes", "total_bytes")}
    assert e.memory.total_bytes == pytest.approx(sum(parts.values()))
    for faster in (_scaled(ZIONEX, hbm=2.0), _scaled(ZIONEX, network=2.0)):
        assert dlrm(model_id, strategy=strategy, cluster=faster).iteration_s <= e.iteration_s * (1 + 1e-9)


def test_mlperf_dcnv2_runs_on_a_dgx():
    e = dlrm("mlperf-dlrm-dcnv2", batch=65536, devices=8, cluster="dgx-a100-80gb")
    assert e.fits and e.precision == "tf32"
    assert e.serialized_by_kind_s["embedding_lookup"] > 0 and e.serialized_by_kind_s["all_to_all"] > 0


# --- bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, field", [
    ({"strategy": "embedding=(mp) dense=(tp,fsdp,ddp)"}, "strategy.dense"),  # 3 levels on a 2-level cluster
    ({"strategy": "embedding=(mp) dense=(foo)"}, "strategy.dense"),
    ({"batch": 1000}, "plan.global_batch_size"),
    ({"tp": 8}, "plan.tp"),
    ({"devices": 12, "batch": 6144}, "num_devices"),  # not whole nodes
    ({"model": "dlrm-a-moe", "strategy": {"moe": ["ep"]}}, "strategy.moe"),  # 16 experts over 128 GPUs
    ({"precision": "fp4"}, "plan.precision"),
    ({"framework": "megatron-core"}, "plan.framework"),  # DLRM trainers: torchrec, hugectr
])
def test_bad_dlrm_input_names_the_field(kwargs, field):
    with pytest.raises(MeshplanError) as err:
        dlrm(**kwargs)
    assert err.value.field == field


def test_missing_batch_names_the_field():
    with pytest.raises(MeshplanError) as err:
        meshplan.estimate("dlrm-a", ZIONEX, num_devices=128)
    assert err.value.field == "plan.global_batch_size"


# --- validation and CLI -------------------------------------------------------------------------------


def test_validation_case_runs():
    from meshplan.io.validation_cases import run_case

    case = {
        "id": "madmax_dlrm_a_128gpu_zionex", "group": "madmax_dlrm",
        "model": {"arch": "dlrm", "num_tables": 4096, "rows_per_table": 2080000, "embedding_dim": 94,
                  "pooling_factor": 15, "bottom_mlp_layers": 10, "top_mlp_layers": 10, "mlp_width": 3994,
                  "bytes_per_emb_param": 2, "bytes_per_dense_param": 4, "params_total": 801170000000.0},
        "hardware": {"cluster": ZIONEX, "num_devices": 128, "devices_per_node": 8},
        "precision": "fp16", "measured": {"step_time_s": 0.05461},
        "batch": {"global_batch_samples": 65536, "per_gpu_batch": 512},
    }
    r = run_case(case, 0)
    assert r.error is None and r.fits
    assert abs(r.relative_error) < 0.15  # MAD Max Table 1's tolerance
    # a case may give only the per-GPU batch, and its own strategy under `parallelism`
    case = {**case, "batch": {"per_gpu_batch": 512}, "parallelism": {"dense": ["tp", "ddp"]}}
    assert run_case(case, 0).predicted_step_time_s == pytest.approx(dlrm(strategy="embedding=(mp) dense=(tp,ddp)", precision="fp16").iteration_s)


def test_cli_estimate_json(monkeypatch, capsys):
    code, out, err = run_cli(monkeypatch, capsys, "estimate", "--model", "dlrm-a", "--cluster", ZIONEX, "--devices", "128",
                             "--strategy", "embedding=(mp) dense=(tp,ddp)", "--global-batch", "65536", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["strategy"] == "embedding=(mp) dense=(tp,ddp)"
    assert result["samples_per_s"] > 0 and result["memory"]["fits"]
    assert set(result["serialized_by_kind_s"]) >= {"embedding_lookup", "gemm", "all_to_all", "all_reduce"}


def test_cli_estimate_table_and_errors(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "estimate", "--model", "dlrm-b", "--cluster", ZIONEX, "--devices", "128",
                           "--global-batch", "262144")
    assert code == 0 and "MQPS" in out
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--model", "dlrm-a", "--cluster", ZIONEX, "--devices", "128",
                           "--strategy", "embedding=(mp) dense=(tp,bogus)", "--global-batch", "65536")
    assert code == 2 and err.startswith("error: strategy")
    code, _, err = run_cli(monkeypatch, capsys, "estimate", "--model", "dlrm-a", "--cluster", ZIONEX, "--devices", "128",
                           "--strategy", "embedding=(ddp) dense=(ddp)", "--global-batch", "65536")
    assert code == 2 and err.startswith("error: memory")


def test_cli_catalog_lists_and_shows_dlrm(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "catalog", "list", "models")
    assert code == 0 and "dlrm-a" in out.split() and "mlperf-dlrm-dcnv2" in out.split()
    code, out, _ = run_cli(monkeypatch, capsys, "catalog", "show", "dlrm-b")
    assert code == 0 and "sources" in out


def test_dlrm_inference_runs_forward_only():
    """MAD Max Fig. 11b: inference runs the forward pass only, with no gradients or optimizer state."""
    train = meshplan.estimate("dlrm-a", "zionex-a100", num_devices=128, global_batch_size=65536)
    serve = meshplan.estimate("dlrm-a", "zionex-a100", num_devices=128, global_batch_size=65536, task={"kind": "inference"})
    assert serve.samples_per_s > 2 * train.samples_per_s
    assert serve.memory.dense_gradients_bytes == 0 and serve.memory.dense_optimizer_bytes == 0
    assert serve.memory.embedding_optimizer_bytes == 0
    assert serve.memory.embedding_weights_bytes == train.memory.embedding_weights_bytes


# --- one IR, one scheduler, one trace (issue 8) ---------------------------------------------------


def test_dlrm_lowers_to_the_common_graph():
    """Embedding bags are the head's lookup op, the loss the tail, MLP layers matmul blocks kept
    as (block, count); MoE towers are expert ops holding every tower's weights."""
    from meshplan.workloads.ops import Graph

    m = catalog.model("dlrm-a")
    g = lower_dlrm(m)
    assert isinstance(g, Graph)
    assert [op.kind for op in g.head.ops] == ["lookup"] and g.head.ops[0].params == m.embedding_params
    assert [(b.name, b.count, [op.shard_dim for op in b.ops]) for b in g.blocks if b.name != "interaction"] == [
        ("bottom", 5, ["n", "k"]), ("top", 5, ["n", "k"])]
    assert g.params == pytest.approx(m.num_params)
    moe = catalog.model("dlrm-a-moe")
    towers = [op for b in lower_dlrm(moe).blocks if b.name == "top" for op in b.ops]
    assert all(op.expert and op.m == moe.moe.top_k for op in towers)
    assert lower_dlrm(moe).params == pytest.approx(moe.num_params)


def test_iteration_is_scheduled_by_the_engine_and_traced_from_it():
    """The engine's pass time is the iteration; the trace draws every scheduled task on its
    stream (compute, and the network level each collective crosses)."""
    from meshplan.api import scenario, trace
    from meshplan.parallel.strategy import build_strategy_program
    from meshplan.timeline.engine import schedule_pass
    from meshplan.timeline.iteration import iteration_pass

    s = scenario("dlrm-a", ZIONEX, None, 128, None, strategy="embedding=(mp) dense=(tp,ddp)", global_batch_size=65536)
    program = build_strategy_program(s)
    timed = schedule_pass(iteration_pass(program))
    e = meshplan.estimate("dlrm-a", ZIONEX, num_devices=128, strategy="embedding=(mp) dense=(tp,ddp)", global_batch_size=65536)
    assert timed.time_s == pytest.approx(e.iteration_s, rel=1e-12)
    assert timed.compute_s == pytest.approx(e.compute_s, rel=1e-9)
    assert sum(timed.waited_s.values()) == pytest.approx(e.iteration_s, rel=1e-9)
    events = trace(s)["traceEvents"]
    spans = [ev for ev in events if ev["ph"] == "X"]
    assert len(spans) == len(e.tasks)
    assert max(ev["ts"] + ev["dur"] for ev in spans) / 1e6 == pytest.approx(e.iteration_s)
    threads = {ev["args"]["name"] for ev in events if ev["name"] == "thread_name"}
    assert threads == {"compute", "nvlink3", "roce"}  # TP inside the node, all-to-all and DDP across
