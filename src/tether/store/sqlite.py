"""SQLite store: the embedded default.

One connection per thread: a writer thread batches every write submitted while the previous
batch was committing into one IMMEDIATE transaction (group commit, one fsync for many steps;
each job in its own savepoint so one failure does not undo the others), and a reader thread
serves reads from a WAL snapshot without waiting for fsyncs. `synchronous=FULL` by default:
a committed checkpoint survives power loss, not just a process crash.
"""

from __future__ import annotations

import asyncio
import os
import queue
import sqlite3
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import orjson

from ..errors import ConfigError, LeaseLost, RunConflict, SchemaError, StoreError, StoreUnavailable
from .base import (
    CHECKPOINT_COLUMNS,
    RUN_COLUMNS,
    CheckpointRecord,
    JournalRecord,
    Lease,
    NewRun,
    RunRecord,
    StepCommit,
)
from .migrate import behind_message, latest, migrations, queries

T = TypeVar("T")
Job = Callable[[sqlite3.Connection], Any]
_SYNC_MODES = {"OFF", "NORMAL", "FULL", "EXTRA"}
_MAX_BATCH = 1024


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """sqlite:///relative.db, sqlite:////abs/path.db, sqlite:///:memory: -> (path, options)."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc:
        raise ConfigError(
            f"malformed SQLite URL {url!r}: expected sqlite:///path.db or sqlite:///:memory:"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise ConfigError(f"malformed SQLite URL {url!r}: no database path")
    opts = {k.lower(): v[-1] for k, v in parse_qs(parts.query).items()}
    return path, opts


class _DBThread:
    """A thread owning one sqlite3 connection; jobs run in batches, results go back to the
    event loop in one callback per batch."""

    def __init__(self, connect: Callable[[], sqlite3.Connection], name: str, writer: bool):
        self._connect = connect
        self._writer = writer
        self._queue: queue.SimpleQueue[tuple[Job, asyncio.Future[Any], bool] | None] = (
            queue.SimpleQueue()
        )
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def submit(self, job: Job, write: bool) -> asyncio.Future[Any]:
        assert self._loop is not None, "store is not open"
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._queue.put((job, fut, write))
        return fut

    def _main(self) -> None:
        try:
            conn = self._connect()
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                batch = [item]
                stop = False
                while len(batch) < _MAX_BATCH:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop = True
                        break
                    batch.append(nxt)
                self._run_batch(conn, batch)
                if stop:
                    return
        finally:
            conn.close()

    def _run_batch(
        self, conn: sqlite3.Connection, batch: list[tuple[Job, asyncio.Future[Any], bool]]
    ) -> None:
        results: list[tuple[asyncio.Future[Any], bool, Any]] = []
        reads = [b for b in batch if not b[2]]
        writes = [b for b in batch if b[2]]
        for job, fut, _ in reads:
            try:
                conn.execute("BEGIN")
                try:
                    results.append((fut, True, job(conn)))
                finally:
                    conn.execute("COMMIT")
            except BaseException as exc:
                results.append((fut, False, _wrap(exc)))
        if writes:
            pending: list[tuple[asyncio.Future[Any], bool, Any]] = []
            try:
                conn.execute("BEGIN IMMEDIATE")
                for job, fut, _ in writes:
                    conn.execute("SAVEPOINT job")
                    try:
                        value = job(conn)
                    except BaseException as exc:
                        conn.execute("ROLLBACK TO job")
                        conn.execute("RELEASE job")
                        pending.append((fut, False, _wrap(exc)))
                    else:
                        conn.execute("RELEASE job")
                        pending.append((fut, True, value))
                conn.execute("COMMIT")
                results.extend(pending)
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                err = _wrap(exc)
                results.extend((fut, False, err) for _, fut, _ in writes)
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(_deliver, results)
        except RuntimeError:  # loop closed while we were working
            pass


def _deliver(results: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for fut, ok, value in results:
        if fut.done():
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def _wrap(exc: BaseException) -> BaseException:
    if isinstance(exc, sqlite3.Error):
        err = StoreError(f"SQLite error: {exc}")
        err.__cause__ = exc
        return err
    return exc


def _run(row: sqlite3.Row | tuple[Any, ...]) -> RunRecord:
    return RunRecord(*row)


def _checkpoint(row: tuple[Any, ...]) -> CheckpointRecord:
    return CheckpointRecord(*row)


class SQLiteStore:
    dialect = "sqlite"

    def __init__(self, url: str, *, synchronous: str | None = None, busy_timeout: float = 30.0):
        self.url = url
        self.path, opts = parse_sqlite_url(url)
        sync = (synchronous or opts.get("synchronous", "FULL")).upper()
        if sync not in _SYNC_MODES:
            raise ConfigError(f"synchronous must be one of {sorted(_SYNC_MODES)}, got {sync!r}")
        self.synchronous = sync
        self.busy_timeout = busy_timeout
        self.memory = self.path == ":memory:"
        self._target = f"file:tether-{uuid.uuid4().hex}?mode=memory&cache=shared" if self.memory else self.path
        self._q = queries("sqlite")
        self._writer: _DBThread | None = None
        self._reader: _DBThread | None = None
        self._keepalive: sqlite3.Connection | None = None
        self.work_available = asyncio.Event()

    def __repr__(self) -> str:
        return f"SQLiteStore({self.url!r})"

    # -- lifecycle -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if not self.memory:
            parent = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(parent):
                raise StoreUnavailable(
                    f"cannot open {self.url}: directory {parent!r} does not exist"
                )
        try:
            conn = sqlite3.connect(
                self._target,
                isolation_level=None,
                check_same_thread=False,
                timeout=self.busy_timeout,
                uri=self.memory,
            )
            if not self.memory:
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open {self.url}: {exc}") from exc
        return conn

    async def open(self, *, check_schema: bool = True) -> None:
        if self._writer is not None:
            return
        if self.memory:
            # A shared-cache in-memory database lives while one connection is open.
            self._keepalive = self._connect()
        self._writer = _DBThread(self._connect, f"tether-sqlite-writer", writer=True)
        self._writer.start()
        if self.memory:
            self._reader = self._writer
        else:
            self._reader = _DBThread(self._connect, f"tether-sqlite-reader", writer=False)
            self._reader.start()
        if check_schema:
            current, target = await self.schema_version()
            if current < target:
                await self.close()
                raise SchemaError(behind_message(current, target, self.url))

    async def close(self) -> None:
        writer, reader = self._writer, self._reader
        self._writer = self._reader = None
        if reader is not None and reader is not writer:
            await asyncio.to_thread(reader.stop)
        if writer is not None:
            await asyncio.to_thread(writer.stop)
        if self._keepalive is not None:
            self._keepalive.close()
            self._keepalive = None

    def _w(self, job: Job) -> asyncio.Future[Any]:
        if self._writer is None:
            raise StoreError("store is not open")
        return self._writer.submit(job, True)

    def _r(self, job: Job) -> asyncio.Future[Any]:
        if self._reader is None:
            raise StoreError("store is not open")
        return self._reader.submit(job, False)

    # -- schema ----------------------------------------------------------------------------

    @staticmethod
    def _applied(conn: sqlite3.Connection) -> int:
        row = conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='schema_version'"
        ).fetchone()
        if not row[0]:
            return 0
        got = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        return int(got or 0)

    async def schema_version(self) -> tuple[int, int]:
        current = await self._r(self._applied)
        return int(current), latest("sqlite")

    async def migrate(self) -> list[int]:
        def job(conn: sqlite3.Connection) -> list[int]:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            current = self._applied(conn)
            done: list[int] = []
            for mig in migrations("sqlite"):
                if mig.version <= current:
                    continue
                for stmt in _split_sql(mig.sql):
                    conn.execute(stmt)
                conn.execute(
                    "INSERT INTO schema_version VALUES (?, ?, (julianday('now') - 2440587.5) * 86400.0)",
                    (mig.version, mig.name),
                )
                done.append(mig.version)
            return done

        # The IMMEDIATE transaction serializes concurrent migrators across processes.
        result: list[int] = await self._w(job)
        return result

    async def now(self) -> float:
        q = self._q["now"]
        return float(await self._r(lambda c: c.execute(q).fetchone()[0]))

    # -- runs ------------------------------------------------------------------------------

    async def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        q = self._q

        def job(conn: sqlite3.Connection) -> tuple[RunRecord, bool]:
            if new.idempotency_key is not None:
                row = conn.execute(q["get_run_by_key"], {"key": new.idempotency_key}).fetchone()
                if row is not None:
                    return _same_run(_run(row), new, "idempotency key"), False
            row = conn.execute(q["insert_run"], _new_run_params(new)).fetchone()
            if row is not None:
                return _run(row), True
            row = conn.execute(q["get_run"], {"thread_id": new.thread_id}).fetchone()
            if row is None:  # lost to a concurrent key insert; report it as a conflict
                raise RunConflict(f"idempotency key {new.idempotency_key!r} is already used")
            return _same_run(_run(row), new, "thread_id"), False

        run, created = await self._w(job)
        if created:
            self.work_available.set()
        return run, created

    async def get_run(self, thread_id: str) -> RunRecord | None:
        q = self._q["get_run"]
        row = await self._r(lambda c: c.execute(q, {"thread_id": thread_id}).fetchone())
        return None if row is None else _run(row)

    async def list_runs(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        limit: int = 100,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        q = self._q["list_runs"]
        params = {
            "status": status,
            "agent": agent,
            "limit": limit,
            "before_ts": before[0] if before else None,
            "before_id": before[1] if before else None,
        }
        rows = await self._r(lambda c: c.execute(q, params).fetchall())
        return [_run(r) for r in rows]

    # -- leases ----------------------------------------------------------------------------

    async def claim_runs(
        self, worker: str, version: str, agents: Sequence[str], limit: int, lease_ttl: float
    ) -> list[RunRecord]:
        q = self._q["claim_runs"]
        params = {
            "worker": worker,
            "version": version,
            "agents": orjson.dumps(list(agents)).decode(),
            "limit": limit,
            "ttl": lease_ttl,
        }
        rows = await self._w(lambda c: c.execute(q, params).fetchall())
        return [_run(r) for r in rows]

    async def renew_leases(self, worker: str, lease_ttl: float) -> set[str]:
        q = self._q["renew_leases"]
        rows = await self._w(lambda c: c.execute(q, {"worker": worker, "ttl": lease_ttl}).fetchall())
        return {r[0] for r in rows}

    async def release_runs(self, leases: Sequence[Lease]) -> None:
        if not leases:
            return
        q = self._q["release_run"]
        params = [{"thread_id": le.thread_id, "epoch": le.epoch} for le in leases]
        await self._w(lambda c: c.executemany(q, params))
        self.work_available.set()

    # -- steps -----------------------------------------------------------------------------

    async def record_call(self, lease: Lease, step: int, idx: int, name: str, result: bytes) -> None:
        q = self._q["insert_journal"]
        params = {
            "thread_id": lease.thread_id,
            "epoch": lease.epoch,
            "step": step,
            "idx": idx,
            "name": name,
            "result": result,
        }
        count = await self._w(lambda c: c.execute(q, params).rowcount)
        if count != 1:
            raise LeaseLost(f"run {lease.thread_id!r}: lease lost before journaling call {idx}")

    async def load_journal(self, thread_id: str, step: int) -> list[JournalRecord]:
        q = self._q["load_journal"]
        rows = await self._r(lambda c: c.execute(q, {"thread_id": thread_id, "step": step}).fetchall())
        return [JournalRecord(r[0], r[1], r[2]) for r in rows]

    async def commit_step(self, commit: StepCommit) -> None:
        q_run, q_cp = self._q["commit_run"], self._q["insert_checkpoint"]
        lease = commit.lease
        run_params = {
            "thread_id": lease.thread_id,
            "epoch": lease.epoch,
            "step": commit.step,
            "next_node": commit.next_node,
            "status": commit.status,
            "wake_at": commit.wake_at,
            "waiting_for": commit.waiting_for,
        }
        cp_params = (
            lease.thread_id,
            commit.step,
            commit.node,
            commit.next_node,
            commit.kind,
            commit.data,
            lease.worker,
            commit.attempt,
            commit.started_at,
            commit.finished_at,
        )
        insert_cp = (
            "INSERT INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )

        def job(conn: sqlite3.Connection) -> bool:
            if conn.execute(q_run, run_params).rowcount != 1:
                return False
            conn.execute(insert_cp, cp_params)
            for child in commit.children:
                conn.execute(self._q["insert_run"], _new_run_params(child)).fetchall()
            return True

        del q_cp
        if not await self._w(job):
            raise LeaseLost(f"run {lease.thread_id!r}: lease lost; step {commit.step} not committed")
        if commit.children or commit.status == "queued":
            self.work_available.set()

    async def fail_step(
        self,
        lease: Lease,
        *,
        failures: int,
        wake_at: float | None,
        error: bytes | None,
        final: bool,
    ) -> None:
        q = self._q["fail_step"]
        params = {
            "thread_id": lease.thread_id,
            "epoch": lease.epoch,
            "failures": failures,
            "wake_at": wake_at,
            "error": error,
            "final": final,
        }
        if await self._w(lambda c: c.execute(q, params).rowcount) != 1:
            raise LeaseLost(f"run {lease.thread_id!r}: lease lost; failure not recorded")
        if not final:
            self.work_available.set()

    async def cancel_run(self, thread_id: str) -> RunRecord | None:
        q_cancel, q_get = self._q["cancel_run"], self._q["get_run"]

        def job(conn: sqlite3.Connection) -> RunRecord | None:
            conn.execute(q_cancel, {"thread_id": thread_id})
            row = conn.execute(q_get, {"thread_id": thread_id}).fetchone()
            return None if row is None else _run(row)

        result: RunRecord | None = await self._w(job)
        return result

    async def load_checkpoints(self, thread_id: str, upto: int | None = None) -> list[CheckpointRecord]:
        q_snap, q_range = self._q["last_snapshot"], self._q["checkpoints_range"]
        limit = upto if upto is not None else 2**62

        def job(conn: sqlite3.Connection) -> list[CheckpointRecord]:
            snap = conn.execute(q_snap, {"thread_id": thread_id, "upto": limit}).fetchone()[0]
            rows = conn.execute(
                q_range, {"thread_id": thread_id, "from_step": snap or 0, "upto": limit}
            ).fetchall()
            return [_checkpoint(r) for r in rows]

        result: list[CheckpointRecord] = await self._r(job)
        return result

    async def checkpoints(self, thread_id: str) -> list[CheckpointRecord]:
        q = self._q["checkpoints_range"]
        params = {"thread_id": thread_id, "from_step": 0, "upto": 2**62}
        rows = await self._r(lambda c: c.execute(q, params).fetchall())
        return [_checkpoint(r) for r in rows]


def _new_run_params(new: NewRun) -> dict[str, Any]:
    return {
        "thread_id": new.thread_id,
        "agent": new.agent,
        "version": new.version,
        "node": new.node,
        "input": new.input,
        "input_hash": new.input_hash,
        "idempotency_key": new.idempotency_key,
        "parent_thread_id": new.parent_thread_id,
        "forked_from": new.forked_from,
        "forked_step": new.forked_step,
    }


def _same_run(existing: RunRecord, new: NewRun, by: str) -> RunRecord:
    """An existing run matches a start request only with the same agent and input."""
    if existing.agent != new.agent or existing.input_hash != new.input_hash:
        what = f"thread_id {new.thread_id!r}" if by == "thread_id" else f"idempotency key {new.idempotency_key!r}"
        raise RunConflict(
            f"{what} already belongs to a run of agent {existing.agent!r} with different input; "
            f"use another {by} or the same input"
        )
    return existing


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements (our migrations hold no ';' inside literals)."""
    lines = [ln for ln in script.splitlines() if not ln.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


assert RUN_COLUMNS[0] == "thread_id" and CHECKPOINT_COLUMNS[0] == "thread_id"
