"""The store's side of the metrics: group-commit batch sizes and latency (both stores), and
the Postgres pool's connections, scraped in the Prometheus text format, against the true
counts: the writes made, and the server's own list of connections."""

from __future__ import annotations

import asyncio
import hashlib
import uuid

import orjson
import psycopg
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tether.observe.metrics import Metrics
from tether.store import make_store
from tether.store.base import NewRun

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(m: Metrics) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(generate_latest(m.registry()).decode()):
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    [found] = [v for lab, v in samples[name] if all(lab.get(k) == w for k, w in labels.items())]
    return found


def new_run() -> NewRun:
    data = orjson.dumps({"q": 1})
    return NewRun(thread_id=f"t-{uuid.uuid4().hex[:12]}", agent="a", version="v", node="n",
                  input=data, input_hash=hashlib.sha256(data).hexdigest())


async def test_group_commits_are_counted_with_their_writes(db_url: str) -> None:
    store = make_store(db_url)
    m = Metrics()
    m.watch_store(store)  # before it opens: what it commits from its first write is seen
    await store.open()
    try:
        for _ in range(5):  # one at a time: five commits of one write
            await store.create_run(new_run())
        after_singles = scrape(m)
        await asyncio.gather(*(store.create_run(new_run()) for _ in range(50)))
        samples = scrape(m)
        runs = len(await store.list_runs(limit=1000))
    finally:
        await store.close()
    assert runs == 55
    assert value(after_singles, "tether_commit_batch_size_count") == 5
    assert value(after_singles, "tether_commit_batch_size_sum") == 5
    assert value(after_singles, "tether_commit_batch_size_bucket", le="1.0") == 5
    # Every write is in exactly one group commit; concurrent ones share them.
    assert value(samples, "tether_commit_batch_size_sum") == runs
    commits = value(samples, "tether_commit_batch_size_count")
    if store.dialect == "sqlite":  # submitted in one loop iteration: one transaction
        assert commits == 6
        assert value(samples, "tether_commit_batch_size_bucket", le="20.0") == 5
        assert value(samples, "tether_commit_batch_size_bucket", le="50.0") == 6
    else:  # two writers take one each at once, the rest queue into group commits
        assert 5 + 3 <= commits < runs
    assert value(samples, "tether_commit_duration_seconds_count") == commits
    assert value(samples, "tether_commit_duration_seconds_sum") > 0
    assert "tether_pool_connections" not in samples or store.dialect == "postgres"


async def test_the_pool_gauges_match_the_servers_connections(db_url: str) -> None:
    store = make_store(db_url)
    if store.dialect != "postgres":
        assert store.pool_statistics() == {}  # SQLite has no pool: no gauge
        m = Metrics()
        m.watch_store(store)
        assert "tether_pool_connections" not in scrape(m)
        return
    m = Metrics()
    m.watch_store(store)
    assert "tether_pool_connections" not in scrape(m)  # not open: nothing to report
    await store.open()
    try:
        await asyncio.gather(*(store.create_run(new_run()) for _ in range(20)))
        samples = scrape(m)
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as probe:
            cur = await probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()")
            row = await cur.fetchone()
            assert row is not None
            server = int(row[0])
    finally:
        await store.close()
    in_use = value(samples, "tether_pool_connections", state="in_use")
    idle = value(samples, "tether_pool_connections", state="idle")
    assert in_use == 2  # the group commit's two writers keep theirs; reads gave theirs back
    assert in_use + idle == server - 1  # the server's, less the listener's own connection
    assert value(samples, "tether_pool_max_connections") == getattr(store, "max_size", None)
    assert value(samples, "tether_pool_requests_waiting") == 0
