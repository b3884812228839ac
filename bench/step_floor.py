"""What a step commit cannot cost less than (issue 35 goal 4): W1's reference is a raw commit,
one INSERT of a W1-sized row; a step commit of tether's shape also moves the run (an UPDATE of
its row, fenced on its epoch) and indexes the checkpoint's finish time. This bench times the
two shapes alone, on tables of their own in a fresh database: on Postgres through a C client
(pgbench, so no Python in the figure) and through psycopg (as tether and W1's reference talk
to the server); on SQLite through sqlite3 on this thread (WAL, synchronous=FULL, as tether
and W1's reference open it; the raw table is W1's reference's); with the disk's fsync latency
beside them.

    python -m bench.step_floor [--seconds 4] [--rounds 3]

Shapes, each one durable commit (synchronous_commit as the server's; SQLite: the step's two
statements in one BEGIN IMMEDIATE transaction):
- raw: INSERT of a 347-byte row (W1's reference, bench/README.md);
- step: UPDATE of a run row (HOT: no indexed column changes) that returns its new step, and
  INSERT of the 347-byte checkpoint at that step, its table keyed (thread_id, step) with an
  index on finished_at, as tether's checkpoints are; what any design that keeps the run's
  step in its row pays per step, before tether's own code runs.
The ratio raw/step is the most W1 can reach against its reference with such a commit
(W1 also commits each run's start); goal 4 asks for 0.85x.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import statistics
import subprocess
import tempfile
import time
from urllib.parse import urlparse

import psycopg
from rich.console import Console
from rich.table import Table

from tether.bench.common import bench_db

from .fsync_latency import fsync_ms

ROW = "x" * 300  # with the key columns, a 347-byte row (W1's checkpoint row)
SCHEMA = """
CREATE TABLE floor_raw (thread_id TEXT NOT NULL, step BIGINT NOT NULL, data BYTEA);
CREATE TABLE floor_runs (thread_id TEXT PRIMARY KEY, epoch BIGINT NOT NULL, step BIGINT NOT NULL,
                         node TEXT, status TEXT NOT NULL, updated_at DOUBLE PRECISION)
    WITH (fillfactor = 80);
CREATE TABLE floor_checkpoints (thread_id TEXT NOT NULL, step BIGINT NOT NULL, node TEXT,
                                data BYTEA, finished_at DOUBLE PRECISION,
                                PRIMARY KEY (thread_id, step));
CREATE INDEX floor_checkpoints_finished ON floor_checkpoints (finished_at);
INSERT INTO floor_runs VALUES ('floor-run-0000000000000000000000', 1, 0, 'n', 'running', 0);
"""
RAW = ("INSERT INTO floor_raw VALUES ('floor-run-0000000000000000000000', 1, "
       f"convert_to('{ROW}', 'UTF8'));")
STEP = ("WITH u AS (UPDATE floor_runs SET step = step + 1, node = 'n', "
        "updated_at = extract(epoch FROM clock_timestamp()) "
        "WHERE thread_id = 'floor-run-0000000000000000000000' AND epoch = 1 "
        "AND status = 'running' RETURNING thread_id, step, updated_at) "
        f"INSERT INTO floor_checkpoints SELECT thread_id, step, 'n', convert_to('{ROW}', 'UTF8'), "
        "updated_at FROM u;")
SHAPES = {"raw": RAW, "step": STEP}
SQLITE_RUN = "floor-run-0000000000000000000000"
SQLITE_SCHEMA = f"""
CREATE TABLE floor_raw (thread_id TEXT NOT NULL, step INTEGER NOT NULL, data BLOB NOT NULL,
                        PRIMARY KEY (thread_id, step)) WITHOUT ROWID;
CREATE TABLE floor_runs (thread_id TEXT PRIMARY KEY, epoch INTEGER NOT NULL,
                         step INTEGER NOT NULL, node TEXT, status TEXT NOT NULL, updated_at REAL);
CREATE TABLE floor_checkpoints (thread_id TEXT NOT NULL, step INTEGER NOT NULL, node TEXT,
                                data BLOB, finished_at REAL,
                                PRIMARY KEY (thread_id, step)) WITHOUT ROWID;
CREATE INDEX floor_checkpoints_finished ON floor_checkpoints (finished_at);
INSERT INTO floor_runs VALUES ('{SQLITE_RUN}', 1, 0, 'n', 'running', 0);
"""


def pgbench_ms(url: str, sql: str, seconds: float) -> float:
    """pgbench's average latency (ms) for `sql` on one client, prepared."""
    exe = shutil.which("pgbench")
    if exe is None:
        raise SystemExit("pgbench not found (Debian: postgresql-client)")
    u = urlparse(url)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(sql + "\n")
    try:
        out = subprocess.run(
            [exe, "-n", "-c", "1", "-T", str(max(1, round(seconds))), "-M", "prepared", "-f", f.name,
             "-h", u.hostname or "127.0.0.1", "-p", str(u.port or 5432),
             "-U", u.username or "postgres", (u.path or "/postgres").lstrip("/")],
            capture_output=True, text=True, check=True).stdout
    finally:
        os.remove(f.name)
    for line in out.splitlines():
        if line.startswith("latency average"):
            return float(line.split("=")[1].split()[0])
    raise RuntimeError(f"no latency in pgbench's output:\n{out}")


def psycopg_ms(url: str, sql: str, seconds: float) -> float:
    """The same through psycopg (autocommit, prepared after its first runs), in ms."""
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor()
        took = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            cur.execute(sql.encode(), prepare=True)
            took.append(time.perf_counter() - t0)
    return statistics.mean(took) * 1e3


def sqlite_ms(conn: sqlite3.Connection, shape: str, seconds: float) -> float:
    """One shape on SQLite through sqlite3, on this thread, in ms a commit."""
    data = ROW.encode()
    took: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        if shape == "raw":  # autocommit: a transaction of its own
            conn.execute("INSERT INTO floor_raw VALUES (?, ?, ?)", (SQLITE_RUN, len(took), data))
        else:
            conn.execute("BEGIN IMMEDIATE")
            (step, at), = conn.execute(
                "UPDATE floor_runs SET step = step + 1, node = 'n', "
                "updated_at = (julianday('now') - 2440587.5) * 86400.0 "
                "WHERE thread_id = ? AND epoch = 1 AND status = 'running' "
                "RETURNING step, updated_at", (SQLITE_RUN,)).fetchall()
            conn.execute("INSERT INTO floor_checkpoints VALUES (?, ?, 'n', ?, ?)",
                         (SQLITE_RUN, step, data, at))
            conn.execute("COMMIT")
        took.append(time.perf_counter() - t0)
    conn.execute("DELETE FROM floor_raw")  # the next round's keys start at 0 again
    return statistics.mean(took) * 1e3


async def measure(seconds: float, rounds: int) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tether_floor_") as tmp:
        lite = sqlite3.connect(os.path.join(tmp, "floor.db"), isolation_level=None)
        try:
            lite.execute("PRAGMA journal_mode=WAL")
            lite.execute("PRAGMA synchronous=FULL")
            lite.executescript(SQLITE_SCHEMA)
            async with bench_db("postgres") as url:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(SCHEMA.encode())
                for _ in range(rounds):  # interleaved: the disk's drift falls on all alike
                    for shape, sql in SHAPES.items():
                        out.setdefault(("pgbench", shape), []).append(
                            pgbench_ms(url, sql, seconds))
                        out.setdefault(("psycopg", shape), []).append(
                            psycopg_ms(url, sql, seconds))
                        out.setdefault(("sqlite3", shape), []).append(
                            sqlite_ms(lite, shape, seconds))
        finally:
            lite.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=4.0, help="per shape, client and round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    fs = sorted(fsync_ms(300))
    load = os.getloadavg()[0]
    got = asyncio.run(measure(args.seconds, args.rounds))
    table = Table(title=f"One commit, median of {args.rounds} rounds (ms)")
    for col in ("client", "raw INSERT", "step (UPDATE + INSERT)", "raw / step"):
        table.add_column(col, justify="right")
    for client in ("pgbench", "psycopg", "sqlite3"):
        raw = statistics.median(got[(client, "raw")])
        step = statistics.median(got[(client, "step")])
        table.add_row(client, f"{raw:.3f}", f"{step:.3f}", f"{raw / step:.2f}x")
    console = Console()
    console.print(table)
    console.print(f"fsync of 4 KiB: median {statistics.median(fs):.3f} ms; load average "
                  f"{load:.2f}; rounds: " + "; ".join(
                      f"{c} {s} " + ", ".join(f"{v:.3f}" for v in vs) for (c, s), vs in got.items()))


if __name__ == "__main__":
    main()
