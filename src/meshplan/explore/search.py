"""Search: the best plans of a space, exactly, evaluating only the candidates that can win.

Candidates are sorted by their lower bound (meshplan.explore.bound). They are evaluated with
the same code as ``meshplan estimate``, in bound order, until the next bound exceeds the k-th
best exact step time among plans that fit: no unevaluated plan can then enter the top k, so the
result equals brute force.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from meshplan.costs.costed import cost_program
from meshplan.errors import MeshplanError
from meshplan.explore.bound import lower_bounds
from meshplan.explore.space import SearchSpace, expand
from meshplan.parallel.program import build_program
from meshplan.specs import Cluster, Plan, Task, TransformerModel
from meshplan.timeline.estimate import Estimate
from meshplan.timeline.step import step_estimate

#: plan knobs reported per row, in this order
PLAN_COLUMNS = (
    "tp", "pp", "dp", "cp", "micro_batch_size", "virtual_pipeline_stages", "schedule", "recompute",
    "zero_stage", "sequence_parallel",
)


def plan_row(estimate: Estimate) -> dict:
    """One long-form row: plan knobs, then results (stable snake_case columns)."""
    p = estimate.plan
    b = estimate.breakdown
    row = {name: p[name] for name in PLAN_COLUMNS}
    row.update(
        num_devices=estimate.num_devices,
        global_batch_size=p["global_batch_size"],
        seq_len=p["seq_len"],
        step_time_s=estimate.step_time_s,
        tokens_per_s=estimate.tokens_per_s,
        mfu=estimate.mfu,
        memory_bytes=estimate.memory.total_bytes,
        fits=estimate.fits,
        compute_s=b.compute_s,
        bubble_s=b.bubble_s,
        **{f"exposed_{axis}_s": t for axis, t in b.exposed_comm_s.items()},
    )
    return row


@dataclass(frozen=True)
class SearchResult:
    top: list[dict]  # the best plans that fit, best first
    space_size: int  # points in the declared space
    candidates: int  # valid plans after the constraints
    evaluated: int  # plans evaluated exactly (memory first, then time for those that fit)
    infeasible_memory: int  # evaluated plans that do not fit
    rejected: dict[str, int]  # constraint -> points it removed
    wall_s: float
    evaluated_rows: list[dict] = field(default_factory=list, repr=False)  # every plan timed exactly
    reference: dict | None = None  # the reference plan's row, if one was given
    reference_rank: int | None = None  # its rank among all plans of the space that fit
    leanest_infeasible_bytes: float = float("inf")  # least memory per device of a plan that does not fit

    @property
    def best(self) -> dict | None:
        return self.top[0] if self.top else None

    def to_arrow(self, rows: list[dict] | None = None):
        import pyarrow as pa

        return pa.Table.from_pylist(rows if rows is not None else self.top)

    def to_pandas(self):
        import pandas as pd

        return pd.DataFrame(self.top)


def search(
    model: TransformerModel,
    cluster: Cluster,
    num_devices: int,
    base: Plan,
    space: SearchSpace | None = None,
    top_k: int = 10,
    task: Task | None = None,
    progress: Callable[[int, int], None] | None = None,
    reference: dict | None = None,
) -> SearchResult:
    """The ``top_k`` fastest plans of ``space`` that fit in memory, exactly.

    ``reference`` (plan knobs, e.g. a published plan) is ranked among all plans that fit: the
    search then also evaluates every plan whose bound is below the reference's step time.
    """
    if top_k < 1:
        raise MeshplanError("top", top_k, "must be at least 1")
    start = time.perf_counter()
    candidates = expand(space or SearchSpace(), model, cluster, num_devices, base, task)
    scenarios = candidates.scenarios
    bounds = lower_bounds(scenarios)
    order = np.argsort(bounds, kind="stable")
    reference_row = _reference_row(reference, model, cluster, num_devices, base, task)
    reference_s = reference_row["step_time_s"] if reference_row and reference_row["fits"] else -np.inf

    best: list[tuple[float, int, dict]] = []  # max-heap of the top k by step time (negated)
    rows: list[dict] = []
    infeasible = 0
    leanest = np.inf  # least memory per device among plans that do not fit
    for done, index in enumerate(order):
        if len(best) == top_k and bounds[index] > max(-best[0][0], reference_s):
            break
        program = build_program(scenarios[index])
        if not all(role.memory.fits for role in program.roles):  # memory first: no costing needed
            infeasible += 1
            leanest = min(leanest, max(role.memory.total_bytes for role in program.roles))
            continue
        row = plan_row(step_estimate(cost_program(program)))
        rows.append(row)
        if len(best) < top_k:
            heapq.heappush(best, (-row["step_time_s"], -int(index), row))
        elif row["step_time_s"] < -best[0][0]:
            heapq.heapreplace(best, (-row["step_time_s"], -int(index), row))
        if progress and done % 64 == 0:
            progress(done + 1, len(order))
    if progress:
        progress(len(rows), len(order))
    top = [row for _, _, row in sorted(best, key=lambda item: (-item[0], -item[1]))]
    reference_rank = None
    if reference_row and reference_row["fits"]:
        reference_rank = 1 + sum(r["step_time_s"] < reference_s for r in rows)
    return SearchResult(
        top=top,
        space_size=candidates.space_size,
        candidates=len(scenarios),
        evaluated=len(rows) + infeasible,
        infeasible_memory=infeasible,
        rejected=dict(candidates.rejected),
        wall_s=time.perf_counter() - start,
        evaluated_rows=rows,
        reference=reference_row,
        reference_rank=reference_rank,
        leanest_infeasible_bytes=float(leanest),
    )


def _reference_row(reference, model, cluster, num_devices, base, task) -> dict | None:
    if not reference:
        return None
    from meshplan.specs import make_scenario

    plan = Plan.model_validate({**base.model_dump(exclude_unset=True), **reference})
    scenario = make_scenario(model, cluster, plan, num_devices, task)
    return plan_row(step_estimate(cost_program(build_program(scenario))))


def brute_force(model, cluster, num_devices, base, space=None, task=None) -> list[dict]:
    """Every valid plan evaluated exactly, fastest first (for tests and small spaces)."""
    from meshplan.api import estimate_scenario

    candidates = expand(space or SearchSpace(), model, cluster, num_devices, base, task)
    rows = [plan_row(estimate_scenario(s)) for s in candidates.scenarios]
    return sorted((r for r in rows if r["fits"]), key=lambda r: r["step_time_s"])


def rank_of(rows_sorted: list[dict], plan: dict) -> int | None:
    """1-based rank of ``plan`` (matched on the plan columns it gives) in sorted rows."""
    for rank, row in enumerate(rows_sorted, start=1):
        if all(row[k] == v for k, v in plan.items() if k in PLAN_COLUMNS):
            return rank
    return None


