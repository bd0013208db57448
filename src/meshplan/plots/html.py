"""One self-contained HTML page of a Report: plotly figures with plotly.js inlined once (the page
opens offline), tables as HTML tables. Needs the ``report`` extra (plotly)."""

from __future__ import annotations

import html
import json
import math

from meshplan.errors import MeshplanError
from meshplan.plots.figures import Bars, Report, Scatter, Table, Timeline

#: a qualitative palette (plotly's default, D3 category 10), reused in order
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")

#: how an axis shows SI values: (scale, unit label)
_UNITS = {"s": (1.0, "s"), "bytes": (2.0**-30, "GiB"), "j": (1e-3, "kJ"), "count": (1.0, ""), "fraction": (100.0, "%")}


def plotly():
    try:
        import plotly.graph_objects as go
        import plotly.offline
    except ImportError:
        raise MeshplanError("--format", "html", "install the report extra: pip install 'meshplan[report]'") from None
    return go, plotly.offline


def page(report: Report) -> str:
    """The whole HTML document."""
    go, offline = plotly()
    body = []
    for index, figure in enumerate(report.figures):
        if isinstance(figure, Table):
            body.append(table_html(figure))
            continue
        fig = plotly_figure(go, figure)
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"figure-{index}-{figure.name}",
                          config={"displaylogo": False, "responsive": True})
        body.append(f'<section class="figure" data-figure="{html.escape(figure.name)}">{div}</section>')
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(report.title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }}
th {{ background: #f4f4f4; }} td:first-child, th:first-child {{ text-align: left; }}
.source {{ color: #666; }} .notes {{ color: #666; font-size: 0.85em; }}
</style>
<script type="text/javascript">{offline.get_plotlyjs()}</script>
</head><body>
<h1>{html.escape(report.title)}</h1>
<p class="source">{html.escape(report.source)}</p>
{''.join(body)}
<ul class="notes">{notes}</ul>
</body></html>
"""


def table_html(table: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(format_cell(c, v))}</td>" for c, v in zip(table.columns, row)) + "</tr>"
                   for row in table.rows)
    if table.columns == ("metric", "value"):  # the unit depends on the row's metric
        rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(format_cell(str(k), v))}</td></tr>"
                       for k, v in table.rows)
    return (f'<section class="table" data-figure="{html.escape(table.name)}"><h2>{html.escape(table.title)}</h2>'
            f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></section>")


def format_cell(column: str, value) -> str:
    """A cell for people: bytes in GiB, fractions in percent, seconds with 4 significant digits."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if column.endswith("_bytes"):
        return f"{value / 2**30:.2f} GiB"
    if column in ("mfu", "hfu", "relative_error") or column.endswith("_fraction"):
        return f"{value:.1%}"
    if column.endswith("_per_s"):  # a rate, not a time
        return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:,.4g}"
    if column.endswith("_s"):
        return f"{value:.4g} s"
    if column.endswith("_j"):
        return f"{value / 1e3:,.1f} kJ" if abs(value) >= 1e3 else f"{value:.4g} J"
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:,.4g}"


def plotly_figure(go, figure):
    """A plotly Figure of one figure's data."""
    if isinstance(figure, Bars):
        return _bars(go, figure)
    if isinstance(figure, Scatter):
        return _scatter(go, figure)
    if isinstance(figure, Timeline):
        return _timeline(go, figure)
    raise TypeError(f"no plotly drawing for {type(figure).__name__}")


def _axis_title(label: str, unit: str) -> str:
    shown = _UNITS[unit][1]
    return f"{label} ({shown})" if shown else label


def _bars(go, bars: Bars):
    scale, shown = _UNITS[bars.unit]
    horizontal = len(bars.categories) == 1
    fig = go.Figure()
    for i, (name, values) in enumerate(bars.series.items()):
        if not any(values):
            continue  # a component that is zero everywhere only crowds the legend
        scaled = [v * scale for v in values]
        kwargs = dict(x=scaled, y=list(bars.categories), orientation="h") if horizontal else dict(x=list(bars.categories), y=scaled)
        fig.add_trace(go.Bar(name=name, marker_color=PALETTE[i % len(PALETTE)],
                             hovertemplate=f"{name}: %{{{'x' if horizontal else 'y'}:.4g}} {shown}<extra></extra>", **kwargs))
    if bars.line is not None:
        line = dict(x0=bars.line * scale, x1=bars.line * scale, y0=0, y1=1, xref="x", yref="paper") if horizontal else \
            dict(y0=bars.line * scale, y1=bars.line * scale, x0=0, x1=1, yref="y", xref="paper")
        fig.add_shape(type="line", line=dict(color="black", dash="dash", width=2), **line)
        fig.add_annotation(text=bars.line_label, showarrow=False, xanchor="left",
                           **(dict(x=bars.line * scale, y=1, xref="x", yref="paper") if horizontal else
                              dict(x=1, y=bars.line * scale, xref="paper", yref="y")))
    value_axis = dict(title=shown or bars.unit)
    fig.update_layout(barmode="stack", title=bars.title, height=260 if horizontal else 420, legend_traceorder="normal",
                      margin=dict(l=60, r=30, t=50, b=40))
    (fig.update_xaxes if horizontal else fig.update_yaxes)(**value_axis)
    return fig


def _scatter(go, scatter: Scatter):
    xs, _ = _UNITS[scatter.x_unit]
    ys, _ = _UNITS[scatter.y_unit]
    fig = go.Figure()
    if scatter.band is not None:
        values = [v for s in scatter.series for v in (*s.x, *s.y)]
        lo, hi = min(values) * 0.8, max(values) * 1.25
        fig.add_trace(go.Scatter(x=[lo, hi, hi, lo], y=[lo * (1 + scatter.band), hi * (1 + scatter.band),
                                                       hi * (1 - scatter.band), lo * (1 - scatter.band)],
                                 mode="lines", fill="toself", fillcolor="rgba(120,120,120,0.15)", line=dict(width=0),
                                 name=scatter.band_label, hoverinfo="skip"))
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", line=dict(color="gray", dash="dot"),
                                 name="predicted = measured", hoverinfo="skip"))
    for i, s in enumerate(scatter.series):
        line = dict(shape="hv", width=2) if "lines" in s.mode else None
        fig.add_trace(go.Scatter(x=[v * xs for v in s.x], y=[v * ys for v in s.y], mode=s.mode, name=s.name,
                                 text=list(s.labels) or None, line=line,
                                 marker=dict(color=PALETTE[i % len(PALETTE)], size=7 if "lines" in s.mode else 6)))
    axis_type = "log" if scatter.log else "linear"
    fig.update_layout(title=scatter.title, height=440, margin=dict(l=60, r=30, t=50, b=50),
                      xaxis=dict(title=_axis_title(scatter.x_label, scatter.x_unit), type=axis_type),
                      yaxis=dict(title=_axis_title(scatter.y_label, scatter.y_unit), type=axis_type))
    return fig


def _timeline(go, t: Timeline):
    fig = go.Figure()
    kinds = list(dict.fromkeys(s.kind for s in t.spans))
    for i, kind in enumerate(kinds):
        spans = [s for s in t.spans if s.kind == kind]
        fig.add_trace(go.Bar(
            name=kind, orientation="h", y=[s.lane for s in spans], x=[s.duration_s * 1e3 for s in spans],
            base=[s.start_s * 1e3 for s in spans], marker_color=PALETTE[i % len(PALETTE)], marker_line_width=0,
            customdata=[[s.label] for s in spans],
            hovertemplate="%{customdata[0]}<br>%{base:.4g} ms + %{x:.4g} ms<extra>" + kind + "</extra>"))
    title = t.title + (f"<br><sup>{t.note}</sup>" if t.note else "")
    fig.update_layout(title=title, barmode="overlay", bargap=0.25, height=max(300, 120 + 28 * len(t.lanes)),
                      margin=dict(l=60, r=30, t=70, b=40), xaxis=dict(title="time (ms)", range=[0, t.end_s * 1e3]),
                      yaxis=dict(categoryorder="array", categoryarray=list(reversed(t.lanes)), automargin=True))
    return fig


def figure_json(figure) -> dict:
    """The plotly JSON of one figure (for tests and notebooks)."""
    go, _ = plotly()
    return json.loads(plotly_figure(go, figure).to_json())
