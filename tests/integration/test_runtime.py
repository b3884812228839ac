"""The runtime end to end, in process, on every store: runs, the checkpoint log, the journal,
retries and failures, bad input, cancellation. Real databases (the `db_url` fixture), a real
worker (`runtime.work`) as an asyncio task."""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from apps import inprocess
from apps.inprocess import eventually
from tether import (
    Agent,
    Command,
    ConfigError,
    Context,
    DefinitionError,
    LeaseLost,
    RetryPolicy,
    RunConflict,
    RunNotFound,
    RunStatus,
    Runtime,
    SchemaError,
    SerializationError,
    StoreUnavailable,
    append,
    finish,
    goto,
    serde,
)
from tether.context import callable_name
from tether.store.base import Lease

State = dict[str, Any]
WAIT = 20.0  # generous: a wait that times out fails the test, it does not hang it
make_runtime = functools.partial(inprocess.make_runtime, poll_interval=0.02)
working = functools.partial(inprocess.working, concurrency=4)




# -- agents -----------------------------------------------------------------------------------


def pipeline_agent() -> Agent:
    agent = Agent("pipeline")

    @agent.node(start=True)
    async def plan(state: State, ctx: Context) -> Command:
        return goto("research", {"plan": f"plan for {state['topic']}", "log": append(["plan"])})

    @agent.node
    async def research(state: State, ctx: Context) -> Command:
        await asyncio.sleep(0.03)
        return goto("write", {"notes": [state["plan"], "fact"], "log": append(["research"])})

    @agent.node
    async def write(state: State, ctx: Context) -> Command:
        return finish({"report": " / ".join(state["notes"]), "log": append(["write"])})

    return agent


def counter_agent(steps: int) -> Agent:
    agent = Agent("counter")

    @agent.node(start=True)
    async def tick(state: State, ctx: Context) -> Command:
        n = state.get("n", 0) + 1
        update = {"n": n, "log": append([n]), f"k{n % 4}": n * 10}
        return goto("tick", update) if n < steps else finish(update)

    return agent


def expected_counter_state(step: int) -> State:
    state: State = {"start": True}
    for n in range(1, step + 1):
        state["n"] = n
        state.setdefault("log", []).append(n)
        state[f"k{n % 4}"] = n * 10
    return state


# -- runs and the checkpoint log --------------------------------------------------------------


async def test_multi_node_run_completes(db_url: str) -> None:
    rt = make_runtime(db_url, pipeline_agent())
    run = await rt.start("pipeline", {"topic": "tides"})
    assert run.status == RunStatus.QUEUED and run.status == "queued"
    assert run.state == {"topic": "tides"} and run.step == 0 and run.agent == "pipeline"
    async with working(rt):
        done = await rt.wait(run.thread_id, timeout=WAIT)
        got = await rt.get(run.thread_id)
    expected = {
        "topic": "tides",
        "plan": "plan for tides",
        "notes": ["plan for tides", "fact"],
        "report": "plan for tides / fact",
        "log": ["plan", "research", "write"],
    }
    for r in (done, got):
        assert r.status == RunStatus.COMPLETED and r.status.terminal
        assert r.state == expected
        assert r.step == 3
        assert r.version == "v1"
        assert r.error is None


async def test_start_hands_runs_to_a_local_worker_with_free_slots(db_url: str) -> None:
    gate = asyncio.Event()
    agent = Agent("gated")

    @agent.node(start=True)
    async def hold(state: State, ctx: Context) -> Command:
        await gate.wait()
        return finish({"done": ctx.thread_id})

    rt = make_runtime(db_url, agent)
    async with working(rt, concurrency=2):
        await eventually(lambda: bool(rt.local_workers))
        worker = rt.local_workers[0]
        first = await rt.start("gated", {})
        second = await rt.start("gated", {})
        third = await rt.start("gated", {})  # no slot left: queued for any worker
        assert (first.status, second.status, third.status) == ("running", "running", "queued")
        assert first.lease_owner == second.lease_owner == worker.id
        assert third.lease_owner is None
        assert (await rt.start("gated", {}, thread_id=first.thread_id)).thread_id == first.thread_id
        gate.set()
        done = [await rt.wait(r.thread_id, timeout=WAIT) for r in (first, second, third)]
        assert [r.state["done"] for r in done] == [first.thread_id, second.thread_id,
                                                  third.thread_id]
        for r in done:
            assert [cp.attempt for cp in await rt.checkpoints(r.thread_id)] == [1]
        assert worker.steps_committed == 3
    # With the worker stopped, runs are queued again.
    rt2 = make_runtime(db_url, agent)
    try:
        assert (await rt2.start("gated", {})).status == "queued"
    finally:
        await rt2.close()


async def test_checkpoints_record_every_step(db_url: str) -> None:
    rt = make_runtime(db_url, pipeline_agent())
    run = await rt.start("pipeline", {"topic": "t"})
    async with working(rt):
        await rt.wait(run.thread_id, timeout=WAIT)
        cps = await rt.checkpoints(run.thread_id)
    assert [cp.step for cp in cps] == [1, 2, 3]
    assert [cp.node for cp in cps] == ["plan", "research", "write"]
    assert [cp.next_node for cp in cps] == ["research", "write", None]
    assert cps[0].state == {"topic": "t", "plan": "plan for t", "log": ["plan"]}
    assert cps[1].state == {
        "topic": "t", "plan": "plan for t", "notes": ["plan for t", "fact"],
        "log": ["plan", "research"],
    }
    assert cps[2].state["report"] == "plan for t / fact"
    assert cps[2].state["log"] == ["plan", "research", "write"]
    for cp in cps:
        assert cp.thread_id == run.thread_id
        assert f":{os.getpid()}:" in cp.worker  # this process's worker ran every step
        assert cp.attempt == 1
        assert cp.started_at <= cp.finished_at
        assert cp.duration == cp.finished_at - cp.started_at
        assert abs(cp.finished_at - time.time()) < 60
    assert len({cp.worker for cp in cps}) == 1
    for a, b in itertools.pairwise(cps):
        assert a.finished_at <= b.started_at + 1e-3
    assert cps[1].duration >= 0.025  # research sleeps 30 ms
    # Each checkpoint's state is its own copy.
    cps[0].state["log"].append("mutated")
    assert (await rt.checkpoints(run.thread_id))[0].state["log"] == ["plan"]
    await rt.close()


async def test_delta_and_snapshot_encoding_gives_exact_states(db_url: str) -> None:
    steps = 10
    rt = make_runtime(db_url, counter_agent(steps), snapshot_every=3)
    run = await rt.start("counter", {"start": True})
    async with working(rt):
        done = await rt.wait(run.thread_id, timeout=WAIT)
        cps = await rt.checkpoints(run.thread_id)
        raw = await rt.store.checkpoints(run.thread_id)
        tail = await rt.store.load_checkpoints(run.thread_id)
        mid = await rt.store.load_checkpoints(run.thread_id, 5)
    assert done.status == "completed"
    assert done.state == expected_counter_state(steps)
    assert [cp.step for cp in cps] == list(range(1, steps + 1))
    for cp in cps:
        assert cp.state == expected_counter_state(cp.step), cp.step
    # A snapshot every third step, deltas between.
    assert [r.kind for r in raw] == ["d", "d", "s"] * 3 + ["d"]
    assert [cp.kind for cp in cps] == [r.kind for r in raw]
    # Resume reads the last snapshot and the deltas after it, nothing older.
    assert [r.step for r in tail] == [9, 10]
    assert [r.step for r in mid] == [3, 4, 5]


async def test_resumed_run_keeps_state_and_snapshot_cadence(db_url: str) -> None:
    """A worker stops mid-run (the run is released at a checkpoint); another worker resumes it
    from snapshot + deltas and finishes with exactly the state of an uninterrupted run."""
    steps = 8
    stop_first = asyncio.Event()
    agent = Agent("counter")

    @agent.node(start=True)
    async def tick(state: State, ctx: Context) -> Command:
        n = state.get("n", 0) + 1
        if ctx.step == 4 and not stop_first.is_set():
            stop_first.set()
            await asyncio.sleep(0.1)  # let the worker see the stop before this step commits
        update = {"n": n, "log": append([n]), f"k{n % 4}": n * 10}
        return goto("tick", update) if n < steps else finish(update)

    rt1 = make_runtime(db_url, agent, snapshot_every=3)
    run = await rt1.start("counter", {"start": True})
    worker = asyncio.create_task(rt1.work(concurrency=2, stop=stop_first))
    try:
        await asyncio.wait_for(worker, WAIT)
        paused = await rt1.get(run.thread_id)
    finally:
        await rt1.close()
    assert paused.status == "queued" and paused.lease_owner is None
    assert paused.step == 4
    assert paused.state == expected_counter_state(4)

    rt2 = make_runtime(db_url, agent, snapshot_every=3)
    async with working(rt2):
        done = await rt2.wait(run.thread_id, timeout=WAIT)
        raw = await rt2.store.checkpoints(run.thread_id)
        cps = await rt2.checkpoints(run.thread_id)
    assert done.status == "completed" and done.step == steps
    assert done.state == expected_counter_state(steps)
    assert [cp.state for cp in cps] == [expected_counter_state(s) for s in range(1, steps + 1)]
    assert [r.kind for r in raw] == ["d", "d", "s", "d", "d", "s", "d", "d"]
    assert len({r.worker for r in raw[:4]}) == 1 and raw[4].worker != raw[0].worker


async def test_append_keeps_each_checkpoint_small(db_url: str) -> None:
    steps = 150
    agent = Agent("chat")

    @agent.node(start=True)
    async def turn(state: State, ctx: Context) -> Command:
        i = len(state.get("messages", [])) + 1
        msg = {"role": "assistant", "text": f"message {i:04d} " + "x" * 100}
        update = {"messages": append([msg]), "turns": i}
        return goto("turn", update) if i < steps else finish(update)

    rt = make_runtime(db_url, agent, snapshot_every=10_000)
    run = await rt.start("chat", {})
    async with working(rt):
        done = await rt.wait(run.thread_id, timeout=60)
        raw = await rt.store.checkpoints(run.thread_id)
    assert done.status == "completed"
    assert len(done.state["messages"]) == steps and done.state["turns"] == steps
    assert done.state["messages"][-1]["text"].startswith(f"message {steps:04d} ")
    assert len(raw) == steps
    size5, size150 = len(bytes(raw[4].data)), len(bytes(raw[149].data))
    assert size150 <= size5 * 1.2, (size5, size150)
    sizes = [len(bytes(r.data)) for r in raw]
    assert max(sizes) <= min(sizes) * 1.2
    assert max(sizes) < 400  # one message and a counter, not the whole history


async def test_next_step_sees_the_committed_state(db_url: str) -> None:
    """The state a node gets in a live run must equal the state replayed from the log, or a
    run resumed after a crash behaves differently from one that was not interrupted. A tuple
    is stored as a list; the live state must hold the list too."""
    seen: list[State] = []
    agent = Agent("roundtrip")

    @agent.node(start=True)
    async def first(state: State, ctx: Context) -> Command:
        return goto("second", {"pair": (1, 2)})

    @agent.node
    async def second(state: State, ctx: Context) -> Command:
        seen.append(dict(state))
        return goto("third", {"pair": append([3])})

    @agent.node
    async def third(state: State, ctx: Context) -> Command:
        return finish({"done": True})

    rt = make_runtime(db_url, agent)
    run = await rt.start("roundtrip", {})
    async with working(rt):
        done = await rt.wait(run.thread_id, timeout=WAIT)
        cps = await rt.checkpoints(run.thread_id)
    assert seen and seen[0] == cps[0].state == {"pair": [1, 2]}
    assert done.status == "completed", done.error
    assert done.state == {"pair": [1, 2, 3], "done": True}


# -- start: idempotency and conflicts ---------------------------------------------------------


async def test_idempotency_key_returns_the_same_run(db_url: str) -> None:
    rt = make_runtime(db_url, pipeline_agent())
    try:
        a = await rt.start("pipeline", {"topic": "x"}, idempotency_key="order-42")
        b = await rt.start("pipeline", {"topic": "x"}, idempotency_key="order-42")
        assert a.thread_id == b.thread_id
        assert a.idempotency_key == b.idempotency_key == "order-42"
        assert b.created_at == a.created_at
        with pytest.raises(RunConflict):
            await rt.start("pipeline", {"topic": "other"}, idempotency_key="order-42")
        assert len(await rt.list_runs()) == 1
    finally:
        await rt.close()


async def test_same_thread_id_same_input_is_the_same_run(db_url: str) -> None:
    rt = make_runtime(db_url, pipeline_agent())
    try:
        a = await rt.start("pipeline", {"topic": "x"}, thread_id="t-1")
        b = await rt.start("pipeline", {"topic": "x"}, thread_id="t-1")
        assert a.thread_id == b.thread_id == "t-1"
        assert a.created_at == b.created_at
        assert len(await rt.list_runs()) == 1
    finally:
        await rt.close()


async def test_same_thread_id_other_input_is_a_conflict(db_url: str) -> None:
    other = counter_agent(1)
    rt = make_runtime(db_url, pipeline_agent(), other)
    try:
        await rt.start("pipeline", {"topic": "x"}, thread_id="t-1")
        with pytest.raises(RunConflict) as info:
            await rt.start("pipeline", {"topic": "y"}, thread_id="t-1")
        assert "t-1" in str(info.value)
        with pytest.raises(RunConflict):
            await rt.start("counter", {"topic": "x"}, thread_id="t-1")
        run = await rt.get("t-1")
        assert run.state == {"topic": "x"} and run.agent == "pipeline"
    finally:
        await rt.close()


async def test_unknown_run(db_url: str) -> None:
    rt = make_runtime(db_url, pipeline_agent())
    try:
        with pytest.raises(RunNotFound):
            await rt.get("nope")
        with pytest.raises(RunNotFound):
            await rt.checkpoints("nope")
        with pytest.raises(RunNotFound):
            await rt.cancel("nope")
        with pytest.raises(RunNotFound):
            await rt.wait("nope", timeout=1)
    finally:
        await rt.close()


async def test_wait_times_out_while_no_worker_runs(db_url: str) -> None:
    rt = make_runtime(db_url, pipeline_agent())
    try:
        run = await rt.start("pipeline", {"topic": "x"})
        with pytest.raises(TimeoutError):
            await rt.wait(run.thread_id, timeout=0.2)
        assert (await rt.get(run.thread_id)).status == "queued"
    finally:
        await rt.close()


async def test_waiters_of_a_run_finished_here_get_the_state_of_its_log(db_url: str) -> None:
    """A local worker hands the final state to the first waiter; every waiter (there are
    three here, one arriving after the end) gets its own copy, equal to a replay of the log."""
    rt = make_runtime(db_url, counter_agent(6))
    async with working(rt):
        run = await rt.start("counter")
        first, second = await asyncio.wait_for(
            asyncio.gather(rt.wait(run.thread_id), rt.wait(run.thread_id)), WAIT)
        late = await rt.wait(run.thread_id)
        stored = await rt.get(run.thread_id)
        log = await rt.checkpoints(run.thread_id)
    assert first.status is RunStatus.COMPLETED and first.step == 6
    for got in (first, second, late):
        assert got.state == stored.state == log[-1].state
        assert got.updated_at == stored.updated_at
    assert first.state["log"] == [1, 2, 3, 4, 5, 6]
    assert first.state is not second.state and first.state["log"] is not second.state["log"]


async def test_a_wait_that_times_out_on_a_run_driven_here_leaves_no_waiter_behind(
        db_url: str) -> None:
    agent = Agent("gated")
    gate = asyncio.Event()

    @agent.node(start=True)
    async def hold(state: State, ctx: Context) -> Command:
        await gate.wait()
        return finish({"done": True})

    rt = make_runtime(db_url, agent)
    async with working(rt):
        run = await rt.start("gated")
        await eventually(lambda: rt.hub.driving(run.thread_id), "the local worker to drive the run")
        with pytest.raises(TimeoutError):
            await rt.wait(run.thread_id, timeout=0.1)
        assert run.thread_id not in rt.hub.waited()  # the timed-out waiter unregistered
        gate.set()
        got = await asyncio.wait_for(rt.wait(run.thread_id), WAIT)
        assert got.status is RunStatus.COMPLETED and got.state == {"done": True}
        assert rt.hub.waited() == frozenset()


# -- the journal ------------------------------------------------------------------------------


def journaled_agent(calls: list[int]) -> tuple[Agent, Callable[[int], dict[str, int]]]:
    agent = Agent("journaled")

    def fetch(i: int) -> dict[str, int]:
        calls.append(i)
        return {"value": i * 10}

    @agent.node(start=True)
    async def work(state: State, ctx: Context) -> Command:
        a = await ctx.call(fetch, 1)
        b = await ctx.call(fetch, 2)
        return finish({"a": a, "b": b, "attempt": ctx.attempt})

    return agent, fetch


async def _crash_after_one_call(rt: Runtime, thread_id: str, name: str, result: Any) -> Lease:
    """Claim the run as a worker that then dies: journal one call, let the lease expire."""
    claimed = await rt.store.claim_runs("dead-worker", "v1", ["journaled"], 10, 0.3)
    assert [r.thread_id for r in claimed] == [thread_id]
    lease = Lease(thread_id, "dead-worker", claimed[0].epoch)
    await rt.store.record_call(lease, 1, 0, name, serde.dumps(result))
    await asyncio.sleep(0.6)  # the lease (0.3 s on the database clock) expires
    return lease


async def test_journaled_calls_are_not_repeated_after_a_crash(db_url: str) -> None:
    calls: list[int] = []
    agent, fetch = journaled_agent(calls)
    rt = make_runtime(db_url, agent, lease_ttl=10)
    run = await rt.start("journaled", {}, thread_id="crashy")
    dead = await _crash_after_one_call(rt, "crashy", callable_name(fetch), {"value": "recorded"})
    async with working(rt):
        done = await rt.wait("crashy", timeout=WAIT)
        cps = await rt.checkpoints("crashy")
        # The dead worker's lease was taken over: it cannot journal anything more.
        with pytest.raises(LeaseLost):
            await rt.store.record_call(dead, 1, 1, callable_name(fetch), serde.dumps(0))
    assert run.status == "queued"
    assert done.status == "completed", done.error
    assert calls == [2]  # call #0 came from the journal; only call #1 ran
    assert done.state == {"a": {"value": "recorded"}, "b": {"value": 20}, "attempt": 2}
    assert [cp.attempt for cp in cps] == [2]
    assert cps[0].worker != "dead-worker"


async def test_first_execution_sees_what_a_replay_sees(db_url: str) -> None:
    results: list[Any] = []
    agent = Agent("journaled")

    def make() -> tuple[int, ...]:
        return (1, 2)

    @agent.node(start=True)
    async def work(state: State, ctx: Context) -> Command:
        results.append(await ctx.call(make))
        return finish({"r": results[-1]})

    rt = make_runtime(db_url, agent)
    run = await rt.start("journaled", {})
    async with working(rt):
        done = await rt.wait(run.thread_id, timeout=WAIT)
    assert results == [[1, 2]]
    assert done.state == {"r": [1, 2]}


async def test_a_changed_call_sequence_fails_with_nondeterminism(db_url: str) -> None:
    calls: list[int] = []
    agent, fetch = journaled_agent(calls)
    rt = make_runtime(db_url, agent, lease_ttl=10)
    await rt.start("journaled", {}, thread_id="diverged")
    await _crash_after_one_call(rt, "diverged", "billing.charge_card", {"ok": True})
    async with working(rt):
        done = await rt.wait("diverged", timeout=WAIT)
        cps = await rt.checkpoints("diverged")
    assert done.status == "failed"
    assert done.error is not None
    assert done.error.category == "nondeterminism"
    assert "billing.charge_card" in done.error.message
    assert callable_name(fetch) in done.error.message
    assert calls == []
    assert cps == []


# -- retries and failures ---------------------------------------------------------------------


async def test_a_node_failing_twice_then_succeeding_completes(db_url: str) -> None:
    attempts: list[int] = []
    agent = Agent("flaky")

    @agent.node(start=True, retry=RetryPolicy(attempts=3, initial=0.01))
    async def call_api(state: State, ctx: Context) -> Command:
        attempts.append(ctx.attempt)
        if len(attempts) < 3:
            raise ConnectionError(f"transient #{len(attempts)}")
        return goto("done", {"ok": True})

    @agent.node
    async def done(state: State, ctx: Context) -> Command:
        return finish({"finished": True})

    rt = make_runtime(db_url, agent)
    run = await rt.start("flaky", {})
    async with working(rt):
        result = await rt.wait(run.thread_id, timeout=WAIT)
        cps = await rt.checkpoints(run.thread_id)
    assert result.status == "completed", result.error
    assert result.state == {"ok": True, "finished": True}
    assert len(attempts) == 3
    assert attempts == [1, 2, 3]  # ctx.attempt counts the executions of the step
    assert [cp.attempt for cp in cps] == [3, 1]


async def test_exhausted_retries_fail_the_run_with_traceback(db_url: str) -> None:
    executions: list[int] = []
    agent = Agent("doomed")

    @agent.node(start=True, retry=RetryPolicy(attempts=3, initial=0.01))
    async def always_fails(state: State, ctx: Context) -> Command:
        executions.append(ctx.attempt)
        raise ValueError(f"bad value #{len(executions)}")

    rt = make_runtime(db_url, agent)
    run = await rt.start("doomed", {"keep": 1})
    async with working(rt):
        result = await rt.wait(run.thread_id, timeout=WAIT)
        cps = await rt.checkpoints(run.thread_id)
    assert len(executions) == 3
    assert result.status == RunStatus.FAILED
    assert result.error is not None
    assert result.error.category == "exception"
    assert result.error.type == "ValueError"
    assert result.error.message == "bad value #3"
    assert "Traceback" in result.error.traceback
    assert "always_fails" in result.error.traceback
    assert "ValueError: bad value #3" in result.error.traceback
    assert str(result.error).startswith("[exception] ValueError")
    assert result.state == {"keep": 1} and result.step == 0
    assert cps == []


async def test_retry_on_filter_fails_at_once(db_url: str) -> None:
    executions: list[int] = []
    agent = Agent("picky")

    @agent.node(start=True, retry=RetryPolicy(attempts=5, initial=0.01,
                                              retry_on=(ConnectionError,)))
    async def lookup(state: State, ctx: Context) -> Command:
        executions.append(1)
        raise KeyError("missing")

    rt = make_runtime(db_url, agent)
    run = await rt.start("picky", {})
    async with working(rt):
        result = await rt.wait(run.thread_id, timeout=WAIT)
    assert executions == [1]
    assert result.status == "failed"
    assert result.error is not None and result.error.type == "KeyError"
    assert result.error.category == "exception"


async def test_agent_retry_policy_applies_to_its_nodes(db_url: str) -> None:
    executions: list[int] = []
    agent = Agent("agent_policy", retry=RetryPolicy(attempts=2, initial=0.01))

    @agent.node(start=True)
    async def once_more(state: State, ctx: Context) -> Command:
        executions.append(1)
        raise RuntimeError("no")

    rt = make_runtime(db_url, agent)
    run = await rt.start("agent_policy", {})
    async with working(rt):
        result = await rt.wait(run.thread_id, timeout=WAIT)
    assert result.status == "failed"
    assert len(executions) == 2


async def test_a_failing_run_never_blocks_the_others(db_url: str) -> None:
    agent = Agent("mixed")

    @agent.node(start=True, retry=RetryPolicy(attempts=3, initial=0.2, jitter=0))
    async def step(state: State, ctx: Context) -> Command:
        if state.get("fail") == "hard":
            raise RuntimeError("hard failure")
        if state.get("fail") == "retrying":
            raise ConnectionError("keeps failing")
        return finish({"ok": state["i"]})

    rt = make_runtime(db_url, agent)
    bad = [await rt.start("mixed", {"fail": kind}) for kind in ("hard", "retrying", "hard")]
    good = [await rt.start("mixed", {"i": i}) for i in range(6)]
    async with working(rt, concurrency=1):
        results = [await rt.wait(r.thread_id, timeout=WAIT) for r in good]
        failed = [await rt.wait(r.thread_id, timeout=WAIT) for r in bad]
    assert [r.status for r in results] == ["completed"] * 6
    assert [r.state["ok"] for r in results] == list(range(6))
    assert [r.status for r in failed] == ["failed"] * 3


async def test_a_node_returning_a_non_command_fails_as_definition(db_url: str) -> None:
    agent = Agent("sloppy")

    @agent.node(start=True)
    async def oops(state: State, ctx: Context) -> Command:
        return {"not": "a command"}  # type: ignore[return-value]

    rt = make_runtime(db_url, agent)
    run = await rt.start("sloppy", {})
    async with working(rt):
        result = await rt.wait(run.thread_id, timeout=WAIT)
    assert result.status == "failed"
    assert result.error is not None and result.error.category == "definition"
    assert "oops" in result.error.message and "dict" in result.error.message


async def test_goto_an_unknown_node_fails_as_definition(db_url: str) -> None:
    agent = Agent("lost")
    executions: list[int] = []

    @agent.node(start=True)
    async def here(state: State, ctx: Context) -> Command:
        executions.append(1)
        return goto("nowhere", {"x": 1})

    @agent.node
    async def there(state: State, ctx: Context) -> Command:
        return finish()

    rt = make_runtime(db_url, agent)
    run = await rt.start("lost", {})
    async with working(rt):
        result = await rt.wait(run.thread_id, timeout=WAIT)
        cps = await rt.checkpoints(run.thread_id)
    assert executions == [1]  # a definition error is not retried
    assert result.status == "failed"
    assert result.error is not None and result.error.category == "definition"
    assert "'nowhere'" in result.error.message
    assert "here" in result.error.message and "there" in result.error.message
    assert cps == [] and result.state == {}


async def test_a_non_serializable_update_fails_and_commits_nothing(db_url: str) -> None:
    agent = Agent("leaky")

    @agent.node(start=True)
    async def fine(state: State, ctx: Context) -> Command:
        return goto("broken", {"ok": 1})

    @agent.node
    async def broken(state: State, ctx: Context) -> Command:
        return goto("fine", {"good": 2, "bad": {"inner": {1, 2}}})

    rt = make_runtime(db_url, agent)
    run = await rt.start("leaky", {"input": True})
    async with working(rt):
        result = await rt.wait(run.thread_id, timeout=WAIT)
        cps = await rt.checkpoints(run.thread_id)
    assert result.status == "failed"
    assert result.error is not None and result.error.category == "serialization"
    assert "'bad'" in result.error.message and "'inner'" in result.error.message
    assert "set" in result.error.message
    assert [cp.step for cp in cps] == [1]  # step 2 committed nothing
    assert result.step == 1
    assert result.state == {"input": True, "ok": 1}


async def test_non_serializable_input_is_refused_and_writes_nothing(db_url: str) -> None:
    rt = make_runtime(db_url, pipeline_agent())
    try:
        with pytest.raises(SerializationError) as info:
            await rt.start("pipeline", {"topic": "x", "when": {"tags": {"a", "b"}}})
        assert "'when'" in str(info.value) and "'tags'" in str(info.value)
        assert "set" in str(info.value)
        with pytest.raises(SerializationError):
            await rt.start("pipeline", ["not", "a", "dict"])  # type: ignore[arg-type]
        assert await rt.list_runs() == []
    finally:
        await rt.close()


async def test_unknown_agent_at_start(db_url: str) -> None:
    rt = make_runtime(db_url, pipeline_agent())
    try:
        with pytest.raises(DefinitionError) as info:
            await rt.start("ghost", {})
        assert "'ghost'" in str(info.value) and "pipeline" in str(info.value)
        with pytest.raises(DefinitionError):
            await rt.start(Agent("unregistered"), {})
        assert await rt.list_runs() == []
    finally:
        await rt.close()


async def test_bad_thread_id_or_key_at_start_writes_nothing(db_url: str) -> None:
    rt = make_runtime(db_url, pipeline_agent())
    try:
        for bad in ("", "x" * 201, "a\x00b", 7, "a/b", "/lead", "tab\there"):
            with pytest.raises(DefinitionError) as info:
                await rt.start("pipeline", {}, thread_id=bad)  # type: ignore[arg-type]
            assert "thread_id" in str(info.value) and "'/'" in str(info.value)
        with pytest.raises(DefinitionError) as info:
            await rt.start("pipeline", {}, idempotency_key="k\x00")
        assert "idempotency_key" in str(info.value) and "NUL" in str(info.value)
        assert await rt.list_runs() == []
    finally:
        await rt.close()


async def test_any_other_printable_thread_id_is_taken(db_url: str) -> None:
    rt = make_runtime(db_url, pipeline_agent())
    try:
        ids = ["user:42", "a.b-c_d", "mail@example.com", "with space", "q?x#y%z", "ünï"]
        for tid in ids:
            assert (await rt.start("pipeline", {}, thread_id=tid)).thread_id == tid
        assert sorted(r.thread_id for r in await rt.list_runs()) == sorted(ids)
        with pytest.raises(DefinitionError, match="new_thread_id"):
            await rt.fork("user:42", 0, new_thread_id="x/y")
    finally:
        await rt.close()


async def test_agent_without_nodes_at_start(db_url: str) -> None:
    rt = make_runtime(db_url, Agent("hollow"))
    try:
        with pytest.raises(DefinitionError, match="no nodes"):
            await rt.start("hollow", {})
        assert await rt.list_runs() == []
    finally:
        await rt.close()


# -- bad databases ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["nonsense", "postgresql//u@h/db", "mysql://u@h/db", "sqlite://host/db.sqlite"]
)
def test_malformed_db_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError):
        Runtime(url, agents=[pipeline_agent()])


async def test_postgres_pool_options_in_the_url(pg_url: str) -> None:
    sep = "&" if "?" in pg_url else "?"
    rt = make_runtime(pg_url + f"{sep}pool_max=3&pool_timeout=2.5", pipeline_agent())
    store: Any = rt.store
    assert (store.max_size, store.pool_timeout) == (3, 2.5)
    async with working(rt):  # libpq never saw the options: the pool connects
        run = await rt.start("pipeline", {"topic": "x"})
        assert (await rt.wait(run.thread_id, timeout=WAIT)).status == RunStatus.COMPLETED


async def test_unreachable_postgres_is_unavailable_and_redacted() -> None:
    rt = Runtime("postgresql://u:secret@127.0.0.1:1/db", agents=[pipeline_agent()])
    try:
        with pytest.raises(StoreUnavailable) as info:
            await rt.open()
        with pytest.raises(StoreUnavailable) as info2:
            await rt.start("pipeline", {"topic": "x"})
    finally:
        await rt.close()
    for exc in (info.value, info2.value):
        assert "secret" not in str(exc)
        assert "127.0.0.1" in str(exc)
        assert "secret" not in repr(exc)
        assert "secret" not in "".join(traceback.format_exception(exc))


async def test_migrate_on_an_open_runtime_leaves_it_open_and_usable(db_url: str) -> None:
    """migrate() on a runtime in use applies nothing new and does not close its store."""
    rt = make_runtime(db_url, pipeline_agent())
    try:
        first = await rt.start("pipeline", {"topic": "x"})
        assert await rt.migrate() == []
        again = await rt.get(first.thread_id)
        assert again.thread_id == first.thread_id
        second = await rt.start("pipeline", {"topic": "y"})
        assert second.created and not (await rt.start(
            "pipeline", {"topic": "y"}, thread_id=second.thread_id)).created
    finally:
        await rt.close()


async def test_unmigrated_database_says_to_run_migrate(empty_db_url: str) -> None:
    rt = make_runtime(empty_db_url, pipeline_agent())
    try:
        with pytest.raises(SchemaError) as info:
            await rt.open()
        assert "tether migrate" in str(info.value)
        with pytest.raises(SchemaError):
            await rt.start("pipeline", {"topic": "x"})
        assert await rt.migrate()
        run = await rt.start("pipeline", {"topic": "x"})
        assert run.status == "queued"
    finally:
        await rt.close()


# -- cancellation -----------------------------------------------------------------------------


async def test_cancel_a_queued_run(db_url: str) -> None:
    executed: list[str] = []
    agent = Agent("cancellable")

    @agent.node(start=True)
    async def work(state: State, ctx: Context) -> Command:
        executed.append(ctx.thread_id)
        return finish({"ran": True})

    rt = make_runtime(db_url, agent)
    victim = await rt.start("cancellable", {"i": 1})
    cancelled = await rt.cancel(victim.thread_id)
    assert cancelled.status == RunStatus.CANCELLED
    assert cancelled.state == {"i": 1}
    survivor = await rt.start("cancellable", {"i": 2})
    async with working(rt):
        await rt.wait(survivor.thread_id, timeout=WAIT)
        await asyncio.sleep(0.2)
        after = await rt.get(victim.thread_id)
        waited = await rt.wait(victim.thread_id, timeout=WAIT)
        cps = await rt.checkpoints(victim.thread_id)
    assert executed == [survivor.thread_id]
    assert after.status == waited.status == "cancelled"
    assert cps == [] and after.step == 0


async def test_cancel_a_running_run_cancels_its_node_task(db_url: str) -> None:
    started = asyncio.Event()
    interrupted: list[int] = []
    later: list[int] = []
    agent = Agent("long")

    @agent.node(start=True)
    async def slow(state: State, ctx: Context) -> Command:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            interrupted.append(ctx.step)
            raise
        return goto("after", {"slept": True})

    @agent.node
    async def after(state: State, ctx: Context) -> Command:
        later.append(1)
        return finish()

    rt = make_runtime(db_url, agent)
    run = await rt.start("long", {})
    async with working(rt):
        await asyncio.wait_for(started.wait(), WAIT)
        cancelled = await rt.cancel(run.thread_id)
        assert cancelled.status == "cancelled"
        await eventually(lambda: interrupted == [1], timeout=5)
        await asyncio.sleep(0.2)
        final = await rt.get(run.thread_id)
        cps = await rt.checkpoints(run.thread_id)
        # The worker is still healthy: other runs go on.
        other = await rt.start("long", {}, thread_id="other")
        await asyncio.wait_for(started.wait(), WAIT)
    assert final.status == "cancelled" and final.step == 0
    assert cps == []
    assert later == []
    assert other.thread_id == "other"


async def test_cancel_from_elsewhere_refuses_the_in_flight_commit(db_url: str) -> None:
    """Cancelled through another Runtime (as from another process): this worker's node
    finishes, but its step's commit is fenced out and nothing after it runs."""
    started = asyncio.Event()
    finished_sleep: list[int] = []
    later: list[int] = []
    agent = Agent("long")

    @agent.node(start=True)
    async def slow(state: State, ctx: Context) -> Command:
        if state.get("quick"):
            return finish({"quick": "done"})
        started.set()
        await asyncio.sleep(0.5)
        finished_sleep.append(1)
        return goto("after", {"slept": True})

    @agent.node
    async def after(state: State, ctx: Context) -> Command:
        later.append(1)
        return finish()

    rt = make_runtime(db_url, agent, lease_ttl=30)
    elsewhere = make_runtime(db_url, agent)
    try:
        run = await rt.start("long", {})
        async with working(rt):
            await asyncio.wait_for(started.wait(), WAIT)
            cancelled = await elsewhere.cancel(run.thread_id)
            assert cancelled.status == "cancelled"
            await eventually(lambda: finished_sleep == [1], timeout=5)
            await asyncio.sleep(0.3)
            final = await rt.get(run.thread_id)
            cps = await rt.checkpoints(run.thread_id)
            quick = await rt.start("long", {"quick": True})
            quick_done = await rt.wait(quick.thread_id, timeout=WAIT)
    finally:
        await elsewhere.close()
    assert final.status == "cancelled" and final.step == 0
    assert cps == []
    assert later == []
    assert quick_done.status == "completed"


async def test_cancel_from_elsewhere_stops_the_node_within_a_heartbeat(db_url: str) -> None:
    """Cancelled by another process: the worker learns it at its next heartbeat (lease_ttl/3)
    and cancels the node's task instead of letting it run on."""
    started = asyncio.Event()
    interrupted: list[int] = []
    agent = Agent("long")

    @agent.node(start=True)
    async def slow(state: State, ctx: Context) -> Command:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            interrupted.append(ctx.step)
            raise
        return finish({"slept": True})

    rt = make_runtime(db_url, agent, lease_ttl=0.9)
    elsewhere = make_runtime(db_url, agent)
    try:
        run = await rt.start("long", {})
        async with working(rt):
            await asyncio.wait_for(started.wait(), WAIT)
            await elsewhere.cancel(run.thread_id)
            await eventually(lambda: interrupted == [1], timeout=5)
            final = await rt.get(run.thread_id)
            cps = await rt.checkpoints(run.thread_id)
    finally:
        await elsewhere.close()
    assert final.status == "cancelled"
    assert cps == []


async def test_a_failed_run_names_the_node_that_failed(db_url: str) -> None:
    """Run.failed_node (kept in the run's record) names the node whose step raised; the run's
    `node` is None once it failed. None while the run has not failed."""
    agent = Agent("breaks")

    @agent.node(start=True)
    async def first(state: State, ctx: Context) -> Command:
        return goto("second", {})

    @agent.node(retry=RetryPolicy(attempts=1))
    async def second(state: State, ctx: Context) -> Command:
        raise ValueError("the second node broke")

    rt = make_runtime(db_url, agent)
    run = await rt.start("breaks", {}, thread_id="breaks-1")
    assert run.failed_node is None
    async with working(rt):
        done = await rt.wait(run.thread_id, timeout=WAIT)
    assert done.status == "failed" and done.failed_node == "second"
    assert done.to_dict()["failed_node"] == "second"
    assert (await rt.peek("breaks-1")).failed_node == "second"
    (listed,) = await rt.list_runs(status="failed")
    assert listed.failed_node == "second"
