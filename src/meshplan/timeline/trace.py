"""A Chrome / Perfetto trace of one step (or one serving request): one process per device
role, one track per stream.

Every task the scheduler placed is drawn on its stream (compute, and one stream per network
axis or level): each micro-batch's forward and backward at the time the pipeline schedule runs
it, the first micro-batch's forward and the last one's backward with the data-parallel
collectives the framework runs beside them, then the optimizer step. A serving request draws
the prefill and the first decode steps, each a token's pass through the stages. A DLRM
iteration is one pass of one device (``tasks_trace``). Open the JSON in ui.perfetto.dev or
chrome://tracing (Trace Event Format, "X" complete events, timestamps in microseconds).
"""

from __future__ import annotations

from collections.abc import Sequence

from meshplan.costs.costed import CostedProgram
from meshplan.timeline.engine import Placed, place_pass, schedule_pass
from meshplan.timeline.estimate import Estimate
from meshplan.timeline.inference import InferenceEstimate, PhasePlan
from meshplan.timeline.pipeline_schedule import simulate
from meshplan.timeline.step import pass_plans, pipeline_inputs, role_passes

#: a training role's streams: compute and one per network axis (axes sharing a network level
#: share a stream, named by them, "ep+dp": those get tracks after these)
STREAMS = ("compute", "tp", "cp", "ep", "dp", "pp")


class _Tracks:
    """Thread ids per (process, stream): the fixed STREAMS first, shared streams as they come."""

    def __init__(self):
        self.extra: dict[int, list[str]] = {}

    def tid(self, pid: int, stream: str) -> int:
        if stream in STREAMS:
            return STREAMS.index(stream)
        names = self.extra.setdefault(pid, [])
        if stream not in names:
            names.append(stream)
        return len(STREAMS) + names.index(stream)

    def names(self) -> list[dict]:
        return [{"ph": "M", "name": "thread_name", "pid": pid, "tid": len(STREAMS) + i, "args": {"name": stream}}
                for pid, names in self.extra.items() for i, stream in enumerate(names)]


def chrome_trace(costed: CostedProgram, estimate: Estimate) -> dict:
    """Every role's representative stage through the step, as the pipeline schedule runs it
    (``pipeline_schedule.simulate``, any schedule): a whole-stage forward or backward drawn as
    its scheduled tasks, a model chunk (interleaved), weight-gradient op (zero-bubble) or paired
    forward-and-backward (DualPipe) as one box on the compute stream."""
    program = costed.program
    s = program.scenario
    plan = s.plan
    m = s.num_micro_batches
    passes = [role_passes(costed, i) for i in range(len(program.roles))]
    works, p2p_s, overlap_p2p = pipeline_inputs(costed, passes)
    schedule = simulate(works, m, plan.schedule, plan.virtual_pipeline_stages, p2p_s, overlap_p2p, plan.microbatch_group_size)
    whole = plan.virtual_pipeline_stages == 1

    events: list[dict] = []
    tracks = _Tracks()
    for index, role in enumerate(program.roles):
        stage = role.stage
        pid = index + 1
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"{role.name} stage (stage {stage})"}})
        for tid, stream in enumerate(STREAMS):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": stream}})
        plans = pass_plans(costed, index)
        if passes[index].release_s:  # interleaved: the parameter all-gathers the first forward waits for
            events.append(_event("all_gather: parameters, before the first forward", pid, tracks.tid(pid, "dp"), 0.0,
                                 passes[index].release_s, {}))
        end = 0.0
        for op in schedule[stage]:
            label = {"F": "forward", "B": "backward", "W": "weight gradients", "FB": "forward+backward"}[op.kind]
            args = {"micro_batch": op.micro_batch, "chunk": op.chunk}
            p = _drawn_pass(plans, op.kind, op.micro_batch, m, plan.schedule) if whole else None
            if p is None:
                events.append(_event(f"{label} mb{op.micro_batch}", pid, 0, op.start_s, op.end_s - op.start_s, args))
            else:
                for placed in place_pass(p, op.start_s):
                    events.append(_event(f"{placed.task.kind}: {placed.task.name}", pid, tracks.tid(pid, placed.task.stream),
                                         placed.start_s, placed.end_s - placed.start_s, {**args, "pass": label}))
            end = max(end, op.end_s)
        optimizer_start = max(end, estimate.step_time_s - costed.optimizer_s)
        events.append(_event("optimizer", pid, 0, optimizer_start, costed.optimizer_s, {}))
    events += tracks.names()
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": {"step_time_s": estimate.step_time_s}}


def _drawn_pass(plans: dict, kind: str, micro_batch: int, m: int, schedule: str):
    """The pass whose tasks draw a whole-stage op, or None to draw it as one box."""
    if kind == "F":
        return plans.get("first_forward", plans["forward"]) if micro_batch == 0 else plans["forward"]
    if kind == "B":
        if schedule in ("zb-h1", "dualpipe"):
            return plans.get("input_backward")
        return plans.get("last_backward", plans["backward"]) if micro_batch == m - 1 else plans["backward"]
    return None


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


#: decode steps a serving trace draws after the prefill; a marker stands for the rest
TRACE_DECODE_STEPS = 4


def serving_trace(prefill: PhasePlan, decode: PhasePlan, estimate: InferenceEstimate, decode_steps: int = TRACE_DECODE_STEPS) -> dict:
    """The prefill, then the first ``decode_steps`` decode steps (each the step at the mean
    context that ``tpot_s`` is), one process per device role: a token runs through the stages
    one after another, each stage's pass as scheduled, then the activation send to the next
    stage on the pp stream. A marker after the last step drawn stands for the others."""
    program = decode.costed.program
    roles = program.roles
    steps = min(decode_steps, estimate.output_len)
    events: list[dict] = []
    for index, role in enumerate(roles):
        pid = index + 1
        name = f"{role.name} stage (stage {role.stage}" + (f", like {role.stages} stages)" if role.stages > 1 else ")")
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})
        for tid, stream in enumerate(STREAMS):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": stream}})
    drawn = [("prefill", prefill, 0.0, program.scenario.task.prompt_len)]
    drawn += [(f"decode step {k + 1}", decode, estimate.ttft_s + k * estimate.tpot_s, decode.costed.program.phase.kv_len)
              for k in range(steps)]
    tracks = _Tracks()
    for label, plan, start, context in drawn:
        events += _serving_pass(plan, start, {"phase": label, "context_tokens": context}, tracks)
    events += tracks.names()
    end_s = estimate.ttft_s + steps * estimate.tpot_s
    if steps < estimate.output_len:
        events.append({"name": f"{estimate.output_len - steps} more decode steps", "ph": "i", "s": "g", "pid": len(roles), "tid": 0,
                       "ts": end_s * 1e6, "args": {"request_end_s": estimate.request_s}})
    metadata = {"ttft_s": estimate.ttft_s, "tpot_s": estimate.tpot_s, "request_s": estimate.request_s,
                "decode_steps_drawn": steps, "end_s": end_s}
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": metadata}


def _serving_pass(plan: PhasePlan, start_s: float, args: dict, tracks: _Tracks) -> list[dict]:
    """One token's pass through the pipeline from ``start_s``: each role drawn at its
    representative stage."""
    roles = plan.costed.program.roles
    role_of_stage = [i for i, role in enumerate(roles) for _ in range(role.stages)]
    times = [schedule_pass(p).time_s for p in plan.passes]
    events = []
    offset = start_s
    for stage, index in enumerate(role_of_stage):
        if roles[index].stage == stage:
            for placed in place_pass(plan.passes[index], offset):
                events.append(_event(f"{placed.task.kind}: {placed.task.name}", index + 1, tracks.tid(index + 1, placed.task.stream),
                                     placed.start_s, placed.end_s - placed.start_s, args))
        offset += times[index]
        if stage < len(role_of_stage) - 1:
            if roles[index].stage == stage:
                events.append(_event(f"send_recv: activation to stage {stage + 1}", index + 1, STREAMS.index("pp"), offset,
                                     plan.send_s, args))
            offset += plan.send_s
    return events
