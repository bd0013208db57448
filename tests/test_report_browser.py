"""The HTML report in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright. No console errors, every figure has drawn marks, the screenshot is not blank.

Without chromium or playwright the test skips and says why; with ``MESHPLAN_REQUIRE_BROWSER=1``
(set by .ci/run once it has installed both) it fails instead. ``MESHPLAN_REPORT_SCREENSHOT=PATH``
keeps the estimate report's screenshot there (the README's picture is made so).
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest

from meshplan.plots import write_report
from meshplan.plots.build import report
from meshplan.plots.figures import Bars, Scatter, Table, Timeline
from meshplan.plots.inputs import load, load_trace
from report_inputs import write_inputs

#: Chromium's flags on a machine with no network and no screen, running as root
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]


def _unavailable(reason: str):
    if os.environ.get("MESHPLAN_REQUIRE_BROWSER") == "1":
        pytest.fail(f"browser test required (MESHPLAN_REQUIRE_BROWSER=1) but {reason}")
    pytest.skip(f"no browser test: {reason}")


def _chromium() -> str:
    path = os.environ.get("MESHPLAN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        _unavailable("chromium is not installed (apt-get install chromium, or set MESHPLAN_CHROMIUM)")
    return path


@pytest.fixture(scope="module")
def browser():
    executable = _chromium()
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed (pip install -e '.[test]')")
    with sync_playwright() as p:
        try:
            chromium = p.chromium.launch(executable_path=executable, headless=True, args=FLAGS)
        except Error as err:
            _unavailable(f"{executable} did not start: {str(err).splitlines()[0]}")
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    return write_inputs(tmp_path_factory.mktemp("stored"))


def expected_marks(figure) -> int:
    """How many SVG marks plotly must draw for a figure: a bar per non-zero segment, a point per
    scatter marker, a path per line, a bar per timeline span."""
    if isinstance(figure, Bars):
        return sum(v > 0 for values in figure.series.values() for v in values)
    if isinstance(figure, Timeline):
        return len(figure.spans)
    if isinstance(figure, Scatter):
        return sum(len(s.x) if s.mode == "markers" else 1 for s in figure.series)
    return 0


#: the drawn marks of each plotly figure: bar paths and scatter points/lines with a real shape
MARKS_JS = """() => Object.fromEntries([...document.querySelectorAll('section.figure')].map(s => [
    s.dataset.figure,
    [...s.querySelectorAll('.barlayer .point path, .scatterlayer path.point, .scatterlayer path.js-line')]
        .filter(p => { const b = p.getBBox(); return (p.getAttribute('d') || '').length > 4 && b.width + b.height > 0; })
        .length]))"""


@pytest.mark.parametrize("name", ["estimate", "inference", "dlrm", "store", "validation"])
def test_report_draws_every_figure_in_chromium(browser, stored, tmp_path, name):
    trace = {"estimate": stored["trace"], "inference": stored["inference_trace"], "dlrm": stored["dlrm_trace"]}.get(name)
    out = tmp_path / f"{name}.html"
    write_report(stored[name], out, "html", trace)
    built = report(load(stored[name]), load_trace(trace) if trace else None)

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("request", lambda r: problems.append(f"network request {r.url}") if not r.url.startswith(("file:", "data:")) else None)
    page.goto(out.as_uri())
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length > 0")
    page.wait_for_timeout(300)
    marks = page.evaluate(MARKS_JS)
    tables = page.evaluate("() => [...document.querySelectorAll('section.table tbody tr')].length")
    shot = page.screenshot(full_page=True)
    page.close()

    assert problems == []  # no console errors, and the page asked nothing of the network
    drawn = {f.name: expected_marks(f) for f in built.figures if not isinstance(f, Table)}
    assert set(marks) == set(drawn)
    for figure, count in drawn.items():
        assert count > 0 and marks[figure] >= count, (figure, marks[figure], count)
    assert tables == sum(len(f.rows) for f in built.figures if isinstance(f, Table))
    assert _pixel_spread(shot) > 0.05  # not a blank page
    keep = os.environ.get("MESHPLAN_REPORT_SCREENSHOT")
    if keep and name == "estimate":
        Path(keep).write_bytes(shot)


def _pixel_spread(png: bytes) -> float:
    """Standard deviation of the screenshot's RGB values (0 to 1): 0 for a blank page."""
    import matplotlib.image

    pixels = matplotlib.image.imread(io.BytesIO(png), format="png")
    return float(pixels[..., :3].std())
