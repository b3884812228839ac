"""Compensation (saga): book a flight, book a hotel, charge the card; the card is declined,
so the run fails and the bookings are cancelled, in reverse order, each exactly once.

    python examples/saga.py

Each booking is an outbox effect (`ctx.effect`) performed after its step commits, with a stable
dedup key. A `compensate` handler is registered with it; when the run fails for good (or is
cancelled), tether queues one compensation per effect, newest first, each itself an outbox
effect with its own key (`<key>:compensate`) and the original payload and result.
"""

from __future__ import annotations

import asyncio
import os
import tempfile

import tether

trip = tether.Agent("trip")
PATH = os.path.join(tempfile.mkdtemp(), "saga.db")
runtime = tether.Runtime(f"sqlite:///{PATH}", agents=[trip], poll_interval=0.05)
ledger: list[str] = []  # the outside world; a real handler would call an API with `key`


async def cancel_booking(data: dict, key: str) -> None:
    ledger.append(f"cancel {data['result']['booking']}  (key {key})")


@runtime.effect("book", compensate=cancel_booking)
async def book(payload: dict, key: str) -> dict:
    ledger.append(f"book   {payload['what']}  (key {key})")
    return {"booking": f"#{len(ledger)} {payload['what']}"}


class CardDeclined(Exception):
    pass


async def charge_card(amount: int) -> str:
    raise CardDeclined(f"card declined for {amount} EUR")


@trip.node(start=True)
async def flight(state: dict, ctx: tether.Context) -> tether.Command:
    ctx.effect("book", {"what": "flight CDG-BCN"})
    return tether.goto("hotel")


@trip.node
async def hotel(state: dict, ctx: tether.Context) -> tether.Command:
    ctx.effect("book", {"what": "hotel Barcelona, 2 nights"})
    return tether.goto("pay")


@trip.node(retry=tether.RetryPolicy(attempts=2, initial=0.05))
async def pay(state: dict, ctx: tether.Context) -> tether.Command:
    receipt = await ctx.call(charge_card, 840)
    return tether.finish({"receipt": receipt})


async def main() -> None:
    await runtime.migrate()
    async with runtime:
        stop = asyncio.Event()
        worker = asyncio.create_task(runtime.work(concurrency=4, stop=stop))
        run = await runtime.start(trip, {})
        done = await runtime.wait(run.thread_id, timeout=10)
        print(f"run {done.status}: {done.error}")
        for _ in range(100):  # compensations are performed by the dispatcher after the failure
            effects = await runtime.effects(run.thread_id)
            if all(e.status in ("done", "dead") for e in effects) and len(effects) == 4:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await worker
        print("what happened outside:", *ledger, sep="\n  ")
        print("outbox:")
        effects = await runtime.effects(run.thread_id)
        width = max(len(e.key) for e in effects)
        for e in effects:
            print(f"  {e.key:<{width}}  {e.status:<7}  attempts={e.attempts}")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(PATH + suffix):
            os.remove(PATH + suffix)
    os.rmdir(os.path.dirname(PATH))


if __name__ == "__main__":
    asyncio.run(main())
