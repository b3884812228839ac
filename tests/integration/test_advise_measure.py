"""`tether advise --measure` on real stores filled with a known synthetic history: the
measured figures are the known ones, on SQLite and Postgres alike."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tether.advise import Inputs, advise, measured_json
from tether.store.base import Store

HOUR = 3600.0
DAY = 86400.0
RUNS = 120          # finished runs over the last 10 hours, one per 5 minutes
STEPS = 4           # each with 4 steps of 0.5 s and 64-byte checkpoints
WAITING = 3         # runs waiting for a person since 3 days
BURST = 7           # extra runs started in one minute (the peak minute: 1 + 7)


@contextmanager
def raw(db_url: str) -> Iterator[Any]:
    """A plain DB-API connection to the test database, committing at the end."""
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        try:
            yield conn
            conn.commit()
        finally:
            conn.close()
    else:
        with psycopg.connect(db_url) as pg:
            yield pg


def fill(db_url: str, now: float) -> None:
    ph = "?" if db_url.startswith("sqlite") else "%s"
    run_sql = (f"INSERT INTO runs (thread_id, agent, version, status, node, step, input, "
               f"input_hash, created_at, updated_at, waiting_for) VALUES "
               f"({', '.join([ph] * 11)})")
    cp_sql = (f"INSERT INTO checkpoints (thread_id, step, node, next_node, kind, data, worker, "
              f"attempt, started_at, finished_at) VALUES ({', '.join([ph] * 10)})")
    it_sql = (f"INSERT INTO interrupts (thread_id, step, idx, id, payload, status, created_at) "
              f"VALUES ({', '.join([ph] * 7)})")
    first = (now - 10 * HOUR) // 60 * 60 + 1  # minute-aligned: the burst shares run 0's minute
    with raw(db_url) as conn:
        cur = conn.cursor()
        for i in range(RUNS):
            created = first + i * 300
            tid = f"r{i}"
            cur.execute(run_sql, (tid, "a", "v1", "completed", None, STEPS, b"{}", "h",
                                  created, created + STEPS * 0.5, None))
            for s in range(1, STEPS + 1):
                start = created + (s - 1) * 0.5
                cur.execute(cp_sql, (tid, s, "n", None, "d", b"x" * 64, "w", 1, start,
                                     start + 0.5))
        for j in range(BURST):  # queued runs, all in the minute of run 0
            cur.execute(run_sql, (f"b{j}", "a", "v1", "queued", "n", 0, b"{}", "h",
                                  first + 1 + j, first + 1 + j, None))
        for k in range(WAITING):
            created = now - 3 * DAY
            cur.execute(run_sql, (f"w{k}", "a", "v1", "waiting", "n", 1, b"{}", "h", created,
                                  created + 1, "interrupt"))
            cur.execute(it_sql, (f"w{k}", 2, 0, f"w{k}:2:0", b"null", "pending", created + 1))


async def test_measured_figures_equal_the_known_history(store: Store, db_url: str) -> None:
    now = await store.now()
    fill(db_url, now)
    stats = await store.measure(DAY)
    assert stats.runs_started == RUNS + BURST
    assert stats.runs_finished == RUNS
    assert stats.steps == RUNS * STEPS
    assert stats.checkpoint_bytes == RUNS * STEPS * 64
    assert stats.peak_runs_minute == 1 + BURST
    assert stats.statuses_now == {"completed": RUNS, "queued": BURST, "waiting": WAITING}
    assert stats.interrupts_pending_now == WAITING
    assert stats.run_seconds_mean == pytest.approx(STEPS * 0.5)
    assert stats.steps_per_run_mean == pytest.approx(STEPS)
    assert stats.covered == pytest.approx(DAY, abs=5)
    assert stats.db_bytes > 0
    m = measured_json(stats)
    assert m["step_p50_s"] == pytest.approx(0.5) and m["step_p99_s"] == pytest.approx(0.5)
    assert m["waiting"] == WAITING and m["running"] == 0
    assert m["longest_wait_s"] == pytest.approx(3 * DAY, abs=60)
    assert m["steps_per_s"] == pytest.approx(RUNS * STEPS / DAY, rel=1e-3)
    assert set(m) >= {"runs_started", "steps", "steps_per_s", "runs_per_s", "running",
                      "waiting", "db_bytes"}
    a = advise(Inputs.from_stats(stats), store.dialect, None)
    assert a.recommendation == "sqlite" if store.dialect == "sqlite" else "postgres"
    assert any("runs/s (measured)" in r or "steps/s" in r for r in a.reasons)


async def test_a_window_longer_than_the_data_covers_what_there_is(store: Store,
                                                                   db_url: str) -> None:
    now = await store.now()
    fill(db_url, now)
    stats = await store.measure(30 * DAY)
    assert stats.covered == pytest.approx(3 * DAY, abs=60)  # the oldest run is 3 days old
    assert stats.runs_started == RUNS + BURST + WAITING


async def test_an_empty_store_measures_nothing(store: Store) -> None:
    stats = await store.measure(DAY)
    assert (stats.runs_started, stats.steps, stats.covered) == (0, 0, 0)
    assert Inputs.from_stats(stats).empty()


def tether(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TETHER_DB": ""}
    return subprocess.run([sys.executable, "-m", "tether", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def register_workers(db_url: str, now: float) -> None:
    """Two live workers of v1 (100 slots, 30 and 10 busy) and one dead one."""
    ph = "?" if db_url.startswith("sqlite") else "%s"
    q = (f"INSERT INTO workers (id, host, pid, version, agents, concurrency, busy, lease_ttl, "
         f"started_at, last_seen) VALUES ({', '.join([ph] * 10)})")
    with raw(db_url) as conn:
        cur = conn.cursor()
        for wid, busy, seen in (("w1", 30, now), ("w2", 10, now), ("dead", 5, now - DAY)):
            cur.execute(q, (wid, "h", 1, "v1", '{"a": ["n"]}', 100, busy, 30.0, now - 2 * DAY,
                            seen))


def register_v2(db_url: str, now: float) -> None:
    ph = "?" if db_url.startswith("sqlite") else "%s"
    with raw(db_url) as conn:
        conn.cursor().execute(
            f"INSERT INTO workers (id, host, pid, version, agents, concurrency, busy, lease_ttl, "
            f"started_at, last_seen, stopped_at) VALUES ({', '.join([ph] * 11)})",
            ("w3", "h", 2, "v2", '{"a": ["n"]}', 50, 0, 30.0, now - 3600, now - 60, now - 60))


def test_the_command_measures_probes_and_answers_in_json(db_url: str, tmp_path: Path) -> None:
    fill(db_url, time.time())
    register_workers(db_url, time.time())
    register_v2(db_url, time.time())
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = tether("advise", "--measure", "--probe-seconds", "0.2", "--db", db_url, "--json",
                 cwd=cwd)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["measured"]["runs_started"] == RUNS + BURST
    assert got["probe"]["single_rows_per_s"] > 0 and got["probe"]["batch100_rows_per_s"] > 0
    assert got["recommendation"] and got["reasons"] and got["settings"]
    m = got["measured"]
    assert (m["workers_live"], m["worker_slots"], m["worker_busy"]) == (2, 200, 40)
    assert m["deploys"] == 1  # v2's first worker started in the window, v1's before it
    assert m["slot_utilisation"] == pytest.approx(0.2) and m["versions_live"] == ["v1"]
    assert any("2 live workers hold 200 slots, 20% busy" in r for r in got["reasons"])
    assert list(cwd.iterdir()) == []  # nothing written where it ran
    if db_url.startswith("postgresql"):
        with psycopg.connect(db_url) as pg:
            left = pg.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE "
                              "'tether_probe%%'").fetchone()
        assert left == (0,)
    else:
        folder = Path(db_url.removeprefix("sqlite:///")).parent
        assert not list(folder.glob(".tether-probe-*"))  # the probe's scratch file is gone


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    for args, needle in ((["--window", "soon"], "bad duration"),
                         (["--runs-per-s", "-3"], "--runs-per-s"),
                         (["--languages", "0"], "--languages"),
                         (["--measure", "--db", "postgresql://postgres@127.0.0.1:1/x"], "")):
        out = tether("advise", *args, cwd=tmp_path)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert needle in out.stderr and "Traceback" not in out.stderr, out.stderr
