"""Typed journal results end to end on every store: a pydantic model, a dataclass, datetimes,
... returned by ctx.call are journaled, and a re-executed step gets the same types back from
the journal without calling again; an unsupported result fails the run, naming it."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import functools
import uuid
from typing import Any

import pydantic

from apps import inprocess
from tether import Agent, Command, Context, RetryPolicy, finish
from tether.context import callable_name

State = dict[str, Any]
WAIT = 20.0
make_runtime = functools.partial(inprocess.make_runtime, poll_interval=0.02)


class Usage(pydantic.BaseModel):
    prompt_tokens: int
    completion_tokens: int


class Completion(pydantic.BaseModel):
    id: str
    created: datetime.datetime
    text: str
    usage: Usage


class Role(enum.StrEnum):
    USER = "user"


@dataclasses.dataclass(frozen=True)
class Ticket:
    id: uuid.UUID
    price: decimal.Decimal
    role: Role
    blob: bytes


def complete(calls: list[int], prompt: str) -> Completion:
    calls.append(1)
    return Completion(id="c1", created=datetime.datetime(2026, 12, 1, 9, tzinfo=datetime.UTC),
                      text=f"echo {prompt}", usage=Usage(prompt_tokens=3, completion_tokens=2))


async def ticket(calls: list[int]) -> Ticket:
    calls.append(1)
    return Ticket(uuid.UUID(int=7), decimal.Decimal("9.90"), Role.USER, b"\x00\x01")


async def test_typed_results_read_back_from_the_journal_as_the_same_types(db_url: str) -> None:
    calls: list[int] = []
    seen: list[tuple[int, Any, Any]] = []
    agent = Agent("typed")

    @agent.node(start=True, retry=RetryPolicy(attempts=2, initial=0.01))
    async def work(state: State, ctx: Context) -> Command:
        reply = await ctx.call(complete, calls, "hi")
        t = await ctx.call(ticket, calls)
        seen.append((ctx.attempt, reply, t))
        if ctx.attempt == 1:
            raise ConnectionError("after both calls were journaled")
        return finish({"text": reply.text, "tokens": reply.usage.completion_tokens})

    rt = make_runtime(db_url, agent)
    run = await rt.start("typed", {})
    async with inprocess.working(rt):
        done = await rt.wait(run.thread_id, timeout=WAIT)
    assert done.status == "completed", done.error
    assert calls == [1, 1]  # the second attempt read both results from the journal
    assert [a for a, _, _ in seen] == [1, 2]
    (_, live, live_t), (_, replayed, replayed_t) = seen
    assert type(replayed) is Completion and type(replayed.usage) is Usage
    assert replayed == live == complete([], "hi")
    assert replayed.created.tzinfo is not None
    assert type(replayed_t) is Ticket and replayed_t == live_t
    assert type(replayed_t.role) is Role and type(replayed_t.price) is decimal.Decimal
    assert done.state == {"text": "echo hi", "tokens": 2}


async def test_an_unsupported_result_fails_the_run_naming_it(db_url: str) -> None:
    agent = Agent("untyped")

    def bad() -> dict[str, Any]:
        return {"ok": [1, {"ids": {1, 2}}]}

    @agent.node(start=True)
    async def work(state: State, ctx: Context) -> Command:
        await ctx.call(bad)
        return finish()

    rt = make_runtime(db_url, agent)
    run = await rt.start("untyped", {})
    async with inprocess.working(rt):
        done = await rt.wait(run.thread_id, timeout=WAIT)
    assert done.status == "failed"
    assert done.error is not None and done.error.category == "serialization"
    assert (f"result of call #0 to {callable_name(bad)}['ok'][1]['ids'] has a value of type 'set'"
            in done.error.message)
