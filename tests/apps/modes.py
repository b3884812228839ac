"""An agent whose first step does what its input's `mode` says (plain, fail, ask, sleep), and
a check of a column the database keeps from a run's status: the tests of runs.finished_at and
runs.idle_at share both."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any

import psycopg

from tether import Agent, Command, Context, RetryPolicy, finish, goto

State = dict[str, Any]


def modes_agent(name: str, sleep_s: float) -> Agent:
    """`mode`: plain (two steps), fail (raises, no retry), ask (an interrupt), sleep
    (`sleep_s`, then on as plain)."""
    agent = Agent(name, retry=RetryPolicy(attempts=1, initial=0.01))

    @agent.node(start=True)
    async def first(state: State, ctx: Context) -> Command:
        mode = state["mode"]
        if mode == "fail":
            raise RuntimeError("no")
        if mode == "ask":
            return finish({"answer": ctx.interrupt({"q": "?"})})
        if mode == "sleep":
            ctx.sleep(sleep_s)
        return goto("second", {"n": 1})

    @agent.node
    async def second(state: State, ctx: Context) -> Command:
        return finish({"n": 2})

    return agent


def rows_off(url: str, check: str) -> list[tuple[Any, ...]]:
    """The rows `check` (a query with IS DISTINCT FROM) finds, on either store."""
    if url.startswith("sqlite"):
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db:
            return db.execute(check.replace("IS DISTINCT FROM", "IS NOT")).fetchall()
    with psycopg.connect(url, autocommit=True) as pg:
        return pg.execute(check.encode()).fetchall()
