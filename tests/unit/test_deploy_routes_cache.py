"""Deployer.current_routes: one read for a burst of starts, all woken together, and a stale
table refreshed in the background (a start never waits for a re-read)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tether import deploy
from tether.store.deploy_types import DeploymentRecord


class Table:
    """The store's deployment part, as far as load_routes reads it (a unit test's stand-in)."""

    def __init__(self) -> None:
        self.reads = 0
        self.gate = asyncio.Event()
        self.weights: list[DeploymentRecord] = []
        self.fail = False

    async def list_deployments(self) -> list[DeploymentRecord]:
        self.reads += 1
        await self.gate.wait()
        if self.fail:
            raise OSError("database gone")
        return list(self.weights)

    async def list_workers(self) -> list[Any]:
        return []


class Store:
    def __init__(self) -> None:
        self.deploys = Table()


async def test_a_burst_of_starts_shares_one_read_and_wakes_at_once() -> None:
    store = Store()
    d = deploy.Deployer(store, "v1", 30.0)  # type: ignore[arg-type]
    calls = [asyncio.ensure_future(d.current_routes()) for _ in range(1000)]
    await asyncio.sleep(0.01)
    assert store.deploys.reads == 1 and not any(c.done() for c in calls)
    store.deploys.gate.set()
    await asyncio.sleep(0)  # the read ends ...
    await asyncio.sleep(0)  # ... and every waiter is scheduled in the same iteration
    await asyncio.sleep(0)
    assert all(c.done() for c in calls)
    assert {c.result().weights for c in calls} == {()}


async def test_a_stale_table_is_refreshed_behind_the_starts(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    store = Store()
    store.deploys.gate.set()
    d = deploy.Deployer(store, "v1", 30.0)  # type: ignore[arg-type]
    first = await d.current_routes()
    monkeypatch.setattr(deploy, "ROUTES_TTL", 0.0)
    store.deploys.weights = [DeploymentRecord("v1", 10, None, 0.0)]
    store.deploys.gate.clear()
    assert await d.current_routes() is first  # at once, with the table it had
    assert await d.current_routes() is first  # one refresh in flight, not two
    await asyncio.sleep(0)
    assert store.deploys.reads == 2
    store.deploys.gate.set()
    for _ in range(5):
        await asyncio.sleep(0)
    monkeypatch.setattr(deploy, "ROUTES_TTL", 3600.0)
    assert (await d.current_routes()).weights == (("v1", 10),)
    d.close()


async def test_a_failed_first_read_raises_and_the_next_start_reads_again() -> None:
    store = Store()
    store.deploys.fail = True
    store.deploys.gate.set()
    d = deploy.Deployer(store, "v1", 30.0)  # type: ignore[arg-type]
    with pytest.raises(OSError):
        await d.current_routes()
    store.deploys.fail = False
    assert (await d.current_routes()).weights == ()
    assert store.deploys.reads == 2
