"""The scheduler: tasks on streams with dependencies, repeated segments composed, not unrolled.

A device's work is a sequence of segments (one decoder layer's forward, say). A segment is a
list of tasks in issue order; each task runs on one stream (the compute stream, or the
communication stream of one network axis), starts when its stream is free and every task it
depends on has finished, and lasts a fixed time (MAD Max Sec. 4.3: "GPU kernels are launched
whenever data dependencies are resolved"). Between segments the device carries a small state:
when each stream is free, and named signals (the activation is ready, the next layer's weights
have arrived).

Composition. A segment maps the state by max and + only, so it is max-plus linear and
homogeneous: shifting every input time by λ shifts every output by λ. Once one more run of a
segment moves every slot it touches by the same λ (and any slot it only reads is no later than
the slots it writes), every later run moves them by λ again, exactly. ``repeat`` runs a segment
until that happens (one to three runs for the layers meshplan builds) and adds the remaining
runs as multiples of λ, so n identical layers cost a few runs, not n; ``unrolled`` runs all n
and is the reference the differential tests compare against.

Besides its time, each slot carries the critical path that produced it, as seconds per
category (compute, or the network axis whose collective or contention the path waited on). The
path of the last slot to finish says what a pass waited on; it sums to the pass time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: what the critical path is made of: compute, or waiting on a network axis ("mp": a DLRM's
#: model-parallel embedding tables, MAD Max Sec. 2.2)
CATEGORIES = ("compute", "tp", "cp", "ep", "dp", "pp", "mp")
_INDEX = {name: i for i, name in enumerate(CATEGORIES)}
_ZERO = (0.0,) * len(CATEGORIES)

#: relative tolerance of the steady-state test: the shift must agree to this over the slots
STEADY_RTOL = 1e-12


@dataclass(frozen=True)
class Task:
    """One kernel or collective. ``parts`` splits its time by category (a compute task that
    also waits on a pipelined collective carries both); its duration is their sum."""

    name: str
    stream: str
    parts: tuple[tuple[str, float], ...]
    deps: tuple[str, ...] = ()  # earlier tasks of the segment, or state signals
    kind: str = ""  # op or collective kind, for the trace
    duration_s: float = field(init=False, repr=False, compare=False)
    vector: tuple[float, ...] = field(init=False, repr=False, compare=False)  # parts per category

    def __post_init__(self) -> None:
        object.__setattr__(self, "duration_s", sum(seconds for _, seconds in self.parts))
        object.__setattr__(self, "vector", _add(_ZERO, self.parts))


def compute(name: str, seconds: float, deps: tuple[str, ...] = (), kind: str = "compute") -> Task:
    return Task(name, "compute", (("compute", seconds),), deps, kind)


def collective(name: str, axis: str, seconds: float, deps: tuple[str, ...] = (), kind: str = "", stream: str = "") -> Task:
    """A collective of ``axis`` on ``stream`` (default: the axis's own stream)."""
    return Task(name, stream or axis, ((axis, seconds),), deps, kind or axis)


@dataclass(frozen=True)
class Segment:
    """Tasks in issue order, and the signals they set: ``signals`` maps a state signal to the
    task (or another signal) whose end time it takes. Streams update themselves."""

    name: str
    tasks: tuple[Task, ...]
    signals: tuple[tuple[str, str], ...] = ()

    @property
    def writes(self) -> frozenset[str]:
        return frozenset({t.stream for t in self.tasks} | {s for s, _ in self.signals})

    @property
    def reads(self) -> frozenset[str]:
        names = {t.name for t in self.tasks}
        return frozenset({d for t in self.tasks for d in t.deps if d not in names} | {src for _, src in self.signals if src not in names})


@dataclass(frozen=True)
class State:
    """When each stream is free and each signal is set, with the critical path to it."""

    times: dict[str, float] = field(default_factory=dict)
    paths: dict[str, tuple[float, ...]] = field(default_factory=dict)

    @property
    def end_s(self) -> float:
        return max(self.times.values(), default=0.0)

    def critical_path(self) -> dict[str, float]:
        """Seconds per category along the path to the slot that finishes last."""
        if not self.times:
            return dict.fromkeys(CATEGORIES, 0.0)
        last = max(self.times, key=self.times.__getitem__)
        return dict(zip(CATEGORIES, self.paths[last]))


@dataclass(frozen=True)
class Placed:
    """A task as scheduled."""

    task: Task
    start_s: float
    end_s: float


def _add(path: tuple[float, ...], parts: tuple[tuple[str, float], ...]) -> tuple[float, ...]:
    out = list(path)
    for category, seconds in parts:
        out[_INDEX[category]] += seconds
    return tuple(out)


def run(state: State, segment: Segment, placed: list[Placed] | None = None) -> State:
    """One run of ``segment`` from ``state``: each task starts at max(its stream free, its
    dependencies done). Unknown slots count as time 0 (free from the start)."""
    times, paths = dict(state.times), dict(state.paths)
    end: dict[str, float] = {}
    end_path: dict[str, tuple[float, ...]] = {}
    for task in segment.tasks:
        start, path = times.get(task.stream, 0.0), paths.get(task.stream, _ZERO)
        for dep in task.deps:
            if dep in end:
                t, p = end[dep], end_path[dep]
            else:
                t, p = times.get(dep, 0.0), paths.get(dep, _ZERO)
            if t > start:
                start, path = t, p
        finish = start + task.duration_s
        path = tuple(a + b for a, b in zip(path, task.vector))
        end[task.name] = times[task.stream] = finish
        end_path[task.name] = paths[task.stream] = path
        if placed is not None:
            placed.append(Placed(task, start, finish))
    updates = []
    for signal, source in segment.signals:
        if source in end:
            updates.append((signal, end[source], end_path[source]))
        else:
            updates.append((signal, times.get(source, 0.0), paths.get(source, _ZERO)))
    for signal, t, p in updates:
        times[signal], paths[signal] = t, p
    return State(times, paths)


def _shift(before: State, after: State, slots: frozenset[str]) -> float | None:
    """The common shift λ of ``slots`` from ``before`` to ``after``, or None if they moved
    differently."""
    deltas = [after.times[s] - before.times.get(s, 0.0) for s in slots]
    lam = max(deltas)
    scale = max(abs(after.times[s]) for s in slots) or 1.0
    if any(abs(d - lam) > STEADY_RTOL * scale for d in deltas):
        return None
    return lam


def sinks(segment: Segment) -> frozenset[str]:
    """Streams of ``segment`` nothing else waits on: no task of another stream and no signal
    reads them (a gradient reduction fired after each layer's backward)."""
    stream_of = {t.name: t.stream for t in segment.tasks}
    read = set()
    for t in segment.tasks:
        for dep in t.deps:
            source = stream_of.get(dep, dep)
            if source != t.stream:
                read.add(source)
    read |= {stream_of.get(src, src) for _, src in segment.signals}
    return frozenset({t.stream for t in segment.tasks} - read)


def repeat(state: State, segment: Segment, count: int) -> State:
    """``count`` runs of ``segment``, composed: run until the steady state (every slot the
    segment writes moves by one λ, each with the same critical-path increment, and no slot it
    only reads can bind again), then add the remaining runs as multiples of that shift.

    A sink stream (one nothing waits on) may fall behind or keep up at its own pace: with P
    seconds of its tasks per run and A_j the time it would end in run j if it were idle, its
    end after run n is max(d_{n-1} + P, A_j); in the steady state A_j grows by λ per run, so
    d_n = max(d_k + (n-k)·P, A_{k+1} + (n-k-1)·P, A_{k+1} + (n-k-1)·λ) from any steady run k
    (the maximum over j of A_j + (n-j)·P is linear in j, so it lies at an end). Equal to ``unrolled`` up to float rounding."""
    writes = segment.writes
    sunk = sinks(segment)
    core = writes - sunk
    read_only = segment.reads - writes
    previous = state
    last_step: tuple[float, dict] | None = None
    for done in range(1, count + 1):
        current = run(previous, segment)
        if done == count or not core:
            if done == count:
                return current
            previous = current
            continue
        shift = _shift(previous, current, core)
        steps = None
        if shift is not None:
            steps = {s: tuple(a - b for a, b in zip(current.paths[s], previous.paths.get(s, _ZERO))) for s in core}
        floor = min(current.times[s] for s in core)
        settled = all(current.times.get(s, 0.0) <= floor for s in read_only)
        if shift is not None and last_step is not None and settled and _same(last_step, (shift, steps)):
            return _extrapolate(previous, current, segment, count - done, shift, steps, sunk)
        last_step = (shift, steps) if shift is not None else None
        previous = current
    return previous


def _extrapolate(previous: State, current: State, segment: Segment, left: int, lam: float,
                 steps: dict[str, tuple[float, ...]], sunk: frozenset[str]) -> State:
    """``left`` more runs from the steady ``current`` (see ``repeat``)."""
    times, paths = dict(current.times), dict(current.paths)
    for s, step in steps.items():
        times[s] = current.times[s] + left * lam
        paths[s] = tuple(p + left * d for p, d in zip(current.paths[s], step))
    for s in sunk:
        own = [t for t in segment.tasks if t.stream == s]
        per_run = sum(t.duration_s for t in own)
        per_run_path = _add(_ZERO, tuple(part for t in own for part in t.parts))
        behind = (current.times[s] + left * per_run, tuple(p + left * d for p, d in zip(current.paths[s], per_run_path)))
        idle_now = run(_without(previous, s), segment)
        idle_next = run(_without(current, s), segment)
        candidates = [behind]
        if idle_next.times[s] > float("-inf"):
            first, first_path = idle_next.times[s], idle_next.paths[s]  # A of the next run
            gain = tuple(a - b for a, b in zip(first_path, idle_now.paths[s]))
            candidates.append((first + (left - 1) * per_run, tuple(p + (left - 1) * d for p, d in zip(first_path, per_run_path))))
            candidates.append((first + (left - 1) * lam, tuple(p + (left - 1) * g for p, g in zip(first_path, gain))))
        times[s], paths[s] = max(candidates, key=lambda c: c[0])
    return State(times, paths)


def _without(state: State, slot: str) -> State:
    """``state`` with ``slot`` never free before any dependency (idle since -inf)."""
    times = dict(state.times)
    times[slot] = float("-inf")
    return State(times, state.paths)


def _same(a: tuple[float, dict], b: tuple[float, dict]) -> bool:
    scale = max(abs(a[0]), abs(b[0]), 1e-300)
    if abs(a[0] - b[0]) > 1e3 * STEADY_RTOL * scale:
        return False
    for slot, step in b[1].items():
        other = a[1].get(slot)
        if other is None or any(abs(x - y) > 1e3 * STEADY_RTOL * scale for x, y in zip(step, other)):
            return False
    return True


def unrolled(state: State, segment: Segment, count: int, placed: list[Placed] | None = None) -> State:
    """``count`` runs one after another: the reference for ``repeat``."""
    for _ in range(count):
        state = run(state, segment, placed)
    return state


@dataclass(frozen=True)
class Pass:
    """A pass over a device's layers: segments with repeat counts, in order."""

    name: str
    parts: tuple[tuple[Segment, int], ...]


@dataclass(frozen=True)
class PassTime:
    """A pass scheduled from idle streams."""

    time_s: float  # until every stream is done
    compute_s: float  # seconds of compute tasks (contention excluded)
    waited_s: dict[str, float]  # critical path per category (sums to time_s)
    ready_s: float = 0.0  # when the pass's output (signal "x") is ready: the next stage can go on

    @property
    def trailing_s(self) -> float:
        """What runs on after the output is ready (a gradient reduction, the contention it costs)."""
        return max(self.time_s - self.ready_s, 0.0)

    @property
    def exposed_s(self) -> dict[str, float]:
        """Time the pass is not computing, attributed to the network axes the critical path
        waited on, in proportion (MAD Max's exposed communication: time minus compute)."""
        idle = max(self.time_s - self.compute_s, 0.0)
        waited = {axis: s for axis, s in self.waited_s.items() if axis != "compute" and s > 0}
        total = sum(waited.values())
        out = dict.fromkeys(CATEGORIES[1:], 0.0)
        for axis, seconds in waited.items():
            out[axis] = idle * seconds / total
        return out


def _compute_seconds(segment: Segment) -> float:
    return sum(s for t in segment.tasks if t.stream == "compute" for c, s in t.parts if c == "compute")


def schedule_pass(p: Pass, compose: bool = True) -> PassTime:
    """Schedule ``p`` from idle streams, composing repeats (or unrolling them, for tests)."""
    state = State()
    for segment, count in p.parts:
        if count <= 0:
            continue
        state = repeat(state, segment, count) if compose else unrolled(state, segment, count)
    compute_s = sum(count * _compute_seconds(segment) for segment, count in p.parts if count > 0)
    return PassTime(state.end_s, compute_s, state.critical_path(), state.times.get("x", state.end_s))


def place_pass(p: Pass, offset_s: float = 0.0) -> list[Placed]:
    """Every task of ``p`` with its start and end (unrolled; for traces)."""
    placed: list[Placed] = []
    state = State()
    for segment, count in p.parts:
        state = unrolled(state, segment, max(count, 0), placed)
    if offset_s:
        placed = [Placed(x.task, x.start_s + offset_s, x.end_s + offset_s) for x in placed]
    return placed


def chunked_s(comm_s: float, compute_s: float, chunks: int) -> float:
    """A collective pipelined with the computation it feeds, in ``chunks`` steps: chunk 0
    computes on local data while chunk 1 arrives, and so on (ring attention, Liu et al. 2023;
    Transformer Engine's ring-exchange AG+GEMM). With c = comm/(chunks-1) per step and
    g = compute/chunks, chunk i can start at max(i·c, (previous chunk end)), so the end is
    max(chunks·g, (chunks-1)·c + g)."""
    if chunks <= 1 or comm_s <= 0:
        return compute_s + comm_s
    step, piece = comm_s / (chunks - 1), compute_s / chunks
    return max(compute_s, (chunks - 1) * step + piece)
