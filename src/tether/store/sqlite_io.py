"""SQLite connections (SQLiteConnections), the part SQLiteStore (sqlite.py) owns: the settings a
URL gives, the two connections and their group commit (the schema is sqlite_schema.py's).

Writes submitted during one event-loop iteration are committed together in one IMMEDIATE
transaction (group commit: one fsync for many steps); reads use a second connection and see
the last committed WAL snapshot. WAL mode with `synchronous=FULL` by default: a committed
checkpoint survives power loss, not just a process crash.

The stores of one process on one database file (on one event loop) share these connections,
so their writes make up one group commit: a second connection would only take the file's one
write lock in turn with the first, each commit with its own fsync (two runtime versions in one
worker process, bench R). A write that wakes workers wakes those of every such store.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sqlite3
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, TypeVar

import orjson

from ..errors import ConfigError, LeaseLost, StoreError, StoreUnavailable
from .audit import Audit
from .base import CommitObserver
from .sqlite_jobs import SharedWake, finished
from .sqlite_jobs import swap_observer as _swap
from .sqlite_schema import create_private, parse_sqlite_url

T = TypeVar("T")

Job = Callable[[sqlite3.Connection], Any]


class Fenced:
    """A write of the hot path (a journaled call, a step that advances or finishes the run, a
    run created leased to a local worker), batched with the others of its kind into one
    statement per group commit. `sql` must change exactly one row, or the lease was lost;
    `then_sql` runs only where it did. The caller's future gets `result` when the write
    holds, else LeaseLost(`lost`), or, when `fallback` is given, what that job returns when
    run in the write's place (it decides what an unchanged row means)."""

    __slots__ = ("fallback", "lost", "params", "result", "sql", "then_params", "then_sql")

    def __init__(self, sql: str, params: tuple[Any, ...], lost: str,
                 then_sql: str | None = None, then_params: tuple[Any, ...] = (),
                 result: Any = None, fallback: Job | None = None) -> None:
        self.sql, self.params, self.lost = sql, params, lost
        self.then_sql, self.then_params = then_sql, then_params
        self.result, self.fallback = result, fallback

    def run(self, conn: sqlite3.Connection) -> tuple[bool, Any]:
        """This write alone: (held, the future's result or exception)."""
        if conn.execute(self.sql, self.params).rowcount != 1:
            if self.fallback is not None:
                return True, finished(self.fallback(conn))
            return False, LeaseLost(self.lost)
        if self.then_sql is not None:
            conn.execute(self.then_sql, self.then_params)
        return True, self.result


Item = tuple["Job | Fenced", "asyncio.Future[Any]"]
_SYNC_MODES = {"OFF", "NORMAL", "FULL", "EXTRA"}
_AUTO_VACUUM = {"INCREMENTAL", "NONE"}
_MAX_BATCH = 2048
# A small group commit (fewer fenced writes) stays on the loop thread only while COMMIT is
# measured at most _HANDOFF_S: below it, the loop stalls other runs less than a hand-over to
# the commit thread slows this write (a hand-over costs 0.15-0.2 ms of latency and about 40%
# more CPU a commit on W1, which commits one write at a time: 1,334 steps/s against 2,193
# inline on a disk whose COMMIT takes 0.27 ms). On a disk whose fsync costs more, every COMMIT
# goes to the commit thread, and a fast one again brings small batches back. Measured per
# connection, as a moving average of COMMIT.
_THREAD_MIN = 32
_HANDOFF_S = 0.0005


class _Open:
    """A write connection whose jobs are group-committed, and a read connection used
    directly on the loop thread.

    A group commit starts on the loop thread (BEGIN IMMEDIATE and the jobs that are Python
    functions, which are short) and ends on a commit thread: the fenced writes of the hot
    path, one set-based statement per kind, and COMMIT with its fsync. The sqlite3 module
    releases the GIL inside each statement, so that SQLite work runs on the other core while
    the loop goes on with steps; writes submitted meanwhile make up the next group commit.
    An in-memory database (one connection for both) commits on the loop thread.

    The loop thread never waits for another connection's write lock (another process, or
    another store on the file): its BEGIN IMMEDIATE does not wait (busy_timeout 0 on the write
    connection), and a group commit that finds the lock held runs whole on the commit thread,
    which waits up to the busy timeout. (SQLite's busy handler sleeps 1, 2, 5, 10... ms: on the
    loop thread each sleep stalled every run of the process.)"""

    def __init__(self, connect: Callable[[], sqlite3.Connection], shared: bool,
                 set_sql: dict[str, str], busy_ms: int = 0) -> None:
        self.write = connect()
        self.read = self.write if shared else connect()
        self._busy_ms = busy_ms
        if not shared:
            self.write.execute("PRAGMA busy_timeout=0")
        self._pending: list[Item] = []
        self._loop = asyncio.get_running_loop()
        self._scheduled = False
        self._set_sql = set_sql
        self._pool = None if shared else ThreadPoolExecutor(1, "tether-sqlite-commit")
        self._inflight: concurrent.futures.Future[Any] | None = None
        self._inflight_batch: list[Item] = []
        self._inflight_t0 = 0.0
        self.commit_s = 0.0
        """COMMIT's cost here (a moving average, seconds; the loop and the thread update it)."""
        self.observers: list[CommitObserver] = []
        """Told of each group commit (its writes, BEGIN to COMMIT)."""
        self.wakes: list[asyncio.Event] = []
        """The work_available events of the stores sharing these connections."""
        self.users = 0
        self.key: tuple[Any, ...] | None = None  # in _SHARED under this key, if shared

    def commit_pending(self) -> None:
        """Commit what was submitted, on this thread."""
        self._settle()
        while self._pending:
            self._flush(inline=True)

    def close(self) -> None:
        self.commit_pending()
        if self._pool is not None:
            self._pool.shutdown()
        if self.read is not self.write:
            self.read.close()
        self.write.close()

    def submit(self, job: Job | Fenced) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._pending.append((job, fut))
        if not self._scheduled and self._inflight is None:
            self._scheduled = True
            self._loop.call_soon(self._flush)
        return fut

    def _flush(self, inline: bool = False) -> None:
        """Commit every write submitted since the last group commit in one IMMEDIATE
        transaction (one fsync for all). If any job fails, the batch is rolled back and each
        job is retried in a transaction of its own, so a failing job is undone alone."""
        self._scheduled = False
        if self._inflight is not None or not self._pending:
            return
        batch, self._pending = self._pending[:_MAX_BATCH], self._pending[_MAX_BATCH:]
        t0 = time.perf_counter() if self.observers else 0.0
        try:
            if self._pool is None or inline or (self.commit_s < _HANDOFF_S and (
                    len(batch) < _THREAD_MIN
                    or sum(type(job) is Fenced for job, _ in batch) < _THREAD_MIN)):
                results = self._transaction(batch, wait=self._pool is None or inline)
                self._finish(batch, results, reschedule=not inline)
                self._observed(len(batch), t0)
                return
            begun = self._begin(batch)
        except _Busy:  # another connection holds the write lock: wait for it off the loop
            assert self._pool is not None
            self._on_thread(self._pool.submit(self._waiting_transaction, batch), batch, t0)
            return
        if not isinstance(begun, tuple):  # a job failed (alone: its result) and rolled back
            self._finish(batch, begun)
            self._observed(len(batch), t0)
            return
        results, groups = begun
        self._on_thread(self._pool.submit(self._commit, groups, results), batch, t0)

    def _on_thread(self, cf: concurrent.futures.Future[Any], batch: list[Item],
                   t0: float) -> None:
        self._inflight, self._inflight_batch, self._inflight_t0 = cf, batch, t0
        cf.add_done_callback(lambda f: self._loop.call_soon_threadsafe(self._committed, f))

    def _waiting_transaction(self, batch: list[Item]) -> list[_Result] | None:
        """The commit thread's whole group commit when the write lock was taken: BEGIN
        waits for it (up to the busy timeout)."""
        return self._transaction(batch, wait=True)

    def _committed(self, cf: concurrent.futures.Future[Any]) -> None:
        if self._inflight is not cf:
            return  # close() settled it
        self._inflight, batch, t0 = None, self._inflight_batch, self._inflight_t0
        results = self._retry_inline(batch, cf.result())
        self._observed(len(batch), t0)
        # The writes that queued meanwhile go to the commit thread now, before the callers
        # of this batch run on: it works while they do.
        self._flush()
        self._finish(batch, results)

    def _observed(self, writes: int, t0: float) -> None:
        if self.observers and t0:
            took = time.perf_counter() - t0
            for observer in self.observers:
                observer.committed(writes, took)

    def _retry_inline(self, batch: list[Item], results: list[_Result] | None
                      ) -> list[_Result] | None:
        """A group commit the commit thread rolled back (a lost fence or a failed write)
        runs again here, one statement per row, so only the stale or failing writes fail."""
        return self._transaction(batch) if results is None else results

    def _settle(self) -> None:
        """Wait for the group commit on the commit thread, if any, and deliver it."""
        cf, self._inflight = self._inflight, None
        if cf is not None:
            batch = self._inflight_batch
            self._finish(batch, self._retry_inline(batch, cf.result()), reschedule=False)
            self._observed(len(batch), self._inflight_t0)

    def _finish(self, batch: list[Item], results: list[_Result] | None,
                reschedule: bool = True) -> None:
        if results is None:
            results = []
            for item in batch:
                results.extend(self._transaction([item]) or [])
        _deliver(results)
        if reschedule and self._pending and not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _begin(
        self, batch: list[Item]
    ) -> tuple[list[_Result], list[_Group]] | list[_Result] | None:
        """The loop thread's part of a group commit: _start, then the fenced writes grouped
        by kind with their rows as JSON."""
        started = self._start(batch, wait=False)
        if not isinstance(started, tuple):
            return started
        results, fenced = started
        groups: list[_Group] = []
        for (sql, then_sql), items in fenced.items():
            set_sql = self._set_sql.get(sql)
            then_set = self._set_sql.get(then_sql) if then_sql is not None else None
            rows = then_rows = None
            # A kind with one write (W1's case: one run, one step at a time) goes as its plain
            # statement: encoding its row as JSON and reading it back through json_each cost
            # more than the statement itself.
            if len(items) > 1 and set_sql is not None and (then_sql is None
                                                           or then_set is not None):
                try:
                    rows = orjson.dumps([job.params for job, _ in items], default=_text)
                    if then_sql is not None:
                        then_rows = orjson.dumps([job.then_params for job, _ in items],
                                                 default=_text)
                except (TypeError, UnicodeDecodeError):
                    rows = then_rows = None
                # SQLite's JSON functions end a string at a NUL character: such rows (a NUL
                # in a name or thread_id; never in JSON data, where orjson escapes it) go
                # one statement per row. The test also matches an escaped backslash before
                # "u0000", which only costs those rows the slower path.
                if rows is not None and (_NUL in rows or (then_rows is not None
                                                          and _NUL in then_rows)):
                    rows = then_rows = None
            groups.append(_Group(sql, then_sql, items, set_sql, rows, then_set, then_rows))
        return results, groups

    def _commit(self, groups: list[_Group], results: list[_Result]) -> list[_Result] | None:
        """The commit thread's part: the fenced writes, one statement per kind, and COMMIT.
        None if it failed (rolled back); a lost fence fails it too, so each write is then
        retried alone and only the stale one gets LeaseLost."""
        conn = self.write
        try:
            for g in groups:
                n = len(g.items)
                if n == 1:
                    job, fut = g.items[0]
                    if conn.execute(job.sql, job.params).rowcount != 1:
                        raise _FenceMoved  # (retried on the loop thread, as below)
                    if job.then_sql is not None:
                        conn.execute(job.then_sql, job.then_params)
                    results.append((fut, True, job.result))
                elif g.rows is not None and g.set_sql is not None:
                    if conn.execute(g.set_sql, (g.rows,)).rowcount != n:
                        raise _FenceMoved
                    if g.then_set is not None:
                        conn.execute(g.then_set, (g.then_rows,))
                    results.extend((fut, True, job.result) for job, fut in g.items)
                else:
                    _run_fenced(conn, g.sql, g.then_sql, g.items, results)
            self._timed_commit()
        except Exception:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return None
        return results

    def _start(self, batch: list[Item], wait: bool) -> _Started | list[_Result] | None:
        """BEGIN IMMEDIATE and run the jobs that are functions; the fenced writes come back
        grouped by kind, to run after them. The order of jobs within one batch is free: they
        were all submitted while none of them had committed. If a job fails, see _undo.
        Raises _Busy if another connection holds the write lock and not `wait`."""
        conn = self.write
        results: list[_Result] = []
        fenced: _Fenced = {}
        try:
            self._begin_immediate(wait)
            for job, fut in batch:
                if type(job) is Fenced:
                    fenced.setdefault((job.sql, job.then_sql), []).append((job, fut))
                else:
                    results.append((fut, True, finished(job(conn))))  # type: ignore[operator]
        except _Busy:
            raise
        except Exception as exc:
            return self._undo(batch, exc)
        return results, fenced

    def _begin_immediate(self, wait: bool) -> None:
        conn = self.write
        if conn is self.read:  # in memory: no other connection can hold the lock
            conn.execute("BEGIN IMMEDIATE")
        elif not wait:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY:
                    raise _Busy from exc
                raise
        else:
            conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            try:
                conn.execute("BEGIN IMMEDIATE")
            finally:
                conn.execute("PRAGMA busy_timeout=0")

    def _undo(self, batch: list[Item], exc: Exception) -> list[_Result] | None:
        """Roll back a failed transaction: None for a batch of several (each is then retried
        alone), else the lone job's failure as its result."""
        if self.write.in_transaction:
            self.write.execute("ROLLBACK")
        return [(batch[0][1], False, store_error(exc))] if len(batch) == 1 else None

    def _transaction(self, batch: list[Item], wait: bool = True) -> list[_Result] | None:
        """Run jobs in one transaction on this thread, the fenced writes last, one
        executemany per kind. None if a job of a multi-job batch failed (rolled back); a
        single job's failure is returned as its result. Raises _Busy as _start does."""
        started = self._start(batch, wait)
        if not isinstance(started, tuple):
            return started
        results, fenced = started
        try:
            for (sql, then_sql), items in fenced.items():
                _run_fenced(self.write, sql, then_sql, items, results)
            self._timed_commit()
        except Exception as exc:
            return self._undo(batch, exc)
        return results

    def _timed_commit(self) -> None:
        t0 = time.perf_counter()
        self.write.execute("COMMIT")
        self.commit_s += (time.perf_counter() - t0 - self.commit_s) * 0.2

    def others_version(self) -> int | None:
        """PRAGMA data_version of the write connection, which moves only when another
        connection (another process's, or another store's on other settings) commits; None
        while a group commit is in flight (the connection is not ours to use then)."""
        if self._inflight is not None or self.write is self.read:
            return None
        return int(self.write.execute("PRAGMA data_version").fetchone()[0])

    def run_read(self, job: Job, snapshot: bool = False) -> Any:
        """Run a read job on the read connection. A single statement reads one consistent
        snapshot by itself (autocommit); `snapshot=True` wraps a multi-statement job in one
        read transaction."""
        conn = self.read
        try:
            if not snapshot or conn is self.write:
                return job(conn)
            conn.execute("BEGIN")
            try:
                return job(conn)
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise store_error(exc) from exc


_Result = tuple["asyncio.Future[Any]", bool, Any]
_Fenced = dict[tuple[str, "str | None"], list[tuple[Fenced, "asyncio.Future[Any]"]]]
_Started = tuple[list[_Result], _Fenced]


class _Busy(Exception):
    """BEGIN IMMEDIATE found the write lock held by another connection (and did not wait)."""


class _FenceMoved(Exception):
    """A set-based fenced write changed fewer rows than it had: some lease was lost."""


class _Group(NamedTuple):
    sql: str
    then_sql: str | None
    items: list[tuple[Fenced, asyncio.Future[Any]]]
    set_sql: str | None
    rows: bytes | None
    then_set: str | None
    then_rows: bytes | None


_NUL = b"\\u0000"


def _text(value: Any) -> str:
    """orjson's fallback for the blob parameters of set-based writes (JSON bytes)."""
    if type(value) is bytes:
        return value.decode()
    raise TypeError(type(value).__name__)


def _run_fenced(
    conn: sqlite3.Connection, sql: str, then_sql: str | None,
    items: list[tuple[Fenced, asyncio.Future[Any]]],
    results: list[_Result],
) -> None:
    """One kind of fenced write for many runs: one executemany when every fence holds (the
    common case), else each on its own inside a savepoint-undone retry."""
    if len(items) > 1:
        conn.execute("SAVEPOINT fenced")
        if conn.executemany(sql, [job.params for job, _ in items]).rowcount == len(items):
            if then_sql is not None:
                conn.executemany(then_sql, [job.then_params for job, _ in items])
            conn.execute("RELEASE fenced")
            results.extend((fut, True, job.result) for job, fut in items)
            return
        conn.execute("ROLLBACK TO fenced")
        conn.execute("RELEASE fenced")
    for job, fut in items:
        results.append((fut, *job.run(conn)))


def _deliver(results: list[_Result]) -> None:
    for fut, ok, value in results:
        if fut.done():  # the caller was cancelled; the write still happened or not, atomically
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


def store_error(exc: BaseException) -> BaseException:
    if isinstance(exc, sqlite3.Error):
        err = StoreError(f"SQLite error: {exc}")
        err.__cause__ = exc
        return err
    return exc


_SHARED: weakref.WeakValueDictionary[tuple[Any, ...], _Open] = weakref.WeakValueDictionary()
"""The open connections of this process's stores, by _share_key."""


class SQLiteConnections:
    """The connections part: the settings; once open, the write connection whose jobs are
    group-committed and the read connection. Interface: open(), close(), write(job) (a
    future of its result, group-committed), read(job) (on the loop thread)."""

    def __init__(self, url: str, *, synchronous: str | None = None, busy_timeout: float = 30.0):
        self.url = url
        self.path, opts = parse_sqlite_url(url)
        sync = (synchronous or opts.get("synchronous", "FULL")).upper()
        if sync not in _SYNC_MODES:
            raise ConfigError(f"synchronous must be one of {sorted(_SYNC_MODES)}, got {sync!r}")
        self.synchronous = sync
        auto_vacuum = opts.get("auto_vacuum", "INCREMENTAL").upper()
        if auto_vacuum not in _AUTO_VACUUM:
            raise ConfigError(f"auto_vacuum must be one of {sorted(_AUTO_VACUUM)}, "
                              f"got {auto_vacuum!r}")
        self.auto_vacuum = auto_vacuum
        self.busy_timeout = busy_timeout
        self.memory = self.path == ":memory:"
        self._open: _Open | None = None
        self._observer: CommitObserver | None = None
        self.wake = SharedWake()
        """The owning store's work_available (see SharedWake)."""

    @property
    def observer(self) -> CommitObserver | None:
        """Told of each group commit (tether.observe's metrics), open or not yet."""
        return self._observer

    @observer.setter
    def observer(self, observer: CommitObserver | None) -> None:
        if self._open is not None:
            _swap(self._open.observers, self._observer, observer)
        self._observer = observer

    @property
    def is_open(self) -> bool:
        return self._open is not None

    def open(self, set_sql: dict[str, str]) -> None:
        """Connect, or join the connections another store of this process (on this event
        loop) has open on the same file with the same settings (`wake` then sets theirs
        too). `set_sql` maps each fenced write's statement to its set-based form, which
        writes a whole group commit's rows of that kind in one statement."""
        key = self._share_key()
        conns = _SHARED.get(key) if key is not None else None
        if conns is None:
            conns = _Open(self._connect, shared=self.memory, set_sql=set_sql,
                          busy_ms=int(self.busy_timeout * 1000))
            conns.key = key or self._share_key()  # a new file exists now
            if conns.key is not None:
                _SHARED[conns.key] = conns
        conns.users += 1
        _swap(conns.observers, None, self._observer)
        conns.wakes.append(self.wake)
        self.wake.peers = conns.wakes
        self._open = conns

    def close(self) -> None:
        """Commit what was submitted, then leave the connections (closed by the last store
        that uses them); idempotent."""
        conns, self._open = self._open, None
        if conns is None:
            return
        conns.users -= 1
        _swap(conns.observers, self._observer, None)
        conns.wakes[:] = [w for w in conns.wakes if w is not self.wake]
        self.wake.peers = [self.wake]
        if conns.users:
            conns.commit_pending()
            return
        if conns.key is not None and _SHARED.get(conns.key) is conns:
            del _SHARED[conns.key]
        conns.close()

    def _share_key(self) -> tuple[Any, ...] | None:
        """What identifies connections this store may share: the event loop, the file (by
        device and inode, so a file deleted and made anew is another) and the settings."""
        if self.memory:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (asyncio.get_running_loop(), st.st_dev, st.st_ino, self.synchronous,
                self.busy_timeout)

    def _connect(self) -> sqlite3.Connection:
        if not self.memory:
            parent = os.path.dirname(os.path.abspath(self.path))
            if not os.path.isdir(parent):
                raise StoreUnavailable(f"cannot open {self.url}: directory {parent!r} does not "
                                       "exist")
        # A database's auto-vacuum mode is fixed when its first page is written (here: by
        # journal_mode=WAL on a new file); only a VACUUM changes it later (docs/retention.md).
        try:
            new = not self.memory and create_private(self.path)
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=self.busy_timeout,
                                   check_same_thread=False)
            if new:
                conn.execute(f"PRAGMA auto_vacuum={self.auto_vacuum}")
            if not self.memory:
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute("PRAGMA temp_store=MEMORY")  # statement journals: not /var/tmp files
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"cannot open {self.url}: {exc}") from exc
        return conn

    def write(self, job: Job | Fenced) -> asyncio.Future[Any]:
        if self._open is None:
            raise StoreError("store is not open")
        return self._open.submit(job)

    def others_version(self) -> int | None:
        """See _Open.others_version; None when not open."""
        return None if self._open is None else self._open.others_version()

    async def read(self, job: Job, snapshot: bool = False) -> Any:
        if self._open is None:
            raise StoreError("store is not open")
        return self._open.run_read(job, snapshot)


def audited(insert: str, job: Callable[[sqlite3.Connection], T], audit: Audit | None,
            happened: Callable[[T], bool]) -> Callable[[sqlite3.Connection], T]:
    """`job`, then (in its transaction) the audit row (`insert`) when `happened(its
    result)`."""
    if audit is None:
        return job

    def run(conn: sqlite3.Connection) -> T:
        result = job(conn)
        if happened(result):
            conn.execute(insert, audit.params())
        return result

    return run
