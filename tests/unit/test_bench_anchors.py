"""The comparison anchors' runner (bench/anchors): option parsing, the plan of workload
processes, the JSON-line check and error rows. Nothing here installs the anchors' venvs."""

from __future__ import annotations

import argparse
import json
import re
import stat
from pathlib import Path

import pytest
from bench.anchors import run_anchors
from bench.anchors.common import percentile, suffix, w2_delays
from bench.anchors.runner import (
    ERROR_TEXT_MAX,
    Job,
    error_row,
    parse_args,
    plan,
    run_job,
    split_list,
    validate_line,
)
from bench.anchors.venvs import PINS, requirements


def test_split_list() -> None:
    assert split_list("dbos, LangGraph,dbos", ("langgraph", "dbos"), "system") == ["dbos",
                                                                                  "langgraph"]
    assert split_list("w1,W5", ("W1", "W2", "W5"), "workload") == ["W1", "W5"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown backend 'mysql'"):
        split_list("sqlite,mysql", ("sqlite", "postgres"), "backend")
    with pytest.raises(argparse.ArgumentTypeError, match="no workload given"):
        split_list(" , ", ("W1",), "workload")


def test_parse_args_defaults_and_choices() -> None:
    args = parse_args([])
    assert args.systems == ["langgraph", "dbos"]
    assert args.backends == ["sqlite", "postgres"]
    assert args.workloads == ["W1", "W2", "W3", "W4", "W5"]
    assert args.quick is False and args.timeout is None
    args = parse_args(["--systems", "dbos", "--backend", "postgres", "--workloads", "w3,w4",
                       "--quick", "--timeout", "30"])
    assert (args.systems, args.backends, args.workloads) == (["dbos"], ["postgres"], ["W3", "W4"])
    assert args.quick is True and args.timeout == 30.0
    with pytest.raises(SystemExit):
        parse_args(["--systems", "temporal"])


def test_plan_quick_sizes_and_unsupported_workloads() -> None:
    jobs = plan(["langgraph", "dbos"], ["sqlite"], ["W1", "W2", "W3", "W4", "W5"], quick=True)
    labels = [(j.system, j.workload, j.size) for j in jobs]
    assert labels == [
        ("langgraph", "W1", None), ("langgraph", "W2", 1000), ("langgraph", "W5", 1000),
        ("dbos", "W1", None), ("dbos", "W2", 1000), ("dbos", "W3", 20), ("dbos", "W4", 2000),
        ("dbos", "W5", 1000),
    ]
    assert all(j.timeout == 300.0 for j in jobs)


def test_plan_full_puts_w2_at_10k_last() -> None:
    jobs = plan(["dbos"], ["sqlite", "postgres"], ["W2", "W5"], quick=False)
    labels = [(j.backend, j.workload, j.size) for j in jobs]
    assert labels == [
        ("sqlite", "W2", 1000), ("sqlite", "W5", 10_000), ("postgres", "W2", 1000),
        ("postgres", "W5", 10_000), ("sqlite", "W2", 10_000), ("postgres", "W2", 10_000),
    ]
    assert [j.timeout for j in jobs] == [600.0, 900.0, 600.0, 900.0, 900.0, 900.0]
    assert all(j.timeout == 42.0 for j in plan(["dbos"], ["sqlite"], ["W1"], False, 42.0))


def test_job_argv_and_label() -> None:
    job = Job("langgraph", "postgres", "W2", 10_000, 900.0)
    assert job.argv("/py") == ["/py", "-m", "bench.anchors.langgraph_w", "W2", "postgres",
                               "10000"]
    assert job.label() == "langgraph postgres W2 (10,000)"
    assert Job("dbos", "sqlite", "W1", None, 1.0).argv("/py")[-2:] == ["W1", "sqlite"]


def row(**kw: object) -> str:
    base: dict[str, object] = {"system": "dbos", "backend": "sqlite", "workload": "W1",
                               "metric": "wall_s", "value": 1.5, "unit": "s"}
    base.update(kw)
    return json.dumps({k: v for k, v in base.items() if v is not None})


def test_validate_line() -> None:
    assert validate_line(row()) == json.loads(row())
    assert validate_line("  " + row(value=3) + "\n")["value"] == 3  # type: ignore[index]
    assert validate_line("Recovering 3 workflows") is None
    assert validate_line("{not json") is None
    assert validate_line("[1, 2]") is None
    assert validate_line(row(value="1.5")) is None
    assert validate_line(row(value=True)) is None
    assert validate_line(row(unit=None)) is None  # a key missing
    assert validate_line(row(extra=1)) is None  # a key too many
    assert validate_line(row(system="tether")) is None
    assert validate_line(row(backend="mysql")) is None
    assert validate_line(row(metric="")) is None


def test_error_row_is_a_valid_line_with_truncated_text() -> None:
    job = Job("dbos", "postgres", "W2", 10_000, 900.0)
    err = error_row(job, "timed   out\nafter 900 s")
    assert err == {"system": "dbos", "backend": "postgres", "workload": "W2", "metric": "error",
                   "value": 0, "unit": "W2 (10,000): timed out after 900 s"}
    assert validate_line(json.dumps(err)) == err
    long = error_row(Job("dbos", "sqlite", "W1", None, 1.0), "x" * 1000)
    assert len(str(long["unit"])) == ERROR_TEXT_MAX and str(long["unit"]).endswith("...")


def fake_python(tmp_path: Path, body: str) -> str:
    """An executable standing in for an anchor venv's python: runs `body` with sh."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_run_job_keeps_results_and_reports_a_failure(tmp_path: Path) -> None:
    line = row(metric="checkpoints_per_s", value=12.5, unit="1/s")
    py = fake_python(tmp_path, f"echo 'noise'\necho '{line}'\n"
                               "echo 'Traceback...' >&2\necho 'RuntimeError: boom' >&2\nexit 3")
    rows = run_job(Job("dbos", "sqlite", "W1", None, 30.0), py)
    assert rows[0] == json.loads(line)
    assert rows[1]["metric"] == "error" and rows[1]["unit"] == "exit 3: RuntimeError: boom"


def test_run_job_timeout_and_no_output(tmp_path: Path) -> None:
    rows = run_job(Job("dbos", "sqlite", "W1", None, 0.5), fake_python(tmp_path, "sleep 5"))
    assert [r["unit"] for r in rows] == ["timed out after 0.5 s"]
    rows = run_job(Job("dbos", "sqlite", "W1", None, 30.0), fake_python(tmp_path, "exit 0"))
    assert rows == [error_row(Job("dbos", "sqlite", "W1", None, 30.0), "no result lines")]


def test_run_anchors_reports_a_venv_failure_as_error_rows(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    def broken(system: str) -> Path:
        raise RuntimeError("no network")

    monkeypatch.setattr("bench.anchors.runner.ensure_venv", broken)
    seen: list[dict[str, object]] = []
    rows = run_anchors(["langgraph"], ["sqlite"], ["W1", "W3"], True, on_row=seen.append)
    assert rows == seen
    assert [(r["workload"], r["metric"]) for r in rows] == [("W1", "error")]
    assert "venv setup failed" in str(rows[0]["unit"])


def test_requirements_follow_the_pins() -> None:
    assert requirements("dbos")[0] == f"dbos=={PINS['dbos']['dbos']}"
    assert f"psycopg[binary]=={PINS['dbos']['psycopg']}" in requirements("dbos")
    reqs = requirements("langgraph")
    assert f"langgraph=={PINS['langgraph']['langgraph']}" in reqs
    assert any(r.startswith("psycopg-pool==") for r in reqs)
    assert not any(r.startswith("psycopg-binary") for r in reqs)


def test_shared_helpers_match_the_tether_harness() -> None:
    assert suffix(1000) == "1k" and suffix(10_000) == "10k" and suffix(20) == "20"
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    delays = w2_delays(7)
    assert len(delays) == 5 and all(0.05 <= d <= 0.15 for d in delays)
    assert delays == w2_delays(7)


def test_harnesses_do_not_import_tether() -> None:
    here = Path(__file__).resolve().parents[2] / "bench" / "anchors"
    for name in ("common.py", "dbos_w.py", "langgraph_w.py", "__init__.py"):
        text = (here / name).read_text()
        assert not re.search(r"^\s*(import|from) tether\b", text, re.MULTILINE), name
