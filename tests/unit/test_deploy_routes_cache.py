"""Deployer.current_routes: one read for a burst of starts, all woken together; a table past
half its age re-read behind the starts; a start never routes by a table older than ROUTES_TTL
(it waits for the re-read, which the burst shares)."""

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


async def test_an_aging_table_is_refreshed_behind_the_starts() -> None:
    store = Store()
    store.deploys.gate.set()
    d = deploy.Deployer(store, "v1", 30.0)  # type: ignore[arg-type]
    first = await d.current_routes()
    d._read_at -= deploy.ROUTES_TTL * 0.6  # past half its age, not past all of it
    store.deploys.weights = [DeploymentRecord("v1", 10, None, 0.0)]
    store.deploys.gate.clear()
    assert await d.current_routes() is first  # at once, with the table it had
    assert await d.current_routes() is first  # one refresh in flight, not two
    await asyncio.sleep(0)
    assert store.deploys.reads == 2
    store.deploys.gate.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert (await d.current_routes()).weights == (("v1", 10),)
    assert store.deploys.reads == 2
    d.close()


async def test_a_start_never_routes_by_a_table_past_its_age() -> None:
    """After `deploy route` in another process, the first start of an idle process follows the
    new table: it waits for the re-read, and a burst of such starts shares one."""
    store = Store()
    store.deploys.gate.set()
    d = deploy.Deployer(store, "v1", 30.0)  # type: ignore[arg-type]
    await d.current_routes()
    d._read_at -= 60.0  # idle for a minute
    store.deploys.weights = [DeploymentRecord("v2", 100, None, 0.0)]
    store.deploys.gate.clear()
    calls = [asyncio.ensure_future(d.current_routes()) for _ in range(100)]
    await asyncio.sleep(0.01)
    assert store.deploys.reads == 2 and not any(c.done() for c in calls)
    store.deploys.gate.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert {c.result().weights for c in calls} == {(("v2", 100),)}
    d.close()


async def test_a_failed_refresh_behind_the_starts_is_logged_not_raised(
        caplog: pytest.LogCaptureFixture) -> None:
    store = Store()
    store.deploys.gate.set()
    d = deploy.Deployer(store, "v1", 30.0)  # type: ignore[arg-type]
    first = await d.current_routes()
    d._read_at -= deploy.ROUTES_TTL * 0.6
    store.deploys.fail = True
    assert await d.current_routes() is first
    for _ in range(3):
        await asyncio.sleep(0)
    assert "reading the deployment weights failed" in caplog.text
    d._read_at -= deploy.ROUTES_TTL  # now too old to route by: the start gets the error
    with pytest.raises(OSError):
        await d.current_routes()
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
