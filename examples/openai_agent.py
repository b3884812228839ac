"""A tool-using OpenAI agent with a human approval, made durable by tether.

    python examples/openai_agent.py          # offline, against tether.testing.FakeLLM
    OPENAI_API_KEY=sk-... python examples/openai_agent.py --real    # the real API

(`pip install "tether[llm,server]"`: the `openai` SDK, and FastAPI for the fake server.) With
`--real` the SDK reads its usual environment (OPENAI_API_KEY, OPENAI_BASE_URL); the model is
OPENAI_MODEL, default gpt-4o-mini.

`think` streams the model's answer with ctx.stream_call: tokens go to the run's live events as
they arrive, the assembled ChatCompletion is journaled once (a crash after it never pays for
the call again, and the replay gets a ChatCompletion back). When the model asks for the
`refund` tool, `approve` parks the run for a person (ctx.interrupt: no worker, no memory held),
then performs the approved refund as a journaled call and hands the result back to the model.
Run.usage is the tokens the run consumed, each call counted once.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from typing import Any

import openai

import tether

MODEL = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
BASE_URL: str | None = None  # the fake server's, offline; None: the SDK's environment
TOOLS: list[Any] = [{"type": "function", "function": {
    "name": "refund", "description": "Refund an order, in euros.",
    "parameters": {"type": "object", "required": ["order", "amount"], "properties": {
        "order": {"type": "string"}, "amount": {"type": "number"}}}}}]

support = tether.Agent("support", retry=tether.RetryPolicy(attempts=4, initial=0.5))


def client() -> openai.AsyncOpenAI:
    # max_retries=0: rate limits and 5xx are tether's retry decisions (after Retry-After).
    return openai.AsyncOpenAI(base_url=BASE_URL, max_retries=0,
                              api_key=os.environ.get("OPENAI_API_KEY", "offline"))


async def refund(order: str, amount: float) -> dict[str, Any]:
    """The tool: a real one would call the payments API, idempotent on the order."""
    return {"order": order, "refunded": amount, "status": "done"}


@support.node(start=True)
async def think(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    async with client() as llm:
        completion = await ctx.stream_call(
            llm.chat.completions.create, model=MODEL, messages=state["messages"], tools=TOOLS,
            stream=True, stream_options={"include_usage": True})
    message = completion.choices[0].message
    messages = [*state["messages"], message.model_dump(exclude_none=True)]
    if message.tool_calls:
        return tether.goto("approve", {"messages": messages})
    return tether.finish({"messages": messages, "answer": message.content})


@support.node
async def approve(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
    call = state["messages"][-1]["tool_calls"][0]
    args = json.loads(call["function"]["arguments"])
    decision = ctx.interrupt({"tool": call["function"]["name"], "args": args})
    result = (await ctx.call(refund, **args) if decision.get("approve")
              else {"refused": "a person declined the refund"})
    reply = {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
    return tether.goto("think", {"messages": [*state["messages"], reply]})


async def run(db_url: str) -> tether.Run:
    runtime = tether.Runtime(db_url, agents=[support], poll_interval=0.05)
    await runtime.migrate()
    async with runtime:
        stop = asyncio.Event()
        worker = asyncio.create_task(runtime.work(concurrency=10, stop=stop))
        question = "My order A-17 arrived broken; can I get my 25 EUR back?"
        started = await runtime.start(support, {"messages": [
            {"role": "system", "content": "You are a support agent; use refund when fair."},
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
    """What a client of GET /runs/{id}/events sees: the tokens as the model writes them."""
    async for event in runtime.subscribe(thread_id):
        if event["type"] == "stream":
            for choice in event["data"].get("choices", []):
                print(choice.get("delta", {}).get("content", ""), end="", flush=True)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tether-openai-") as tmp:  # removed afterwards
        return main_on(f"sqlite:///{os.path.join(tmp, 'openai_agent.db')}")


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
            BASE_URL = f"{url}/v1"
            done = asyncio.run(run(db_url))
        assert done.usage == fake.usage(), (done.usage, fake.usage())
    print(f"\n{done.status}: {done.state.get('answer')}\nusage: {done.usage}")
    return 0 if done.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
