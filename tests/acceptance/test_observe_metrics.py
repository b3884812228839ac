"""Acceptance: a worker subprocess's scraped metrics equal the true counts exactly (50 runs
with retries and failures, both stores), and no label holds a thread_id; asking for metrics
or traces that cannot work stops the worker at start with a clear error."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import tether
from apps import TESTS_DIR, Workers, eventually
from apps import observe_app as app
from apps.scrape import free_port, scrape, total

RUNS = 50


async def test_scraped_counters_equal_the_true_counts(db_url: str, tmp_path: Path) -> None:
    log = tmp_path / "executions.log"
    port = free_port()
    async with tether.Runtime(db_url, agents=[app.agent, app.child_agent]) as rt:
        ids = []
        for i in range(RUNS):
            fail = 3 if i % 5 == 0 else 1 if i % 5 == 1 else 0  # 3: fails for good
            run = await rt.start(app.agent, {"steps": 3, "fail": fail}, thread_id=f"obs-{i:02}")
            ids.append(run.thread_id)
        with Workers(db_url, tmp_path, call_log=log, app="apps.observe_app:make_runtime") as ws:
            worker = ws.start(concurrency=10, lease_ttl=5,
                              extra=["--metrics-port", str(port)])
            runs = {t: await rt.wait(t, timeout=60) for t in ids}
            completed = sum(r.status == "completed" for r in runs.values())

            async def effects_done() -> bool:
                done = await rt.effects(status="done", limit=RUNS)
                return len(done) == completed

            await eventually(effects_done, what="every effect done", workers=ws)

            def effects_counted() -> bool:
                return total(scrape(port)[1], "tether_effects_total", outcome="done") == completed

            await eventually(effects_counted, what="effects counted", workers=ws)
            text, samples = scrape(port)
            assert worker.terminate() == 0, worker.output()

        executions = [line.split(",") for line in log.read_text().splitlines()]
        failed_runs = [t for t, r in runs.items() if r.status == "failed"]
        steps = 0
        for t in ids:
            steps += len(await rt.checkpoints(t))
        fails = sum(e[3] == "fail" for e in executions)
        live = len({(e[0], e[1]) for e in executions})  # a step's first execution calls live

    assert completed == 40 and len(failed_runs) == 10
    assert total(samples, "tether_runs_started_total") == RUNS
    assert total(samples, "tether_runs_started_total", agent="obs", version="v1") == RUNS
    assert total(samples, "tether_runs_finished_total", status="completed") == completed
    assert total(samples, "tether_runs_finished_total", status="failed") == len(failed_runs)
    assert total(samples, "tether_steps_total") == steps == 40 * 3
    assert total(samples, "tether_steps_total", agent="obs", node="work", version="v1") == steps
    assert total(samples, "tether_retries_total", category="exception") == fails - len(failed_runs)
    assert total(samples, "tether_retries_total") == 10 * 2 + 10 * 1
    assert total(samples, "tether_failures_total", category="exception") == len(failed_runs)
    assert total(samples, "tether_journal_calls_total", outcome="live") == live
    assert total(samples, "tether_journal_calls_total", outcome="replayed") == len(executions) - live
    assert total(samples, "tether_step_duration_seconds_count") == steps
    assert total(samples, "tether_run_duration_seconds_count", status="completed") == completed
    assert total(samples, "tether_queue_wait_seconds_count") == RUNS
    assert total(samples, "tether_lease_takeovers_total") == 0
    assert total(samples, "tether_leases_lost_total") == 0
    assert {lab["state"] for lab, _ in samples["tether_worker_slots"]} == {"busy", "free"}
    # Histograms in seconds, 1 ms to 1 h.
    bounds = {lab["le"] for lab, _ in samples["tether_step_duration_seconds_bucket"]}
    assert {"0.001", "3600.0", "+Inf"} <= bounds
    # No label value is a thread_id, or anything like one.
    values = {v for series in samples.values() for lab, _ in series for v in lab.values()}
    assert not values & set(ids)
    assert not any(re.search(r"obs-\d|[0-9a-f]{16}", v) for v in values), values
    assert "obs-0" not in text


def worker_cmd(db: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tether", "worker", "--app", "apps.observe_app:make_runtime",
            "--db", db, *extra]


def run_cli(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=TESTS_DIR,
                          env={**os.environ, "PYTHONPATH": str(TESTS_DIR), **env})


def test_a_metrics_port_in_use_stops_the_worker_at_start(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_cli(worker_cmd(f"sqlite:///{tmp_path}/t.db", "--metrics-port", str(port)))
    assert done.returncode == 2, done
    assert f"cannot serve metrics on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("var", "value"), [
    ("OTEL_TRACES_EXPORTER", "zipkin-ish"),
    ("OTEL_TRACES_SAMPLER", "sometimes"),
    ("OTEL_BSP_SCHEDULE_DELAY", "soon"),
    ("OTEL_TRACES_SAMPLER_ARG", "2"),
])
def test_a_bad_otel_setting_stops_the_worker_at_start(tmp_path: Path, var: str,
                                                       value: str) -> None:
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "traceidratio", var: value}
    done = run_cli(worker_cmd(f"sqlite:///{tmp_path}/t.db"), **env)
    assert done.returncode == 2, done
    assert var in done.stderr and value in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "t.db").exists()  # stopped before it touched the database
