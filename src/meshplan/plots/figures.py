"""What a figure shows, as plain data: the renderers (``html``, ``static``) draw these and
compute nothing. Units are SI as stored (seconds, bytes, joules); a renderer only scales them
for its axis labels."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.errors import one_line
from meshplan.units import finite_number


def _numbers(what: str, values) -> None:
    """Every value a figure draws is a finite number (a stored file edited by hand may hold
    anything there); a ValueError says which."""
    for value in values:
        if not finite_number(value):
            raise ValueError(f"{what} holds {one_line(repr(value), 40)}, not a finite number")


@dataclass(frozen=True)
class Table:
    """Rows of values under named columns (the top plans, the key numbers)."""

    name: str  # a file-name-safe id
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple, ...]


@dataclass(frozen=True)
class Bars:
    """Stacked bars: one bar per category, one segment per series. ``line`` draws a limit
    across the bars (a device's memory capacity)."""

    name: str
    title: str
    unit: str  # "s", "bytes" or "j"
    categories: tuple[str, ...]  # the bars, in order
    series: dict[str, tuple[float, ...]]  # segment name -> one value per bar (stacked in this order)
    line: float | None = None
    line_label: str = ""

    def __post_init__(self):
        for segment, values in self.series.items():
            _numbers(f"{self.title}: {segment}", values)
        _numbers(f"{self.title}: {self.line_label or 'line'}", () if self.line is None else (self.line,))

    def totals(self) -> tuple[float, ...]:
        """The height of each bar: its segments summed."""
        return tuple(sum(values[i] for values in self.series.values()) for i in range(len(self.categories)))


@dataclass(frozen=True)
class Series:
    name: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    labels: tuple[str, ...] = ()  # a hover text per point
    mode: str = "markers"  # markers, lines (a front: steps between the points) or lines+markers

    def __post_init__(self):
        _numbers(f"{self.name}: x", self.x)
        _numbers(f"{self.name}: y", self.y)


@dataclass(frozen=True)
class Scatter:
    """Points and lines on two axes; ``band`` shades y between (1 - band) x and (1 + band) x
    around y = x (predicted against measured)."""

    name: str
    title: str
    x_label: str
    y_label: str
    x_unit: str
    y_unit: str
    series: tuple[Series, ...]
    log: bool = False
    band: float | None = None
    band_label: str = ""


@dataclass(frozen=True)
class Span:
    lane: str  # "<role> / <stream>"
    kind: str  # the colour: the task kind (gemm, all_reduce, forward, ...)
    start_s: float
    duration_s: float
    label: str  # what it stands for (a task, or "12 tasks")

    def __post_init__(self):
        _numbers(f"{self.lane}: {self.label}", (self.start_s, self.duration_s))


@dataclass(frozen=True)
class Timeline:
    """Per-device lanes of scheduled tasks (one lane per role and stream)."""

    name: str
    title: str
    lanes: tuple[str, ...]  # top to bottom
    spans: tuple[Span, ...]
    end_s: float
    note: str = ""  # how the tasks were merged to keep the figure light


Figure = Table | Bars | Scatter | Timeline


@dataclass(frozen=True)
class Report:
    """A page of figures about one stored result."""

    title: str
    source: str  # which file or folder it was built from, and its kind
    figures: tuple[Figure, ...]
    notes: tuple[str, ...] = field(default=())  # figures left out and why
