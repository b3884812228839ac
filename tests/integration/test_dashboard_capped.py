"""The dashboard and `runtime.deployments()` at a size where counting every open run would be
a scan (a million parked actors): counts stop at their cap and say so ("10,000+"), exact
below it, and a status's runs list pages through every run of that status, in order, once.
On both stores, with runs that stay queued (no worker): an open status like waiting."""

from __future__ import annotations

import html
import re

import httpx

from apps import inprocess
from tether import Agent, Command, Context, Runtime, finish
from tether.deploy import COUNT_CAP
from tether.service.api import create_app
from tether.service.dashboard_data import RUN_CAP

MANY = COUNT_CAP + 3  # queued runs of v1: past the cap
FEW = 3  # queued runs of v2


def agent() -> Agent:
    a = Agent("idle")

    @a.node(start=True)
    async def only(state: dict[str, object], ctx: Context) -> Command:
        return finish({})

    return a


async def _start(db_url: str, n: int, version: str, prefix: str) -> None:
    rt = Runtime(db_url, agents=[agent()], version=version)
    try:
        for lo in range(0, n, 5000):  # batches: runs of one batch share created_at
            await rt.start_many([{"agent": "idle", "input": {}, "thread_id": f"{prefix}{i:06d}"}
                                 for i in range(lo, min(n, lo + 5000))])
    finally:
        await rt.close()


def _cell(page: str, status: str) -> list[str]:
    row = re.search(rf'<tr data-status="{status}">(.*?)</tr>', page, re.S)
    assert row is not None, page[-2000:]
    return re.findall(r'<td class="num">([^<]*)</td>', row.group(1))


async def test_counts_stop_at_their_cap_and_say_so(db_url: str) -> None:
    assert COUNT_CAP == RUN_CAP == 10_000
    await _start(db_url, MANY, "v1", "a")
    await _start(db_url, FEW, "v2", "b")
    rt = inprocess.make_runtime(db_url, agent())
    try:
        found = {d.version: d for d in await rt.deployments()}
        assert found["v1"].runs == {"queued": COUNT_CAP} and found["v1"].capped == {"queued"}
        assert found["v1"].open_more and found["v1"].as_dict()["capped"] == ["queued"]
        assert found["v2"].runs == {"queued": FEW} and not found["v2"].capped
        exact = {d.version: d for d in await rt.deployments(cap=None)}
        assert exact["v1"].runs == {"queued": MANY} and not exact["v1"].capped
        counts = await rt.status_counts(cap=RUN_CAP)
        assert counts.runs[("queued", "v1")] == RUN_CAP
        assert counts.runs_more == {("queued", "v1")}
        assert counts.runs[("queued", "v2")] == FEW
        assert (await rt.status_counts()).runs[("queued", "v1")] == MANY  # the gauges': exact

        app = create_app(rt)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as c:
            page = (await c.get("/ui")).text
            # all (at least v1's 10,000 and v2's 3), v1, v2
            assert _cell(page, "queued") == ["10,003+", "10,000+", "3"]
            assert _cell(page, "completed") == ["0", "0", "0"]
            deployments = (await c.get("/ui/deployments")).text
            assert "10,000+</a>" in deployments and ">3</a>" in deployments
            metrics = await c.get("/ui/metrics")
            assert metrics.status_code == 200
    finally:
        await rt.close()


async def test_an_open_status_pages_through_every_run_once_in_order(db_url: str) -> None:
    await _start(db_url, 130, "v1", "a")
    await _start(db_url, 70, "v2", "b")
    rt = inprocess.make_runtime(db_url, agent())
    try:
        every = await rt.list_runs(limit=1000)
        want = [r.thread_id for r in sorted(every, key=lambda r: (r.created_at, r.thread_id),
                                            reverse=True)]
        app = create_app(rt)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as c:
            for order, expect in (("newest", want), ("oldest", want[::-1])):
                seen: list[str] = []
                path: str | None = f"/ui/runs?status=queued&order={order}&limit=20"
                while path is not None:
                    page = (await c.get(path)).text
                    seen += re.findall(r'class="tid" href="/ui/runs/([^"]+)"', page)
                    nxt = re.search(r'<a rel="next" href="([^"]+)"', page)
                    path = html.unescape(nxt.group(1)) if nxt else None
                assert seen == expect, order
            for version, prefix in (("v1", "a"), ("v2", "b")):
                runs = await rt.list_runs(status="queued", version=version, limit=1000)
                assert [r.thread_id for r in runs] == [t for t in want if t[0] == prefix]
    finally:
        await rt.close()
