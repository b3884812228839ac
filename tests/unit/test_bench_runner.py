"""The benchmark runner's pure logic: option parsing, the plan of workload processes, goals,
and the table with the anchors' figures and tether's ratio to them."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
from bench.run import CHECKOUT

from tether.bench import runner
from tether.bench.common import Result
from tether.bench.report import anchor_results, check, compare, direction, rows
from tether.bench.runner import (
    Checkout,
    Job,
    parse_backends,
    parse_systems,
    parse_workloads,
    plan,
)
from tether.errors import ConfigError


def test_parse_lists() -> None:
    assert parse_backends("sqlite,postgres") == ["sqlite", "postgres"]
    assert parse_backends("both") == ["sqlite", "postgres"]
    assert parse_backends(" Postgres ") == ["postgres"]
    assert parse_workloads("w3, W4,w3") == ["W3", "W4"]
    assert parse_workloads("e,m,l") == ["E", "M", "L"]
    assert parse_systems("DBOS") == ["dbos"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown workload 'W9'; choose from W1"):
        parse_workloads("W1,W9")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown backend 'mysql'"):
        parse_backends("mysql")
    with pytest.raises(argparse.ArgumentTypeError, match="no workload given"):
        parse_workloads(" , ")


def parse(*argv: str, anchors_by_default: bool = False,
          checkout: Checkout | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    runner.add_arguments(p, anchors_by_default=anchors_by_default)
    p.set_defaults(checkout=checkout)
    return p.parse_args(argv)


def test_arguments_and_anchor_defaults() -> None:
    args = parse()
    assert args.backend == ["sqlite", "postgres"] and args.workloads is None
    assert args.anchors is None and args.anchors_auto is None and args.out is None
    assert parse(anchors_by_default=True).anchors_auto == ["langgraph", "dbos"]
    assert parse("--anchors").anchors == ["langgraph", "dbos"]
    assert parse("--anchors", "dbos").anchors == ["dbos"]
    assert parse("--db", "postgresql://u@h/db").pg_url == "postgresql://u@h/db"


def test_plan_sizes() -> None:
    full = plan(["sqlite"], ["W3", "W4", "W2"], quick=False)
    assert [(j.workload, j.args) for j in full] == [
        ("W3", ("plain",)), ("W3", ("outbox",)), ("W4", ("20000", "4")),
        ("W2", ("1000",)), ("W2", ("10000",))]
    quick = plan(["sqlite", "postgres"], ["W4", "M"], quick=True, m_timeout=60)
    assert [(j.backend, j.args) for j in quick] == [
        ("sqlite", ("5000", "4")), ("sqlite", ("100", "60")), ("sqlite", ("1000", "60")),
        ("postgres", ("5000", "4")), ("postgres", ("100", "60")), ("postgres", ("1000", "60"))]
    assert quick[1].timeout == 60 + runner.M_GRACE_S
    assert full[0].argv()[1:] == ["-m", "tether.bench.workloads", "W3", "sqlite", "plain"]


def test_goals_of_w3() -> None:
    assert check(Result("sqlite", "W3", "lost_runs", 0, "count")) == ("0", True)
    assert check(Result("postgres", "W3", "duplicate_effects_outbox", 2, "count")) == ("0", False)
    assert check(Result("sqlite", "W3", "duplicate_effects", 80, "count")) == ("", None)


@pytest.mark.parametrize(("metric", "unit", "tether", "anchor", "text"), [
    ("checkpoints_per_s", "1/s", 1500.0, 500.0, "3.00x faster"),
    ("checkpoints_per_s", "1/s", 250.0, 500.0, "2.00x slower"),
    ("recovery_s", "s", 2.0, 10.0, "5.00x faster"),
    ("latency_p50_ms", "ms", 4.0, 1.0, "4.00x slower"),
    ("wall_over_ideal_1k", "x", 2.0, 23.0, "11.50x faster"),
    ("peak_rss_mib_10k", "MiB", 100.0, 250.0, "2.50x less memory"),
    ("rss_delta_mib_10k", "MiB", 60.0, 30.0, "2.00x more memory"),
    ("bytes_on_disk", "bytes", 2e6, 2e7, "10.00x less disk"),
    ("duplicate_effects", "count", 0, 12, "12 fewer"),
    ("repeated_steps_outbox", "count", 5, 5, "same"),
    ("lost_runs", "count", 3, 0, "3 more"),
    ("steps_at_kill", "count", 500, 520, ""),
    ("recovery_s", "s", 0.0, 3.0, ""),
])
def test_compare_reads_as_tether_is(metric: str, unit: str, tether: float, anchor: float,
                                    text: str) -> None:
    assert compare(metric, unit, tether, anchor) == text


def test_direction() -> None:
    assert direction("enqueue_per_s", "1/s") == (True, "faster", "slower")
    assert direction("checkpoints_vs_raw_inline", "x") is None
    assert direction("jobs", "count") is None


def test_table_with_synthetic_anchors() -> None:
    job = Job("sqlite", "W3", ("plain",), label="W3 plain", results=[
        Result("sqlite", "W3", "recovery_s", 2.0, "s"),
        Result("sqlite", "W3", "duplicate_effects", 90, "count"),
        Result("sqlite", "W3", "lost_runs", 0, "count"),
    ])
    failed = Job("postgres", "W4", label="W4 N=20,000", error="timed out after 900 s")
    anchors: list[dict[str, Any]] = [
        {"system": "langgraph", "backend": "sqlite", "workload": "W3", "metric": "recovery_s",
         "value": 8.0, "unit": "s"},
        {"system": "dbos", "backend": "sqlite", "workload": "W3", "metric": "recovery_s",
         "value": 1.0, "unit": "s"},
        {"system": "dbos", "backend": "sqlite", "workload": "W3", "metric": "duplicate_effects",
         "value": 100, "unit": "count"},
        {"system": "dbos", "backend": "postgres", "workload": "W4", "metric": "drain_per_s",
         "value": 900.5, "unit": "1/s"},
        {"system": "langgraph", "backend": "postgres", "workload": "W4", "error": "no venv"},
        {"system": "dbos", "backend": "sqlite", "workload": "W5", "metric": "error", "value": 0,
         "unit": "W5 (10,000): timed out"},
    ]
    head, table = rows([job, failed], [], anchors)
    assert head[-2:] == ("LangGraph (tether vs it)", "DBOS (tether vs it)")
    by_metric = {(r[0], r[2]): r for r in table}
    assert by_metric[("sqlite", "recovery_s")][-2:] == ("8.000 (tether 4.00x faster)",
                                                        "1.000 (tether 2.00x slower)")
    assert by_metric[("sqlite", "duplicate_effects")][-2:] == ("", "100 (tether 10 fewer)")
    assert by_metric[("sqlite", "lost_runs")][5:] == ("0", "yes", "", "")
    # An anchor metric tether did not report gets a row of its own, tether's cells empty.
    assert by_metric[("postgres", "drain_per_s")] == ("postgres", "W4", "drain_per_s", "", "1/s",
                                                      "", "", "", "900.5")
    errors = [r for r in table if r[2] == "error"]
    assert errors == [
        ("postgres", "W4 N=20,000", "error", "timed out after 900 s", "", "", "FAILED", "", ""),
        ("postgres", "W4", "error", "", "", "", "", "no venv", ""),
        ("sqlite", "W5", "error", "", "", "", "", "", "W5 (10,000): timed out")]
    assert all(len(r) == len(head) for r in table)


def test_table_without_anchors_keeps_seven_columns() -> None:
    job = Job("sqlite", "W4", label="W4", results=[Result("sqlite", "W4", "jobs", 200, "count")])
    head, table = rows([job], [], None)
    assert len(head) == 7 and table == [("sqlite", "W4", "jobs", "200", "count", "", "")]


def test_anchor_results_skip_non_numbers() -> None:
    index, systems = anchor_results([
        {"system": "dbos", "backend": "sqlite", "workload": "W1", "metric": "m", "value": True},
        {"system": "dbos", "backend": "sqlite", "workload": "W1", "metric": "n", "value": "x"},
        {"system": "langgraph", "backend": "sqlite", "workload": "W1", "metric": "k",
         "value": 3, "unit": "s"},
    ])
    assert systems == ["dbos", "langgraph"]
    assert index == {("langgraph", "sqlite", "W1", "k"): (3.0, "s")}


def test_m_without_examples() -> None:
    args = parse("--backend", "sqlite", "--no-anchors")
    workloads, systems, notes = runner.resolve(args)
    assert "M" not in workloads and systems is None
    assert notes == [f"M skipped: {runner.M_HINT}"]
    with pytest.raises(ConfigError, match=r"examples/megaagent/run\.py, which is not installed"):
        runner.resolve(parse("--backend", "sqlite", "--workloads", "W1,M"))


def test_the_checkout_runs_m_from_bench() -> None:
    args = runner.parse(["--backend", "sqlite", "--workloads", "W1,M", "--no-anchors"],
                        "python -m bench.run", CHECKOUT)
    assert runner.resolve(args) == (["W1", "M"], None, [])
    assert args.anchors_auto == ["langgraph", "dbos"]  # on by default in the checkout
    jobs = plan(["sqlite"], ["W1", "M"], quick=True, m_timeout=60, checkout=CHECKOUT)
    assert [j.argv()[1:] for j in jobs] == [
        ["-m", "tether.bench.workloads", "W1", "sqlite"],
        ["-m", "bench.workloads", "M", "sqlite", "100", "60"],
        ["-m", "bench.workloads", "M", "sqlite", "1000", "60"]]


def test_anchors_need_the_checkout() -> None:
    _, systems, notes = runner.resolve(parse("--backend", "sqlite", "--workloads", "W1"))
    assert systems is None and notes == []
    with pytest.raises(ConfigError, match="--anchors: the anchors need a tether checkout"):
        runner.resolve(parse("--backend", "sqlite", "--workloads", "W1", "--anchors"))


def test_anchors_not_there() -> None:
    checkout = Checkout("bench.workloads", ("M",), "no bench/anchors here")
    _, systems, notes = runner.resolve(parse("--backend", "sqlite", "--workloads", "W1",
                                             anchors_by_default=True, checkout=checkout))
    assert systems is None and notes == ["anchors skipped: no bench/anchors here"]
    with pytest.raises(ConfigError, match="--anchors: no bench/anchors here"):
        runner.resolve(parse("--backend", "sqlite", "--workloads", "W1", "--anchors",
                             checkout=checkout))
    # Workloads the anchors do not run: no anchors, nothing to say.
    assert runner.resolve(parse("--backend", "sqlite", "--workloads", "L", "--anchors",
                                checkout=checkout))[1:] == (None, [])


def test_workload_arguments() -> None:
    from tether.bench.workloads import workload_call

    with pytest.raises(SystemExit, match="W3 variant must be plain or outbox"):
        workload_call("W3", "sqlite", ["twice"])
    with pytest.raises(SystemExit, match="'many' is not a number"):
        workload_call("W4", "sqlite", ["many"])
    with pytest.raises(SystemExit, match="unknown workload 'W7'"):
        workload_call("W7", "sqlite", [])


def test_bad_pg_url_and_timeout() -> None:
    with pytest.raises(ConfigError, match="--pg-url must be a postgresql:// URL"):
        runner.resolve(parse("--backend", "postgres", "--workloads", "W4", "--db",
                             "sqlite:///x.db"))
    with pytest.raises(argparse.ArgumentTypeError, match="must be > 0"):
        runner._seconds("0")


def test_call_anchors_streams_rows() -> None:
    row = {"system": "dbos", "backend": "sqlite", "workload": "W3", "metric": "recovery_s",
           "value": 4.0, "unit": "s"}
    calls: list[tuple[Any, ...]] = []

    def streaming(systems: list[str], backends: list[str], workloads: list[str], quick: bool,
                  timeout: float | None = None, on_row: Any = None) -> list[dict[str, Any]]:
        calls.append((systems, backends, workloads, quick))
        on_row(row)
        return [row]

    def plain(systems: list[str], backends: list[str], workloads: list[str], quick: bool
              ) -> list[dict[str, Any]]:
        return [row]

    def failing(*args: Any) -> list[dict[str, Any]]:
        raise OSError("no disk")

    for fn in (streaming, plain):
        shown: list[str] = []
        assert runner.call_anchors(fn, ["dbos"], ["sqlite"], ["W3"], True, shown.append) == [row]
        assert [json.loads(s) for s in shown] == [row]  # once, streamed or not
    assert calls == [(["dbos"], ["sqlite"], ["W3"], True)]
    shown = []
    out = runner.call_anchors(failing, ["dbos"], ["sqlite"], ["W3"], False, shown.append)
    assert out == [{"system": "dbos", "error": "run_anchors failed: OSError('no disk')"}]


def test_anchor_at_another_size_is_shown_not_compared() -> None:
    job = Job("sqlite", "W4", label="W4", results=[
        Result("sqlite", "W4", "jobs", 5000, "count"),
        Result("sqlite", "W4", "drain_per_s", 2000.0, "1/s"),
    ])

    def anchor(metric: str, value: float, unit: str) -> dict[str, Any]:
        return {"system": "dbos", "backend": "sqlite", "workload": "W4", "metric": metric,
                "value": value, "unit": unit}

    _, table = rows([job], [], [anchor("jobs", 2000, "count"), anchor("drain_per_s", 100.0, "1/s")])
    assert [r[-1] for r in table] == ["2,000", "100.0 (at 2,000 jobs)"]
    _, table = rows([job], [], [anchor("jobs", 5000, "count"), anchor("drain_per_s", 100.0, "1/s")])
    assert [r[-1] for r in table] == ["5,000", "100.0 (tether 20.00x faster)"]
