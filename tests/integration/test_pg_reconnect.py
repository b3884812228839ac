"""Postgres connections lost under the store (issue 34): a step commit or a journaled call
whose reply was lost is read back, never reported failed when it landed nor applied twice;
every part of the store (pool, group committer, listener) reconnects within a fraction of a
second, says so once, and counts it (tether_store_reconnects_total).

A TCP proxy between the store and the test database cuts the connections (the machine's
server is left alone)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from apps import eventually
from apps.pgproxy import PgProxy
from apps.store_rows import leased, step_commit
from tether.observe.metrics import Metrics
from tether.store.postgres import PostgresStore

pytestmark = pytest.mark.postgres


@pytest.fixture
async def proxied(pg_url: str) -> AsyncIterator[tuple[PgProxy, PostgresStore]]:
    parts = urlsplit(pg_url)
    async with PgProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        store = PostgresStore(proxy.url(parts.path.lstrip("/")))
        await store.open()
        try:
            yield proxy, store
        finally:
            await store.close()


async def test_a_commit_whose_reply_was_lost_is_read_back(
        proxied: tuple[PgProxy, PostgresStore]) -> None:
    proxy, store = proxied
    lease = await leased(store)
    await store.commit_step(step_commit(lease, 1))  # the writer's connection is up
    proxy.cut_at_next_reply()
    await store.commit_step(step_commit(lease, 2))  # committed; its reply was lost: read back
    assert proxy.cut_replies == 1
    proxy.cut_at_next_reply()
    await store.record_call(lease, 3, 0, "llm", b'"answer"')  # the same for a journaled call
    assert proxy.cut_replies == 2
    assert [cp.step for cp in await store.checkpoints(lease.thread_id)] == [1, 2]
    journal = await store.load_journal(lease.thread_id, 3)
    assert [(j.idx, bytes(j.result)) for j in journal] == [(0, b'"answer"')]
    run = await store.get_run(lease.thread_id)
    assert run is not None and run.step == 2 and run.epoch == lease.epoch


async def test_a_commit_sent_on_a_dead_connection_is_sent_again(
        proxied: tuple[PgProxy, PostgresStore]) -> None:
    proxy, store = proxied
    lease = await leased(store)
    await store.commit_step(step_commit(lease, 1))
    proxy.cut()  # every connection of the store is dead, and it does not know yet
    await store.commit_step(step_commit(lease, 2))  # it did not land: read back, sent again
    await store.record_call(lease, 3, 0, "llm", b"1")
    assert [cp.step for cp in await store.checkpoints(lease.thread_id)] == [1, 2]
    assert [j.idx for j in await store.load_journal(lease.thread_id, 3)] == [0]


async def test_every_part_reconnects_at_once_and_says_so(
        proxied: tuple[PgProxy, PostgresStore], caplog: pytest.LogCaptureFixture) -> None:
    proxy, store = proxied
    caplog.set_level(logging.INFO, "tether.store.postgres")
    lease = await leased(store)
    await store.commit_step(step_commit(lease, 1))
    proxy.cut()
    t0 = time.monotonic()
    await store.commit_step(step_commit(lease, 2))
    assert await store.get_run(lease.thread_id) is not None
    elapsed = time.monotonic() - t0
    assert elapsed < 1.0, elapsed  # (psycopg_pool alone waits 1 s, then 2, then 4...)

    def counted() -> bool:
        stats = store.pool_statistics()
        return all(stats[f"reconnects_{p}"] >= 1 for p in ("pool", "committer", "listener"))

    await eventually(counted, timeout=5, what="every part reconnected")
    lines = [r.getMessage() for r in caplog.records if "reconnected to" in r.getMessage()]
    assert {line.split()[1] for line in lines} == {"pool", "committer", "listener"}, lines
    assert all(f"127.0.0.1:{proxy.listen_port}" in line for line in lines), lines
    metrics = Metrics()
    metrics.watch_store(store)
    families = {f.name: f for f in metrics.collect()}
    samples = {s.labels["part"]: s.value for s in families["tether_store_reconnects"].samples
               if s.name == "tether_store_reconnects_total"}
    assert set(samples) == {"pool", "committer", "listener"}
    assert all(v >= 1 for v in samples.values()), samples


async def test_the_store_is_back_soon_after_the_server(
        proxied: tuple[PgProxy, PostgresStore]) -> None:
    """Down for 1.2 s: the pool's attempts (0.1 s, then doubling, at most 1 s apart) find
    the server again within a fraction of a second (psycopg_pool's own: at 1 s, 3 s, 7 s)."""
    proxy, store = proxied
    lease = await leased(store)
    await store.commit_step(step_commit(lease, 1))
    proxy.down = True
    proxy.cut()
    commit = asyncio.create_task(store.commit_step(step_commit(lease, 2)))
    await asyncio.sleep(1.2)
    proxy.down = False
    up = time.monotonic()
    await asyncio.wait_for(commit, 10)
    back = time.monotonic() - up
    assert back < 1.1, back
    assert [cp.step for cp in await store.checkpoints(lease.thread_id)] == [1, 2]
