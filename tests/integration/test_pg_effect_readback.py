"""An effect's done mark whose outcome is unknown (issue 34): the connection dies while the
mark is at the server. The store reads back where the effects stand instead of reporting a
failure: a mark that landed is answered as made; one that did not is sent again. Without the
read-back the dispatcher would log the outcome as not recorded, and the effect would stay
`running` until its lease ran out and then be performed again.

A TCP proxy between the store and the test database cuts the connections (apps.pgproxy, as
in test_pg_reconnect.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import orjson
import pytest

from apps.pgproxy import PgProxy
from tether.store.base import EffectRecord, EffectRow, Lease, NewRun, StepCommit
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


async def _claimed_effects(store: PostgresStore, n: int) -> list[EffectRecord]:
    """`n` runs whose step 1 requested an effect (one run's effects are claimed in order, one
    at a time), each effect claimed by this dispatcher."""
    data = orjson.dumps({})
    now = time.time()
    for _ in range(n):
        new = NewRun(thread_id=f"fx-{uuid.uuid4().hex[:10]}", agent="a", version="v1",
                     node="start", input=data, input_hash=hashlib.sha256(data).hexdigest())
        run, _ = await store.create_run(new)
        (claimed,) = await store.claim_runs("w", "v1", ["a"], 10, 60.0)
        await store.commit_step(StepCommit(
            lease=Lease(run.thread_id, "w", claimed.epoch), step=1, node="start",
            next_node="start", kind="d", data=b"{}", attempt=1, started_at=now,
            finished_at=now, status="running",
            effects=(EffectRow("k", 0, "book", orjson.dumps({"n": n})),)))
    got = await store.claim_effects("w", ["book"], n, 60.0)
    assert len(got) == n, got
    return got


async def _statuses(store: PostgresStore, effects: list[EffectRecord]) -> list[str]:
    out = []
    for e in effects:
        now = await store.get_effect(e.thread_id, e.key)
        assert now is not None
        out.append(now.status)
    return out


async def test_a_done_mark_whose_reply_was_lost_is_read_back(
        proxied: tuple[PgProxy, PostgresStore], caplog: pytest.LogCaptureFixture) -> None:
    proxy, store = proxied
    caplog.set_level(logging.INFO, "tether.store.postgres")
    (effect,) = await _claimed_effects(store, 1)
    proxy.cut_at_next_reply()
    assert await store.complete_effect(effect, b'"booked"') is True  # it landed: read back
    assert proxy.cut_replies == 1
    now = await store.get_effect(effect.thread_id, effect.key)
    assert now is not None and now.status == "done" and bytes(now.result or b"") == b'"booked"'
    assert now.epoch == effect.epoch
    assert any("read back: it landed" in r.getMessage() for r in caplog.records), caplog.text


async def test_a_batch_of_marks_whose_reply_was_lost_is_read_back(
        proxied: tuple[PgProxy, PostgresStore]) -> None:
    """One statement marks the batch; a mark fenced out (its effect's lease taken over) is
    answered False after the read-back, as it would have been."""
    proxy, store = proxied
    effects = await _claimed_effects(store, 3)
    stale = dataclasses.replace(effects[2], epoch=effects[2].epoch - 1)
    proxy.cut_at_next_reply()
    marks = await store.complete_effects([(effects[0], b"0"), (effects[1], b"1"), (stale, b"2")])
    assert proxy.cut_replies == 1
    assert marks == [True, True, False]
    assert await _statuses(store, effects) == ["done", "done", "running"]


async def test_a_done_mark_sent_on_a_dead_connection_is_sent_again(
        proxied: tuple[PgProxy, PostgresStore], caplog: pytest.LogCaptureFixture) -> None:
    proxy, store = proxied
    caplog.set_level(logging.INFO, "tether.store.postgres")
    effects = await _claimed_effects(store, 2)
    proxy.cut()  # every connection of the store is dead, and it does not know yet
    assert await store.complete_effects([(e, b"ok") for e in effects]) == [True, True]
    assert await _statuses(store, effects) == ["done", "done"]
    assert any("did not land; sending it again" in r.getMessage() for r in caplog.records), \
        caplog.text
