"""A Chrome / Perfetto trace of one step: one process per device role, one track per stream.

Every task the scheduler placed is drawn on its stream (compute, and one stream per network
axis): each micro-batch's forward and backward at the time the pipeline schedule runs it, the
first micro-batch's forward and the last one's backward with the data-parallel collectives the
framework runs beside them, then the optimizer step. Open the JSON in ui.perfetto.dev or
chrome://tracing (Trace Event Format, "X" complete events, timestamps in microseconds).
"""

from __future__ import annotations

from meshplan.costs.costed import CostedProgram
from meshplan.timeline.engine import CATEGORIES, place_pass
from meshplan.timeline.estimate import Estimate
from meshplan.timeline.pipeline_schedule import simulate_1f1b
from meshplan.timeline.step import pass_plans

STREAMS = CATEGORIES  # compute, tp, cp, ep, dp, pp


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


def _event(name: str, pid: int, tid: int, start_s: float, duration_s: float, args: dict) -> dict:
    return {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": start_s * 1e6, "dur": max(duration_s, 0.0) * 1e6, "args": args}
