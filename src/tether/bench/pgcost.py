"""What a workload costs the Postgres server itself, read from the server while it runs:
the CPU time of the database's backend processes (utime + stime in /proc/<pid>/stat, so the
bench must run on the database's machine), transactions and rows from pg_stat_database, and
the WAL written for the database (pg_walinspect: the records that touch its relations, plus
its commit records at the range's mean commit-record size). Other databases on the same
server do not count, except in `wal_bytes_cluster` (the WAL position's advance, everything).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from typing import Any

from .common import direct_url, libpq_url

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class DbCost:
    """The server's cost over one measured interval."""

    backend_cpu_s: float
    backends: int
    commits: int
    rows_written: int  # inserted + updated + deleted
    wal_bytes: int | None  # this database's records (None: pg_walinspect not available)
    wal_bytes_cluster: int


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process in seconds (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


class PgCost:
    """Samples the backends of one database every `interval` s between `start()` and
    `stop()` (a backend that exits in between counts up to its last sample). Use
    `finish()` after the clients have disconnected, so the statistics are flushed."""

    STATS = ("SELECT xact_commit, tup_inserted + tup_updated + tup_deleted "
             "FROM pg_stat_database WHERE datname = current_database()")

    def __init__(self, url: str, interval: float = 0.1) -> None:
        self.url = libpq_url(direct_url(url))
        self.exclude: set[int] = set()  # the bench's own watchers' backends
        self.interval = interval
        self._conn: Any = None
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._lsn0 = self._lsn1 = ""
        self._stats0: tuple[int, int] = (0, 0)
        self.oid = 0
        self.walinspect = False
        self._wal: tuple[int, int, int] | None = (0, 0, 0)  # own bytes, commit bytes, commits
        self._wal_lsn = ""
        self._own = self._own0 = 0  # this watcher's own transactions (left out of `commits`)

    async def __aenter__(self) -> PgCost:
        import psycopg

        self._conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        try:
            await self._conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            self.walinspect = True
        except psycopg.Error:
            self.walinspect = False
        # The extension's catalog rows are this watcher's own writes: have them reported now
        # (a backend reports its counts about once a second), not in an interval measured.
        with contextlib.suppress(psycopg.Error):  # Postgres 15 and later
            await self._conn.execute("SELECT pg_stat_force_next_flush()")
            await self._conn.execute("SELECT 1")
        self.oid = int((await self._one("SELECT oid FROM pg_database "
                                        "WHERE datname = current_database()"))[0])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._conn is not None:
            await self._conn.close()

    async def _one(self, q: str) -> tuple[Any, ...]:
        self._own += 1
        row = await (await self._conn.execute(q.encode())).fetchone()
        assert row is not None
        return tuple(row)

    async def _sample(self) -> None:
        self._own += 1
        rows = await (await self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()")).fetchall()
        for (pid,) in rows:
            if int(pid) in self.exclude:
                continue
            cpu = proc_cpu_s(int(pid))
            if cpu is None:
                continue
            self._first.setdefault(int(pid), cpu if self._task is None else 0.0)
            self._last[int(pid)] = cpu

    async def _loop(self) -> None:
        n = 0
        while True:
            await asyncio.sleep(self.interval)
            await self._sample()
            n += 1
            if n % 5 == 0:
                await self._read_wal()

    async def _read_wal(self) -> None:
        """Add up the WAL since the last read (read as it goes: on a busy server the
        segments are recycled soon after a checkpoint)."""
        import psycopg

        lsn = str((await self._one("SELECT pg_current_wal_flush_lsn()"))[0])
        if not self.walinspect or self._wal is None or lsn == self._wal_lsn:
            return
        try:
            own, commit_bytes, commits = await self._one(
                "SELECT coalesce(sum(record_length) FILTER (WHERE block_ref LIKE "
                f"'%/{self.oid}/%'), 0), coalesce(sum(record_length) FILTER (WHERE "
                "resource_manager = 'Transaction' AND record_type LIKE 'COMMIT%'), 0), "
                "count(*) FILTER (WHERE resource_manager = 'Transaction' AND record_type "
                f"LIKE 'COMMIT%') FROM pg_get_wal_records_info('{self._wal_lsn}', '{lsn}')")
        except psycopg.Error:
            self._wal = None  # a segment was recycled before it was read: no figure
            return
        self._wal = (self._wal[0] + int(own), self._wal[1] + int(commit_bytes),
                     self._wal[2] + int(commits))
        self._wal_lsn = lsn

    async def start(self) -> None:
        """Begin the interval: backends alive now count from their CPU time now, later ones
        from zero (their connection set-up is part of the workload)."""
        self._first.clear()
        self._last.clear()
        self._stats0 = await self._stats()
        self._own0 = self._own
        self._lsn0 = self._wal_lsn = str((await self._one("SELECT pg_current_wal_flush_lsn()"))[0])
        self._wal = (0, 0, 0)
        await self._sample()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        """End the interval (the CPU sampling; the counts are read by `finish`)."""
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        await self._sample()
        await self._read_wal()
        self._lsn1 = str((await self._one("SELECT pg_current_wal_lsn()"))[0])

    async def _stats(self) -> tuple[int, int]:
        self._own += 1
        await self._conn.execute("SELECT pg_stat_clear_snapshot()")
        commits, rows = await self._one(self.STATS)
        return int(commits), int(rows)

    async def finish(self, wait_s: float = 1.5) -> DbCost:
        """The interval's cost. Waits `wait_s` first: a backend reports its counts at most
        once a second (PostgreSQL 15), and all of them when it exits."""
        await asyncio.sleep(wait_s)
        own = self._own - self._own0
        commits1, rows1 = await self._stats()
        commits = max(0, commits1 - self._stats0[0] - own)
        cpu = sum(self._last[p] - self._first[p] for p in self._last)
        cluster = int((await self._one(
            f"SELECT pg_wal_lsn_diff('{self._lsn1}', '{self._lsn0}')"))[0])
        wal: int | None = None
        if self.walinspect and self._wal is not None:
            own, commit_bytes, commit_records = self._wal
            mean_commit = commit_bytes / commit_records if commit_records else 0.0
            wal = own + round(mean_commit * commits)
        return DbCost(round(cpu, 3), len(self._last), commits, rows1 - self._stats0[1], wal,
                      cluster)


class NoCost(PgCost):
    """PgCost's interface for a store without a server (SQLite): nothing to measure, zeros."""

    async def __aenter__(self) -> NoCost:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def finish(self, wait_s: float = 1.5) -> DbCost:
        return DbCost(0.0, 0, 0, 0, None, 0)
