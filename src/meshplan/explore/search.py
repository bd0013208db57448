"""Search: the best plans of a space, exactly, evaluating only the candidates that can win.

Candidates are sorted by their lower bound (meshplan.explore.bound). They are evaluated with
the same code as ``meshplan estimate``, in bound order, until the next bound exceeds the k-th
best exact step time among plans that fit: no unevaluated plan can then enter the top k, so the
result equals brute force.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from meshplan import catalog
from meshplan.costs.costed import cost_program
from meshplan.costs.tco import task_price
from meshplan.errors import MeshplanError
from meshplan.explore import objectives
from meshplan.explore.bound import lower_bounds
from meshplan.explore.space import SearchSpace, expand, strategy_space
from meshplan.explore.store import PlanStore
from meshplan.parallel.program import build_program
from meshplan.parallel.strategy import build_strategy_program
from meshplan.specs import Cluster, Plan, Task, TransformerModel
from meshplan.specs.base import build
from meshplan.specs.dlrm import DLRMModel
from meshplan.specs.dlrm_scenario import make_dlrm_scenario
from meshplan.specs.strategy import Strategy
from meshplan.timeline.estimate import DLRMEstimate, Estimate
from meshplan.timeline.iteration import iteration_estimate
from meshplan.timeline.step import step_estimate

#: plan knobs reported per row, in this order
PLAN_COLUMNS = (
    "tp", "pp", "dp", "cp", "ep", "micro_batch_size", "virtual_pipeline_stages", "schedule", "recompute",
    "recompute_layers", "zero_stage", "sequence_parallel",
)


#: every column of a row, plan knobs first; a plan that does not fit has no times (None)
ROW_COLUMNS = (
    *PLAN_COLUMNS, "num_devices", "global_batch_size", "seq_len", "step_time_s", "tokens_per_s", "mfu",
    "memory_bytes", "fits", "compute_s", "bubble_s", "optimizer_s", "exposed_tp_s", "exposed_cp_s", "exposed_ep_s",
    "exposed_pp_s", "exposed_dp_s", "energy_j", "average_device_w",
)


#: the type of each column, for stores (a column may be None where a plan does not fit)
ROW_TYPES = {
    **dict.fromkeys(("tp", "pp", "dp", "cp", "ep", "micro_batch_size", "virtual_pipeline_stages", "zero_stage",
                     "num_devices", "global_batch_size", "seq_len", "recompute_layers"), "int64"),
    "schedule": "string", "recompute": "string", "sequence_parallel": "bool", "fits": "bool",
    **dict.fromkeys(("step_time_s", "tokens_per_s", "mfu", "memory_bytes", "compute_s", "bubble_s", "optimizer_s",
                     "exposed_tp_s", "exposed_cp_s", "exposed_ep_s", "exposed_pp_s", "exposed_dp_s", "energy_j",
                     "average_device_w"), "float64"),
}


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
        optimizer_s=b.optimizer_s,
        **{f"exposed_{axis}_s": t for axis, t in b.exposed_comm_s.items()},
        energy_j=estimate.energy.total_j if estimate.energy else None,
        average_device_w=estimate.energy.average_device_w if estimate.energy else None,
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
    leanest_infeasible_bytes: float | None = None  # least memory per device of a plan that does not fit (None: all fit)
    reused: int = 0  # rows taken from the store instead of being evaluated again

    @property
    def best(self) -> dict | None:
        return self.top[0] if self.top else None

    def to_arrow(self, rows: list[dict] | None = None):
        try:
            import pyarrow as pa
        except ImportError:
            raise MeshplanError("to_arrow", "pyarrow", "install the store extra: pip install 'meshplan[store]'") from None
        return pa.Table.from_pylist(rows if rows is not None else self.top)

    def _repr_html_(self) -> str:
        """The fastest plans and where their time goes, in notebooks (meshplan.plots.notebook)."""
        from meshplan.plots.notebook import search_html

        return search_html(self)

    def to_pandas(self):
        try:
            import pandas as pd
        except ImportError:
            raise MeshplanError("to_pandas", "pandas", "install the pandas extra: pip install 'meshplan[pandas]'") from None
        return pd.DataFrame(self.top)


def ranked(rows: list[dict], space_size: int, rejected: dict, started: float, top_k: int) -> SearchResult:
    """A SearchResult from exhaustively evaluated rows: the ``top_k`` fastest that fit."""
    feasible = sorted((r for r in rows if r["fits"]), key=lambda r: r["step_time_s"])
    infeasible = [r for r in rows if not r["fits"]]
    return SearchResult(
        top=feasible[:top_k],
        space_size=space_size,
        candidates=len(rows),
        evaluated=len(rows),
        infeasible_memory=len(infeasible),
        rejected=dict(rejected),
        wall_s=time.perf_counter() - started,
        evaluated_rows=feasible,
        leanest_infeasible_bytes=min((r["memory_bytes"] for r in infeasible), default=None),
    )


def strategy_row(e: DLRMEstimate, strategy: Strategy) -> dict:
    return {
        "strategy": strategy.label, "num_devices": e.num_devices, "global_batch_size": e.global_batch_size,
        "step_time_s": e.iteration_s, "serialized_s": e.serialized_s, "samples_per_s": e.samples_per_s,
        "comm_exposed_fraction": e.comm_exposed_fraction, "memory_bytes": e.memory.total_bytes, "fits": e.fits,
    }


def search_strategies(model: DLRMModel, cluster: Cluster, num_devices: int, plan: dict, top_k: int, task) -> SearchResult:
    """Every per-layer-kind strategy of the space (meshplan.explore.space.strategy_space),
    evaluated exactly and ranked by iteration time (MAD Max Sec. 2.2, Fig. 9)."""
    start = time.perf_counter()
    rejected: Counter = Counter()
    rows = []
    space = strategy_space(model)
    for strategy in space:
        try:
            scenario = make_dlrm_scenario(model, cluster, {**plan, "strategy": strategy}, num_devices, task)
            rows.append(strategy_row(iteration_estimate(build_strategy_program(scenario)), strategy))
        except MeshplanError as err:
            rejected[err.field] += 1
    return ranked(rows, len(space), rejected, start, top_k)


def evaluate(scenarios: list) -> list[dict]:
    """Exact rows for a chunk of scenarios (runs in worker processes too).

    Memory comes first: a plan that does not fit is not costed, and its row has no times.
    """
    rows = []
    for scenario in scenarios:
        program = build_program(scenario)
        if all(role.memory.fits for role in program.roles):
            rows.append(plan_row(step_estimate(cost_program(program))))
        else:
            p = scenario.plan.model_dump()
            row = dict.fromkeys(ROW_COLUMNS)
            row.update({name: p[name] for name in PLAN_COLUMNS})
            row.update(
                num_devices=scenario.num_devices, global_batch_size=p["global_batch_size"], seq_len=p["seq_len"],
                memory_bytes=max(role.memory.total_bytes for role in program.roles), fits=False,
            )
            rows.append(row)
    return rows


def plan_key(row: dict) -> tuple:
    return tuple(row[name] for name in PLAN_COLUMNS)


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
    executor: Executor | None = None,
    store: PlanStore | None = None,
    chunk: int = 64,
    objective: str = "time",
) -> SearchResult:
    """The ``top_k`` best plans of ``space`` by ``objective`` (meshplan.explore.objectives:
    time, energy, edp or cost per step) that fit in memory, exactly.

    ``reference`` (plan knobs, e.g. a published plan) is ranked among all plans that fit: the
    search then also evaluates every plan whose bound is below the reference's step time.
    ``executor`` evaluates chunks of candidates (in-process when None); ``store`` keeps every
    evaluated row and supplies the rows of an earlier, interrupted run of the same search.
    """
    if top_k < 1:
        raise MeshplanError("top", top_k, "must be at least 1")
    start = time.perf_counter()
    objectives.check(objective, task, catalog.efficiency(cluster.device.efficiency).power is not None)
    price = task_price(task, cluster, num_devices) if objective == "cost" else None
    candidates = expand(space or SearchSpace(), model, cluster, num_devices, base, task)
    scenarios = candidates.scenarios
    bounds = objectives.bounds(scenarios, lower_bounds(scenarios), objective, price)
    order = [int(i) for i in np.argsort(bounds, kind="stable")]
    reference_row = _reference_row(reference, model, cluster, num_devices, base, task)
    if reference_row:
        reference_row = objectives.annotate(reference_row, objective, price)
    reference_s = objectives.value(reference_row, objective, price) if reference_row and reference_row["fits"] else -np.inf
    known = {plan_key(row): row for row in store.load()} if store else {}
    workers = getattr(executor, "_max_workers", 1) or 1

    best: list[tuple[float, int, dict]] = []  # max-heap of the top k by step time (negated)
    rows: list[dict] = []

    def take(index: int, row: dict) -> None:
        row = objectives.annotate(row, objective, price)
        rows.append(row)
        if not row["fits"]:
            return
        item = (-objectives.value(row, objective, price), -index, row)
        if len(best) < top_k:
            heapq.heappush(best, item)
        elif item > best[0]:
            heapq.heapreplace(best, item)

    position = 0
    try:
        while position < len(order):
            if len(best) == top_k and bounds[order[position]] > max(-best[0][0], reference_s):
                break
            batch = order[position:position + chunk * workers]
            position += len(batch)
            todo = []
            for index in batch:
                row = known.get(plan_key(_point(scenarios[index]))) if known else None
                if row is None:
                    todo.append(index)
                else:
                    take(index, row)
            if todo:
                pieces = [todo[i:i + chunk] for i in range(0, len(todo), chunk)]
                if executor is None:
                    results = [evaluate([scenarios[i] for i in piece]) for piece in pieces]
                else:
                    futures = [executor.submit(evaluate, [scenarios[i] for i in piece]) for piece in pieces]
                    results = [f.result() for f in futures]
                for piece, piece_rows in zip(pieces, results):
                    for index, row in zip(piece, piece_rows):
                        take(index, row)
                        if store:
                            store.add(row)
            if progress:
                progress(position, len(order))
    finally:
        if store:
            store.flush()

    top = [row for _, _, row in sorted(best, key=lambda item: (-item[0], -item[1]))]
    feasible = [r for r in rows if r["fits"]]
    reference_rank = None
    if reference_row and reference_row["fits"]:
        reference_rank = 1 + sum(objectives.value(r, objective, price) < reference_s for r in feasible)
    infeasible = [r for r in rows if not r["fits"]]
    return SearchResult(
        top=top,
        space_size=candidates.space_size,
        candidates=len(scenarios),
        evaluated=len(rows),
        infeasible_memory=len(infeasible),
        rejected=dict(candidates.rejected),
        wall_s=time.perf_counter() - start,
        evaluated_rows=feasible,
        reference=reference_row,
        reference_rank=reference_rank,
        leanest_infeasible_bytes=min((r["memory_bytes"] for r in infeasible), default=None),
        reused=sum(plan_key(r) in known for r in rows),
    )


def _point(scenario) -> dict:
    p = scenario.plan.model_dump()
    return {name: p[name] for name in PLAN_COLUMNS}


def _reference_row(reference, model, cluster, num_devices, base, task) -> dict | None:
    if not reference:
        return None
    from meshplan.specs import make_scenario

    plan = build(Plan, {**base.model_dump(exclude_unset=True), **reference}, "reference")
    scenario = make_scenario(model, cluster, plan, num_devices, task)
    return plan_row(step_estimate(cost_program(build_program(scenario))))


def brute_force(model, cluster, num_devices, base, space=None, task=None, objective: str = "time") -> list[dict]:
    """Every valid plan evaluated exactly, best first by ``objective`` (for tests and small spaces)."""
    from meshplan.api import estimate_scenario

    price = task_price(task, cluster, num_devices) if objective == "cost" else None
    candidates = expand(space or SearchSpace(), model, cluster, num_devices, base, task)
    rows = [objectives.annotate(plan_row(estimate_scenario(s)), objective, price) for s in candidates.scenarios]
    return sorted((r for r in rows if r["fits"]), key=lambda r: objectives.value(r, objective, price))


def rank_of(rows_sorted: list[dict], plan: dict) -> int | None:
    """1-based rank of ``plan`` (matched on the plan columns it gives) in sorted rows."""
    for rank, row in enumerate(rows_sorted, start=1):
        if all(row[k] == v for k, v in plan.items() if k in PLAN_COLUMNS):
            return rank
    return None


