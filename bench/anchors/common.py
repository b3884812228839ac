"""Helpers shared by the anchor harnesses (langgraph_w.py, dbos_w.py).

These run inside the anchors' own venvs (bench/.anchors/<system>/), started from the repo
root as `python -m bench.anchors.<harness>`: only the standard library and psycopg (which
both venvs have) may be imported here, never tether.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator

PG_ADMIN_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = ("sqlite", "postgres")

# The shared workloads (../shared/WORKLOADS.md), as bench/workloads.py sizes them.
W1_THREADS, W1_STEPS, W1_MSG_BYTES = 200, 20, 256
W2_STEPS = 5
W2_DELAY = (0.05, 0.15)
W3_RUNS, W3_STEPS, W3_SLEEP = 100, 10, 0.020
W4_JOBS = 20_000
W5_RUNS = 10_000


def exit_on_sigterm() -> None:
    """Turn SIGTERM (the runner's timeout) into SystemExit, so that bench_db's cleanup runs:
    the database is dropped and the temporary directory removed."""
    import signal

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(f"terminated (signal {signum})")

    signal.signal(signal.SIGTERM, stop)


def result(system: str, backend: str, workload: str, metric: str, value: float,
           unit: str) -> dict[str, object]:
    return {"system": system, "backend": backend, "workload": workload, "metric": metric,
            "value": value, "unit": unit}


def emit(row: dict[str, object]) -> None:
    """One result as a JSON line on stdout (the anchors' runner reads only such lines)."""
    print(json.dumps(row), flush=True)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def peak_rss_mib() -> float:
    """This process's peak resident set size (VmHWM) in MiB."""
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mib() -> float:
    """This process's resident set size right now (VmRSS) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation, as bench/workloads.py computes it."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def suffix(runs: int) -> str:
    """Metric-name suffix for a run count, as bench/workloads.py's w2_suffix: 1000 -> 1k."""
    return f"{runs // 1000}k" if runs % 1000 == 0 else str(runs)


def pg_url(dbname: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + dbname


@contextlib.contextmanager
def bench_db(backend: str, prefix: str) -> Iterator[tuple[str, str]]:
    """A fresh, empty database for one workload, removed at the end: yields (a temporary
    directory for side files, the database's URL). SQLite: `bench.db` in that directory;
    Postgres: a database `<prefix>_<uuid>`, dropped WITH (FORCE) at the end."""
    tmp = tempfile.mkdtemp(prefix=f"{prefix}_")
    try:
        if backend == "sqlite":
            yield tmp, f"sqlite:///{os.path.join(tmp, 'bench.db')}"
            return
        if backend != "postgres":
            raise ValueError(f"unknown backend {backend!r}")
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex}"
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"'.encode())
        try:
            yield tmp, pg_url(name)
        finally:
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def sqlite_bytes(path: str) -> int:
    """The database file plus its WAL and rollback journal, if any."""
    return sum(os.path.getsize(p) for p in (path, path + "-wal", path + "-journal")
               if os.path.exists(p))


def pg_bytes(url: str) -> int:
    """pg_total_relation_size (heap, indexes, TOAST) of every table in the database, as
    bench/workloads.py's W1 measures tether."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
        ).fetchone()
    return int(row[0]) if row else 0


def db_bytes(url: str) -> int:
    return sqlite_bytes(sqlite_path(url)) if url.startswith("sqlite") else pg_bytes(url)


def w2_delays(run_index: int) -> list[float]:
    """The simulated LLM latencies of one W2 run, as bench/workloads.py draws them."""
    import random

    rng = random.Random(run_index)
    return [rng.uniform(*W2_DELAY) for _ in range(W2_STEPS)]


def w2_deadline(runs: int) -> float:
    """Seconds a W2 harness waits for all runs (tether's bench gives up after 60 s at 1,000
    runs; the anchors get 300 s there, so a slow anchor still gets a figure, and 600 s at
    10,000 as tether does)."""
    return 300.0 if runs <= 1000 else 600.0


def message(thread_id: str, step: int) -> str:
    """W1's 256-byte message for super-step `step`."""
    return f"{thread_id} step {step} ".ljust(W1_MSG_BYTES, ".")
