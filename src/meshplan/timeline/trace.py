"""A Chrome / Perfetto trace of one step: one process per device role, one track per stream.

Open the JSON in ui.perfetto.dev or chrome://tracing (Trace Event Format, "X" complete events,
timestamps in microseconds).
"""

from __future__ import annotations

from meshplan.costs.costed import CostedProgram
from meshplan.timeline.estimate import Estimate
from meshplan.timeline.pipeline_schedule import simulate_1f1b

STREAMS = ("compute", "tp", "cp", "pp", "dp", "ep")


def chrome_trace(costed: CostedProgram, estimate: Estimate) -> dict:
    program = costed.program
    s = program.scenario
    pp, m = s.plan.pp, s.num_micro_batches
    role_of_stage = {}
    for index, role in enumerate(program.roles):
        role_of_stage[role.stage] = index
    # every stage's F and B from its role (middle stages all share the middle role)
    forward, backward = [], []
    for stage in range(pp):
        role_index = 0 if stage == 0 else len(program.roles) - 1 if stage == pp - 1 else 1
        r = estimate.roles[role_index]
        forward.append(r.forward_s)
        backward.append(r.backward_s)
    schedule = simulate_1f1b(forward, backward, m)

    events: list[dict] = []
    for stage, role_index in role_of_stage.items():
        role = program.roles[role_index]
        times = costed.roles[role_index]
        pid = role_index + 1
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"{role.name} stage (stage {stage})"}})
        for tid, stream in enumerate(STREAMS):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": stream}})
        end = 0.0
        for phase, micro_batch, start, stop in schedule[stage]:
            compute = times.compute_forward_s if phase == "F" else times.compute_backward_s
            tp = times.tp_forward_s if phase == "F" else times.tp_backward_s
            name = f"{'forward' if phase == 'F' else 'backward'} mb{micro_batch}"
            events.append(_event(name, pid, 0, start, min(compute, stop - start)))
            if tp:
                events.append(_event(f"tp {name}", pid, 1, start + compute, min(tp, max(stop - start - compute, 0.0))))
            if times.pp_s:
                events.append(_event(f"send {name}", pid, 3, stop - times.pp_s / 2, times.pp_s / 2))
            end = max(end, stop)
        if costed.dp_s:
            events.append(_event("dp gradient reduce", pid, 4, max(end - backward[stage], 0.0), costed.dp_s))
        tail = max(end, max(end - backward[stage], 0.0) + costed.dp_s)
        events.append(_event("optimizer", pid, 0, tail, costed.optimizer_s))
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": {"step_time_s": estimate.step_time_s}}


def _event(name: str, pid: int, tid: int, start_s: float, duration_s: float) -> dict:
    return {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": start_s * 1e6, "dur": max(duration_s, 0.0) * 1e6}
