"""`tether serve`'s /metrics (the app in-process): the store-wide gauges, read from the store
at most once per cache period however often it is scraped, and the embedded worker's
counters."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

import tether
from apps import observe_app as app
from tether.service import create_app


def gauges(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == name}


async def test_metrics_gauges_are_cached_reads_of_the_store(db_url: str) -> None:
    rt = tether.Runtime(db_url, agents=[app.agent, app.child_agent], poll_interval=0.05)
    asgi = create_app(rt)
    async with asgi.router.lifespan_context(asgi):
        for i in range(3):
            await rt.start(app.agent, {"steps": 1}, thread_id=f"g{i}")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi),
                                     base_url="http://test") as c:
            first = await c.get("/metrics")
            assert first.status_code == 200
            assert first.headers["content-type"].startswith("text/plain")
            runs = gauges(first.text, "tether_runs")
            assert runs == {(("status", "queued"), ("version", "v1")): 3.0}
            assert gauges(first.text, "tether_effects_open")[(("status", "dead"),)] == 0
            await rt.start(app.agent, {"steps": 1}, thread_id="g3")
            for _ in range(5):
                again = await c.get("/metrics")
                assert gauges(again.text, "tether_runs")[(("status", "queued"),
                                                          ("version", "v1"))] == 3.0
            cache = asgi.state.store_gauges
            assert cache.reads == 1
            cache.read_at = float("-inf")  # the cache period passed
            later = await c.get("/metrics")
            assert gauges(later.text, "tether_runs")[(("status", "queued"),
                                                      ("version", "v1"))] == 4.0
            assert cache.reads == 2


async def test_metrics_count_the_embedded_workers_runs(db_url: str) -> None:
    rt = app.make_runtime().with_db(db_url)
    asgi = create_app(rt, worker_concurrency=4)
    async with asgi.router.lifespan_context(asgi):
        runs = [await rt.start(app.agent, {"steps": 2}) for _ in range(3)]
        for r in runs:
            assert (await rt.wait(r.thread_id, timeout=30)).status == "completed"
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi),
                                     base_url="http://test") as c:
            text = (await c.get("/metrics")).text
    finished = gauges(text, "tether_runs_finished_total")
    assert finished == {(("agent", "obs"), ("status", "completed"), ("version", "v1")): 3.0}
    steps = gauges(text, "tether_steps_total")
    assert steps == {(("agent", "obs"), ("node", "work"), ("version", "v1")): 6.0}
    assert rt.hub.observers == []  # detached when the app stopped
