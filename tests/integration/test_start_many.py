"""Runtime.start_many: a burst of starts, checked first, group-committed, idempotent per
request, returned in order; on SQLite and Postgres."""

from __future__ import annotations

from typing import Any

import pytest

from apps.inprocess import make_runtime, working
from tether import Agent, Context, DefinitionError, RunConflict, RunStatus, finish

WAIT = 30.0


def echo_agent() -> Agent:
    agent = Agent("echo")

    @agent.node
    async def answer(state: dict[str, Any], ctx: Context) -> Any:
        return finish({"out": state.get("n", 0) * 2})

    return agent


async def test_a_burst_starts_in_order_and_runs(db_url: str) -> None:
    rt = make_runtime(db_url, echo_agent(), poll_interval=0.02)
    requests = [{"agent": "echo", "input": {"n": i}, "thread_id": f"b{i}"} for i in range(300)]
    runs = await rt.start_many(requests)
    assert [r.thread_id for r in runs] == [f"b{i}" for i in range(300)]
    assert all(r.created and r.status is RunStatus.QUEUED for r in runs)
    assert runs[7].state == {"n": 7}
    async with working(rt, concurrency=50):
        done = [await rt.wait(r.thread_id, timeout=WAIT) for r in runs]
    assert [d.state["out"] for d in done] == [2 * i for i in range(300)]


async def test_the_same_batch_again_starts_nothing_twice(db_url: str) -> None:
    rt = make_runtime(db_url, echo_agent())
    try:
        batch = [{"agent": "echo", "input": {"n": 1}, "idempotency_key": "k1"},
                 {"agent": "echo", "input": {"n": 2}, "thread_id": "t2"},
                 {"agent": "echo", "input": {"n": 2}, "thread_id": "t2"}]  # twice in one batch
        first = await rt.start_many(batch)
        assert first[1].thread_id == first[2].thread_id == "t2"
        assert [r.created for r in first].count(True) == 2
        again = await rt.start_many(batch)
        assert [r.thread_id for r in again] == [r.thread_id for r in first]
        assert not any(r.created for r in again)
        assert len(await rt.list_runs()) == 2
        with pytest.raises(RunConflict, match="request 1: "):
            await rt.start_many([{"agent": "echo", "input": {"n": 3}, "thread_id": "t3"},
                                 {"agent": "echo", "input": {"n": 9}, "thread_id": "t2"}])
        assert (await rt.get("t3")).state == {"n": 3}  # the others are written: safe to resend
    finally:
        await rt.close()


async def test_a_bad_request_writes_nothing(db_url: str) -> None:
    rt = make_runtime(db_url, echo_agent())
    try:
        good = {"agent": "echo", "input": {}}
        for bad, match in [({"agent": "ghost"}, "request 1: .*'ghost'"),
                           ({"agent": "echo", "thread_id": "a/b"}, "request 1: thread_id"),
                           ({"agent": "echo", "input": {"x": {1, 2}}}, "request 1: "),
                           ({"input": {}}, "request 1 has no 'agent'"),
                           ({"agent": "echo", "thread": "x"}, r"unknown keys \['thread'\]"),
                           ("echo", "request 1 must be a mapping")]:
            with pytest.raises((DefinitionError, Exception), match=match):
                await rt.start_many([good, bad])  # type: ignore[list-item]
        with pytest.raises(DefinitionError, match="a list of requests"):
            await rt.start_many(good)  # type: ignore[arg-type]
        with pytest.raises(DefinitionError, match="at most 10000"):
            await rt.start_many([good] * 10_001)
        assert await rt.list_runs() == []
        assert await rt.start_many([]) == []
    finally:
        await rt.close()


@pytest.mark.parametrize("n", [2000])
async def test_a_big_burst_is_one_pass(db_url: str, n: int) -> None:
    """Thousands at once, beside a run that exists (speed is bench/startmany.py's)."""
    rt = make_runtime(db_url, echo_agent())
    try:
        await rt.start_many([{"agent": "echo", "input": {"n": -1}}])
        runs = await rt.start_many([{"agent": "echo", "input": {"n": i}} for i in range(n)])
        assert len({r.thread_id for r in runs}) == n
        assert [r.state["n"] for r in runs] == list(range(n))
        assert len(await rt.list_runs(limit=n + 10)) == n + 1
    finally:
        await rt.close()
