"""The SQLite group commit's writes (sqlite_io.py's _Open commits them): a job (a function of
the write connection), a fenced write of the hot path (Fenced), and how a group commit's
fenced writes of one kind run as one statement, with their results handed to the callers."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import LeaseLost, StoreError
from .sqlite_jobs import finished

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


def _wrap(exc: BaseException) -> BaseException:
    if isinstance(exc, sqlite3.Error):
        err = StoreError(f"SQLite error: {exc}")
        err.__cause__ = exc
        return err
    return exc
