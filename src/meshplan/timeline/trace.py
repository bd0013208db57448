"""A Chrome / Perfetto trace of one step: one process per device role, one track per stream.

Every task the scheduler placed is drawn on its stream (compute, and one stream per network
axis or level): each micro-batch's forward and backward at the time the pipeline schedule runs
it, the first micro-batch's forward and the last one's backward with the data-parallel
collectives the framework runs beside them, then the optimizer step. A DLRM iteration is one
pass of one device (``tasks_trace``). Open the JSON in ui.perfetto.dev or chrome://tracing
(Trace Event Format, "X" complete events, timestamps in microseconds).
"""

from __future__ import annotations

from collections.abc import Sequence

from meshplan.costs.costed import CostedProgram
from meshplan.timeline.engine import Placed, place_pass
from meshplan.timeline.estimate import Estimate
from meshplan.timeline.pipeline_schedule import simulate_1f1b
from meshplan.timeline.step import pass_plans

#: a training role's streams: compute and one per network axis
STREAMS = ("compute", "tp", "cp", "ep", "dp", "pp")


def chrome_trace(costed: CostedProgram, estimate: Estimate) -> dict:
    program = costed.program
    s = program.scenario
    m = s.num_micro_batches
    role_of_stage = []
    for index, role in enumerate(program.roles):
        role_of_stage += [index] * role.stages
    forward = [estimate.roles[i].forward_s for i in role_of_stage]
    backward = [estimate.roles[i].backward_s for i in role_of_stage]
    schedule = simulate_1f1b(forward, backward, m)

    events: list[dict] = []
    for index, role in enumerate(program.roles):
        stage = role.stage
        pid = index + 1
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"{role.name} stage (stage {stage})"}})
        for tid, stream in enumerate(STREAMS):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": stream}})
        plans = pass_plans(costed, index)
        end = 0.0
        for phase, micro_batch, start, _ in schedule[stage]:
            if phase == "F":
                p = plans.get("first_forward", plans["forward"]) if micro_batch == 0 else plans["forward"]
            else:
                p = plans.get("last_backward", plans["backward"]) if micro_batch == m - 1 else plans["backward"]
            label = f"{'forward' if phase == 'F' else 'backward'} mb{micro_batch}"
            for placed in place_pass(p, start):
                events.append(_event(f"{placed.task.kind}: {placed.task.name}", pid, STREAMS.index(placed.task.stream),
                                     placed.start_s, placed.end_s - placed.start_s, {"micro_batch": label}))
                end = max(end, placed.end_s)
        optimizer_start = max(end, estimate.step_time_s - costed.optimizer_s)
        events.append(_event("optimizer", pid, 0, optimizer_start, costed.optimizer_s, {}))
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": {"step_time_s": estimate.step_time_s}}


def tasks_trace(process: str, placed: Sequence[Placed], end_s: float) -> dict:
    """One device's scheduled tasks, one track per stream in the order the streams are first
    used (compute first)."""
    rows = {name: i for i, name in enumerate(dict.fromkeys(("compute", *(p.task.stream for p in placed))))}
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": process}}]
    events += [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": stream}} for stream, tid in rows.items()]
    events += [_event(f"{p.task.kind}: {p.task.name}", 1, rows[p.task.stream], p.start_s, p.end_s - p.start_s, {})
               for p in placed]
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": {"step_time_s": end_s}}


def _event(name: str, pid: int, tid: int, start_s: float, duration_s: float, args: dict) -> dict:
    return {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": start_s * 1e6, "dur": max(duration_s, 0.0) * 1e6, "args": args}
