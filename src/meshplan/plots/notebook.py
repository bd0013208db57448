"""Results that render themselves in notebooks (``_repr_html_``): the key numbers and a small
chart, drawn as inline SVG from the same figure data as the report. Needs no extra and imports
neither plotly nor matplotlib."""

from __future__ import annotations

import html

from meshplan.plots.figures import Bars, Table
from meshplan.plots.html import _UNITS as _SCALE  # html.py imports plotly only when drawing
from meshplan.plots.html import PALETTE, format_cell


def svg_bars(bars: Bars, width: int = 560, row_height: int = 18) -> str:
    """Horizontal stacked bars, one row per category, a legend below and the limit line dashed."""
    scale, unit = _SCALE[bars.unit]
    label_w, legend_h = 150, 16
    # colours by series position, as in the report, so a segment keeps its colour when others are zero
    shown = [(i, name, values) for i, (name, values) in enumerate(bars.series.items()) if any(values)]
    top = max([*bars.totals(), bars.line or 0.0, 1e-300])
    plot_w = width - label_w - 10
    legend_rows = (len(shown) + 3) // 4
    height = row_height * len(bars.categories) + 24 + legend_h * legend_rows
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">']
    for row, category in enumerate(bars.categories):
        y = row * row_height + 4
        parts.append(f'<text x="{label_w - 6}" y="{y + row_height * 0.65:.1f}" text-anchor="end">{html.escape(category)}</text>')
        x = float(label_w)
        for i, name, values in shown:
            w = values[row] / top * plot_w
            if w > 0:
                parts.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_height - 4}" fill="{PALETTE[i % 10]}">'
                             f'<title>{html.escape(name)}: {values[row] * scale:.4g} {unit}</title></rect>')
            x += w
    axis_y = row_height * len(bars.categories) + 4
    if bars.line:
        lx = label_w + bars.line / top * plot_w
        parts.append(f'<line x1="{lx:.2f}" y1="0" x2="{lx:.2f}" y2="{axis_y}" stroke="black" stroke-dasharray="4 3"/>')
    parts.append(f'<text x="{label_w}" y="{axis_y + 12}">0</text><text x="{width - 10}" y="{axis_y + 12}" '
                 f'text-anchor="end">{top * scale:.4g} {unit}</text>')
    for k, (i, name, _) in enumerate(shown):
        lx, ly = 10 + (k % 4) * (width // 4), axis_y + 20 + (k // 4) * legend_h
        parts.append(f'<rect x="{lx}" y="{ly}" width="10" height="10" fill="{PALETTE[i % 10]}"/>'
                     f'<text x="{lx + 14}" y="{ly + 9}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return f"<div><b>{html.escape(bars.title)}</b><br>{''.join(parts)}</div>"


def table_html(table: Table, limit: int = 10) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in table.columns)
    metric = table.columns == ("metric", "value")
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(format_cell(str(row[0]) if metric else c, v))}</td>"
                         for c, v in zip(table.columns, row)) + "</tr>"
        for row in table.rows[:limit])
    more = f"<p>… {len(table.rows) - limit} more</p>" if len(table.rows) > limit else ""
    return f"<b>{html.escape(table.title)}</b><table><tr>{head}</tr>{rows}</table>{more}"


def estimate_html(estimate) -> str:
    """An Estimate: its key numbers, where the step time goes, memory against capacity."""
    from meshplan.plots.build import key_numbers, memory_per_role, step_breakdown

    data = estimate.to_dict()
    return (f"<div>{table_html(key_numbers(data), limit=20)}"
            f"{svg_bars(step_breakdown(data))}{svg_bars(memory_per_role(data))}</div>")


def inference_html(estimate) -> str:
    """An InferenceEstimate: key numbers, the prefill and a decode step by part, memory."""
    from meshplan.plots.build_other import inference_figures
    from meshplan.plots.inputs import Source

    return _figures_html(inference_figures(Source("inference", "", estimate.to_dict()))[0])


def dlrm_html(estimate) -> str:
    """A DLRMEstimate: key numbers, the iteration, serialized time by kind, memory, energy."""
    from meshplan.plots.build_other import dlrm_figures
    from meshplan.plots.inputs import Source

    return _figures_html(dlrm_figures(Source("dlrm", "", estimate.to_dict()))[0])


def _figures_html(figures) -> str:
    return "<div>" + "".join(table_html(f, limit=20) if isinstance(f, Table) else svg_bars(f) for f in figures) + "</div>"


def search_html(result) -> str:
    """A SearchResult: the fastest plans and where their step time goes."""
    from meshplan.plots.build import plan_breakdowns, top_plans

    rows = list(result.top[:5])
    if not rows or "compute_s" not in rows[0]:  # DLRM and serving searches: the table only
        columns = tuple(rows[0]) if rows else ()
        return table_html(Table("top", "Fastest plans", columns, tuple(tuple(r.values()) for r in rows)))
    return f"<div>{table_html(top_plans(rows))}{svg_bars(plan_breakdowns(rows))}</div>"


def cases_html(cases) -> str:
    """Validation cases: the table and each group's median and largest absolute error."""
    from meshplan.plots.build import case_table, group_errors

    data = [c.as_dict() for c in cases]
    scored = [c for c in data if c.get("relative_error") is not None]
    chart = svg_bars(group_errors(scored)) if scored else ""
    return f"<div>{table_html(case_table(data), limit=20)}{chart}</div>"
