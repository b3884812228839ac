"""`tether serve`'s /metrics (the app in-process): the store-wide gauges, read from the store
at most once per cache period however often it is scraped, and the embedded worker's
counters."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

import tether
from apps import eventually
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
                                     base_url="http://127.0.0.1") as c:
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
                                     base_url="http://127.0.0.1") as c:
            text = (await c.get("/metrics")).text
    finished = gauges(text, "tether_runs_finished_total")
    assert finished == {(("agent", "obs"), ("status", "completed"), ("version", "v1")): 3.0}
    steps = gauges(text, "tether_steps_total")
    assert steps == {(("agent", "obs"), ("node", "work"), ("version", "v1")): 6.0}
    assert rt.hub.observers == []  # detached when the app stopped


async def test_effects_done_and_dead_are_counted_as_the_store_has_them(db_url: str) -> None:
    agent = tether.Agent("fxobs")

    @agent.node(start=True)
    async def pay(state: dict[str, int], ctx: tether.Context) -> tether.Command:
        ctx.effect("card.charge", {"n": state["n"]})
        return tether.finish({})

    rt = tether.Runtime(db_url, agents=[agent], version="v1", poll_interval=0.05)

    @rt.effect("card.charge", retry=tether.RetryPolicy(attempts=2, initial=0.01, jitter=0.0))
    async def charge(payload: dict[str, int], key: str) -> None:
        if payload["n"] % 3 == 0:
            raise ValueError("declined")

    asgi = create_app(rt, worker_concurrency=4)
    async with asgi.router.lifespan_context(asgi):
        for n in range(7):
            await rt.start(agent, {"n": n}, thread_id=f"fx{n}")

        async def settled() -> bool:
            effects = await rt.effects(limit=100)
            return len(effects) == 7 and all(e.status in ("done", "dead") for e in effects)

        await eventually(settled, what="every effect done or dead")
        dead = len(await rt.effects(status="dead", limit=100))
        done = len(await rt.effects(status="done", limit=100))
        text = ""

        async def counted() -> bool:  # the dispatcher counts an outcome once it is stored
            nonlocal text
            asgi.state.store_gauges.read_at = float("-inf")  # read the store afresh
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi),
                                         base_url="http://127.0.0.1") as c:
                text = (await c.get("/metrics")).text
            return sum(gauges(text, "tether_effects_total").values()) == done + 2 * dead

        await eventually(counted, what="every effect outcome counted")
    assert (dead, done) == (3, 4)  # n = 0, 3, 6 are declined, twice each
    outcomes = gauges(text, "tether_effects_total")
    assert outcomes == {(("name", "card.charge"), ("outcome", "done")): done,
                        (("name", "card.charge"), ("outcome", "retry")): dead,
                        (("name", "card.charge"), ("outcome", "dead")): dead}
    open_effects = gauges(text, "tether_effects_open")
    assert open_effects == {(("status", "pending"),): 0, (("status", "running"),): 0,
                            (("status", "dead"),): dead}
    assert gauges(text, "tether_effect_duration_seconds_count") == {
        (("name", "card.charge"),): done + 2 * dead}
    # The embedded worker's store: its group commits are counted too.
    assert sum(gauges(text, "tether_commit_batch_size_count").values()) > 0


async def test_effects_waiting_for_a_handler_show_as_pending(db_url: str) -> None:
    """tether_effects_open{status="pending"} with a non-zero count: the mailer is down, so
    each effect failed once and waits a minute for its next attempt; the gauge says how
    many wait."""
    agent = tether.Agent("fxwait")

    @agent.node(start=True)
    async def notify(state: dict[str, int], ctx: tether.Context) -> tether.Command:
        ctx.effect("mail.send", {"n": state["n"]})
        return tether.finish({})

    rt = tether.Runtime(db_url, agents=[agent], version="v1", poll_interval=0.05)

    @rt.effect("mail.send", retry=tether.RetryPolicy(attempts=5, initial=60, jitter=0.0))
    async def send(payload: dict[str, int], key: str) -> None:
        raise ConnectionError("mailer down")

    asgi = create_app(rt, worker_concurrency=4)
    async with asgi.router.lifespan_context(asgi):
        for n in range(5):
            await rt.start(agent, {"n": n}, thread_id=f"fw{n}")

        async def waiting() -> bool:
            effects = await rt.effects(status="pending", limit=10)
            return len(effects) == 5 and all(e.attempts == 1 for e in effects)

        await eventually(waiting, what="every effect failed once, waiting")
        asgi.state.store_gauges.read_at = float("-inf")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi),
                                     base_url="http://127.0.0.1") as c:
            text = (await c.get("/metrics")).text
    assert gauges(text, "tether_effects_open")[(("status", "pending"),)] == 5
    assert len(await rt.effects(status="pending", limit=10)) == 5
