"""The report's figures as static files through matplotlib (png, svg or pdf), for papers: one
file per figure, ``NN-name.FORMAT`` in the ``--out`` folder, numbered in page order. Tables
become CSV files (``NN-name.csv``). Needs the ``report`` extra (matplotlib)."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

from meshplan.errors import MeshplanError
from meshplan.plots.figures import Bars, Report, Scatter, Table, Timeline
from meshplan.plots.html import _UNITS, PALETTE


def pyplot(fmt: str = "png"):
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no screen needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise MeshplanError("--format", fmt, "install the report extra: pip install 'meshplan[report]'") from None
    return plt


def write_figures(report: Report, folder: Path, fmt: str) -> list[Path]:
    """Every figure of ``report`` into ``folder`` (created if needed); the paths written."""
    plt = pyplot(fmt)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for index, figure in enumerate(report.figures, start=1):
        stem = folder / f"{index:02d}-{figure.name}"
        if isinstance(figure, Table):
            path = stem.with_suffix(".csv")
            with path.open("w", newline="", encoding="utf-8") as f:
                writer = csv.writer(f)
                writer.writerow(figure.columns)
                writer.writerows(figure.rows)
            written.append(path)
            continue
        path = stem.with_suffix(f".{fmt}")
        with warnings.catch_warnings():  # axis ticks for values near the float limit overflow; the figure is still drawn
            warnings.simplefilter("ignore", RuntimeWarning)
            fig = draw(plt, figure)
            fig.savefig(path, format=fmt, dpi=150, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def draw(plt, figure):
    """A matplotlib Figure of one figure's data."""
    if isinstance(figure, Bars):
        return _bars(plt, figure)
    if isinstance(figure, Scatter):
        return _scatter(plt, figure)
    if isinstance(figure, Timeline):
        return _timeline(plt, figure)
    raise TypeError(f"no matplotlib drawing for {type(figure).__name__}")


def _bars(plt, bars: Bars):
    scale, shown = _UNITS[bars.unit]
    horizontal = len(bars.categories) == 1
    fig, ax = plt.subplots(figsize=(8, 2.2) if horizontal else (8, 4.5))
    positions = range(len(bars.categories))
    bottom = [0.0] * len(bars.categories)
    for i, (name, values) in enumerate(bars.series.items()):
        if not any(values):
            continue
        scaled = [v * scale for v in values]
        if horizontal:
            ax.barh(positions, scaled, left=bottom, label=name, color=PALETTE[i % len(PALETTE)])
        else:
            ax.bar(positions, scaled, bottom=bottom, label=name, color=PALETTE[i % len(PALETTE)])
        bottom = [b + v for b, v in zip(bottom, scaled)]
    if bars.line is not None:
        draw_line = ax.axvline if horizontal else ax.axhline
        draw_line(bars.line * scale, color="black", linestyle="--", label=bars.line_label)
    if horizontal:
        ax.set_yticks(list(positions), bars.categories)
        ax.set_xlabel(shown)
    else:
        ax.set_xticks(list(positions), bars.categories, rotation=30 if len(bars.categories) > 3 else 0, ha="right")
        ax.set_ylabel(shown)
    ax.set_title(bars.title)
    _legend(ax, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    return fig


def _scatter(plt, scatter: Scatter):
    xs, xu = _UNITS[scatter.x_unit]
    ys, yu = _UNITS[scatter.y_unit]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if scatter.band is not None:
        values = [v for s in scatter.series for v in (*s.x, *s.y)]
        lo, hi = min(values) * 0.8, max(values) * 1.25
        ax.fill_between([lo, hi], [lo * (1 - scatter.band), hi * (1 - scatter.band)],
                        [lo * (1 + scatter.band), hi * (1 + scatter.band)], color="gray", alpha=0.2, label=scatter.band_label)
        ax.plot([lo, hi], [lo, hi], color="gray", linestyle=":", label="predicted = measured")
    for i, s in enumerate(scatter.series):
        x, y = [v * xs for v in s.x], [v * ys for v in s.y]
        color = PALETTE[i % len(PALETTE)]
        if "lines" in s.mode:
            ax.step(x, y, where="post", color=color, marker="o", label=s.name)
        else:
            ax.scatter(x, y, s=12, color=color, label=s.name)
    if scatter.log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel(f"{scatter.x_label} ({xu})" if xu else scatter.x_label)
    ax.set_ylabel(f"{scatter.y_label} ({yu})" if yu else scatter.y_label)
    ax.set_title(scatter.title)
    _legend(ax, fontsize=8)
    return fig


def _timeline(plt, t: Timeline):
    fig, ax = plt.subplots(figsize=(11, 1 + 0.35 * len(t.lanes)))
    row = {lane: len(t.lanes) - 1 - i for i, lane in enumerate(t.lanes)}
    kinds = list(dict.fromkeys(s.kind for s in t.spans))
    for i, kind in enumerate(kinds):
        spans = [s for s in t.spans if s.kind == kind]
        ax.barh([row[s.lane] for s in spans], [s.duration_s * 1e3 for s in spans], left=[s.start_s * 1e3 for s in spans],
                height=0.7, color=PALETTE[i % len(PALETTE)], label=kind, linewidth=0)
    ax.set_yticks(list(row.values()), list(row))
    ax.set_xlim(0, t.end_s * 1e3)
    ax.set_xlabel("time (ms)")
    ax.set_title(t.title + (f"\n{t.note}" if t.note else ""), fontsize=10)
    _legend(ax, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    return fig


def _legend(ax, **options) -> None:
    """A legend where something drawn has a name (a breakdown whose every segment is zero has
    none, and matplotlib warns at an empty legend)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**options)
