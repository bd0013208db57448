"""DLRM recommenders (MAD Max, Hsia et al. ISCA 2024): specs, catalog, strategies, estimates.

Published numbers and their tolerances:
- MAD Max Table 2 (model characteristics): parameters, forward FLOPs per sample, sparse lookup
  bytes per sample. Our DLRM-A uses the validation case's fields (801B vs 793B), DLRM-B is derived
  from Table 2 (catalog/dlrm.yaml), so parameters within 2%, FLOPs within 5% (we also count the
  transformer variants' attention scores, which MAD Max's artifact leaves out).
"""

from __future__ import annotations

import pytest

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
    assert err.value.field == "model"
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
    ("embedding=(mp) dense=(tp,foo)", "strategy"),  # unknown strategy
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
