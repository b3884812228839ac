"""Effectively-once side effects end to end, in process, on every store: `ctx.effect`, the
dispatcher of a real worker (`runtime.work` as an asyncio task), stable keys, unique explicit
keys, unknown handlers, request order, dead effects and `retry_effect`, wake-up latency,
compensation (saga) on failure and on cancel, and transactional effects."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import sqlite3
import statistics
import time
from collections import defaultdict
from typing import Any

import psycopg

from apps import effects_app
from apps.inprocess import eventually, make_runtime, working
from tether import (
    Agent,
    Command,
    Context,
    DefinitionError,
    DuplicateEffectKey,
    Effect,
    RetryPolicy,
    RunStatus,
    Runtime,
    finish,
    goto,
)

State = dict[str, Any]
WAIT = 20.0  # generous: a wait that times out fails the test, it does not hang it
FAST = RetryPolicy(attempts=3, initial=0.01, factor=1.0, jitter=0.0)



async def settled(rt: Runtime, thread_id: str, count: int, timeout: float = WAIT
                  ) -> list[Effect]:
    """Wait until the run has `count` effects, all done or dead; returns them."""
    got: list[Effect] = []

    async def check() -> bool:
        nonlocal got
        got = await rt.effects(thread_id)
        return len(got) == count and all(e.status in ("done", "dead") for e in got)

    try:
        await eventually(check, f"{count} settled effects of {thread_id}", timeout)
    except AssertionError:
        raise AssertionError(f"effects of {thread_id} did not settle: {got}") from None
    return got


# -- keys -------------------------------------------------------------------------------------


async def test_default_key_is_stable_across_re_executions(db_url: str) -> None:
    agent = Agent("flaky", retry=RetryPolicy(attempts=3, initial=0.01, jitter=0.0))
    executions: list[int] = []
    performed: list[tuple[Any, str]] = []

    @agent.node(start=True)
    async def book(state: State, ctx: Context) -> Command:
        executions.append(ctx.attempt)
        key = ctx.effect("book", {"execution": len(executions)})
        if len(executions) == 1:
            raise RuntimeError("flaky after requesting the effect")
        return finish({"key": key})

    rt = make_runtime(db_url, agent)

    @rt.effect("book")
    async def handler(payload: Any, key: str) -> str:
        performed.append((payload, key))
        return "ok"

    async with working(rt):
        run = await rt.start(agent, {}, thread_id="t-flaky")
        done = await rt.wait(run.thread_id, timeout=WAIT)
        assert done.status == RunStatus.COMPLETED, done.error
        (effect,) = await settled(rt, "t-flaky", 1)
    assert len(executions) == 2
    assert done.state["key"] == "t-flaky:1:0" == effect.key
    assert (effect.step, effect.status, effect.result) == (1, "done", "ok")
    # The failed execution's request leaked nothing; the committed one was performed once.
    assert effect.payload == {"execution": 2}
    assert performed == [({"execution": 2}, "t-flaky:1:0")]


async def test_default_keys_derive_from_thread_step_and_index(db_url: str) -> None:
    agent = Agent("multi")

    @agent.node(start=True)
    async def first(state: State, ctx: Context) -> Command:
        keys = [ctx.effect("note", i) for i in range(3)]
        return goto("second", {"first": keys})

    @agent.node
    async def second(state: State, ctx: Context) -> Command:
        return finish({"second": ctx.effect("note", "x"), "explicit": ctx.effect("note", "y",
                                                                               key="mine")})

    rt = make_runtime(db_url, agent)
    seen: list[str] = []

    @rt.effect("note")
    async def note(payload: Any, key: str) -> None:
        seen.append(key)

    async with working(rt):
        done = await rt.wait((await rt.start(agent, {}, thread_id="m")).thread_id, timeout=WAIT)
        effects = await settled(rt, "m", 5)
    assert done.state["first"] == ["m:1:0", "m:1:1", "m:1:2"]
    assert (done.state["second"], done.state["explicit"]) == ("m:2:0", "mine")
    assert [e.key for e in effects] == ["m:1:0", "m:1:1", "m:1:2", "m:2:0", "mine"]
    assert [e.payload for e in effects] == [0, 1, 2, "x", "y"]
    assert seen == [e.key for e in effects]


async def test_an_explicit_key_reused_in_a_later_step_fails_the_run(db_url: str) -> None:
    agent = Agent("dup", retry=RetryPolicy(attempts=5, initial=0.01))
    executions: list[str] = []

    @agent.node(start=True)
    async def charge(state: State, ctx: Context) -> Command:
        executions.append("charge")
        ctx.effect("pay", {"amount": 1}, key="charge-1")
        return goto("again")

    @agent.node
    async def again(state: State, ctx: Context) -> Command:
        executions.append("again")
        ctx.effect("pay", {"amount": 2}, key="charge-1")
        return finish({"oops": True})

    rt = make_runtime(db_url, agent)
    paid: list[Any] = []

    @rt.effect("pay")
    async def pay(payload: Any, key: str) -> None:
        paid.append(payload)

    async with working(rt):
        run = await rt.wait((await rt.start(agent, {}, thread_id="d")).thread_id, timeout=WAIT)
        (effect,) = await settled(rt, "d", 1)
    assert run.status == RunStatus.FAILED
    assert run.error is not None
    assert run.error.category == "definition"
    assert run.error.type == DuplicateEffectKey.__qualname__
    assert "charge-1" in run.error.message and "unique" in run.error.message
    assert executions == ["charge", "again"], "a definition error is not retried"
    assert run.step == 1 and "oops" not in run.state
    assert (effect.key, effect.step, effect.payload, effect.status) == ("charge-1", 1,
                                                                         {"amount": 1}, "done")
    assert paid == [{"amount": 1}]


async def test_an_explicit_key_reused_within_a_step_raises_at_once(db_url: str) -> None:
    agent = Agent("dup1")
    raised: list[BaseException] = []

    @agent.node(start=True)
    async def charge(state: State, ctx: Context) -> Command:
        ctx.effect("pay", 1, key="k")
        try:
            ctx.effect("pay", 2, key="k")
        except DuplicateEffectKey as exc:
            raised.append(exc)
            raise
        return finish()

    rt = make_runtime(db_url, agent)

    @rt.effect("pay")
    async def pay(payload: Any, key: str) -> None:
        raise AssertionError("nothing of a failed step may be performed")

    async with working(rt):
        run = await rt.wait((await rt.start(agent, {}, thread_id="d1")).thread_id, timeout=WAIT)
        assert await rt.effects("d1") == []
    assert len(raised) == 1 and "'k'" in str(raised[0])
    assert run.status == RunStatus.FAILED and run.error is not None
    assert run.error.category == "definition"


# -- unknown handler --------------------------------------------------------------------------


async def test_an_effect_without_handler_fails_the_step_at_once(db_url: str) -> None:
    agent = Agent("unknown", retry=RetryPolicy(attempts=5, initial=0.01))
    executions: list[int] = []

    @agent.node(start=True)
    async def send(state: State, ctx: Context) -> Command:
        executions.append(ctx.attempt)
        ctx.effect("email.send", {"to": "ada"})
        return finish({"sent": True})

    rt = make_runtime(db_url, agent)

    @rt.effect("sms.send")
    async def sms(payload: Any, key: str) -> None: ...

    @rt.effect("book")
    async def book(payload: Any, key: str) -> None: ...

    async with working(rt):
        run = await rt.wait((await rt.start(agent, {}, thread_id="u")).thread_id, timeout=WAIT)
        assert await rt.effects("u") == []
    assert executions == [1], "an unknown effect is a definition error: no retry"
    assert run.status == RunStatus.FAILED and run.error is not None
    assert run.error.category == "definition"
    assert run.error.type == DefinitionError.__qualname__
    msg = run.error.message
    assert "'email.send'" in msg, msg
    assert "book" in msg and "sms.send" in msg, f"the message should list the handlers: {msg}"
    assert run.step == 0


# -- order ------------------------------------------------------------------------------------


async def test_effects_of_a_run_are_performed_in_request_order(db_url: str) -> None:
    agent = Agent("ordered")

    @agent.node(start=True)
    async def first(state: State, ctx: Context) -> Command:
        for i in range(5):
            ctx.effect("slow", {"n": i})
        return goto("second")

    @agent.node
    async def second(state: State, ctx: Context) -> Command:
        for i in range(5, 8):
            ctx.effect("slow" if i != 6 else "other", {"n": i})
        return finish()

    rt = make_runtime(db_url, agent)
    finished: dict[str, list[int]] = defaultdict(list)
    active: dict[str, int] = defaultdict(int)
    overlaps: list[str] = []

    async def perform(payload: Any, key: str) -> None:
        thread_id = key.split(":")[0]
        active[thread_id] += 1
        if active[thread_id] > 1:
            overlaps.append(key)
        await asyncio.sleep(random.uniform(0, 0.01))  # would reorder concurrent calls
        finished[thread_id].append(payload["n"])
        active[thread_id] -= 1

    rt.effect("slow")(perform)
    rt.effect("other")(perform)
    ids = [f"o{i}" for i in range(6)]
    async with working(rt, concurrency=8):
        for t in ids:
            await rt.start(agent, {}, thread_id=t)
        for t in ids:
            assert (await rt.wait(t, timeout=WAIT)).status == RunStatus.COMPLETED
            await settled(rt, t, 8)
    assert overlaps == [], f"effects of one run were performed concurrently: {overlaps}"
    for t in ids:
        assert finished[t] == list(range(8)), (t, finished[t])


async def test_runs_are_performed_concurrently_each_in_request_order(db_url: str) -> None:
    """Many runs with several effects each, all queued before the worker starts, so the
    dispatcher's claims come in batches of many runs: different runs' effects run side by
    side, one run's never, and a failure that is retried holds back the rest of its run."""
    agent = Agent("many_ordered")

    @agent.node(start=True)
    async def request(state: State, ctx: Context) -> Command:
        for i in range(6):
            ctx.effect("step", {"n": i})
        return finish()

    rt = make_runtime(db_url, agent)
    ids = [f"m{i:02d}" for i in range(30)]
    await asyncio.gather(*(rt.start(agent, {}, thread_id=t) for t in ids))
    finished: dict[str, list[int]] = defaultdict(list)
    active: dict[str, int] = defaultdict(int)
    overlaps: list[str] = []
    most = 0
    failed: set[str] = set()

    async def perform(payload: Any, key: str) -> None:
        nonlocal most
        thread_id = key.split(":")[0]
        active[thread_id] += 1
        most = max(most, sum(1 for n in active.values() if n))
        if active[thread_id] > 1:
            overlaps.append(key)
        try:
            await asyncio.sleep(random.uniform(0, 0.005))
            if payload["n"] == 2 and thread_id in ("m03", "m17") and thread_id not in failed:
                failed.add(thread_id)
                raise RuntimeError("flaky")
            finished[thread_id].append(payload["n"])
        finally:
            active[thread_id] -= 1

    rt.effect("step", retry=FAST)(perform)
    async with working(rt):
        for t in ids:
            await settled(rt, t, 6)
    assert overlaps == [], f"effects of one run were performed concurrently: {overlaps}"
    assert failed == {"m03", "m17"}
    for t in ids:
        assert finished[t] == list(range(6)), (t, finished[t])
    assert most > 1, "effects of different runs should run side by side"


async def test_an_undecodable_payload_is_a_failed_attempt_not_a_dead_worker(
        db_url: str) -> None:
    agent = Agent("garbled")

    @agent.node(start=True)
    async def request(state: State, ctx: Context) -> Command:
        ctx.effect("note", {"n": state["n"]})
        return finish()

    first = make_runtime(db_url, agent)

    async def refuse(payload: Any, key: str) -> None:
        raise RuntimeError("not yet")

    first.effect("note", retry=RetryPolicy(attempts=1))(refuse)
    await first.start(agent, {"n": 1}, thread_id="garbled")
    await first.start(agent, {"n": 2}, thread_id="fine")
    async with working(first):
        (bad,) = await settled(first, "garbled", 1)
        (good,) = await settled(first, "fine", 1)
    assert bad.status == good.status == "dead"
    # The outbox row of "garbled" is damaged by hand: its payload is no longer JSON. Retried,
    # it is a failed attempt each time (dead again at the end); the worker goes on.
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        conn.execute("UPDATE outbox SET payload = x'ff' WHERE thread_id = 'garbled'")
        conn.commit()
        conn.close()
    else:
        with psycopg.connect(db_url, autocommit=True) as pg:
            pg.execute(b"UPDATE outbox SET payload = '\\xff'::bytea WHERE thread_id = 'garbled'")
    rt = make_runtime(db_url, agent)
    seen: list[int] = []

    async def note(payload: Any, key: str) -> None:
        seen.append(payload["n"])

    rt.effect("note", retry=FAST)(note)
    await rt.open()
    async with working(rt) as worker:
        # (through the store: Runtime.retry_effect's Effect would decode the payload)
        assert len(await rt.store.retry_effect(bad.key, "garbled")) == 1
        assert len(await rt.store.retry_effect(good.key, "fine")) == 1

        async def status(thread_id: str, key: str, want: str) -> bool:
            got = await rt.store.get_effect(thread_id, key)
            return got is not None and got.status == want and got.attempts > 0

        await eventually(lambda: status("fine", good.key, "done"), "the good effect done")
        await eventually(lambda: status("garbled", bad.key, "dead"), "the bad one dead again")
        assert not worker.done()
    assert seen == [2]


# -- dead effects and retry_effect ------------------------------------------------------------


async def test_a_failing_handler_is_dead_after_its_attempts_and_retry_revives_it(
        db_url: str) -> None:
    agent = Agent("charge")

    @agent.node(start=True)
    async def charge(state: State, ctx: Context) -> Command:
        return finish({"key": ctx.effect("card.charge", {"amount": 42})})

    rt = make_runtime(db_url, agent)
    calls: list[tuple[Any, str, float]] = []
    declined = True

    @rt.effect("card.charge", retry=RetryPolicy(attempts=3, initial=0.05, factor=2.0,
                                                jitter=0.0))
    async def charge_card(payload: Any, key: str) -> dict[str, Any]:
        calls.append((payload, key, time.monotonic()))
        if declined:
            raise ValueError(f"card declined for {payload['amount']}")
        return {"charged": payload["amount"]}

    async with working(rt):
        run = await rt.wait((await rt.start(agent, {}, thread_id="c")).thread_id, timeout=WAIT)
        assert run.status == RunStatus.COMPLETED, "effects fail on their own, not the run"
        (dead,) = await settled(rt, "c", 1)
        assert (dead.key, dead.status, dead.attempts) == ("c:1:0", "dead", 3)
        assert dead.error is not None and "ValueError" in dead.error
        assert "card declined for 42" in dead.error
        assert dead.result is None and dead.done_at is None
        assert [e.key for e in await rt.effects(status="dead")] == ["c:1:0"]
        assert await rt.effects(status="done") == []
        await asyncio.sleep(0.3)
        assert len(calls) == 3, "no attempt after the last one"
        assert all((p, k) == ({"amount": 42}, "c:1:0") for p, k, _ in calls)
        # Backoff: 0.05 s then 0.1 s between attempts (no jitter).
        gaps = [b[2] - a[2] for a, b in itertools.pairwise(calls)]
        assert gaps[0] >= 0.04 and gaps[1] >= 0.09, gaps

        declined = False
        revived = await rt.retry_effect("c:1:0")
        assert [(e.key, e.status, e.attempts) for e in revived] == [("c:1:0", "pending", 0)]
        (done,) = await settled(rt, "c", 1)
    assert (done.status, done.result, done.attempts) == ("done", {"charged": 42}, 1)
    assert len(calls) == 4 and calls[-1][:2] == ({"amount": 42}, "c:1:0")


async def test_a_handler_that_fails_then_succeeds_is_done_once(db_url: str) -> None:
    agent = Agent("retry")

    @agent.node(start=True)
    async def go(state: State, ctx: Context) -> Command:
        ctx.effect("flaky", "p")
        return finish()

    rt = make_runtime(db_url, agent)
    calls: list[str] = []

    @rt.effect("flaky", retry=FAST)
    async def flaky(payload: Any, key: str) -> str:
        calls.append(key)
        if len(calls) < 3:
            raise ConnectionError("try again")
        return "third time lucky"

    async with working(rt):
        await rt.wait((await rt.start(agent, {}, thread_id="f")).thread_id, timeout=WAIT)
        (e,) = await settled(rt, "f", 1)
    assert (e.status, e.attempts, e.result) == ("done", 3, "third time lucky")
    assert calls == ["f:1:0"] * 3


# -- latency ----------------------------------------------------------------------------------


async def test_an_idle_worker_performs_a_fresh_effect_at_once(db_url: str) -> None:
    """Woken, not polled: the poll interval is 5 s, so anything under 0.5 s is a wake-up."""
    agent = Agent("latency")

    @agent.node(start=True)
    async def go(state: State, ctx: Context) -> Command:
        ctx.effect("ping", state["i"])
        return finish()

    rt = make_runtime(db_url, agent, poll_interval=5.0)
    called: dict[int, float] = {}

    @rt.effect("ping")
    async def ping(payload: Any, key: str) -> None:
        called[payload] = time.time()

    latencies = []
    async with working(rt):
        await asyncio.sleep(0.3)  # the worker and its dispatcher are idle, waiting
        for i in range(20):
            run = await rt.start(agent, {"i": i}, thread_id=f"l{i}")
            await rt.wait(run.thread_id, timeout=WAIT)
            (e,) = await settled(rt, run.thread_id, 1)
            # created_at is written inside the step's transaction, just before its commit.
            latencies.append(called[i] - e.created_at)
            await asyncio.sleep(0.02)
    median = statistics.median(latencies)
    print(f"\n[{rt.store.dialect}] effect commit->handler latency: median "
          f"{median * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms "
          f"(goal 50 ms; n={len(latencies)})")
    assert min(latencies) > -0.05, f"clock skew? {latencies}"
    assert max(latencies) < 0.5, latencies


# -- compensation -----------------------------------------------------------------------------


class CardDeclined(Exception):
    pass


def trip_agent(calls: list[str], *, park: bool = False) -> Agent:
    """flight -> hotel (+ a notification) -> pay, which the card declines; with `park`, the
    run waits for a confirmation after the hotel instead of paying."""
    trip = Agent("trip")

    @trip.node(start=True)
    async def flight(state: State, ctx: Context) -> Command:
        ctx.effect("book", {"what": "flight"})
        return goto("hotel")

    @trip.node
    async def hotel(state: State, ctx: Context) -> Command:
        ctx.effect("book", {"what": "hotel"})
        ctx.effect("notify", {"msg": "hotel booked"})
        return goto("confirm" if park else "pay")

    @trip.node(retry=RetryPolicy(attempts=2, initial=0.01))
    async def pay(state: State, ctx: Context) -> Command:
        calls.append("charge")
        if state.get("decline", True):
            raise CardDeclined("card declined for 840 EUR")
        return finish({"paid": True})

    @trip.node
    async def confirm(state: State, ctx: Context) -> Command:
        ctx.interrupt({"confirm": "trip"})
        return goto("pay")

    return trip


class Bookings:
    """The outside world: bookings made and cancelled, with the key of every call."""

    def __init__(self) -> None:
        self.booked: list[tuple[Any, str]] = []
        self.cancelled: list[tuple[Any, str]] = []
        self.notified: list[str] = []
        self.gate: asyncio.Event | None = None

    def register(self, rt: Runtime) -> None:
        async def cancel_booking(data: Any, key: str) -> dict[str, Any]:
            self.cancelled.append((data, key))
            return {"cancelled": data["result"]["booking"]}

        @rt.effect("book", compensate=cancel_booking, retry=FAST)
        async def book(payload: Any, key: str) -> dict[str, Any]:
            if self.gate is not None:
                await self.gate.wait()
            self.booked.append((payload, key))
            return {"booking": f"{payload['what']}-{len(self.booked)}"}

        @rt.effect("notify")
        async def notify(payload: Any, key: str) -> None:
            self.notified.append(key)


async def test_a_failed_run_compensates_its_effects_in_reverse_order_once(db_url: str) -> None:
    calls: list[str] = []
    trip = trip_agent(calls)
    rt = make_runtime(db_url, trip)
    world = Bookings()
    world.register(rt)
    async with working(rt):
        run = await rt.wait((await rt.start(trip, {}, thread_id="trip")).thread_id,
                            timeout=WAIT)
        assert run.status == RunStatus.FAILED and run.error is not None
        assert run.error.type == "CardDeclined" and calls == ["charge", "charge"]
        effects = await settled(rt, "trip", 5)
        await asyncio.sleep(0.3)  # nothing more happens later
        # Cancelling the failed run changes nothing and queues nothing more.
        again = await rt.cancel("trip")
        assert again.status == RunStatus.FAILED
        await asyncio.sleep(0.3)
        assert len(await rt.effects("trip")) == 5
    assert world.booked == [({"what": "flight"}, "trip:1:0"), ({"what": "hotel"}, "trip:2:0")]
    # Hotel first, then flight; each once, with its own key and the original payload+result.
    assert world.cancelled == [
        ({"payload": {"what": "hotel"}, "result": {"booking": "hotel-2"}},
         "trip:2:0:compensate"),
        ({"payload": {"what": "flight"}, "result": {"booking": "flight-1"}},
         "trip:1:0:compensate"),
    ]
    assert world.notified == ["trip:2:1"], "notify has no compensate handler"
    by_key = {e.key: e for e in effects}
    assert set(by_key) == {"trip:1:0", "trip:2:0", "trip:2:1", "trip:2:0:compensate",
                           "trip:1:0:compensate"}
    assert all(e.status == "done" for e in effects)
    hotel, flight = by_key["trip:2:0:compensate"], by_key["trip:1:0:compensate"]
    assert (hotel.compensates, hotel.name, hotel.payload) == ("trip:2:0", "book",
                                                              {"what": "hotel"})
    assert (flight.compensates, flight.name, flight.payload) == ("trip:1:0", "book",
                                                                 {"what": "flight"})
    assert hotel.result == {"cancelled": "hotel-2"} and flight.result == {"cancelled": "flight-1"}
    assert hotel.attempts == flight.attempts == 1
    assert hotel.done_at is not None and flight.done_at is not None
    assert hotel.done_at <= flight.done_at


async def test_a_completed_run_is_not_compensated(db_url: str) -> None:
    calls: list[str] = []
    trip = trip_agent(calls)
    rt = make_runtime(db_url, trip)
    world = Bookings()
    world.register(rt)
    async with working(rt):
        run = await rt.wait((await rt.start(trip, {"decline": False}, thread_id="ok")).thread_id,
                            timeout=WAIT)
        assert run.status == RunStatus.COMPLETED
        await settled(rt, "ok", 3)
        await asyncio.sleep(0.2)
        assert len(await rt.effects("ok")) == 3
    assert world.cancelled == []


async def test_cancel_compensates_the_run_effects(db_url: str) -> None:
    calls: list[str] = []
    trip = trip_agent(calls, park=True)
    rt = make_runtime(db_url, trip)
    world = Bookings()
    world.register(rt)
    async with working(rt):
        run = await rt.start(trip, {}, thread_id="cx")
        await eventually(lambda: _status_is(rt, "cx", RunStatus.WAITING), "the run to wait")
        await settled(rt, "cx", 3)
        assert world.cancelled == []
        cancelled = await rt.cancel(run.thread_id)
        assert cancelled.status == RunStatus.CANCELLED
        effects = await settled(rt, "cx", 5)
        await asyncio.sleep(0.3)
        await rt.cancel(run.thread_id)  # again: nothing more
        await asyncio.sleep(0.2)
        assert len(await rt.effects("cx")) == 5
    assert calls == []
    assert world.cancelled == [
        ({"payload": {"what": "hotel"}, "result": {"booking": "hotel-2"}}, "cx:2:0:compensate"),
        ({"payload": {"what": "flight"}, "result": {"booking": "flight-1"}},
         "cx:1:0:compensate"),
    ]
    assert all(e.status == "done" for e in effects)
    assert {e.compensates for e in effects} == {None, "cx:1:0", "cx:2:0"}


async def test_a_cancel_from_a_process_without_handlers_still_compensates(db_url: str) -> None:
    """`tether runs cancel THREAD --db URL` (no --app) and other operator processes have no
    effect handlers registered; cancelling a run from there must still compensate it: the
    worker, which has the handlers, performs the compensations."""
    calls: list[str] = []
    trip = trip_agent(calls, park=True)
    rt = make_runtime(db_url, trip)
    world = Bookings()
    world.register(rt)
    operator = Runtime(db_url)  # what the CLI builds without --app
    try:
        async with working(rt):
            await rt.start(trip, {}, thread_id="op-cx")
            await eventually(lambda: _status_is(rt, "op-cx", RunStatus.WAITING),
                             "the run to wait")
            await settled(rt, "op-cx", 3)
            assert (await operator.cancel("op-cx")).status == RunStatus.CANCELLED
            with contextlib.suppress(AssertionError):
                await settled(rt, "op-cx", 5, timeout=3)
            effects = await rt.effects("op-cx")
    finally:
        await operator.close()
    assert [k for _, k in world.cancelled] == ["op-cx:2:0:compensate", "op-cx:1:0:compensate"], (
        f"cancelled without compensation: {[(e.key, e.status) for e in effects]}")


async def _status_is(rt: Runtime, thread_id: str, status: RunStatus) -> bool:
    return (await rt.get(thread_id)).status == status


async def test_cancel_during_a_booking_compensates_after_it(db_url: str) -> None:
    agent = Agent("inflight")

    @agent.node(start=True)
    async def flight(state: State, ctx: Context) -> Command:
        ctx.effect("book", {"what": "flight"})
        return goto("ask")

    @agent.node
    async def ask(state: State, ctx: Context) -> Command:
        ctx.interrupt("ok?")
        return finish()

    rt = make_runtime(db_url, agent)
    world = Bookings()
    world.gate = asyncio.Event()
    world.register(rt)
    async with working(rt):
        await rt.start(agent, {}, thread_id="inf")
        await eventually(lambda: _status_is(rt, "inf", RunStatus.WAITING), "the run to wait")

        async def booking_running() -> bool:
            return [e.status for e in await rt.effects("inf")] == ["running"]

        await eventually(booking_running, "the booking to be in flight")
        await rt.cancel("inf")
        await asyncio.sleep(0.3)
        assert world.cancelled == [], "compensated before the booking finished"
        world.gate.set()
        effects = await settled(rt, "inf", 2)
    assert world.booked == [({"what": "flight"}, "inf:1:0")]
    assert world.cancelled == [({"payload": {"what": "flight"},
                                 "result": {"booking": "flight-1"}}, "inf:1:0:compensate")]
    assert [e.status for e in effects] == ["done", "done"]


# -- transactional effects --------------------------------------------------------------------


def register_ledger(rt: Runtime, calls: list[str], fail_once: set[str]) -> None:
    """ledger.insert: inserts (thread_id, step, key) into the user's table, in the step's
    transaction; raises (after inserting) the first time it sees a key in `fail_once`."""

    def should_fail(key: str) -> bool:
        calls.append(key)
        if key in fail_once:
            fail_once.discard(key)
            return True
        return False

    if rt.store.dialect == "sqlite":
        @rt.effect("ledger.insert", transactional=True)
        def insert_sqlite(conn: sqlite3.Connection, payload: Any, key: str) -> None:
            assert isinstance(conn, sqlite3.Connection) and conn.in_transaction
            conn.execute(effects_app.INSERT_SQLITE, (payload["thread_id"], payload["step"], key))
            if should_fail(key):
                raise RuntimeError("constraint violated")
    else:
        @rt.effect("ledger.insert", transactional=True)
        async def insert_pg(conn: psycopg.AsyncConnection[Any], payload: Any, key: str) -> None:
            assert isinstance(conn, psycopg.AsyncConnection)
            await conn.execute(effects_app.INSERT_PG,
                               (payload["thread_id"], payload["step"], key))
            if should_fail(key):
                raise RuntimeError("constraint violated")


async def test_a_transactional_effect_writes_once_per_committed_step(db_url: str) -> None:
    effects_app.create_ledger(db_url)
    agent = Agent("ledger", retry=RetryPolicy(attempts=3, initial=0.01))
    node_failed: set[int] = set()

    @agent.node(start=True)
    async def work(state: State, ctx: Context) -> Command:
        ctx.effect("ledger.insert", {"thread_id": ctx.thread_id, "step": ctx.step})
        if ctx.step == 2 and 2 not in node_failed:
            node_failed.add(2)
            raise RuntimeError("the node fails after requesting the effect")
        n = state.get("n", 0) + 1
        return goto("work", {"n": n}) if n < 4 else finish({"n": n})

    rt = make_runtime(db_url, agent)
    calls: list[str] = []
    register_ledger(rt, calls, fail_once={"tx:3:0"})
    async with working(rt):
        run = await rt.wait((await rt.start(agent, {}, thread_id="tx")).thread_id, timeout=WAIT)
        effects = await rt.effects("tx")
        cps = await rt.checkpoints("tx")
    assert run.status == RunStatus.COMPLETED, run.error
    assert [cp.step for cp in cps] == [1, 2, 3, 4]
    # Step 2's first execution never reached its commit; step 3's first commit was undone.
    assert calls == ["tx:1:0", "tx:2:0", "tx:3:0", "tx:3:0", "tx:4:0"]
    assert effects_app.ledger_rows(db_url) == [("tx", s, f"tx:{s}:0") for s in range(1, 5)]
    assert [(e.key, e.status) for e in effects] == [(f"tx:{s}:0", "done") for s in range(1, 5)]


async def test_a_transactional_effect_that_always_fails_fails_the_run(db_url: str) -> None:
    effects_app.create_ledger(db_url)
    agent = Agent("ledger", retry=RetryPolicy(attempts=2, initial=0.01))

    @agent.node(start=True)
    async def work(state: State, ctx: Context) -> Command:
        if ctx.step == 1:
            ctx.effect("ledger.insert", {"thread_id": ctx.thread_id, "step": ctx.step})
            return goto("work")
        ctx.effect("ledger.insert", {"thread_id": ctx.thread_id, "step": ctx.step}, key="bad")
        return finish()

    rt = make_runtime(db_url, agent)
    calls: list[str] = []

    class Always(set[str]):
        def discard(self, key: str) -> None:
            pass

    register_ledger(rt, calls, fail_once=Always({"bad"}))
    async with working(rt):
        run = await rt.wait((await rt.start(agent, {}, thread_id="tf")).thread_id, timeout=WAIT)
        effects = await rt.effects("tf")
    assert run.status == RunStatus.FAILED and run.error is not None
    assert run.error.type == "EffectError" and "ledger.insert" in run.error.message
    assert run.step == 1
    assert calls == ["tf:1:0", "bad", "bad"]
    assert effects_app.ledger_rows(db_url) == [("tf", 1, "tf:1:0")]
    assert [(e.key, e.status) for e in effects] == [("tf:1:0", "done")]


async def test_an_operator_retry_from_another_process_wakes_the_dispatcher(db_url: str) -> None:
    """`tether effects retry` runs in another process: on Postgres its NOTIFY wakes the idle
    dispatcher at once (poll interval 5 s); SQLite has no cross-process notification, so
    there the dispatcher's poll (0.2 s here) is the fallback that must pick it up."""
    agent = Agent("op")

    @agent.node(start=True)
    async def go(state: State, ctx: Context) -> Command:
        ctx.effect("fragile", "x")
        return finish()

    postgres = not db_url.startswith("sqlite:")
    rt = make_runtime(db_url, agent, poll_interval=5.0 if postgres else 0.2)
    called: list[float] = []
    fail = True

    @rt.effect("fragile", retry=RetryPolicy(attempts=1))
    async def fragile(payload: Any, key: str) -> None:
        called.append(time.time())
        if fail:
            raise RuntimeError("down")

    operator = make_runtime(db_url, agent)  # its own store and connections
    try:
        async with working(rt):
            await rt.wait((await rt.start(agent, {}, thread_id="op")).thread_id, timeout=WAIT)
            (dead,) = await settled(rt, "op", 1)
            assert dead.status == "dead"
            fail = False
            await asyncio.sleep(0.3)  # idle again
            asked = time.time()
            assert [e.status for e in await operator.retry_effect("op:1:0", "op")] == ["pending"]
            (done,) = await settled(rt, "op", 1)
            assert done.status == "done"
        took = called[-1] - asked
        print(f"\n[{rt.store.dialect}] operator retry->handler latency {took * 1000:.1f} ms")
        assert len(called) == 2
        assert took < 0.5 if postgres else took < 1.0, took
    finally:
        await operator.close()


async def test_a_handler_slower_than_the_lease_is_not_performed_again_meanwhile(
        db_url: str) -> None:
    """The dispatcher holds an effect "under a lease with the same fencing as runs": a live
    worker keeps its lease (runs: heartbeats), so a handler that takes longer than the lease
    TTL must not be claimed and performed again, concurrently, while it still runs."""
    agent = Agent("slow")

    @agent.node(start=True)
    async def go(state: State, ctx: Context) -> Command:
        ctx.effect("slow", "x")
        return finish()

    rt = make_runtime(db_url, agent, lease_ttl=0.3)
    calls: list[float] = []

    @rt.effect("slow")
    async def slow(payload: Any, key: str) -> str:
        calls.append(time.monotonic())
        await asyncio.sleep(1.5)  # five lease TTLs
        return "done"

    async with working(rt):
        await rt.start(agent, {}, thread_id="s")
        (e,) = await settled(rt, "s", 1, timeout=6)
        await asyncio.sleep(0.5)
    assert len(calls) == 1, f"performed {len(calls)} times by one live worker"
    assert (e.status, e.attempts, e.result) == ("done", 1, "done")


async def test_a_stopping_worker_does_not_wait_for_a_hung_handler_beyond_its_grace(
        db_url: str) -> None:
    """On stop (SIGTERM) a worker finishes in-flight work within its shutdown grace (1 s
    here) and exits; a handler that hangs must not keep it alive. Its effect is not lost: it
    is performed again, with the same key, once its lease runs out."""
    agent = Agent("hang")

    @agent.node(start=True)
    async def go(state: State, ctx: Context) -> Command:
        ctx.effect("hang", "x")
        return finish()

    rt = make_runtime(db_url, agent, lease_ttl=1.0)
    calls: list[str] = []
    release = asyncio.Event()

    @rt.effect("hang")
    async def hang(payload: Any, key: str) -> str:
        calls.append(key)
        if len(calls) == 1:
            await release.wait()  # the first call hangs (until the test ends)
        return "ok"

    stop = asyncio.Event()
    task = asyncio.create_task(rt.work(concurrency=4, stop=stop))
    try:
        await rt.start(agent, {}, thread_id="h")
        await eventually(lambda: _has_calls(calls), "the handler to be called")
        stopped = time.monotonic()
        stop.set()
        done, _ = await asyncio.wait([task], timeout=5)
        took = time.monotonic() - stopped
        assert done, "the worker did not stop within 5 s: it waits for the hung handler"
        assert took < 3, took
    finally:
        release.set()
        try:
            await asyncio.wait_for(task, WAIT)
        finally:
            await rt.close()
    # Another worker performs the effect again after the lease runs out.
    rt2 = make_runtime(db_url, agent, lease_ttl=1.0)
    rt2.effect("hang")(hang)
    async with working(rt2):
        (e,) = await settled(rt2, "h", 1)
    assert e.status == "done"
    assert calls == ["h:1:0", "h:1:0"]


async def _has_calls(calls: list[str]) -> bool:
    return bool(calls)
