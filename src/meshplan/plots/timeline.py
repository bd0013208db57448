"""The per-device timeline figure from a Chrome trace (``meshplan estimate --trace``): one lane
per device role and stream, the scheduled tasks as spans.

A step of a large job schedules tens of thousands of tasks; a browser draws a few thousand
bars smoothly. When there are more, tasks of the same kind that follow each other on a lane
with a gap of at most ``gap_s`` are drawn as one span, the gap doubling until the figure has at
most ``max_spans`` spans (or, where kinds alternate more often than that, one span per run of
a kind). Every task stays inside a span of its lane and kind; the note says
how far apart merged tasks were.
"""

from __future__ import annotations

from meshplan.plots.figures import Span, Timeline


def timeline(trace: dict, max_spans: int = 3000, title: str = "Per-device timeline of one step") -> Timeline:
    """The Timeline of ``trace``'s complete ("X") events, merged down to ``max_spans``."""
    events = trace["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    tasks = []
    for e in events:
        if e.get("ph") != "X":
            continue
        stream = threads.get((e["pid"], e["tid"]), f"stream {e['tid']}")
        lane = f"{processes.get(e['pid'], 'device ' + str(e['pid']))} / {stream}"
        tasks.append(Span(lane, span_kind(e, stream), e["ts"] * 1e-6, e["dur"] * 1e-6, e["name"]))
    lanes = tuple(dict.fromkeys(s.lane for s in sorted(tasks, key=lambda s: _lane_order(s.lane, processes, threads))))
    end_s = max((s.start_s + s.duration_s for s in tasks), default=0.0)
    metadata = trace.get("metadata") or {}
    end_s = max(end_s, float(metadata.get("step_time_s") or metadata.get("end_s") or 0.0))
    spans, gap_s = sorted(tasks, key=lambda s: (s.lane, s.start_s)), None  # every task, as scheduled
    if len(spans) > max_spans:
        spans, gap_s = merge(tasks, 0.0), 0.0  # touching tasks of one kind first
    while len(spans) > max_spans and gap_s < end_s:  # beyond the step, no gap is left to close
        gap_s = max(2 * gap_s, end_s * 1e-5)
        spans = merge(tasks, gap_s)
    note = "" if gap_s is None else (
        f"{len(tasks)} tasks drawn as {len(spans)} spans: tasks of one kind at most "
        f"{gap_s * 1e3:.3g} ms apart on a lane are merged")
    return Timeline("timeline", title, lanes, tuple(spans), end_s, note)


def span_kind(event: dict, stream: str) -> str:
    """The colour of a task: on the compute stream its pass (forward, backward, ...), else the
    collective (the text before ':' in the task name)."""
    name = event["name"]
    if stream == "compute":
        phase = (event.get("args") or {}).get("pass") or (event.get("args") or {}).get("phase")
        if phase:
            return str(phase).split(" ")[0]  # "decode step 2" -> decode
        return name.split(" mb")[0].split(":")[0]  # "forward mb3" -> forward, "optimizer"
    return name.split(":")[0]


def merge(tasks: list[Span], gap_s: float) -> list[Span]:
    """Tasks of one kind on one lane that start at most ``gap_s`` after the span before ends,
    merged into that span (lane by lane, in time order)."""
    out: list[Span] = []
    open_spans: dict[tuple[str, str], int] = {}  # (lane, kind) -> index in out of the last span
    counts: dict[int, int] = {}
    for task in sorted(tasks, key=lambda s: (s.lane, s.start_s)):
        key = (task.lane, task.kind)
        index = open_spans.get(key)
        last = out[index] if index is not None else None
        # only the latest span of the lane may grow: a task of another kind in between ends it
        if last is not None and index == len(out) - 1 and task.start_s <= last.start_s + last.duration_s + gap_s:
            end = max(last.start_s + last.duration_s, task.start_s + task.duration_s)
            counts[index] += 1
            out[index] = Span(last.lane, last.kind, last.start_s, end - last.start_s, f"{counts[index]} tasks from {_first(last.label)}")
            continue
        out.append(task)
        open_spans[key] = len(out) - 1
        counts[len(out) - 1] = 1
    return out


def _first(label: str) -> str:
    return label.split(" tasks from ", 1)[1] if " tasks from " in label else label


def _lane_order(lane: str, processes: dict, threads: dict) -> tuple:
    process, _, stream = lane.partition(" / ")
    pid = next((p for p, name in processes.items() if name == process), 0)
    tid = next((t for (p, t), name in threads.items() if p == pid and name == stream), 0)
    return (pid, tid)
