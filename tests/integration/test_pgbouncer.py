"""tether through PgBouncer's transaction pooling (issue 34): with `pool_mode=transaction` no
server-side prepared statement crosses transactions (without it the store contract fails:
"prepared statement _pg3_0 already exists"), LISTEN goes to `listen_url` (a direct or
session-mode URL), and without one the store refuses to open with the reason. A PgBouncer of
the test's own (apps.pgbouncer) in front of the test database."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

import tether
from apps import inprocess
from apps.pg_cluster import in_ci
from apps.pgbouncer import PgBouncer, available
from tether.errors import ConfigError
from tether.store.postgres import PostgresStore

pytestmark = [pytest.mark.postgres, pytest.mark.failover]

TESTS = Path(__file__).resolve().parent.parent


@pytest.fixture
def bouncer(pg_url: str) -> Iterator[PgBouncer]:
    reason = available()
    if reason is not None:
        if in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    parts = urlsplit(pg_url)
    with PgBouncer(parts.hostname or "127.0.0.1", parts.port or 5432) as b:
        yield b


def test_transaction_pooling_needs_a_listen_url() -> None:
    url = "postgresql://u:pw@bouncer:6432/db?pool_mode=transaction"
    with pytest.raises(ConfigError, match="listen_url") as err:
        PostgresStore(url)
    assert "pw" not in str(err.value)
    with pytest.raises(ConfigError, match="LISTEN needs a session"):
        PostgresStore("postgresql://u@db/db?listen_url="
                      + quote("postgresql://u@bouncer/db?pool_mode=transaction", safe=""))
    with pytest.raises(ConfigError, match="synchronous_commit"):
        PostgresStore(url + "&listen_url=postgresql%3A%2F%2Fu%40db%2Fdb",
                      synchronous_commit="off")
    with pytest.raises(ConfigError, match="pool_mode"):
        PostgresStore("postgresql://u@db/db?pool_mode=statement")


async def test_runs_through_pgbouncer_are_woken_by_listen(pg_url: str,
                                                          bouncer: PgBouncer) -> None:
    """Journaled steps through transaction pooling; a run started is claimed at once (the
    worker polls only every 5 s): the listener is on the direct URL."""
    agent = tether.Agent("bounced")

    @agent.node(start=True)
    async def step(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
        n = await ctx.call(len, "x" * ctx.step)
        if ctx.step >= 3:
            return tether.finish({"last": n})
        return tether.goto("step")

    url = bouncer.url(urlsplit(pg_url).path.lstrip("/"), listen_url=pg_url)
    rt = inprocess.make_runtime(url, agent, poll_interval=5.0)
    starter = inprocess.make_runtime(url, agent)
    try:
        async with inprocess.working(rt, concurrency=20):
            await asyncio.sleep(0.3)  # the worker is waiting: only a wake-up gets it claiming
            t0 = time.monotonic()
            runs = [await starter.start(agent, {}) for _ in range(30)]  # another process's
            done = [await starter.wait(r.thread_id, timeout=30) for r in runs]
            took = time.monotonic() - t0
        assert [d.state for d in done] == [{"last": 3}] * 30
        assert took < 4.0, took  # not at the next poll
        assert "pool_mode=transaction" in repr(rt.store)
    finally:
        await starter.close()


def test_the_store_contract_passes_through_pgbouncer(bouncer: PgBouncer) -> None:
    """The store contract (and the listing and state-machine contracts) on Postgres, every
    database through a PgBouncer in transaction mode (conftest: TETHER_TEST_PGBOUNCER)."""
    env = {**os.environ, "TETHER_TEST_PGBOUNCER": "1",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "postgres",
         "contract/test_store_contract.py", "contract/test_store_listing_contract.py",
         "contract/test_store_statemachine.py"],
        cwd=TESTS, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "failed" not in out.stdout, out.stdout[-2000:]


async def test_the_langgraph_saver_through_pgbouncer(pg_url: str, bouncer: PgBouncer) -> None:
    """TetherSaver on the same URL: more checkpoints than psycopg's prepare threshold (5),
    each read back, through transaction pooling."""
    from langgraph.checkpoint.base import empty_checkpoint

    from tether.langgraph import TetherSaver

    url = bouncer.url(urlsplit(pg_url).path.lstrip("/"), listen_url=pg_url)
    async with TetherSaver.from_conn_string(url) as saver:
        await saver.setup()
        config: Any = {"configurable": {"thread_id": "bounced", "checkpoint_ns": ""}}
        for step in range(12):
            config = await saver.aput(config, empty_checkpoint(),
                                      {"source": "loop", "step": step}, {})
            got = await saver.aget_tuple(config)
            assert got is not None and got.metadata["step"] == step
