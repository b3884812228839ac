"""SQLite: interrupt answers coalesced. The answers given while a group commit gathers go as
one job of it, and that job answers them with one statement per kind (resolve, journal, wake)
rather than three per answer; an answer after the first to the same run, and every answer of
a job that runs alone, is answered one by one, exactly as before. Each caller gets its own
answer's row (None: the run had no pending interrupt to answer)."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

import orjson

from ..errors import StoreError
from .base import INTERRUPT_CALL, InterruptRecord
from .sqlite_io import store_error

T = TypeVar("T")

# (thread_id, value, interrupt_id)
_Answer = tuple[str, bytes, str | None]
# an answer's outcome: the interrupt answered, None (nothing to answer), or its error
_Result = InterruptRecord | StoreError | None


class _Batch:
    """The answers of one job: open to more until the job first runs, then sealed (the job
    may run again, on a retry after a batch-mate failed: with the same answers)."""

    __slots__ = ("answers", "lock", "sealed")

    def __init__(self) -> None:
        self.answers: list[_Answer] = []
        self.lock = threading.Lock()  # the job may run on the commit thread
        self.sealed = False

    def add(self, answer: _Answer) -> int | None:
        """The answer's index, or None once sealed."""
        with self.lock:
            if self.sealed:
                return None
            self.answers.append(answer)
            return len(self.answers) - 1

    def seal(self) -> list[_Answer]:
        with self.lock:
            self.sealed = True
            return self.answers


class Answers:
    """SQLiteStore.resume_interrupt without an audit row: `answer` joins the open batch, or
    submits a new one through `write` (the store's group commit)."""

    def __init__(self, q: Mapping[str, str],
                 write: Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]]) -> None:
        self._q = q
        self._write = write
        self._open: tuple[_Batch, asyncio.Future[list[_Result]]] | None = None

    async def answer(self, thread_id: str, value: bytes,
                     interrupt_id: str | None) -> InterruptRecord | None:
        answer = (thread_id, value, interrupt_id)
        if self._open is not None:
            batch, fut = self._open
            i = batch.add(answer)
            if i is not None:
                return _outcome((await asyncio.shield(fut))[i])
        batch = _Batch()
        i = batch.add(answer)
        assert i == 0
        fut = asyncio.ensure_future(self._write(lambda conn: self._job(conn, batch)))
        self._open = (batch, fut)
        fut.add_done_callback(lambda _: self._close(batch))
        return _outcome((await asyncio.shield(fut))[i])

    def _close(self, batch: _Batch) -> None:
        if self._open is not None and self._open[0] is batch:
            self._open = None

    def _job(self, conn: sqlite3.Connection, batch: _Batch) -> list[_Result]:
        answers = batch.seal()
        if len(answers) == 1:  # alone: as before (an error fails this job, and only it)
            return [answer_one(self._q, conn, *answers[0])]
        out: list[_Result] = [None] * len(answers)
        first: dict[str, int] = {}  # each run's first answer: answered together
        for i, (thread_id, _, _) in enumerate(answers):
            first.setdefault(thread_id, i)
        alone: list[int] = list(range(len(answers)))
        try:
            together = len(first) > 1 and _isolated(
                conn, lambda: self._together(conn, answers, first, out))
        except sqlite3.Error:  # undone: each answers alone below, so only a culprit fails
            together = False
        if together:
            done = set(first.values())
            alone = [i for i in alone if i not in done]
        for i in alone:  # in the order given: a later answer to a run finds it answered
            try:
                out[i] = _isolated(conn, functools.partial(answer_one, self._q, conn,
                                                           *answers[i]))
            except sqlite3.Error as exc:  # this answer fails, not its batch-mates
                out[i] = cast(StoreError, store_error(exc))
        return out

    def _together(self, conn: sqlite3.Connection, answers: list[_Answer],
                  first: dict[str, int], out: list[_Result]) -> bool:
        """The first answer to each run, one statement per kind; False (nothing written) if
        some value is not UTF-8 text JSON can carry as a string."""
        rows = [[answers[i][0], answers[i][1], answers[i][2]] for i in first.values()]
        try:
            data = orjson.dumps(rows, default=_text)
        except TypeError:  # orjson.JSONEncodeError: a value that is not UTF-8
            return False
        if b"\\u0000" in data:  # SQLite's JSON functions end a string at a NUL
            return False
        q = self._q
        resolved = conn.execute(q["resolve_interrupts"], (data,)).fetchall()
        recs: dict[str, InterruptRecord] = {}
        for row in resolved:  # (several pending interrupts of one run: as fetchone, any one)
            recs.setdefault(row[0], InterruptRecord(*row))
        if not recs:
            return True
        conn.execute(q["journal_values"], (orjson.dumps(
            [[r.thread_id, r.step, r.idx, INTERRUPT_CALL, bytes(r.value or b"").decode()]
             for r in recs.values()]),))
        conn.execute(q["wake_waiting_set"], (orjson.dumps(list(recs)),))
        for thread_id, i in first.items():
            out[i] = recs.get(thread_id)
        return True

def answer_one(q: Mapping[str, str], conn: sqlite3.Connection, thread_id: str, value: bytes,
               interrupt_id: str | None) -> InterruptRecord | None:
    """One answer: resolve the run's pending interrupt, journal the value, wake the run."""
    row = conn.execute(q["resolve_interrupt"],
                       {"thread_id": thread_id, "id": interrupt_id, "value": value}).fetchone()
    if row is None:
        return None
    rec = InterruptRecord(*row)  # as resolved: RETURNING reads the updated row
    conn.execute(q["journal_value"], {"thread_id": thread_id, "step": rec.step, "idx": rec.idx,
                                      "name": INTERRUPT_CALL, "result": value})
    conn.execute(q["wake_waiting"], {"thread_id": thread_id})
    return rec


def _isolated(conn: sqlite3.Connection, step: Callable[[], T]) -> T:
    """`step` inside a savepoint: on an SQLite error its writes are undone (the group
    commit's other writes stay) and the error raised."""
    conn.execute("SAVEPOINT answers")
    try:
        result = step()
    except sqlite3.Error:
        conn.execute("ROLLBACK TO answers")
        conn.execute("RELEASE answers")
        raise
    conn.execute("RELEASE answers")
    return result


def _outcome(result: _Result) -> InterruptRecord | None:
    if isinstance(result, StoreError):
        raise result
    return result


def _text(value: object) -> str:
    """bytes as their UTF-8 text (orjson raises JSONEncodeError for anything else)."""
    if isinstance(value, bytes):
        return value.decode()
    raise TypeError(f"{type(value).__name__} is not JSON text")
