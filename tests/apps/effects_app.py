"""The agents and effect handlers that worker subprocesses run in the outbox crash tests.

    TETHER_DB=URL python -m tether worker --app apps.effects_app:make_runtime --db URL ...

(TETHER_DB must name the same database as --db: transactional handlers differ per dialect, and
the Runtime picks them when it is made.)

Agent `fx`: every step requests one effect, `sink.write`, with a payload that carries a nonce
unique to this *execution* of the step; the node logs `key nonce pid` to $CHAOS_CALL_LOG when
it requests it, then pauses (`state["pause"]`), so a SIGKILL often lands between the request
and the commit: that execution's effect must never be performed. The handler appends
`key nonce pid` to the sink ($EFFECTS_SINK) with O_APPEND + fsync, then holds for a random
time within $EFFECTS_HOLD ("lo,hi" seconds, default none) before returning, so a SIGKILL lands
between the side effect and its done mark. Lines are whole single write(2)s, so they survive.

Agent `fxtx`: every step requests one transactional effect, `ledger.insert`, which inserts
`(thread_id, step, key)` into the user's table `fx_ledger` inside the step's transaction. It
logs `key pid` to $EFFECTS_APPLIED when called, then holds the transaction open for a random
time within $EFFECTS_TX_HOLD, so a SIGKILL lands mid-commit.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import psycopg

import tether

from . import CALL_LOG_ENV

SINK_ENV = "EFFECTS_SINK"
HOLD_ENV = "EFFECTS_HOLD"
APPLIED_ENV = "EFFECTS_APPLIED"
TX_HOLD_ENV = "EFFECTS_TX_HOLD"
LEDGER = "fx_ledger"

agent = tether.Agent("fx")
tx_agent = tether.Agent("fxtx")


def append_line(path: str, line: str, *, fsync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _hold(env: str) -> float:
    raw = os.environ.get(env, "")
    if not raw:
        return 0.0
    lo, hi = (float(x) for x in raw.split(","))
    return random.uniform(lo, hi)


def _next(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    update = {"done": tether.append([ctx.step])}
    if ctx.step >= state["steps"]:
        return tether.finish({**update, "finished": True})
    return tether.goto("work", update)


@agent.node(start=True)
async def work(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    nonce = uuid.uuid4().hex
    key = ctx.effect("sink.write", {"thread_id": ctx.thread_id, "step": ctx.step,
                                    "nonce": nonce})
    append_line(os.environ[CALL_LOG_ENV], f"{key} {nonce} {os.getpid()}\n")
    await asyncio.sleep(random.uniform(*state["pause"]))
    return _next(state, ctx)


@tx_agent.node(name="work", start=True)
async def tx_work(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    ctx.effect("ledger.insert", {"thread_id": ctx.thread_id, "step": ctx.step})
    await asyncio.sleep(random.uniform(*state["pause"]))
    return _next(state, ctx)


async def sink_write(payload: dict[str, Any], key: str) -> dict[str, Any]:
    """The outside world's side effect: durable once this returns from fsync."""
    append_line(os.environ[SINK_ENV], f"{key} {payload['nonce']} {os.getpid()}\n", fsync=True)
    hold = _hold(HOLD_ENV)
    if hold:
        await asyncio.sleep(hold)
    return {"written": key}


INSERT_SQLITE = f"INSERT INTO {LEDGER} (thread_id, step, key) VALUES (?, ?, ?)"
INSERT_PG = f"INSERT INTO {LEDGER} (thread_id, step, key) VALUES (%s, %s, %s)"


def ledger_insert_sqlite(conn: sqlite3.Connection, payload: dict[str, Any], key: str) -> None:
    append_line(os.environ[APPLIED_ENV], f"{key} {os.getpid()}\n")
    conn.execute(INSERT_SQLITE, (payload["thread_id"], payload["step"], key))
    hold = _hold(TX_HOLD_ENV)
    if hold:
        time.sleep(hold)  # the step's write transaction stays open meanwhile


async def ledger_insert_pg(conn: psycopg.AsyncConnection[Any], payload: dict[str, Any],
                           key: str) -> None:
    append_line(os.environ[APPLIED_ENV], f"{key} {os.getpid()}\n")
    await conn.execute(INSERT_PG, (payload["thread_id"], payload["step"], key))
    hold = _hold(TX_HOLD_ENV)
    if hold:
        await asyncio.sleep(hold)


def make_runtime() -> tether.Runtime:
    rt = tether.Runtime(os.environ.get("TETHER_DB"), agents=[agent, tx_agent], version="v1")
    rt.effect("sink.write", retry=tether.RetryPolicy(attempts=1000, initial=0.05,
                                                     maximum=0.5))(sink_write)
    if rt.store.dialect == "sqlite":
        rt.effect("ledger.insert", transactional=True)(ledger_insert_sqlite)
    else:
        rt.effect("ledger.insert", transactional=True)(ledger_insert_pg)
    return rt


def run_input(i: int, *, steps: int, pause: tuple[float, float] = (0.005, 0.03)
              ) -> dict[str, Any]:
    return {"i": i, "steps": steps, "pause": list(pause)}


# -- reading what happened -------------------------------------------------------------------


class Line(NamedTuple):
    key: str
    nonce: str
    pid: int


def read_lines(path: Path) -> list[Line]:
    """`key nonce pid` lines (sink or request log), in the order they were written."""
    if not path.exists():
        return []
    out = []
    for raw in path.read_text().splitlines():
        key, nonce, pid = raw.split(" ")
        out.append(Line(key, nonce, int(pid)))
    return out


def by_key(lines: list[Line]) -> dict[str, list[Line]]:
    """The sink deduplicated by key: every delivery of each key."""
    out: dict[str, list[Line]] = defaultdict(list)
    for line in lines:
        out[line.key].append(line)
    return out


def read_applied(path: Path) -> list[tuple[str, int]]:
    if not path.exists():
        return []
    return [(k, int(p)) for k, p in (raw.split(" ") for raw in path.read_text().splitlines())]


# -- the user's table ------------------------------------------------------------------------


def _sqlite_path(db_url: str) -> str:
    return urlsplit(db_url).path[1:]


def create_ledger(db_url: str) -> None:
    ddl = f"CREATE TABLE {LEDGER} (thread_id TEXT NOT NULL, step INTEGER NOT NULL, key TEXT)"
    if db_url.startswith("sqlite:"):
        conn = sqlite3.connect(_sqlite_path(db_url), isolation_level=None)
        try:
            conn.execute(ddl)
        finally:
            conn.close()
    else:
        with psycopg.connect(db_url, autocommit=True) as pg:
            pg.execute(ddl.encode())


def ledger_rows(db_url: str) -> list[tuple[str, int, str]]:
    """Every committed row of the user's table (duplicates included), sorted."""
    query = f"SELECT thread_id, step, key FROM {LEDGER}"
    if db_url.startswith("sqlite:"):
        conn = sqlite3.connect(_sqlite_path(db_url), isolation_level=None, timeout=30)
        try:
            rows = conn.execute(query).fetchall()
        finally:
            conn.close()
    else:
        with psycopg.connect(db_url, autocommit=True) as pg:
            rows = pg.execute(query.encode()).fetchall()
    return sorted((str(t), int(s), str(k)) for t, s, k in rows)
