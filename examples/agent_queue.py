"""An agent queue, made durable: one agent with an inbox stepping Idle -> Processing ->
Response -> Idle for each batch of mail.

    python examples/agent_queue.py

The agent is an actor run: `tether.receive()` parks it (Idle: only a row, no worker, no
memory); a message makes it claimable (Processing); its replies are committed with its
checkpoint (Response); then it parks again (Idle).
"""

from __future__ import annotations

import asyncio
import os
import tempfile

import tether

agent = tether.Agent("answerer")
client = tether.Agent("client")


async def think(question: str) -> str:
    await asyncio.sleep(0.05)  # a simulated LLM call
    return f"answer to {question!r}"


@agent.node(start=True)
async def serve(state: dict, ctx: tether.Context) -> tether.Command:
    answered = state.get("answered", 0)
    for msg in ctx.inbox:
        reply = await ctx.call(think, msg.body["question"])
        if msg.sender:
            ctx.send(msg.sender, {"reply": reply})
        answered += 1
    return tether.receive({"answered": answered})


@client.node(start=True)
async def listen(state: dict, ctx: tether.Context) -> tether.Command:
    replies = state.get("replies", []) + [m.body["reply"] for m in ctx.inbox]
    if len(replies) >= state["expect"]:
        return tether.finish({"replies": replies})
    return tether.receive({"replies": replies})


async def main() -> None:
    path = os.path.join(tempfile.mkdtemp(), "queue.db")
    runtime = tether.Runtime(f"sqlite:///{path}", agents=[agent, client], poll_interval=0.05)
    await runtime.migrate()
    async with runtime:
        stop = asyncio.Event()
        worker = asyncio.create_task(runtime.work(concurrency=10, stop=stop))
        queue = await runtime.start(agent, {})
        me = await runtime.start(client, {"expect": 3})

        async def watch() -> None:
            async for event in runtime.subscribe(queue.thread_id):
                if event["type"] in ("idle", "processing", "response"):
                    extra = {"processing": f"{event.get('inbox')} message(s) in its inbox",
                             "response": f"{event.get('sent')} reply committed with step "
                                         f"{event['step']}",
                             "idle": "parked: no worker, no memory held"}[event["type"]]
                    print(f"  agent -> {event['type'].upper():<10} {extra}")

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.2)
        for q in ("what is a lease?", "what is a checkpoint?", "what is an outbox?"):
            print(f"send: {q}")
            await runtime.send(queue.thread_id, {"question": q}, sender=me.thread_id)
            await asyncio.sleep(0.3)
        done = await runtime.wait(me.thread_id, timeout=10)
        watcher.cancel()
        print("client got:", *done.state["replies"], sep="\n  ")
        stop.set()
        await worker
        await runtime.cancel(queue.thread_id)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    os.rmdir(os.path.dirname(path))


if __name__ == "__main__":
    asyncio.run(main())
