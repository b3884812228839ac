"""Postgres mail from outside a step (runtime.send), group-committed (Sends), given the
connections part (pg_conn.py) and owned by the store.

One send is a transaction: lock the recipient's row (so a park in progress and this mail
cannot miss each other), insert the message if the run can still read it, wake the run if it
is idle for mail, and announce it; that notification makes Postgres serialize the commit with
every other notifying one, so sends one by one run at one WAL flush each (about 115 a second
on a disk that takes 4 ms to flush). Sends made while FLUSHERS such transactions are at the
server queue up and the next takes them all: BEGIN; lock_runs_many (every recipient, in
thread_id order); send_messages (each message in the order sent, with the audit rows of
the audited ones: every send over HTTP); COMMIT, one round trip. A send to an unknown or
finished run fails alone and writes nothing (the rows locked say which); if the transaction
fails, its sends go one by one; if its connection is lost, each gets StoreUnavailable, as a
send of its own would.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Final

from ..errors import RunNotFound
from .base import TERMINAL, Audit, RunRecord
from .pg_conn import BEGIN, Conn, PgConnections
from .pg_full import Cursor, json_param
from .pg_group import GroupCommit, fail, pipelined
from .rows import mail_refused

FLUSHERS: Final = 2
# (recipient, message, sender, future of the message's id, its audit record if audited)
_Send = tuple[str, bytes, "str | None", "asyncio.Future[int]", "Audit | None"]


class Sends(GroupCommit[_Send]):
    """send(): one message delivered (its id), alone or with others (see the module's
    text). Raises RunNotFound, InvalidState (a finished run), StoreUnavailable,
    StoreError."""

    def __init__(self, conns: PgConnections, work_available: asyncio.Event) -> None:
        super().__init__(conns, FLUSHERS, "sends", "tether-pg-send")
        self._work = work_available

    async def send(self, thread_id: str, message: bytes, sender: str | None = None,
                   audit: Audit | None = None) -> int:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._submit((thread_id, message, sender, fut, audit))
        return await fut

    async def alone(self, thread_id: str, message: bytes, sender: str | None = None,
                    audit: Audit | None = None) -> int:
        q = self._conns.q
        self.transactions += 1

        async def body(conn: Conn) -> int:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                await conn.execute(q["lock_runs"], {
                    "ids": [thread_id], "thread_id": thread_id, "parent": False})
                cur = await conn.execute(q["send_message"], {
                    "thread_id": thread_id, "sender": sender, "message": message})
            row = await cur.fetchone()
            if row is None:
                cur = await conn.execute(q["get_run"], {"thread_id": thread_id})
                found = await cur.fetchone()
                if found is None:
                    raise RunNotFound(f"no run with thread_id {thread_id!r}")
                raise mail_refused(thread_id, RunRecord(*found).status)
            if audit is not None:
                await conn.execute(q["insert_audit"], audit.params())
            return int(row[0])

        mid = await self._conns.transaction(body)
        self._work.set()
        return mid

    def _future(self, job: _Send) -> asyncio.Future[int]:
        return job[3]

    async def _alone_job(self, job: _Send) -> int:
        return await self.alone(job[0], job[1], job[2], job[4])

    async def _together(self, batch: list[_Send]) -> None:
        locked, ids = await self._transaction(batch)
        self._work.set()
        for thread_id, _, _, fut, _ in batch:
            status = locked.get(thread_id)
            if status is None:
                fail(fut, RunNotFound(f"no run with thread_id {thread_id!r}"))
            elif status in TERMINAL:
                fail(fut, mail_refused(thread_id, status))
            elif not fut.done():
                fut.set_result(ids[thread_id].popleft())

    async def _transaction(self, batch: list[_Send]
                           ) -> tuple[dict[str, str], dict[str, deque[int]]]:
        """The batch's transaction: each recipient's status when locked, and the ids of the
        messages it got, in the order sent."""
        q = self._conns.q
        recipients = sorted({job[0] for job in batch})
        rows = [{"recipient": r, "sender": s, "message": m} for r, m, s, _, _ in batch]
        query = q["send_messages"]
        if any(job[4] is not None for job in batch):
            query = q["send_messages_audited"]
            for row, job in zip(rows, batch, strict=True):
                if (audit := job[4]) is not None:
                    row.update(audit.prefixed())
        mail = json_param(rows)
        async with self._conns.pool().connection() as conn:
            async def statements() -> tuple[Cursor, Cursor]:
                await conn.execute(BEGIN)
                c_lock = await conn.execute(q["lock_runs_many"], {
                    "ids": json_param(recipients), "terminal": "[]"})
                c_sent = await conn.execute(query, {"mail": mail})
                await conn.execute(b"COMMIT")
                return c_lock, c_sent

            c_lock, c_sent = await pipelined(conn, statements)
            locked = {r[0]: r[2] for r in await c_lock.fetchall()}
            ids: dict[str, deque[int]] = {}
            for thread_id, mid, _ in await c_sent.fetchall():
                ids.setdefault(thread_id, deque()).append(int(mid))
        return locked, ids
