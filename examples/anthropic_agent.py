"""A tool-using Anthropic agent with a human approval, made durable by tether.

    python examples/anthropic_agent.py          # offline, against tether.testing.FakeLLM
    ANTHROPIC_API_KEY=sk-ant-... python examples/anthropic_agent.py --real    # the real API

(`pip install "tether[llm,server]"`: the `anthropic` SDK, and FastAPI for the fake server.)
With `--real` the SDK reads its usual environment (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL);
the model is ANTHROPIC_MODEL, default claude-haiku-4-5.

`think` streams the model's answer with ctx.stream_call: text deltas go to the run's live
events as they arrive, the Message assembled from the stream events is journaled once (a
crash after it never pays for the call again; the replay gets a Message back). When the model
uses the `refund` tool, `approve` parks the run for a person (ctx.interrupt: no worker, no
memory held), then performs the approved refund as a journaled call and returns its result to
the model. Run.usage is the tokens the run consumed, each call counted once.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from typing import Any

import anthropic

import tether

MODEL = os.environ.get("ANTHROPIC_MODEL", "claude-haiku-4-5")
BASE_URL: str | None = None  # the fake server's, offline; None: the SDK's environment
SYSTEM = "You are a support agent; use refund when fair."
TOOLS: list[Any] = [{
    "name": "refund", "description": "Refund an order, in euros.",
    "input_schema": {"type": "object", "required": ["order", "amount"], "properties": {
        "order": {"type": "string"}, "amount": {"type": "number"}}}}]

support = tether.Agent("support", retry=tether.RetryPolicy(attempts=4, initial=0.5))


def client() -> anthropic.AsyncAnthropic:
    # max_retries=0: rate limits, overloads and 5xx are tether's retry decisions.
    return anthropic.AsyncAnthropic(base_url=BASE_URL, max_retries=0,
                                    api_key=os.environ.get("ANTHROPIC_API_KEY", "offline"))


async def refund(order: str, amount: float) -> dict[str, Any]:
    """The tool: a real one would call the payments API, idempotent on the order."""
    return {"order": order, "refunded": amount, "status": "done"}


@support.node(start=True)
async def think(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    async with client() as llm:
        message = await ctx.stream_call(
            llm.messages.create, model=MODEL, max_tokens=1024, system=SYSTEM,
            messages=state["messages"], tools=TOOLS, stream=True)
    content = [block.model_dump(exclude_none=True) for block in message.content]
    messages = [*state["messages"], {"role": "assistant", "content": content}]
    if message.stop_reason == "tool_use":
        return tether.goto("approve", {"messages": messages})
    answer = "".join(b["text"] for b in content if b["type"] == "text")
    return tether.finish({"messages": messages, "answer": answer})


@support.node
async def approve(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    use = next(b for b in state["messages"][-1]["content"] if b["type"] == "tool_use")
    decision = ctx.interrupt({"tool": use["name"], "args": use["input"]})
    result = (await ctx.call(refund, **use["input"]) if decision.get("approve")
              else {"refused": "a person declined the refund"})
    reply = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": use["id"], "content": json.dumps(result)}]}
    return tether.goto("think", {"messages": [*state["messages"], reply]})


async def run(db_url: str) -> tether.Run:
    runtime = tether.Runtime(db_url, agents=[support], poll_interval=0.05)
    await runtime.migrate()
    async with runtime:
        stop = asyncio.Event()
        worker = asyncio.create_task(runtime.work(concurrency=10, stop=stop))
        question = "My order A-17 arrived broken; can I get my 25 EUR back?"
        started = await runtime.start(support, {"messages": [
            {"role": "user", "content": question}]})
        tokens = asyncio.create_task(show_tokens(runtime, started.thread_id))
        waiting = await runtime.wait(started.thread_id, timeout=60, until="waiting")
        [pending] = await runtime.interrupts(thread_id=started.thread_id)
        print(f"\napproval asked: {pending.payload} -> approving")
        await runtime.resume(waiting.thread_id, {"approve": True})
        await runtime.wait(started.thread_id, timeout=60)
        done = await runtime.get(started.thread_id)
        tokens.cancel()
        stop.set()
        await worker
    return done


async def show_tokens(runtime: tether.Runtime, thread_id: str) -> None:
    """What a client of GET /runs/{id}/events sees: the text as the model writes it."""
    async for event in runtime.subscribe(thread_id):
        if event["type"] == "stream" and event["data"].get("type") == "content_block_delta":
            print(event["data"]["delta"].get("text", ""), end="", flush=True)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tether-anthropic-") as tmp:  # removed afterwards
        return main_on(f"sqlite:///{os.path.join(tmp, 'anthropic_agent.db')}")


def main_on(db_url: str) -> int:
    global BASE_URL
    if "--real" in sys.argv[1:]:
        done = asyncio.run(run(db_url))
    else:
        from tether.testing import FakeLLM, Reply, ToolCall

        fake = FakeLLM(model=MODEL)
        fake.script(
            Reply(text="Sorry about that. Let me refund it.", chunk_delay=0.02,
                  tool_calls=[ToolCall("refund", {"order": "A-17", "amount": 25})]),
            Reply(text="Done: 25 EUR are refunded for order A-17.", chunk_delay=0.02))
        with fake.serve() as url:
            BASE_URL = url
            done = asyncio.run(run(db_url))
        assert done.usage == fake.usage(), (done.usage, fake.usage())
    print(f"\n{done.status}: {done.state.get('answer')}\nusage: {done.usage}")
    return 0 if done.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
