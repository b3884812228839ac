"""The agents that worker subprocesses run in the mailbox crash test, and helpers that read
the mailbox table directly (the store has no API for consumed rows).

    python -m tether worker --app apps.mail_app:make_runtime --db URL ...

A `sender` run sends numbered messages `{"sender": its thread_id, "n": n}` for n = 0..k-1 to
every thread_id in `state["targets"]`, `state["per_step"]` numbers per super-step, pausing a
random time in each step (so that kills land inside steps whose messages are not committed
yet). An `actor` run is a mail actor: each time it runs it records its whole batch as
`[message id, sender, n, step]` (the step being the one that consumes the batch), pauses, and
returns `tether.receive`, until it has recorded `state["expect"]` messages; then it finishes.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import orjson
import psycopg

import tether

sender = tether.Agent("sender")
actor = tether.Agent("actor")


@sender.node(start=True)
async def send(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    first, per, k = state["next"], state["per_step"], state["k"]
    numbers = range(first, min(first + per, k))
    for n in numbers:
        for target in state["targets"]:
            ctx.send(target, {"sender": ctx.thread_id, "n": n})
    await asyncio.sleep(random.uniform(*state["pause"]))
    update = {"next": numbers.stop, "steps": tether.append([ctx.step])}
    if numbers.stop >= k:
        return tether.finish(update)
    return tether.goto("send", update)


@actor.node(start=True)
async def handle(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    batch = []
    for m in ctx.inbox:
        if m.body["sender"] != m.sender:
            raise AssertionError(f"message {m.id} claims sender {m.body['sender']!r}, "
                                 f"the mailbox says {m.sender!r}")
        batch.append([m.id, m.sender, m.body["n"], ctx.step])
    await asyncio.sleep(random.uniform(*state["pause"]))
    count = state["count"] + len(batch)
    update = {"got": tether.append(batch), "count": count}
    if count >= state["expect"]:
        return tether.finish(update)
    return tether.receive(update)


def sender_input(targets: list[str], *, k: int, per_step: int,
                 pause: tuple[float, float] = (0.0, 0.0)) -> dict[str, Any]:
    return {"targets": targets, "k": k, "per_step": per_step, "next": 0, "steps": [],
            "pause": list(pause)}


def actor_input(expect: int, pause: tuple[float, float] = (0.0, 0.0)) -> dict[str, Any]:
    return {"expect": expect, "count": 0, "got": [], "pause": list(pause)}


def make_runtime() -> tether.Runtime:
    """The worker's Runtime; `tether worker --db/--lease-ttl` and TETHER_* env override."""
    return tether.Runtime(os.environ.get("TETHER_DB"), agents=[sender, actor], version="v1")


# -- reading the mailbox table ----------------------------------------------------------------


class MailRow(NamedTuple):
    id: int
    thread_id: str
    sender: str | None
    body: Any
    consumed_step: int | None


_MAIL_SQL = "SELECT id, thread_id, sender, message, consumed_step FROM mailbox ORDER BY id"


def query_rows(db_url: str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of one read-only query, on a connection of its own (SQLite or Postgres)."""
    if db_url.startswith("sqlite:"):
        conn = sqlite3.connect(urlsplit(db_url).path[1:], timeout=30)
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.close()
    with psycopg.connect(db_url) as pg:
        return pg.execute(sql.encode()).fetchall()


def mailbox_rows(db_url: str) -> list[MailRow]:
    """Every mailbox row of the database, by id, with its body decoded."""
    rows = query_rows(db_url, _MAIL_SQL)
    return [MailRow(int(r[0]), r[1], r[2], orjson.loads(bytes(r[3])),
                    None if r[4] is None else int(r[4])) for r in rows]


def mail_progress(db_url: str) -> int:
    """Messages sent plus messages consumed so far."""
    return int(query_rows(db_url, "SELECT count(*) + count(consumed_step) FROM mailbox")[0][0])
