"""Search for serving: the tp x pp x dp splits of a device count, ranked by time per output
token (at a fixed batch, decode throughput ranks the same way). The space is small (divisors
of the device count), so every plan is evaluated exactly with the inference estimate."""

from __future__ import annotations

import time
from collections import Counter

from meshplan.errors import MeshplanError
from meshplan.explore.search import SearchResult, ranked
from meshplan.explore.space import SearchSpace
from meshplan.specs import Cluster, Plan, Task, TransformerModel, make_scenario
from meshplan.timeline.inference import inference_estimate


def serving_row(e) -> dict:
    p = e.plan
    return {
        "tp": p["tp"], "pp": p["pp"], "dp": p["dp"], "num_devices": e.num_devices, "batch_size": e.batch_size,
        "ttft_s": e.ttft_s, "tpot_s": e.tpot_s, "decode_tokens_per_s": e.decode_tokens_per_s,
        "tokens_per_s": e.tokens_per_s, "memory_bytes": e.memory.total_bytes, "fits": e.fits,
        "decode_memory_bound": e.decode.memory_bound, "decode_host_bound": e.decode.host_bound, "step_time_s": e.tpot_s,
    }


def search_serving(model: TransformerModel, cluster: Cluster, num_devices: int, base: Plan, space: SearchSpace, top_k: int, task: Task) -> SearchResult:
    start = time.perf_counter()
    rejected: Counter = Counter()
    rows = []
    points = 0
    for tp in space.tp:
        for pp in space.pp:
            points += 1
            if num_devices % (tp * pp):
                rejected["num_devices % (tp*pp)"] += 1
                continue
            plan = Plan.model_validate({**base.model_dump(exclude_unset=True), "tp": tp, "pp": pp, "dp": num_devices // (tp * pp)})
            try:
                rows.append(serving_row(inference_estimate(make_scenario(model, cluster, plan, num_devices, task))))
            except MeshplanError as err:
                rejected[err.field] += 1
    return ranked(rows, points, rejected, start, top_k)
