"""How the Postgres store reads what the runs of a claim read first (Store.load_claimed): a
statement per kind for the lot (load_checkpoints_many, load_journal_many, load_inbox_many),
sent in one pipeline, one round trip. A statement per run and kind, in three rounds one after
the other (checkpoints, then journal, then inbox), was most of a woken actor's wait."""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from psycopg import AsyncCursor
from psycopg.rows import TupleRow

from .base import (
    INBOX_LIMIT,
    CheckpointRecord,
    ClaimedReads,
    JournalRecord,
    MessageRecord,
    RunRecord,
    never_ran,
)
from .pg_conn import BEGIN, Conn, Params, PgConnections
from .pg_group import pipelined


async def load_claimed(conns: PgConnections, runs: Sequence[RunRecord]
                       ) -> dict[str, ClaimedReads]:
    if not runs:
        return {}
    q = conns.q
    statements: list[tuple[bytes, Params]] = [
        (q["load_inbox_many"], {"ids": orjson.dumps([r.thread_id for r in runs]).decode(),
                                "limit": INBOX_LIMIT}),
        (q["load_checkpoints_many"], {"ids": orjson.dumps(
            [r.thread_id for r in runs if r.step > 0]).decode()}),
        (q["load_journal_many"], {"runs": orjson.dumps(
            [{"thread_id": r.thread_id, "step": r.step + 1}
             for r in runs if not never_ran(r)]).decode()}),
    ]

    async def body(conn: Conn) -> list[list[TupleRow]]:
        async def send() -> list[AsyncCursor[TupleRow]]:
            await conn.execute(BEGIN)
            curs = [await conn.execute(sql, params) for sql, params in statements]
            await conn.execute(b"COMMIT")
            return curs

        return [await cur.fetchall() for cur in await pipelined(conn, send)]

    inbox, checkpoints, journal = await conns.transaction(body, body_commits=True)
    out = {r.thread_id: ClaimedReads([], [], []) for r in runs}
    for r in inbox:
        out[r[0]].inbox.append(MessageRecord(r[1], r[2], r[3], r[4]))
    for r in checkpoints:
        out[r[0]].checkpoints.append(CheckpointRecord(*r))
    for r in journal:
        out[r[0]].journal.append(JournalRecord(r[1], r[2], r[3], r[4]))
    return out
