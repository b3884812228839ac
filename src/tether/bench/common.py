"""What every workload shares: the result line, fresh databases, RSS and percentiles, reading
the store's tables directly, and `tether worker` subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import tether
from tether.store.base import RunRecord, StepCommit

if TYPE_CHECKING:
    import psycopg

PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"
BACKENDS = ("sqlite", "postgres")


def pg_admin_url() -> str:
    """The Postgres database to connect to for CREATE/DROP DATABASE: $BENCH_PG_URL, else
    the local server as user postgres."""
    return os.environ.get("BENCH_PG_URL") or PG_DEFAULT


@dataclass(frozen=True, slots=True)
class Result:
    backend: str
    workload: str
    metric: str
    value: float
    unit: str

    def to_json(self) -> str:
        return json.dumps({"system": "tether", "backend": self.backend, "workload": self.workload,
                           "metric": self.metric, "value": self.value, "unit": self.unit})


class PartialFailure(RuntimeError):
    """A workload that failed after measuring something: the results it has are printed
    before the error."""

    def __init__(self, message: str, results: list[Result]) -> None:
        super().__init__(message)
        self.results = results


def emit(result: Result) -> None:
    print(result.to_json(), flush=True)


def peak_rss_mib() -> float:
    """This process's peak resident set size (VmHWM) in MiB."""
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def current_rss_mib() -> float:
    """This process's resident set size right now (VmRSS) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation, as numpy's default does."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def suffix(n: int) -> str:
    """A size in a metric name: 1000 -> "1k", 10000 -> "10k", 991 -> "991"."""
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


# -- databases -------------------------------------------------------------------------------


def pg_url(dbname: str) -> str:
    """The URL a workload's store opens for database `dbname`: on $BENCH_PG_URL's server, or,
    with $BENCH_PG_VIA (a template with {db} and {listen}, e.g. a PgBouncer's URL with
    `pool_mode=transaction&listen_url={listen}`: bench/pgbouncer.py), through that, LISTEN
    going to the server directly. Databases are made and dropped on the server directly."""
    direct = pg_admin_url().split("?", 1)[0].rsplit("/", 1)[0] + "/" + dbname
    via = os.environ.get("BENCH_PG_VIA")
    if not via:
        return direct
    from urllib.parse import quote

    return via.format(db=dbname, listen=quote(direct, safe=""))


def direct_url(url: str) -> str:
    """The server's own URL for a workload's database: `url` itself, or, for one through a
    PgBouncer (bench/pgbouncer.py), its listen_url (the bench's direct reads go there)."""
    from urllib.parse import parse_qs, urlsplit

    listen = parse_qs(urlsplit(url).query).get("listen_url")
    return listen[0] if listen else url


def libpq_url(url: str) -> str:
    """`url` without tether's own options (pool_mode, listen_url): what psycopg takes, to the
    same server or pooler."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    kept = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("pool_mode", "listen_url")]
    return urlunsplit(parts._replace(query=urlencode(kept)))


@contextlib.asynccontextmanager
async def bench_db(backend: str) -> AsyncIterator[str]:
    """A fresh, empty database for one workload: a file in a temporary directory (SQLite)
    or `tether_bench_<uuid>` (Postgres), removed at the end. Yields its URL."""
    if backend == "sqlite":
        tmp = tempfile.mkdtemp(prefix="tether_bench_")
        try:
            yield f"sqlite:///{os.path.join(tmp, 'bench.db')}"
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    if backend != "postgres":
        raise ValueError(f"unknown backend {backend!r}")
    import psycopg  # only here: the core install runs the SQLite workloads without it

    name = f"tether_bench_{uuid.uuid4().hex}"
    admin_url = pg_admin_url()
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as admin:
        await admin.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        yield pg_url(name)
    finally:
        async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as admin:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def sqlite_bytes(path: str) -> int:
    """The database file plus its WAL (the WAL is normally gone once the last connection
    has closed, having been checkpointed into the file)."""
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


async def pg_bytes(url: str) -> int:
    import psycopg

    """pg_total_relation_size (heap, indexes, TOAST) of every table in the database."""
    async with await psycopg.AsyncConnection.connect(direct_url(url), autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
        )
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def query(url: str, q: str) -> list[tuple[Any, ...]]:
    """Rows of one read-only query on a connection of its own (not a runtime's store)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(sqlite_path(url), timeout=30)
        try:
            return conn.execute(q).fetchall()
        finally:
            conn.close()
    import psycopg

    async with await psycopg.AsyncConnection.connect(direct_url(url), autocommit=True) as aconn:
        return await (await aconn.execute(q.encode())).fetchall()


async def checkpoint_times(url: str) -> tuple[float, float]:
    """(latest step-1 checkpoint, latest checkpoint): finished_at in Unix seconds, taken just
    before each commit. The first says when the last run to be picked up got going."""
    rows = await query(url, "SELECT max(finished_at) FILTER (WHERE step = 1), max(finished_at) "
                            "FROM checkpoints")
    return float(rows[0][0]), float(rows[0][1])


async def outbox_counts(url: str) -> dict[str, int]:
    rows = await query(url, "SELECT status, count(*) FROM outbox GROUP BY status")
    return {str(status): int(n) for status, n in rows}


async def stop_worker(stop: asyncio.Event, worker: asyncio.Task[None]) -> None:
    """Stop the in-process worker. A failure while shutting down is reported on stderr but
    does not void what was measured before it."""
    stop.set()
    try:
        await asyncio.wait_for(worker, timeout=60)
    except Exception as exc:
        print(f"warning: the worker failed while stopping: {exc!r}", file=sys.stderr, flush=True)


def timed_commits(runtime: tether.Runtime) -> dict[str, list[tuple[float, float]]]:
    """Wrap this runtime's store.commit_step (on the instance; the store's code is untouched)
    to record, per run, when each commit was called and when it was acknowledged durable."""
    store = runtime.store
    inner: Callable[[StepCommit], Awaitable[RunRecord | None]] = store.commit_step
    commits: dict[str, list[tuple[float, float]]] = {}
    clock = time.perf_counter

    async def commit_step(commit: StepCommit) -> RunRecord | None:
        t0 = clock()
        finished = await inner(commit)
        commits.setdefault(commit.lease.thread_id, []).append((t0, clock()))
        return finished

    store.commit_step = commit_step  # type: ignore[method-assign]
    return commits


async def noop_effect(payload: Any, key: str) -> None:
    return None


class StatusCounts:
    """Counts runs by status with one SQL query on a connection of its own (not the runtime's
    store): what a dashboard polling the database would see."""

    Q = "SELECT status, count(*) FROM runs GROUP BY status"

    def __init__(self, url: str) -> None:
        self.url = url
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.AsyncConnection[Any] | None = None

    async def __aenter__(self) -> StatusCounts:
        if self.url.startswith("sqlite"):
            self._sqlite = sqlite3.connect(sqlite_path(self.url), isolation_level=None,
                                           timeout=30)
        else:
            import psycopg

            self._pg = await psycopg.AsyncConnection.connect(direct_url(self.url), autocommit=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
        if self._pg is not None:
            await self._pg.close()

    def backend_pid(self) -> int | None:
        """The Postgres backend serving this watcher (None on SQLite)."""
        return None if self._pg is None else int(self._pg.info.backend_pid)

    async def get(self, q: str = Q) -> dict[str, int]:
        if self._sqlite is not None:
            rows = self._sqlite.execute(q).fetchall()  # a few ms; readers never block in WAL
        else:
            assert self._pg is not None
            rows = await (await self._pg.execute(q.encode())).fetchall()
        return {str(status): int(n) for status, n in rows}

    async def outbox(self) -> dict[str, int]:
        """Effects by status, on the same connection."""
        return await self.get("SELECT status, count(*) FROM outbox GROUP BY status")

    async def until(self, status: str, n: int, deadline: float, what: str,
                    interval: float = 0.05, check: Callable[[], None] | None = None) -> float:
        """Poll until `n` runs have `status`; returns perf_counter() at that poll. Raises
        RuntimeError (with the counts) at perf_counter() >= deadline. `check` runs before
        each poll (it raises to give up early, e.g. when a worker process died)."""
        while True:
            if check is not None:
                check()
            counts = await self.get()
            now = time.perf_counter()
            if counts.get(status, 0) >= n:
                return now
            if now >= deadline:
                raise RuntimeError(f"{what}: {counts.get(status, 0):,} of {n:,} runs {status} "
                                   f"when the workload gave up (runs by status: {counts})")
            await asyncio.sleep(interval)


async def run_counts(url: str) -> dict[str, int]:
    """Runs by status, read directly (for the message of a run that gave up)."""
    try:
        async with StatusCounts(url) as counts:
            return await counts.get()
    except Exception as exc:  # the database may be gone or locked: the message says so
        return {"error": repr(exc)}  # type: ignore[dict-item]


# -- worker subprocesses ---------------------------------------------------------------------


def append_line(path: str, line: str) -> None:
    """One write(2) with O_APPEND: whole lines from concurrent writers, and in the kernel
    (so it survives a SIGKILL of the writer) once this returns."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class WorkerProcesses:
    """`tether worker --app APP` subprocesses (what a user runs), each one's output in a file
    of `workdir`. On exit, kills every one still running: a workload never leaves one."""

    def __init__(self, url: str, app: str, workdir: Path, env: dict[str, str] | None = None):
        self.url = url
        self.app = app
        self.workdir = workdir
        self.env = {**os.environ, "TETHER_DB": url, **(env or {})}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed: set[int] = set()

    def __enter__(self) -> WorkerProcesses:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def start(self, *, concurrency: int = 100, lease_ttl: float | None = None
              ) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "tether", "worker", "--app", self.app, "--db", self.url,
                "--concurrency", str(concurrency)]
        if lease_ttl is not None:
            args += ["--lease-ttl", f"{lease_ttl:g}"]
        with open(self.workdir / f"worker-{len(self.procs)}.out", "wb") as out:
            proc = subprocess.Popen(args, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def output(self, proc: subprocess.Popen[bytes]) -> str:
        path = self.workdir / f"worker-{self.procs.index(proc)}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL, the crash; returns once the process is gone."""
        self.killed.add(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def check(self) -> None:
        """Raise, with its output, if a worker that nobody killed has exited."""
        for p in self.procs:
            if p.pid not in self.killed and p.poll() is not None:
                tail = "\n".join(self.output(p).strip().splitlines()[-5:])
                raise RuntimeError(f"tether worker {p.pid} exited with {p.returncode}: {tail}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to every live worker (graceful shutdown), then wait; SIGKILL stragglers."""
        live = [p for p in self.procs if p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in live:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                print(f"warning: tether worker {p.pid} ignored SIGTERM for {timeout:g} s",
                      file=sys.stderr, flush=True)
