"""LangGraph's own checkpointer conformance suite (langgraph-checkpoint-conformance) against
TetherSaver, on SQLite and Postgres: every capability, base and extended, must be detected and
pass (conformance level FULL)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from tether.langgraph import TetherSaver


async def test_conformance_full(databases: Any) -> None:
    # One database without tether's schema: the first saver's setup() migrates it. The suite
    # makes a fresh saver per capability; its tests use their own uuid thread ids.
    url = databases.create(migrated=False)
    savers: list[TetherSaver] = []

    @checkpointer_test(name=f"TetherSaver[{databases.backend}]")
    async def saver() -> AsyncIterator[TetherSaver]:
        async with TetherSaver.from_conn_string(url, pool_size=2) as s:
            await s.setup()
            savers.append(s)
            yield s

    report = await validate(saver)
    failures = {cap: r.failures for cap, r in report.results.items() if r.passed is not True}
    assert failures == {}, failures
    assert {cap for cap, r in report.results.items() if r.detected} == {
        c.value for c in ALL_CAPABILITIES}
    assert report.passed_all()
    assert report.conformance_level() == "FULL"
    assert len(savers) == len(ALL_CAPABILITIES)
