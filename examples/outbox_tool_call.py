"""A tool call performed once: it writes to the outbox first; a separate task performs it;
running the same tool call twice performs it once.

    python examples/outbox_tool_call.py

The node requests `send_invoice` with `ctx.effect`: the request is a row committed in the same
transaction as the step's checkpoint. The worker's dispatcher (a separate task) performs it
after the commit with a dedup key. We then re-deliver the same effect by hand, as a crash
between "performed" and "marked done" would, and the idempotent handler performs it once.
"""

from __future__ import annotations

import asyncio
import os
import tempfile

import tether

billing = tether.Agent("billing")
PATH = os.path.join(tempfile.mkdtemp(), "outbox.db")
runtime = tether.Runtime(f"sqlite:///{PATH}", agents=[billing], poll_interval=0.05)
sent: dict[str, dict] = {}  # the invoice service: idempotent on the dedup key
calls = 0


@runtime.effect("send_invoice")
async def send_invoice(payload: dict, key: str) -> dict:
    global calls
    calls += 1
    if key not in sent:  # the idempotent consumer: a key is performed once
        sent[key] = payload
    return {"invoice": key}


@billing.node(start=True)
async def bill(state: dict, ctx: tether.Context) -> tether.Command:
    key = ctx.effect("send_invoice", {"customer": state["customer"], "amount": 42})
    return tether.finish({"invoice_key": key})


async def main() -> None:
    await runtime.migrate()
    async with runtime:
        stop = asyncio.Event()
        worker = asyncio.create_task(runtime.work(concurrency=4, stop=stop))
        run = await runtime.start(billing, {"customer": "ada"})
        done = await runtime.wait(run.thread_id, timeout=10)
        key = done.state["invoice_key"]
        for _ in range(100):
            effects = await runtime.effects(run.thread_id)
            if effects and effects[0].status == "done":
                break
            await asyncio.sleep(0.02)
        print(f"step committed the request; the dispatcher performed it: {effects[0].status}")
        # Deliver the same tool call again (what at-least-once delivery does after a crash).
        await send_invoice({"customer": "ada", "amount": 42}, key)
        stop.set()
        await worker
        print(f"handler called {calls} times with key {key!r}; invoices sent: {len(sent)}")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(PATH + suffix):
            os.remove(PATH + suffix)
    os.rmdir(os.path.dirname(PATH))


if __name__ == "__main__":
    asyncio.run(main())
