"""LLM calls end to end, in process, on every store, through the real `openai` and
`anthropic` SDKs against tether.testing.FakeLLM: streamed calls journaled once and replayed
without calling, provider failures as retry decisions (429 after its Retry-After, 400 at
once), per-call timeout and retry, token usage summed per run, CPU work in the worker's
process pool, typed state where an agent opts in."""

from __future__ import annotations

import asyncio
import datetime
import functools
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import openai
import pydantic
import pytest
from anthropic.types import Message
from openai.types.chat import ChatCompletion

from apps import inprocess
from apps.cpu_work import burn
from tether import Agent, Command, Context, RetryPolicy, Runtime, finish, goto
from tether.errors import CallTimeout
from tether.testing import FakeLLM, Reply, ToolCall

State = dict[str, Any]
WAIT = 30.0
make_runtime = functools.partial(inprocess.make_runtime, poll_interval=0.02)
ASK = [{"role": "user", "content": "plan a trip"}]


@pytest.fixture
def fake() -> Iterator[tuple[FakeLLM, str]]:
    server = FakeLLM()
    with server.serve() as url:
        yield server, url


async def collect(rt: Runtime, thread_id: str, into: list[dict[str, Any]]) -> None:
    async for event in rt.subscribe(thread_id):
        into.append(event)


async def run_to_end(rt: Runtime, agent: str, events: list[dict[str, Any]] | None = None,
                     thread_id: str = "t1") -> Any:
    async with inprocess.working(rt, close=False):
        listener = None
        if events is not None:
            listener = asyncio.create_task(collect(rt, thread_id, events))
            await asyncio.sleep(0)
        await rt.start(agent, {}, thread_id=thread_id)
        done = await rt.wait(thread_id, timeout=WAIT)
        full = await rt.get(thread_id)
        if listener is not None:
            await asyncio.wait_for(listener, WAIT)
    await rt.close()
    assert done.status == full.status
    return full


async def test_a_streamed_openai_call_is_forwarded_journaled_once_and_replayed(
        db_url: str, fake: tuple[FakeLLM, str]) -> None:
    server, url = fake
    server.script(Reply(text="Lisbon then Porto", tool_calls=[ToolCall("book", {"city": "Porto"})]))
    seen: list[tuple[int, ChatCompletion]] = []
    agent = Agent("streamer")

    @agent.node(start=True, retry=RetryPolicy(attempts=2, initial=0.01))
    async def plan(state: State, ctx: Context) -> Command:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client:
            answer = await ctx.stream_call(client.chat.completions.create, model="m",
                                           messages=ASK, stream=True,
                                           stream_options={"include_usage": True})
        seen.append((ctx.attempt, answer))
        if ctx.attempt == 1:
            raise ConnectionError("the step fails after the stream was journaled")
        return finish({"text": answer.choices[0].message.content})

    events: list[dict[str, Any]] = []
    run = await run_to_end(make_runtime(db_url, agent), "streamer", events)
    assert run.status == "completed", run.error
    assert len(server.requests) == 1  # the re-executed step did not call again
    (first, live), (second, replayed) = seen
    assert (first, second) == (1, 2)
    assert type(live) is ChatCompletion and type(replayed) is ChatCompletion
    assert replayed == live
    assert replayed.choices[0].message.tool_calls[0].function.name == "book"  # type: ignore[index,union-attr]
    streamed = [e for e in events if e["type"] == "stream"]
    text = "".join(choice["delta"].get("content", "") for e in streamed
                   for choice in e["data"].get("choices", []))
    assert text == "Lisbon then Porto"
    assert {e["call"] for e in streamed} == {0}
    replays = [e for e in events if e["type"] == "replayed"]
    assert len(replays) == 1 and replays[0]["data"]["choices"][0]["message"]["content"] == text
    assert run.usage == server.usage() == {"input_tokens": 3, "output_tokens": 3 + 10}


async def test_a_streamed_anthropic_call_assembles_a_message(
        db_url: str, fake: tuple[FakeLLM, str]) -> None:
    server, url = fake
    server.script(Reply(text="Bonjour", tool_calls=[ToolCall("translate", {"to": "pt"})]),
                  Reply(text="Thanks", input_tokens=7, output_tokens=1))
    agent = Agent("claude")

    @agent.node(start=True)
    async def ask(state: State, ctx: Context) -> Command:
        async with anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as client:
            first = await ctx.stream_call(client.messages.create, model="m", max_tokens=64,
                                          messages=ASK, stream=True)
            second = await ctx.call(client.messages.create, model="m", max_tokens=64,
                                    messages=ASK)
        assert type(first) is Message and type(second) is Message
        return finish({"said": first.content[0].text, "tool": first.content[1].input,
                       "then": second.content[0].text})

    run = await run_to_end(make_runtime(db_url, agent), "claude")
    assert run.status == "completed", run.error
    assert run.state == {"said": "Bonjour", "tool": {"to": "pt"}, "then": "Thanks"}
    assert run.usage == server.usage() == {"input_tokens": 3 + 7, "output_tokens": 11 + 1}


async def test_a_rate_limit_is_retried_after_its_retry_after(
        db_url: str, fake: tuple[FakeLLM, str]) -> None:
    server, url = fake
    server.script(Reply(status=429, error="rate limited, slow down", retry_after=0.6),
                  Reply(text="fine now"))
    asked: list[float] = []
    agent = Agent("limited")

    @agent.node(start=True, retry=RetryPolicy(attempts=3, initial=0.01))
    async def ask(state: State, ctx: Context) -> Command:
        asked.append(time.monotonic())
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client:
            answer = await ctx.call(client.chat.completions.create, model="m", messages=ASK)
        return finish({"text": answer.choices[0].message.content, "attempt": ctx.attempt})

    events: list[dict[str, Any]] = []
    run = await run_to_end(make_runtime(db_url, agent), "limited", events)
    assert run.status == "completed", run.error
    assert run.state == {"text": "fine now", "attempt": 2}
    assert asked[1] - asked[0] >= 0.6  # the backoff alone would have been 0.01 s
    retrying = [e for e in events if e["type"] == "retrying"]
    assert [(e["category"], e["failures"]) for e in retrying] == [("llm_provider", 1)]
    assert retrying[0]["delay"] >= 0.6 and "RateLimitError" in retrying[0]["error"]
    assert run.usage == server.usage()


async def test_a_request_error_fails_the_run_at_once_with_the_providers_message(
        db_url: str, fake: tuple[FakeLLM, str]) -> None:
    server, url = fake
    server.script(Reply(status=400, error="model 'gpt-9' does not exist"))
    agent = Agent("bad_request")

    @agent.node(start=True, retry=RetryPolicy(attempts=5, initial=0.01))
    async def ask(state: State, ctx: Context) -> Command:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client:
            await ctx.call(client.chat.completions.create, model="gpt-9", messages=ASK,
                           retry=RetryPolicy(attempts=4, initial=0.01))
        return finish()

    run = await run_to_end(make_runtime(db_url, agent), "bad_request")
    assert run.status == "failed"
    assert run.error is not None and run.error.category == "llm_provider"
    assert run.error.type == "BadRequestError"
    assert "model 'gpt-9' does not exist" in run.error.message
    assert len(server.requests) == 1  # neither the call's policy nor the node's retried it
    assert run.usage == {}


async def test_a_call_retries_in_place_and_times_out(db_url: str, fake: tuple[FakeLLM, str]) -> None:
    server, url = fake
    server.script(Reply(status=503, error="unavailable"), Reply(text="second try"))
    slow_calls: list[int] = []

    async def slow_tool(n: int) -> int:
        slow_calls.append(n)
        if len(slow_calls) == 1:
            await asyncio.sleep(5)
        return n * 2

    agent = Agent("in_place")

    @agent.node(start=True, retry=RetryPolicy(attempts=1))
    async def ask(state: State, ctx: Context) -> Command:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client:
            answer = await ctx.call(client.chat.completions.create, model="m", messages=ASK,
                                    retry=RetryPolicy(attempts=2, initial=0.01))
        doubled = await ctx.call(slow_tool, 21, timeout=0.2,
                                 retry=RetryPolicy(attempts=2, initial=0.01))
        return finish({"text": answer.choices[0].message.content, "doubled": doubled,
                       "attempt": ctx.attempt})

    events: list[dict[str, Any]] = []
    run = await run_to_end(make_runtime(db_url, agent), "in_place", events)
    assert run.status == "completed", run.error
    assert run.state == {"text": "second try", "doubled": 42, "attempt": 1}
    assert len(server.requests) == 2 and slow_calls == [21, 21]
    retries = [(e["call"], e["category"], e["error"].split(":")[0]) for e in events
               if e["type"] == "call_retry"]
    assert retries == [(0, "llm_provider", "InternalServerError"), (1, "llm_provider", "CallTimeout")]


async def test_a_timeout_without_retry_reaches_the_node_policy(db_url: str) -> None:
    async def hang() -> None:
        await asyncio.sleep(5)

    agent = Agent("hangs")

    @agent.node(start=True, retry=RetryPolicy(attempts=1))
    async def ask(state: State, ctx: Context) -> Command:
        try:
            await ctx.call(hang, timeout=0.05)
        except CallTimeout as exc:
            assert isinstance(exc, TimeoutError)
            raise
        return finish()

    run = await run_to_end(make_runtime(db_url, agent), "hangs")
    assert run.status == "failed" and run.error is not None
    assert (run.error.category, run.error.type) == ("llm_provider", "CallTimeout")


async def test_cpu_calls_run_in_the_process_pool_and_are_journaled(db_url: str) -> None:
    results: list[tuple[int, dict[str, int]]] = []
    agent = Agent("cpu")

    @agent.node(start=True, retry=RetryPolicy(attempts=2, initial=0.01))
    async def crunch(state: State, ctx: Context) -> Command:
        out = await ctx.cpu_call(burn, 0.05)
        results.append((ctx.attempt, out))
        if ctx.attempt == 1:
            raise ConnectionError("after the CPU call was journaled")
        return finish({"pid": out["pid"]})

    rt = make_runtime(db_url, agent, cpu_workers=1)
    run = await run_to_end(rt, "cpu")
    assert run.status == "completed", run.error
    (a1, live), (a2, replayed) = results
    assert (a1, a2) == (1, 2) and live == replayed  # replayed, not burnt again
    assert live["pid"] != os.getpid() and live["loops"] > 0


async def test_a_cpu_call_of_a_local_function_is_refused_clearly(db_url: str) -> None:
    agent = Agent("cpu_local")

    @agent.node(start=True, retry=RetryPolicy(attempts=1))
    async def crunch(state: State, ctx: Context) -> Command:
        await ctx.cpu_call(lambda: 1)
        return finish()

    run = await run_to_end(make_runtime(db_url, agent, cpu_workers=1), "cpu_local")
    assert run.status == "failed" and run.error is not None
    assert run.error.category == "definition"
    assert "must be picklable" in run.error.message


class Booking(pydantic.BaseModel):
    city: str
    at: datetime.datetime


async def test_typed_state_where_the_agent_opts_in(db_url: str) -> None:
    at = datetime.datetime(2026, 12, 24, 9, 30, tzinfo=datetime.UTC)
    typed = Agent("typed_state", typed_state=True)
    plain = Agent("plain_state", retry=RetryPolicy(attempts=1))

    @typed.node(start=True)
    async def book(state: State, ctx: Context) -> Command:
        return goto("check", {"booking": Booking(city="Porto", at=at), "when": at})

    @typed.node
    async def check(state: State, ctx: Context) -> Command:
        assert type(state["booking"]) is Booking
        return finish({"ok": state["booking"].at == state["when"]})

    @plain.node(start=True)
    async def refuse(state: State, ctx: Context) -> Command:
        return finish({"booking": Booking(city="Porto", at=at)})

    rt = make_runtime(db_url, typed, plain, snapshot_every=1)
    async with inprocess.working(rt, close=False):
        await rt.start("typed_state", {}, thread_id="typed")
        await rt.start("plain_state", {}, thread_id="plain")
        done = await rt.wait("typed", timeout=WAIT)
        refused = await rt.wait("plain", timeout=WAIT)
        cps = await rt.checkpoints("typed")
    await rt.close()
    assert done.status == "completed", done.error
    assert done.state == {"booking": Booking(city="Porto", at=at), "when": at, "ok": True}
    assert type(cps[0].state["booking"]) is Booking
    assert refused.status == "failed" and refused.error is not None
    assert refused.error.category == "serialization" and "'Booking'" in refused.error.message


async def chunks_of(text: str) -> AsyncIterator[str]:
    for word in text.split():
        yield word + " "


async def test_stream_call_takes_any_async_iterator_and_an_assembler(db_url: str) -> None:
    agent = Agent("words")

    @agent.node(start=True)
    async def speak(state: State, ctx: Context) -> Command:
        joined = await ctx.stream_call(chunks_of, "to be durable")
        counted = await ctx.stream_call(chunks_of, "a b c", assemble=len)
        return finish({"joined": joined, "counted": counted})

    run = await run_to_end(make_runtime(db_url, agent), "words")
    assert run.state == {"joined": "to be durable ", "counted": 3}
