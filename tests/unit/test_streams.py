"""The parts of tether.service.streams: stream slots under their caps (per client, in all,
released once however a stream ends) and the shared poller (one task for every key, one probe
per key a poll, a key dropped with its last follower, the task gone with the last key)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tether.service import streams
from tether.service.streams import HeldStream, SharedPoller, StreamSlots, TooManyStreams


def test_slots_cap_each_client_and_the_server_and_forget_a_client_gone() -> None:
    slots = StreamSlots(total=3, per_client=2)
    a1, a2 = slots.acquire("a"), slots.acquire("a")
    with pytest.raises(TooManyStreams, match="--max-streams-per-client") as exc:
        slots.acquire("a")
    assert exc.value.status == 429 and int(exc.value.headers["Retry-After"]) > 0
    b1 = slots.acquire("b")
    with pytest.raises(TooManyStreams, match="--max-streams or TETHER_MAX_STREAMS"):
        slots.acquire("c")
    a1.release()
    a1.release()  # a second release gives nothing back twice
    assert slots.open == 2 and slots.by_client("a") == 1
    c1 = slots.acquire("c")
    for s in (a2, b1, c1):
        s.release()
    assert slots.open == 0 and slots._by_client == {}  # nothing kept of closed streams


async def test_memory_is_handed_back_once_many_streams_have_closed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    released: list[int] = []
    slots = StreamSlots(total=100, per_client=100)
    monkeypatch.setattr(streams, "release_memory", lambda: released.append(slots.open))
    held = [slots.acquire("a") for _ in range(40)]
    for s in held[:5]:
        s.release()
    await asyncio.sleep(1.2)
    assert released == []  # a few closed: nothing to hand back yet
    for s in held[5:]:
        s.release()
    await asyncio.sleep(1.2)
    assert released == [0]  # once, after the rush
    more = [slots.acquire("a") for _ in range(3)]
    for s in more:
        s.release()
    await asyncio.sleep(1.2)
    assert released == [0]


async def test_a_stream_never_sent_still_gives_its_slot_back() -> None:
    slots = StreamSlots(total=1, per_client=1)

    async def body() -> AsyncIterator[bytes]:
        yield b""

    resp = HeldStream(body(), slot=slots.acquire("a"))
    assert slots.open == 1
    del resp
    gc.collect()
    assert slots.open == 0


async def test_one_task_polls_every_key_once_a_poll_and_stops_with_the_last_follower() -> None:
    poller: SharedPoller[int] = SharedPoller(0.02, "test poll")
    calls: dict[str, int] = {}
    values = {"k0": 1, "k1": 1, "k2": 1}

    def probe(key: str) -> Callable[[], Awaitable[int]]:
        async def read() -> int:
            calls[key] = calls.get(key, 0) + 1
            return values[key]
        return read

    async with poller.follow("k0", probe("k0")) as a, poller.follow("k0", probe("k0")) as b, \
            poller.follow("k1", probe("k1"), seen=1) as c, \
            poller.follow("k2", probe("k2")) as d:
        tasks = [t for t in asyncio.all_tasks() if t.get_name() == "tether-test poll"]
        assert len(tasks) == 1 and poller.keys == 3
        await asyncio.wait_for(a.changed.wait(), 2)
        await asyncio.wait_for(b.changed.wait(), 2)
        assert a.take() == 1 and b.take() == 1 and not a.changed.is_set()
        assert not c.changed.is_set()  # it has seen 1 already
        calls.clear()
        await asyncio.sleep(0.2)
        assert 3 <= calls["k0"] <= 12  # once a poll for both followers, not twice
        assert abs(calls["k0"] - calls["k1"]) <= 1
        values["k1"] = 2
        await asyncio.wait_for(c.changed.wait(), 2)
        assert c.take() == 2 and not a.changed.is_set()
        assert d.take() == 1
    assert poller.keys == 0 and poller.followers("k0") == 0
    settled = dict(calls)
    await asyncio.sleep(0.1)
    assert calls == settled  # no key left: nothing polled
    assert not poller.running  # and the task has ended
    await poller.close()


async def test_a_failing_probe_is_retried(caplog: pytest.LogCaptureFixture) -> None:
    poller: SharedPoller[str] = SharedPoller(0.01, "test poll")
    results: list[str | Exception] = [RuntimeError("db down"), "v1"]

    async def probe() -> str:
        got = results.pop(0) if len(results) > 1 else results[0]
        if isinstance(got, Exception):
            raise got
        return got

    async with poller.follow("t", probe) as f:
        await asyncio.wait_for(f.changed.wait(), 2)
        assert f.take() == "v1"
    assert "test poll of t failed" in caplog.text
    await poller.close()
