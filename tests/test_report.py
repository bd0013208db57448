"""meshplan report: figure data from stored results (values, not strings), files in every
format, rebuilt without running a model, clear errors for bad inputs. The browser test is in
test_report_browser.py."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_runner import run_cli
from edits import mutate
from meshplan.errors import MeshplanError
from meshplan.plots import write_report
from meshplan.plots.build import front, memory_per_role, plan_breakdowns, report, step_breakdown
from meshplan.plots.figures import Bars, Scatter, Table, Timeline
from meshplan.plots.inputs import load, load_trace
from meshplan.plots.timeline import merge, timeline
from report_inputs import write_inputs

pytest.importorskip("plotly")
pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    return write_inputs(tmp_path_factory.mktemp("stored"))


def test_inputs_are_recognised_by_their_shape(stored):
    names = ("estimate", "inference", "dlrm", "search", "store", "validation")
    assert {name: load(stored[name]).kind for name in names} == dict(zip(names, names))


def test_serving_phases_sum_to_ttft_and_tpot(stored):
    d = json.loads(stored["inference"].read_text())
    figures = {f.name: f for f in report(load(stored["inference"])).figures}
    assert figures["prefill_breakdown"].totals()[0] == pytest.approx(d["ttft_s"], rel=1e-9)
    assert figures["decode_breakdown"].totals()[0] == pytest.approx(d["tpot_s"], rel=1e-9)
    assert figures["memory"].totals()[0] == pytest.approx(d["memory"]["total_bytes"], rel=1e-12)
    assert figures["memory"].series["kv cache"][0] == d["memory"]["kv_cache_bytes"] > 0


def test_dlrm_iteration_and_serialized_time_by_kind(stored):
    d = json.loads(stored["dlrm"].read_text())
    figures = {f.name: f for f in report(load(stored["dlrm"])).figures}
    assert figures["iteration_breakdown"].totals()[0] == pytest.approx(d["iteration_s"], rel=1e-9)
    assert figures["serialized_by_kind"].totals()[0] == pytest.approx(d["serialized_s"], rel=1e-9)
    assert figures["memory"].totals()[0] == pytest.approx(d["memory"]["total_bytes"], rel=1e-12)
    assert figures["energy"].totals()[0] == pytest.approx(d["energy"]["total_j"], rel=1e-9)


def test_step_breakdown_segments_sum_to_the_step_time(stored):
    e = json.loads(stored["estimate"].read_text())
    bars = step_breakdown(e)
    assert bars.totals()[0] == pytest.approx(e["breakdown"]["total_s"], rel=1e-12)
    assert bars.totals()[0] == pytest.approx(e["step_time_s"], rel=1e-9)
    assert bars.series["recompute"][0] == e["breakdown"]["recompute_s"] > 0  # the estimate recomputes (--recompute full)


def test_memory_segments_sum_to_each_role_against_capacity(stored):
    e = json.loads(stored["estimate"].read_text())
    bars = memory_per_role(e)
    assert len(bars.categories) == len(e["roles"]) == 3  # first, middle and last pipeline stage
    assert bars.totals() == pytest.approx([r["memory"]["total_bytes"] for r in e["roles"]], rel=1e-12)
    assert bars.line == e["memory"]["capacity_bytes"]


def test_energy_segments_sum_to_the_step_energy(stored):
    e = json.loads(stored["estimate"].read_text())
    energy = next(f for f in report(load(stored["estimate"])).figures if f.name == "energy")
    assert energy.totals()[0] == pytest.approx(e["energy"]["total_j"], rel=1e-9)


def test_search_figures_read_every_stored_plan(stored):
    source = load(stored["store"])
    fits = [r for r in source.data if r["fits"]]
    built = report(source, top=5)
    table = next(f for f in built.figures if f.name == "top_plans")
    times = [row[table.columns.index("step_time_s")] for row in table.rows]
    assert times == sorted(r["step_time_s"] for r in fits)[:5]
    points = next(f for f in built.figures if f.name == "pareto_memory").series[0]
    assert len(points.x) == len(fits)
    memory = next(f for f in built.figures if f.name == "plan_memory")
    assert memory.line == source.job["cluster"]["device"]["hbm_bytes"]


def test_energy_front_from_the_stored_energy_per_step(stored):
    source = load(stored["store"])
    fits = [r for r in source.data if r["fits"]]
    assert all(r["energy_j"] > 0 for r in fits)  # the A100 has a power model: rows carry energy
    scatter = next(f for f in report(source).figures if f.name == "pareto_energy")
    line = scatter.series[1]
    assert list(line.x) == sorted(line.x) and all(a > b for a, b in zip(line.y, line.y[1:]))  # a staircase down
    best = min(fits, key=lambda r: r["step_time_s"])
    assert line.y[-1] == best["step_time_s"]  # the fastest plan ends the front
    assert min(line.x) == min(r["energy_j"] for r in fits)  # the most frugal plan starts it


def test_cost_front_with_a_price(stored):
    """With a price per device-hour, a search report draws step time against cost per step
    (device-hours of the step times the price); without one, it says how to get it."""
    source = load(stored["store"])
    fits = [r for r in source.data if r["fits"]]
    assert not any(f.name == "pareto_cost" for f in report(source).figures)
    scatter = next(f for f in report(source, price=2.0).figures if f.name == "pareto_cost")
    cheapest = min(r["step_time_s"] * r["num_devices"] / 3600.0 * 2.0 for r in fits)
    assert min(scatter.series[1].x) == pytest.approx(cheapest, rel=1e-12)
    assert len(scatter.series[0].x) == len(fits)


def test_plan_breakdowns_sum_to_each_step_time(stored):
    rows = json.loads(stored["search"].read_text())["top"]
    bars = plan_breakdowns(rows)
    assert bars.totals() == pytest.approx([r["step_time_s"] for r in rows], rel=1e-9)


rows_strategy = st.lists(st.tuples(st.integers(1, 20), st.integers(1, 20)), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(rows_strategy)
def test_front_is_exactly_the_non_dominated_rows(pairs):
    rows = [{"memory_bytes": m, "step_time_s": t} for m, t in pairs]
    got = front(rows, "memory_bytes")

    def dominated(r):
        return any(o["memory_bytes"] <= r["memory_bytes"] and o["step_time_s"] <= r["step_time_s"]
                   and (o["memory_bytes"], o["step_time_s"]) != (r["memory_bytes"], r["step_time_s"]) for o in rows)

    expected = sorted({(r["memory_bytes"], r["step_time_s"]) for r in rows if not dominated(r)})
    assert [(r["memory_bytes"], r["step_time_s"]) for r in got] == expected


def test_timeline_keeps_every_task_inside_a_span_of_its_lane_and_kind(stored):
    trace = load_trace(stored["trace"])
    tasks = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    t = timeline(trace, max_spans=1500)
    assert len(t.spans) <= 1500 < len(tasks)
    assert t.end_s == pytest.approx(trace["metadata"]["step_time_s"])
    by_lane: dict = {}
    for s in t.spans:
        by_lane.setdefault((s.lane, s.kind), []).append((s.start_s, s.start_s + s.duration_s))
    exact = timeline(trace, max_spans=len(tasks))
    assert len(exact.spans) == len(tasks) and exact.note == ""  # nothing merged when it fits
    for task in exact.spans:
        spans = np.array(by_lane[(task.lane, task.kind)])
        inside = (spans[:, 0] <= task.start_s + 1e-12) & (task.start_s + task.duration_s <= spans[:, 1] + 1e-12)
        assert inside.any(), task


def test_timeline_merges_at_most_down_to_one_span_per_run_of_a_kind(stored):
    trace = load_trace(stored["trace"])
    exact = timeline(trace, max_spans=10**9).spans
    runs = sum(1 for i, s in enumerate(exact) if i == 0 or (s.lane, s.kind) != (exact[i - 1].lane, exact[i - 1].kind))
    assert len(timeline(trace, max_spans=1).spans) == runs


def test_merge_joins_only_tasks_of_one_kind_in_a_row():
    from meshplan.plots.figures import Span

    tasks = [Span("a", "fwd", 0.0, 1.0, "x"), Span("a", "fwd", 1.5, 1.0, "y"), Span("a", "bwd", 2.6, 1.0, "z"),
             Span("a", "fwd", 3.7, 1.0, "w"), Span("b", "fwd", 0.0, 1.0, "v")]
    merged = merge(tasks, gap_s=0.6)
    assert [(s.lane, s.kind, s.start_s, s.duration_s) for s in merged] == [
        ("a", "fwd", 0.0, 2.5), ("a", "bwd", 2.6, 1.0), ("a", "fwd", 3.7, 1.0), ("b", "fwd", 0.0, 1.0)]


def test_validation_scatter_per_group_with_the_median_error_band(stored):
    cases = json.loads(stored["validation"].read_text())
    built = report(load(stored["validation"]))
    scatter = next(f for f in built.figures if isinstance(f, Scatter))
    scored = [c for c in cases if c["relative_error"] is not None]
    assert [s.name for s in scatter.series] == ["sc21", "other"]
    assert sum(len(s.x) for s in scatter.series) == len(scored) == 4
    assert scatter.band == pytest.approx(float(np.median([abs(c["relative_error"]) for c in scored])))
    errors = next(f for f in built.figures if f.name == "group_errors")
    assert errors.totals() == pytest.approx([max(abs(c["relative_error"]) for c in scored if c["group"] == g)
                                             for g in ("sc21", "other")])
    assert len(next(f for f in built.figures if isinstance(f, Table)).rows) == len(cases) == 5


def _model_runners():
    """Every function that runs a model, and each module namespace that holds it."""
    import meshplan.api  # noqa: F401 - load every stage
    from meshplan.costs.costed import cost_program
    from meshplan.parallel.program import build_program
    from meshplan.parallel.strategy import build_strategy_program
    from meshplan.timeline.inference import inference_estimate
    from meshplan.timeline.iteration import iteration_estimate
    from meshplan.timeline.step import step_estimate

    targets = {id(f) for f in (build_program, cost_program, step_estimate, inference_estimate, iteration_estimate,
                               build_strategy_program)}
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("meshplan"):
            for name, value in list(vars(module).items()):
                if id(value) in targets:
                    yield module, name


@pytest.mark.parametrize("fmt", ["html"])  # the static renderers draw the same figure data
def test_reports_are_rebuilt_from_stored_files_without_running_a_model(stored, tmp_path, monkeypatch, fmt):
    def refuse(*args, **kwargs):
        raise AssertionError("a report ran a model")

    runners = list(_model_runners())
    assert len(runners) >= 6  # each function where it is defined, and where it is imported
    for module, name in runners:
        monkeypatch.setattr(module, name, refuse)
    traces = {"estimate": stored["trace"], "inference": stored["inference_trace"], "dlrm": stored["dlrm_trace"]}
    for name in ("estimate", "inference", "dlrm", "store", "search", "validation"):
        out = tmp_path / (f"{name}.html" if fmt == "html" else name)
        trace = traces.get(name)
        written = write_report(stored[name], out, fmt, trace)
        assert all(p.stat().st_size > 0 for p in written)
        expected = len(report(load(stored[name]), load_trace(trace) if trace else None).figures)
        assert len(written) == (1 if fmt == "html" else expected)


@pytest.mark.parametrize("fmt", ["png", "svg", "pdf"])
def test_static_formats_write_one_file_per_figure(stored, tmp_path, fmt):
    trace = stored["trace"] if fmt == "png" else None  # the timeline is the slow one to draw
    written = write_report(stored["estimate"], tmp_path / "figs", fmt, trace)
    built = report(load(stored["estimate"]), load_trace(trace) if trace else None)
    suffixes = [p.suffix for p in written]
    assert suffixes == [".csv" if isinstance(f, Table) else f".{fmt}" for f in built.figures]
    if fmt == "png":
        import matplotlib.image

        for path in written[1:]:
            pixels = matplotlib.image.imread(path)
            assert pixels[..., :3].std() > 0.05, path  # drawn, not a blank canvas


def test_html_report_is_one_self_contained_page(stored, tmp_path):
    out = tmp_path / "r.html"
    write_report(stored["estimate"], out, "html", stored["trace"])
    text = out.read_text()
    assert "<script src=" not in text  # plotly.js inlined: the page opens offline
    built = report(load(stored["estimate"]), load_trace(stored["trace"]))
    assert text.count('data-figure="') == len(built.figures)


def _one_error_line(code: int, err: str) -> bool:
    return code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: ")


def test_bad_inputs_are_one_error_line(stored, tmp_path, monkeypatch, capsys):
    (tmp_path / "other.json").write_text(json.dumps({"a": 1}))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty.json").write_text("[]")
    (tmp_path / "bad.json").write_text("{not json")
    out = str(tmp_path / "r.html")
    for args in (["missing.json"], [str(tmp_path / "other.json")], [str(tmp_path / "empty")],
                 [str(tmp_path / "empty.json")], [str(tmp_path / "bad.json")],
                 [str(stored["estimate"]), "--trace", str(stored["estimate"])],
                 [str(stored["estimate"]), "--format", "gif"], [str(stored["search"]), "--top", "0"]):
        code, _, err = run_cli(monkeypatch, capsys, "report", *args, "--out", out)
        assert _one_error_line(code, err), (args, code, err)
    assert not (tmp_path / "r.html").exists()


#: (stored input, where a hand edit damaged it, the value put there or None to delete the key,
#: the flag and the words the one error line must carry): each was an internal error
DAMAGED = [
    ("estimate", ("plan",), None, "INPUT", ["estimate --json", "it has no 'plan'"]),
    ("estimate", ("breakdown", "compute_s"), "abc", "INPUT", ["breakdown.compute_s holds 'abc', not a number"]),
    ("estimate", ("breakdown", "compute_s"), 10**400, "INPUT", ["breakdown.compute_s holds 1000000", "..., not a number"]),
    ("estimate", ("breakdown", "exposed_comm_s", "cp"), [1, 2], "INPUT", ["exposed cp holds [1, 2], not a finite number"]),
    ("search", ("top", 0, "exposed_tp_s"), True, "INPUT", ["search --json", "top.0.exposed_tp_s holds True"]),
    ("search", ("top", 1, "exposed_pp_s"), {"a": "b"}, "INPUT", ["top.1.exposed_pp_s.a holds 'b'"]),
    ("validation", (1, "predicted_step_time_s"), "fast", "INPUT", ["validate --json", "1.predicted_step_time_s holds 'fast'"]),
    ("validation", (0, "measured_step_time_s"), float("nan"), "INPUT", ["0.measured_step_time_s holds nan"]),
    ("inference", ("memory", "capacity_bytes"), "80GB", "INPUT", ["memory.capacity_bytes holds '80GB'"]),
    ("dlrm", ("energy", "memory_j"), "abc", "INPUT", ["energy.memory_j holds 'abc'"]),
]


@pytest.mark.parametrize(("kind", "path", "value", "flag", "words"), DAMAGED)
@pytest.mark.parametrize("fmt", ["html", "png"])
def test_a_damaged_stored_file_is_one_error_line_naming_it(stored, tmp_path, monkeypatch, capsys, kind, path, value,
                                                          flag, words, fmt):
    damaged = tmp_path / f"{kind}.json"
    damaged.write_text(json.dumps(mutate(json.loads(stored[kind].read_text()), path, value, delete=value is None)))
    code, _, err = run_cli(monkeypatch, capsys, "report", str(damaged), "--out", str(tmp_path / "r"), "--format", fmt)
    assert _one_error_line(code, err), err
    assert err.startswith(f"error: {flag}: got '{damaged}'") and all(w in err for w in words), err


def test_a_damaged_trace_is_one_error_line_naming_it(stored, tmp_path, monkeypatch, capsys):
    trace = json.loads(stored["trace"].read_text())
    first = next(i for i, e in enumerate(trace["traceEvents"]) if e.get("ph") == "X")
    damaged = tmp_path / "trace.json"
    damaged.write_text(json.dumps(mutate(trace, ("traceEvents", first, "dur"), "long")))
    code, _, err = run_cli(monkeypatch, capsys, "report", str(stored["estimate"]), "--trace", str(damaged),
                           "--out", str(tmp_path / "r.html"))
    assert _one_error_line(code, err), err
    assert err.startswith(f"error: --trace: got '{damaged}'") and "estimate --trace" in err, err


def test_a_missing_extra_is_named(stored, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    with pytest.raises(MeshplanError) as err:
        write_report(stored["estimate"], tmp_path / "r.html")
    assert err.value.field == "--format" and "meshplan[report]" in err.value.valid
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MeshplanError) as err:
        write_report(stored["estimate"], tmp_path / "figs", "png")
    assert "meshplan[report]" in err.value.valid


def test_cli_writes_the_report(stored, tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.html"
    code, _, _ = run_cli(monkeypatch, capsys, "report", str(stored["store"]), "--out", str(out), "--top", "3")
    assert code == 0 and out.stat().st_size > 1_000_000  # plotly.js is inside


def test_notebook_views_draw_without_plotly():
    script = (
        "import sys, meshplan\n"
        "e = meshplan.estimate('gpt3-175b', 'dgx-a100-80gb', tp=8, pp=16, num_devices=1536, global_batch_size=1536)\n"
        "html = e._repr_html_()\n"
        "assert 'plotly' not in sys.modules and 'matplotlib' not in sys.modules, 'a heavy import'\n"
        "print(html.count('<rect'))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    rects = int(done.stdout.split()[-1])
    import meshplan

    e = meshplan.estimate("gpt3-175b", "dgx-a100-80gb", tp=8, pp=16, num_devices=1536, global_batch_size=1536)
    d = e.to_dict()
    drawn = [step_breakdown(d), memory_per_role(d)]
    segments = sum(v > 0 for b in drawn for values in b.series.values() for v in values)
    legend = sum(any(values) for b in drawn for values in b.series.values())
    assert rects == segments + legend


def test_search_and_validation_results_render_in_notebooks(stored):
    from meshplan.explore.search import SearchResult
    from meshplan.io.validation_cases import CaseResult, CaseResults

    top = json.loads(stored["search"].read_text())["top"]
    result = SearchResult(top=top, space_size=1, candidates=1, evaluated=1, infeasible_memory=0, rejected={}, wall_s=0.0)
    assert result._repr_html_().count("<tr>") == 1 + min(5, len(top))
    cases = CaseResults(CaseResult(**c) for c in json.loads(stored["validation"].read_text()))
    assert cases._repr_html_().count("<tr>") == 1 + len(cases)


def test_figure_kinds_are_drawn_by_every_renderer(stored):
    from meshplan.plots.html import figure_json

    built = report(load(stored["estimate"]), load_trace(stored["trace"]))
    kinds = {type(f) for f in built.figures}
    assert kinds == {Table, Bars, Timeline}
    t = next(f for f in built.figures if isinstance(f, Timeline))
    bars = [trace for trace in figure_json(t)["data"] if trace["type"] == "bar"]
    assert sum(len(trace["x"]) for trace in bars) == len(t.spans)


def _svg_rects(figures) -> int:
    """Rects an inline SVG chart draws: one per non-zero segment and one per legend entry."""
    bars = [f for f in figures if isinstance(f, Bars)]
    return sum(v > 0 for b in bars for values in b.series.values() for v in values) + \
        sum(any(values) for b in bars for values in b.series.values())


def test_serving_and_dlrm_estimates_render_in_notebooks():
    import meshplan
    from meshplan.plots.build_other import dlrm_figures, inference_figures
    from meshplan.plots.inputs import Source

    serving = meshplan.estimate("llama3-70b", "dgx-h100", tp=8, num_devices=8,
                                task={"kind": "inference", "batch_size": 64, "prompt_len": 2048, "output_len": 512})
    dlrm = meshplan.estimate(model="dlrm-a", cluster="zionex-a100", num_devices=128,
                             strategy="embedding=(mp) dense=(tp,ddp)", global_batch_size=65536)
    expected = _svg_rects(inference_figures(Source("inference", "", serving.to_dict()))[0])
    assert serving._repr_html_().count("<rect") == expected
    assert dlrm._repr_html_().count("<rect") == _svg_rects(dlrm_figures(Source("dlrm", "", dlrm.to_dict()))[0])
