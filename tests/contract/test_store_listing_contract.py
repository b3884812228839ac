"""The Store contract of the runs list (Store.list_runs): its orders, each a keyset that pages
without gaps or duplicates, and its filters (version, parent, created time range, thread_id
prefix), on every store. Pins the docstring of Store.list_runs and store/listing.py."""

from __future__ import annotations

import asyncio
import hashlib

import orjson
import pytest

from tether.errors import DefinitionError
from tether.store.base import Lease, NewRun, RunRecord, Store
from tether.store.listing import FINISHED_STATUSES, OPEN_STATUSES, RunQuery, prefix_end
from tether.types import RunStatus


def new_run(thread_id: str, *, agent: str = "a", version: str = "v1",
            parent: str | None = None) -> NewRun:
    data = orjson.dumps({"q": thread_id})
    return NewRun(thread_id=thread_id, agent=agent, version=version, node="start", input=data,
                  input_hash=hashlib.sha256(data).hexdigest(), parent_thread_id=parent)


async def create(store: Store, *ids: str, **kw: str) -> list[RunRecord]:
    out = []
    for tid in ids:
        run, created = await store.create_run(new_run(tid, **kw))
        assert created
        out.append(run)
    return out


def key(run: RunRecord, order: str) -> tuple[float, str]:
    return (run.updated_at if order == "updated" else run.created_at, run.thread_id)


async def pages(store: Store, size: int, **kw: object) -> list[str]:
    """Every run of a listing, read `size` at a time with the cursor of the last row seen."""
    order = str(kw.get("order", "newest"))
    seen: list[str] = []
    before: tuple[float, str] | None = None
    while True:
        page = await store.list_runs(limit=size, before=before, **kw)  # type: ignore[arg-type]
        assert len(page) <= size
        if not page:
            return seen
        seen.extend(r.thread_id for r in page)
        before = key(page[-1], order)


async def test_each_order_is_a_keyset_that_pages_without_gaps(store: Store) -> None:
    await create(store, "r-a", "r-b", "r-c")
    # Runs created together may share created_at: the thread_id breaks ties.
    await asyncio.gather(*(store.create_run(new_run(f"burst-{i}")) for i in range(6)))
    await asyncio.sleep(0.02)
    await create(store, "late", agent="u")
    await asyncio.sleep(0.02)
    # Claiming "r-a" makes it the most recently updated run, though among the oldest created.
    [claimed] = await store.claim_runs("w1", "v1", ["a"], 1, 30.0)
    rows = {r.thread_id: r for r in await store.list_runs(limit=1000)}
    rows[claimed.thread_id] = claimed
    assert len(rows) == 10
    for order, down in (("newest", True), ("oldest", False), ("updated", True)):
        listed = await store.list_runs(limit=1000, order=order)
        assert [key(r, order) for r in listed] == sorted(
            (key(r, order) for r in rows.values()), reverse=down), order
        for size in (1, 3, 4):
            assert await pages(store, size, order=order) == [r.thread_id for r in listed], (
                order, size)
    assert (await store.list_runs(order="updated", limit=1))[0].thread_id == claimed.thread_id
    assert (await store.list_runs(order="oldest", limit=1))[0].thread_id == "r-a"
    assert (await store.list_runs(order="newest", limit=1))[0].thread_id == "late"


async def test_filters_by_version_parent_and_created_time(store: Store) -> None:
    [old] = await create(store, "old", version="v1")
    await asyncio.sleep(0.05)
    [mid] = await create(store, "mid", version="v2")
    await asyncio.sleep(0.01)  # the kids after mid: created_at ticks in ms, ties go by thread_id
    kids = await create(store, "kid-1", "kid-2", parent="mid", version="v2")
    await asyncio.sleep(0.05)
    [new] = await create(store, "new", version="v1")
    ids = lambda runs: [r.thread_id for r in runs]  # noqa: E731
    assert ids(await store.list_runs(version="v1")) == ["new", "old"]
    assert set(ids(await store.list_runs(version="v2"))) == {"mid", "kid-1", "kid-2"}
    assert await store.list_runs(version="v9") == []
    assert ids(await store.list_runs(parent="mid", order="oldest")) == sorted(
        ids(kids), key=lambda t: (next(k.created_at for k in kids if k.thread_id == t), t))
    assert await store.list_runs(parent="old") == []
    assert ids(await store.list_runs(parent="mid", status="queued", prefix="kid-2")) == ["kid-2"]
    # [since, until): since is inclusive, until exclusive.
    assert ids(await store.list_runs(since=mid.created_at, until=new.created_at,
                                     order="oldest"))[0] == "mid"
    between = ids(await store.list_runs(since=mid.created_at, until=new.created_at))
    assert set(between) == {"mid", "kid-1", "kid-2"}
    assert ids(await store.list_runs(since=new.created_at)) == ["new"]
    assert ids(await store.list_runs(until=mid.created_at)) == ["old"]
    assert ids(await store.list_runs(until=old.created_at)) == []
    assert ids(await store.list_runs(since=mid.created_at, version="v1")) == ["new"]


async def test_prefix_is_exact_with_like_wildcards_and_any_characters(store: Store) -> None:
    names = ["order-1", "order-15", "order-2", "order.x", "orderx", "order_1", "order%1",
             "ordeR-1", "order-é", "order-\U0001f600", "other", "o", "order-\U0010ffff-z",
             "\U0010ffff\U0010ffff-a", "\U0010ffff\U0010ffff"]
    await create(store, *names)
    for prefix in ("order-", "order-1", "order_", "order%", "order", "o", "order-\U0010ffff",
                   "\U0010ffff", "\U0010ffff\U0010ffff", "order-é", "zzz", "ORDER"):
        want = sorted(n for n in names if n.startswith(prefix))
        for order in ("newest", "oldest", "updated"):
            got = [r.thread_id for r in await store.list_runs(prefix=prefix, order=order)]
            assert sorted(got) == want, (prefix, order)
        # Paged, with another filter on top.
        assert sorted(await pages(store, 2, prefix=prefix, agent="a")) == want, prefix


def test_prefix_end_is_the_next_string_in_code_point_order() -> None:
    assert prefix_end("order-") == "order."
    assert prefix_end("a\U0010ffff") == "b"
    assert prefix_end("a\ud7ff") == "a\ue000"  # past the surrogates
    assert prefix_end("\U0010ffff") is None
    name, params = RunQuery(prefix="\U0010ffff").plan(code_point_order=True)
    assert name == "list_runs_newest" and "lo" not in params  # a filter only, still exact
    name, params = RunQuery(prefix="ab").plan(code_point_order=True)
    assert (name, params["lo"], params["hi"]) == ("list_runs_newest_prefix", "ab", "ac")
    assert RunQuery(prefix="ab").plan(code_point_order=False)[0] == "list_runs_newest"
    assert RunQuery(parent="p", prefix="ab", order="updated").plan(
        code_point_order=True)[0] == "list_runs_updated_parent"


@pytest.mark.parametrize("bad, what", [
    ({"order": "sideways"}, "order must be one of newest, oldest, updated"),
    ({"prefix": ""}, "prefix must be a non-empty string"),
    ({"prefix": "a\x00"}, "prefix must be a non-empty string"),
    ({"version": "v" * 201}, "version must be a non-empty string"),
    ({"since": float("nan")}, "since must be a finite number"),
    ({"until": "yesterday"}, "until must be a finite number"),
    ({"before": (float("inf"), "x")}, "before must be a (seconds, thread_id) cursor"),
    ({"limit": 0}, "limit must be a positive integer"),
])
async def test_bad_listings_are_refused_by_name(store: Store, bad: dict[str, object],
                                                what: str) -> None:
    with pytest.raises(DefinitionError) as exc:
        await store.list_runs(**bad)  # type: ignore[arg-type]
    assert what in str(exc.value)


def _ids(runs: list[RunRecord]) -> list[str]:
    return [r.thread_id for r in runs]


async def test_a_status_pages_its_own_runs_in_each_order(store: Store) -> None:
    # failed and cancelled are served by their own queries (partial indexes), the others by
    # runs_created: the same rows as the status filter applied to the whole list, paged
    # without gaps, with the other filters still applied.
    await create(store, "q-1", "q-2", "c-1", "c-2")
    await create(store, "w-1", "w-2", "w-3", version="v2")
    await create(store, "q-3", "c-3", agent="u")
    claimed = {r.thread_id for r in await store.claim_runs("w1", "v2", ["a"], 2, 30.0)}
    assert len(claimed) == 2
    for tid in ("c-1", "c-2", "c-3"):
        assert await store.cancel_run(tid) is not None
    every = await store.list_runs(limit=1000)
    assert {r.thread_id for r in every if r.status == "cancelled"} == {"c-1", "c-2", "c-3"}
    for status in ("queued", "running", "cancelled", "failed"):
        for order in ("newest", "oldest"):
            want = [r.thread_id for r in (every if order == "newest" else every[::-1])
                    if r.status == status]
            assert _ids(await store.list_runs(status=status, order=order)) == want
            for size in (1, 2):
                assert await pages(store, size, status=status, order=order) == want
    assert set(_ids(await store.list_runs(status="running"))) == claimed
    assert _ids(await store.list_runs(status="queued", version="v2")) == sorted(
        {"w-1", "w-2", "w-3"} - claimed, reverse=True)
    assert _ids(await store.list_runs(status="queued", agent="u")) == ["q-3"]
    assert _ids(await store.list_runs(status="running", version="v1")) == []
    assert _ids(await store.list_runs(status="cancelled", agent="u")) == ["c-3"]
    assert _ids(await store.list_runs(status="cancelled", version="v2")) == []
    for order, want in (("newest", ["c-3", "c-2", "c-1"]), ("oldest", ["c-1", "c-2", "c-3"])):
        assert _ids(await store.list_runs(status="cancelled", version="v1", order=order)) == want
        assert await pages(store, 1, status="cancelled", version="v1", order=order) == want


def test_open_and_finished_statuses_split_every_status() -> None:
    # The latest-updated list reads the open runs and the finished ones as two parts: each
    # run must be in exactly one (migration 0012's finished_at names the same three).
    assert set(OPEN_STATUSES) | set(FINISHED_STATUSES) == {s.value for s in RunStatus}
    assert not set(OPEN_STATUSES) & set(FINISHED_STATUSES)
    for status, name in (("running", "list_runs_updated_running"),
                         ("waiting", "list_runs_updated_idle"), (None, "list_runs_updated"),
                         ("failed", "list_runs_updated_finished"),
                         ("nonesuch", "list_runs_updated")):
        assert RunQuery(status=status, order="updated").plan(code_point_order=True)[0] == name


async def test_latest_updated_merges_open_and_finished_runs(store: Store) -> None:
    # Open and finished runs interleaved in update order (the two parts of the query): a
    # finish, a claim, a cancel, a failure and a retry (finished, then open again) in turn.
    ids = [f"u-{i}" for i in range(8)]
    await create(store, *ids)
    await create(store, "other", agent="b")

    async def later() -> None:
        await asyncio.sleep(0.01)  # distinct updated_at on a coarse clock

    await later()
    assert await store.cancel_run("u-2") is not None
    await later()
    [held] = await store.claim_runs("w1", "v1", ["a"], 1, 30.0)
    await later()
    assert await store.cancel_run("u-5") is not None
    await later()
    [failing] = await store.claim_runs("w1", "v1", ["a"], 1, 30.0)
    await store.fail_step(Lease(failing.thread_id, "w1", failing.epoch), failures=1,
                          wake_at=None, error=b"{}", final=True)
    await later()
    assert await store.cancel_run("u-7") is not None
    [retried] = await store.claim_runs("w1", "v1", ["a"], 1, 30.0)
    await store.fail_step(Lease(retried.thread_id, "w1", retried.epoch), failures=1,
                          wake_at=None, error=b"{}", final=True)
    await later()
    assert await store.retry_run(retried.thread_id, "start") is not None  # open again
    every = await store.list_runs(limit=1000)
    statuses = {r.thread_id: r.status for r in every}
    assert statuses[held.thread_id] == "running" and statuses[failing.thread_id] == "failed"
    assert statuses[retried.thread_id] == "queued"
    want = sorted(every, key=lambda r: key(r, "updated"), reverse=True)
    assert _ids(await store.list_runs(order="updated")) == _ids(want)
    assert _ids(want)[:5] == [retried.thread_id, "u-7", failing.thread_id, "u-5",
                              held.thread_id]
    for size in (1, 2, 3, 5):
        assert await pages(store, size, order="updated") == _ids(want), size
    for status in ("queued", "running", "failed", "cancelled", "completed"):
        mine = [r for r in want if r.status == status]
        assert _ids(await store.list_runs(status=status, order="updated")) == _ids(mine)
        assert await pages(store, 1, status=status, order="updated") == _ids(mine), status
    assert _ids(await store.list_runs(order="updated", agent="b")) == ["other"]
    cancelled = [r for r in want if r.status == "cancelled"]
    assert _ids(await store.list_runs(order="updated", status="cancelled", limit=2,
                                      before=key(cancelled[0], "updated"))) == _ids(
        cancelled[1:3])
