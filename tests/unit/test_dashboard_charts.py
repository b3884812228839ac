"""The dashboard's charts without a store: the figures a window assembles from its queries'
rows (store/charts.py) and the SVG drawn from them (service/dashboard_svg.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson
import pytest

from tether.service.dashboard_svg import END, bars, graph, layout, sparkline
from tether.store import charts

NOW = 1_800_000_000.0


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert charts.percentile(values, 50) == 50.0
    assert charts.percentile(values, 95) == 95.0
    assert charts.percentile([3.0], 95) == 3.0
    assert charts.percentile([], 50) is None
    assert charts.Spread.of([1.0, 2.0, 3.0, 4.0]) == charts.Spread(4, 2.0, 4.0)


def test_failure_categories_are_read_from_the_stored_error() -> None:
    assert charts.category_of(b'{"category": "timeout", "type": "T"}') == "timeout"
    assert charts.category_of(memoryview(b'{"type": "E"}')) == "exception"
    assert charts.category_of(None) == "exception"
    assert charts.category_of(b"not json") == "unknown"
    assert charts.category_of(b"[1]") == "unknown"


M = int(NOW // 60)  # the minute under way at NOW: the hour's last bucket


def fake(rows: Mapping[str, list[tuple[Any, ...]]]) -> tuple[charts.Query, list[tuple[str, Any]]]:
    asked: list[tuple[str, Any]] = []

    async def query(name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        asked.append((name, params["since"]))
        if name.endswith("_finished"):
            return slices(rows.get(name, []), params, 60)
        assert params["limit"] == 3 and params["since"] == (M - 59) * 60
        return rows.get(name, [])

    return query, asked


def slices(buckets: list[tuple[int, int]], params: Mapping[str, Any], width: float
           ) -> list[tuple[int, int, float]]:
    """A store's slice rows for (bucket, count) pairs: each bucket's rows all in its first
    slice, finished a second into it (the query counts up to its cap)."""
    assert params["slice"] == width / charts.SLICES and params["cap"] >= charts.MIN_CAP
    out = []
    for b, c in buckets:
        k = round((b * width - params["since"]) / params["slice"])
        if 0 <= k < params["n"]:
            out.append((k, min(c, params["cap"]), b * width + 1.0))
    return out


async def test_a_window_adds_up_its_rows() -> None:
    err = orjson.dumps({"category": "llm_provider"})
    query, asked = fake({
        "charts_runs_finished": [(M - 59, 2), (M, 5), (M - 60, 9)],  # M - 60: before the hour
        "charts_steps_finished": [(M - 49, 7)],
        "charts_step_sample": [("a", 0.5), ("a", 1.5), ("b", 2.0)],
        "charts_run_sample": [("a", "completed", 3.0), ("b", "failed", 1.0)],
        "charts_queue_sample": [("a", NOW - 10, NOW - 9), ("a", NOW - 4, None)],
        "charts_failed_sample": [("b", err, NOW), ("b", err, NOW), ("a", None, NOW)],
    })
    w = await charts.window(query, NOW + 30, "hour", sample=3)
    assert len(w.runs) == 60 and w.runs[0] == 2 and w.runs[59] == 5 and w.runs_total == 7
    assert w.steps[10] == 7 and w.steps_total == 7
    assert w.since == (M - 59) * 60 and w.per_minute(59.5) == 1.0  # 59.5 minutes covered
    assert w.step_latency["a"] == charts.Spread(2, 0.5, 1.5)
    assert w.step_latency["(all)"].n == 3
    assert w.run_latency["b"] == charts.Spread(1, 1.0, 1.0)
    assert w.statuses == {"completed": 1, "failed": 1}
    # A run not started yet counts its wait so far (to now): 34 s; the other waited 1 s.
    assert w.queue_wait == {"a": charts.Spread(2, 1.0, 34.0)}
    assert w.failures == {"llm_provider": 2, "exception": 1}
    assert w.failed_by_agent == {"b": 2, "a": 1}
    assert w.steps_full and w.failed_full and not w.runs_full and not w.queue_full
    assert len({name for name, _ in asked}) == 6


async def test_complete_buckets_are_counted_once() -> None:
    rows = {"charts_runs_finished": [(M - 59, 2), (M - 1, 3), (M, 1)]}
    query, asked = fake(rows)
    buckets = charts.Buckets()
    (first, estimated), _ = await charts.throughput(query, NOW + 45, buckets)
    assert sum(first) == 6 and not estimated
    assert asked[0] == ("charts_runs_finished", (M - 59) * 60)  # the whole hour, once
    asked.clear()
    rows["charts_runs_finished"] = [(M - 59, 99), (M - 1, 99), (M, 4)]  # only M may change
    (again, _), _ = await charts.throughput(query, NOW + 50, buckets)
    assert again[0] == 2 and again[58] == 3 and again[59] == 4
    # Minute M - 1 ended 50 s ago, past GRACE: remembered; only minute M was read again.
    assert asked[0] == ("charts_runs_finished", M * 60)
    asked.clear()
    (later, _), _ = await charts.throughput(query, NOW + 60 * 60 + 45, buckets)  # an hour on
    assert asked[0] == ("charts_runs_finished", (M + 1) * 60)  # M left the window
    assert sum(later) == 0


def test_a_full_slice_is_estimated_from_the_time_its_rows_took() -> None:
    assert charts.estimate(7, 50, 100.4, 100.0, 5.0) == (7, False)  # below the cap: exact
    assert charts.estimate(50, 50, 100.5, 100.0, 5.0) == (500, True)  # 50 in 0.5 s of 5 s
    assert charts.estimate(50, 50, 104.9, 100.0, 5.0) == (51, True)
    assert charts.estimate(50, 50, 100.0, 100.0, 5.0) == (250_000, True)  # 1 ms at least
    assert charts.estimate(50, 50, 110.0, 100.0, 5.0) == (50, True)  # never below the cap


async def test_a_busy_bucket_is_read_capped_and_marked_estimated() -> None:
    seen: list[Mapping[str, Any]] = []

    async def query(name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        if not name.endswith("_finished"):
            return []
        seen.append(params)
        cap, part, since = params["cap"], params["slice"], params["since"]
        lo = M * 60 - since  # minute M's offset: each of its 12 slices full, 2 s for cap rows
        return [(round((lo + i * part) / part), cap, since + lo + i * part + 2.0)
                for i in range(charts.SLICES)] if name == "charts_steps_finished" else []

    w = await charts.window(query, NOW + 30, "hour")
    cap = seen[0]["cap"]
    assert seen[0]["n"] == 60 * charts.SLICES and cap * seen[0]["n"] <= charts.BUDGET
    assert w.steps_estimated and not w.runs_estimated
    assert w.steps[59] == round(cap * 5 / 2.0) * charts.SLICES and sum(w.steps[:59]) == 0


async def test_the_day_has_quarter_hour_bars() -> None:
    async def query(name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        return (slices([(int(NOW // 900), 3)], params, 900) if name == "charts_runs_finished"
                else [])

    w = await charts.window(query, NOW + 450, "day")
    assert len(w.runs) == 96 and w.width == 900 and w.runs[95] == 3
    assert w.per_minute(w.runs_total) == pytest.approx(3 / (95 * 15 + 7.5))
    assert w.step_latency == {} and w.failures == {}


def test_bars_draw_one_bar_per_nonzero_bucket_and_say_the_total() -> None:
    counts = [0, 3, 0, 6]
    svg = str(bars(counts, since=NOW - 240, width_s=60, label="runs <finished>"))
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert 'data-total="9"' in svg and "runs &lt;finished&gt;: 9 in all" in svg
    assert re.findall(r'data-n="(\d+)"', svg) == ["3", "6"]
    heights = [float(h) for h in re.findall(r'class="bar"[^>]* height="([\d.]+)"', svg)]
    assert heights[1] == pytest.approx(2 * heights[0])  # scaled to the largest
    assert "<script" not in svg


def test_sparkline_has_a_point_per_bucket() -> None:
    svg = str(sparkline([0, 1, 2, 1], label="x"))
    (points,) = re.findall(r'points="([^"]+)"', svg)
    assert len(points.split()) == 4 and 'data-total="4"' in svg


def test_the_graph_lays_out_nodes_by_distance_from_the_start() -> None:
    edges = {("plan", "act"): 5, ("act", "act"): 3, ("act", "plan"): 1, ("act", END): 5}
    places = layout(["plan", "act", "review", END], edges, "plan")
    assert places["plan"].x < places["act"].x < places["review"].x < places[END].x
    svg = str(graph(["plan", "act", "review", END], edges, "plan",
                    on=frozenset({("plan", "act"), ("act", END)})))
    assert re.findall(r'class="edge on" data-from="(\w+)" data-to="([^"]+)"', svg) == [
        ("plan", "act"), ("act", END)]
    assert 'data-from="act" data-to="act" data-count="3"' in svg  # the loop is drawn
    assert re.findall(r'class="node[^"]*" data-node="([^"]+)"', svg) == [
        "plan", "act", "review", END]
    assert 'class="node start on" data-node="plan"' in svg
    assert 'class="node" data-node="review"' in svg  # declared, never reached: not lit


def test_the_graph_escapes_node_names() -> None:
    svg = str(graph(['<img src=x onerror="alert(1)">', "b"],
                    {('<img src=x onerror="alert(1)">', "b"): 1}, None))
    assert "<img" not in svg and "&lt;img" in svg


async def test_the_day_takes_the_hours_sample_when_it_was_full() -> None:
    asked: list[tuple[str, float]] = []
    day_start = (int(NOW // 900) - 95) * 900

    async def query(name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        asked.append((name, params["since"]))
        if name == "charts_step_sample":
            return [("a", 1.0)] * 2  # full (sample=2): the day's newest two are these
        if name == "charts_failed_sample":  # read once, for the day; the hour filters it
            return [("a", None, NOW - 7200), ("a", None, NOW - 10)]
        return []

    hour, day = await charts.windows(query, NOW, sample=2)
    samples = [(n, s) for n, s in asked if n.endswith("_sample")]
    assert ("charts_step_sample", day_start) not in samples
    assert [n for n, _ in samples].count("charts_step_sample") == 1
    assert [n for n, _ in samples].count("charts_run_sample") == 2  # not full: read again
    assert samples[0] == ("charts_failed_sample", day_start)
    assert day.step_latency["a"].n == 2 and day.steps_full
    assert hour.failures == {"exception": 1} and day.failures == {"exception": 2}
