"""Finetuning with frozen layers: no weight gradients or optimizer state for them (MAD Max)."""

from __future__ import annotations

import pytest

from meshplan import api, catalog
from meshplan.errors import MeshplanError

PLAN = dict(num_devices=8, tp=8, global_batch_size=8, recompute="none", sequence_parallel=True)


def _finetune(frozen, **extra):
    return api.estimate("llama3-8b", "dgx-h100", **{**PLAN, **extra}, task={"kind": "finetune", "frozen_layers": frozen})


def test_frozen_layers_have_no_gradients_or_optimizer_state():
    from meshplan.parallel.shard import param_share
    from meshplan.workloads.transformer import lower

    model = catalog.model("llama3-8b")
    full = api.estimate("llama3-8b", "dgx-h100", **PLAN)
    half = _finetune(16)
    layer_share = sum(param_share(op, 8) for op in lower(model, 1, 8).layer.ops)  # norms replicate over tp
    embedding_share = model.embedding_params / 8
    assert full.memory.optimizer_bytes - half.memory.optimizer_bytes == pytest.approx(12 * (16 * layer_share + embedding_share), rel=1e-6)
    assert half.memory.weights_bytes == full.memory.weights_bytes  # frozen weights stay in memory
    assert half.memory.activations_bytes < full.memory.activations_bytes


def test_freezing_more_layers_never_costs_more():
    times = [_finetune(k).step_time_s for k in (0, 8, 16, 24, 32)]
    memory = [_finetune(k).memory.total_bytes for k in (0, 8, 16, 24, 32)]
    assert times == sorted(times, reverse=True) and times[-1] < 0.5 * times[0]
    assert memory == sorted(memory, reverse=True)


def test_finetune_flop_counts_backward_only_for_trained_layers():
    full = api.estimate("llama3-8b", "dgx-h100", **PLAN)
    all_frozen = _finetune(32)
    # forward of everything plus the backward of the head: a bit over a third of the full count
    assert all_frozen.model_flop_per_step < 0.4 * full.model_flop_per_step
    assert all_frozen.model_flop_per_step > full.model_flop_per_step / 3


def test_frozen_stages_are_their_own_roles():
    e = api.estimate("llama2-70b", "dgx-a100-80gb", num_devices=64, tp=8, pp=4, global_batch_size=64,
                     recompute="full", task={"kind": "finetune", "frozen_layers": 40})
    names = [r.name for r in e.roles]
    assert "frozen middle" in names and sum(r.devices for r in e.roles) == 64


def test_cannot_freeze_more_layers_than_the_model_has():
    with pytest.raises(MeshplanError) as err:
        _finetune(33)
    assert err.value.field == "task.frozen_layers"
