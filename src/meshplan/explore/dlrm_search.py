"""Search for DLRMs: every per-layer-kind strategy (MAD Max Sec. 2.2) for the dense, transformer
and embedding layers, evaluated exactly and ranked by throughput. The space is small (a few
hundred strategies at most), so there is nothing to prune."""

from __future__ import annotations

import itertools
import time
from collections import Counter

from meshplan.errors import MeshplanError
from meshplan.explore.search import SearchResult, ranked
from meshplan.specs.dlrm import DLRMModel
from meshplan.specs.dlrm_scenario import make_dlrm_scenario
from meshplan.specs.strategy import Strategy
from meshplan.timeline.dlrm import estimate_dlrm

#: strategies for compute layers: one spanning every device, or (inside the node, across nodes)
COMPUTE = (("ddp",), ("fsdp",), ("tp",), *itertools.permutations(("ddp", "fsdp", "tp"), 2))
EMBEDDING = (("mp",), ("ddp",))


def strategies(model: DLRMModel) -> list[Strategy]:
    kinds = [COMPUTE, EMBEDDING]
    transformer = model.interaction == "transformer"
    if transformer:
        kinds.append(COMPUTE)
    out = []
    for combo in itertools.product(*kinds):
        fields = {"dense": combo[0], "embedding": combo[1]}
        if transformer:
            fields["transformer"] = combo[2]
        out.append(Strategy(**fields))
    return out


def dlrm_row(e, strategy: Strategy) -> dict:
    return {
        "strategy": strategy.label, "num_devices": e.num_devices, "global_batch_size": e.global_batch_size,
        "step_time_s": e.iteration_s, "serialized_s": e.serialized_s, "samples_per_s": e.samples_per_s,
        "comm_exposed_fraction": e.comm_exposed_fraction, "memory_bytes": e.memory.total_bytes, "fits": e.fits,
    }


def search_dlrm(model: DLRMModel, cluster, num_devices: int, plan: dict, top_k: int, task) -> SearchResult:
    start = time.perf_counter()
    rejected: Counter = Counter()
    rows = []
    space = strategies(model)
    for strategy in space:
        try:
            scenario = make_dlrm_scenario(model, cluster, {**plan, "strategy": strategy}, num_devices, task)
            rows.append(dlrm_row(estimate_dlrm(scenario), strategy))
        except MeshplanError as err:
            rejected[err.field] += 1
    return ranked(rows, len(space), rejected, start, top_k)
