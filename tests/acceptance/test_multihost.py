"""A multi-host URL (libpq's syntax, target_session_attrs=read-write) works for every way in:
the Runtime, the CLI, `tether serve` (with its worker), TetherSaver and the advisor; its
password is shown masked everywhere; and after the primary is lost and the standby promoted,
the same URL finds the new primary with no change (issue 34). On a primary and a standby of
the test's own (apps.pg_cluster)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tether
from apps import inprocess
from apps.http_harness import Procs, wait_until
from apps.pg_cluster import PgPair, available, in_ci
from tether.langgraph import TetherSaver

pytestmark = [pytest.mark.failover, pytest.mark.slow]

SECRET = "s3cret-pw"  # trust auth: the server never asks for it, so any value works


@pytest.fixture(autouse=True)
def _needs_a_pair() -> None:
    reason = available()
    if reason is not None:
        if in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)


def _cli(url: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("TETHER_DB", None)
    out = subprocess.run([sys.executable, "-m", "tether", *args, "--db", url], env=env,
                         capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert SECRET not in text, text
    return text


async def test_a_multi_host_url_everywhere(tmp_path: Path) -> None:
    agent = tether.Agent("hosts")

    @agent.node(start=True)
    async def only(state: dict[str, Any], ctx: tether.Context) -> tether.Command:
        return tether.finish({"n": await ctx.call(len, "abc")})

    with PgPair(sync=True) as pair:
        url = pair.url(auth=f"postgres:{SECRET}")
        assert "," in url and "target_session_attrs=read-write" in url
        await asyncio.to_thread(_cli, url, "migrate")
        rt = inprocess.make_runtime(url, agent)
        assert SECRET not in repr(rt.store) and SECRET not in rt.store.safe_url
        async with inprocess.working(rt, close=False):
            run = await rt.start(agent, {})
            assert (await rt.wait(run.thread_id, timeout=30)).state == {"n": 3}
        listed = await asyncio.to_thread(_cli, url, "runs", "list")
        assert run.thread_id in listed
        await asyncio.to_thread(_cli, url, "advise", "--measure", "--no-probe")
        async with TetherSaver.from_conn_string(url) as saver:
            assert await saver.aget_tuple({"configurable": {"thread_id": "none"}}) is None
        procs = Procs(tmp_path, url)
        try:
            server = await asyncio.to_thread(procs.serve, worker=True)
            with server.client() as c:
                r = c.post("/runs", json={"agent": "echo", "input": {"text": "hi"}})
                assert r.status_code in (200, 201), r.text
                assert c.get("/runs").status_code == 200
            # The primary is lost; the standby takes over; the same URL finds it.
            pair.kill_primary()
            pair.promote()
            with server.client() as c:

                def listed_again() -> bool:
                    return c.get("/runs").status_code == 200

                await asyncio.to_thread(wait_until, listed_again, 10, "serve after failover")
            assert SECRET not in server.output(), server.output()
        finally:
            procs.close()
        after = await asyncio.to_thread(_cli, url, "runs", "list")
        assert run.thread_id in after
        await rt.close()
