"""Figures of stored results: ``meshplan report`` and the notebook views.

Data flows one way: ``inputs`` reads a stored result (a search store, an estimate, search or
validate JSON, a trace), ``build`` and ``timeline`` turn it into figure data (``figures``),
and a renderer draws that data: ``html`` (plotly, one self-contained page), ``static``
(matplotlib: png, svg or pdf, one file per figure) or ``notebook`` (a small inline SVG, no
extra needed). No figure runs a model. plotly and matplotlib come with the ``report`` extra and
are imported only when drawing.
"""

from __future__ import annotations

from pathlib import Path

from meshplan.errors import MeshplanError

FORMATS = ("html", "png", "svg", "pdf")


def write_report(input_path: str | Path, out: str | Path, fmt: str = "html", trace: str | Path | None = None,
                 top: int = 10, price: float | None = None) -> list[Path]:
    """Build the report of the stored result at ``input_path`` and write it to ``out``: one
    HTML file, or (png, svg, pdf) a folder with one file per figure; ``price`` per device-hour
    adds a search's time-cost front. The paths written."""
    from meshplan.plots.build import report
    from meshplan.plots.inputs import load, load_trace

    if fmt not in FORMATS:
        raise MeshplanError("--format", fmt, f"one of {', '.join(FORMATS)}")
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise MeshplanError("--top", top, "must be at least 1")
    if price is not None and not (isinstance(price, (int, float)) and not isinstance(price, bool) and price > 0):
        raise MeshplanError("--price", price, "a positive price per device-hour")
    if fmt == "html":
        from meshplan.plots.html import plotly

        plotly()  # name the missing extra before reading anything
    else:
        from meshplan.plots.static import pyplot

        pyplot(fmt)
    built = report(load(input_path), load_trace(trace) if trace is not None else None, top, price, str(trace))
    out = Path(out)
    try:
        if fmt == "html":
            from meshplan.plots.html import page

            out.write_text(page(built), encoding="utf-8")
            return [out]
        from meshplan.plots.static import write_figures

        return write_figures(built, out, fmt)
    except OSError as err:
        raise MeshplanError("--out", str(out), f"a path meshplan can write ({err.strerror or err})") from None
