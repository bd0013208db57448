"""The space of plans, declared as data, and the candidates it expands to.

Each field lists the values to try. Constraints (divisibility, batch) are the ones
``make_scenario`` checks for a single plan, so a candidate is valid here exactly when
``meshplan estimate`` would accept it.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Annotated, TypeVar

from pydantic import Field

from meshplan.errors import MeshplanError
from meshplan.specs import Cluster, Plan, Scenario, Task, TransformerModel, make_scenario
from meshplan.specs.base import Count, Natural, Spec
from meshplan.specs.dlrm import DLRMModel
from meshplan.specs.plan import Recompute, Schedule
from meshplan.specs.strategy import Strategy


T = TypeVar("T")
#: a knob's values to try: at least one (an empty list would make the whole space empty)
NonEmpty = Annotated[list[T], Field(min_length=1)]


class SearchSpace(Spec):
    """Values to try per plan knob. ``dp`` is never listed: it follows from the device count."""

    tp: NonEmpty[Count] = [1, 2, 4, 8]
    pp: NonEmpty[Count] = [1, 2, 4, 8, 16, 32, 64]
    cp: NonEmpty[Count] = [1]
    ep: NonEmpty[Count] | None = None  # None: [1] for dense models; 1, 2, 4, ... up to 64 dividing the experts for MoE
    micro_batch_size: NonEmpty[Count] = [1, 2, 4, 8]
    virtual_pipeline_stages: NonEmpty[Count] = [1, 2, 3, 4]
    schedule: NonEmpty[Schedule] = ["1f1b"]
    recompute: NonEmpty[Recompute] = ["none", "selective", "full"]
    # under full recompute, the layers of each model chunk that re-run (Plan.recompute_layers);
    # None: every layer
    recompute_layers: NonEmpty[Natural | None] = [None]
    zero_stage: NonEmpty[Annotated[int, Field(ge=0, le=3)]] = [0, 1, 2, 3]
    sequence_parallel: NonEmpty[bool] = [False, True]

    @property
    def size(self) -> int:
        """Points in the full product, before any constraint."""
        n = 1
        for name in type(self).model_fields:
            n *= len(getattr(self, name) or [1])
        return n


@dataclass(frozen=True)
class Candidates:
    scenarios: list[Scenario]
    space_size: int
    rejected: Counter  # constraint that failed -> how many points it removed


def expand(
    space: SearchSpace,
    model: TransformerModel,
    cluster: Cluster,
    num_devices: int,
    base: Plan,
    task: Task | None = None,
) -> Candidates:
    """Every point of ``space`` that is a valid plan for the model on ``num_devices`` devices.

    ``base`` carries what the search does not vary (global batch, seq_len, precision, ...).
    Points that differ only in knobs that do nothing (sequence parallelism without tp, ZeRO
    without dp, virtual stages without pp, selective recompute with flash attention) are kept
    once.
    """
    if space.ep is None:
        experts = model.moe.num_experts if model.moe else 1
        space = space.model_copy(update={"ep": [e for e in (1, 2, 4, 8, 16, 32, 64) if experts % e == 0]})
    fields = list(type(space).model_fields)
    rejected: Counter = Counter()
    seen = set()
    scenarios = []
    fixed = base.model_dump(exclude_unset=True)
    for values in itertools.product(*(getattr(space, f) for f in fields)):
        point = dict(zip(fields, values))
        mp = point["tp"] * point["cp"] * point["pp"]
        if num_devices % mp:
            rejected["num_devices % (tp*cp*pp)"] += 1
            continue
        dp = num_devices // mp
        if model.moe is None:
            point["ep"] = 1
        if point["tp"] == 1:
            point["sequence_parallel"] = False
        if dp == 1:  # ZeRO does nothing, but the offloaded optimizer is the distributed one
            point["zero_stage"] = 1 if base.optimizer_offload else 0
        if point["pp"] == 1:
            point["virtual_pipeline_stages"] = 1
        if point["recompute"] == "selective" and base.flash_attention and base.selective_recompute == "attention":
            point["recompute"] = "none"  # flash attention keeps no scores: nothing to recompute
        if point["recompute"] == "selective" and base.selective_recompute == "blocks":
            point["recompute"] = "full"  # whole blocks, every one of them: full recompute
        if point["recompute"] != "full":
            point["recompute_layers"] = None  # only whole-layer recompute re-runs some layers
        key = tuple(point.values())
        if key in seen:
            continue
        seen.add(key)
        try:
            plan = Plan.model_validate({**fixed, **point, "dp": dp})
            scenarios.append(make_scenario(model, cluster, plan, num_devices, task))
        except MeshplanError as err:
            rejected[err.field] += 1
    return Candidates(scenarios, space.size, rejected)


#: per-layer-kind strategies tried for compute layers (MAD Max Sec. 2.2): one entry spanning
#: every device, or (inside the node, across nodes); and for embedding tables
COMPUTE_STRATEGIES = (("ddp",), ("fsdp",), ("tp",), *itertools.permutations(("ddp", "fsdp", "tp"), 2))
EMBEDDING_STRATEGIES = (("mp",), ("ddp",))


def strategy_space(model: DLRMModel) -> list[Strategy]:
    """Every per-layer-kind strategy for the dense, embedding (and transformer) layers of a DLRM.
    The space is small (a few hundred strategies at most), so there is nothing to prune."""
    kinds = [COMPUTE_STRATEGIES, EMBEDDING_STRATEGIES]
    transformer = model.interaction == "transformer"
    if transformer:
        kinds.append(COMPUTE_STRATEGIES)
    out = []
    for combo in itertools.product(*kinds):
        fields = {"dense": combo[0], "embedding": combo[1]}
        if transformer:
            fields["transformer"] = combo[2]
        out.append(Strategy(**fields))
    return out
