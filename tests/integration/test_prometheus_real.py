"""A real Prometheus (Debian's `prometheus`, apps.prometheus) scraping a `tether worker
--metrics-port` and a `tether serve` every second while a known workload runs: its HTTP API
says what the workload did. Steps sleep a known time; some runs fail for good, some wait for a
person. Prometheus's answers are checked against the store: the step rate is positive while
runs are still going, the median step time is in the bucket of the known sleep (or the next
one), the runs by status and the steps counted equal the store's."""

from __future__ import annotations

import re
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import tether
from apps import TESTS_DIR, Workers, eventually
from apps import observe_app as app
from apps.http_harness import Procs, app_env, free_port
from apps.pg_cluster import in_ci
from apps.prometheus import Prometheus, available, config
from apps.sessions import blocks
from tether.observe.metrics import BUCKETS

pytestmark = pytest.mark.slow

SLEEP = 0.2
"""Seconds each step of the workload sleeps."""
COMPLETED, FAILED, WAITING = 16, 3, 3
STEPS = 20
CONCURRENCY = 10
STEP_BUCKETS = "tether_step_duration_seconds_bucket"


@pytest.fixture
def prometheus_available() -> Iterator[None]:
    reason = available()
    if reason is not None:
        if in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    yield


def bucket_of(seconds: float) -> int:
    """The index of the histogram bucket holding `seconds` (len(BUCKETS): +Inf)."""
    return bisect_left(BUCKETS, seconds)


def test_bucket_of_follows_prometheus_le() -> None:
    assert bucket_of(0.2) == bucket_of(0.25) == BUCKETS.index(0.25)
    assert bucket_of(0.1) == BUCKETS.index(0.1)
    assert bucket_of(0.11) == BUCKETS.index(0.25)
    assert bucket_of(5000.0) == len(BUCKETS)


async def test_prometheus_scrapes_a_worker_and_serve(prometheus_available: None, db_url: str,
                                                     tmp_path: Path) -> None:
    metrics_port = free_port()
    procs = Procs(tmp_path, db_url)
    rt = tether.Runtime(db_url, agents=[app.agent, app.child_agent])
    try:
        with Workers(db_url, tmp_path, call_log=tmp_path / "calls.log",
                     app="apps.observe_app:make_runtime") as ws:
            worker = ws.start(concurrency=CONCURRENCY, lease_ttl=10,
                              extra=["--metrics-port", str(metrics_port)])
            serve_port = free_port()
            # Prometheus first: its discovery hands it the targets about 5 s after its start,
            # while the worker and `tether serve` start.
            with Prometheus({"tether-worker": [f"127.0.0.1:{metrics_port}"],
                             "tether-serve": [f"127.0.0.1:{serve_port}"]}, interval=1) as prom:
                path = f"{TESTS_DIR}:{app_env(db_url)['PYTHONPATH']}"
                procs.serve(app="apps.observe_app:make_runtime", port=serve_port,
                            env=app_env(db_url, PYTHONPATH=path))

                def both_up() -> bool:
                    health = prom.targets()
                    return len(health) == 2 and set(health.values()) == {"up"}

                await eventually(both_up, what="Prometheus scraping both targets", timeout=30,
                                 workers=ws)
                await workload(prom, rt, ws)
                for expr in doc_queries():  # the docs' queries: valid, with an answer
                    assert prom.query(expr), f"docs/howto-observability.md: {expr} is empty"
            assert worker.terminate() == 0, worker.output()
    finally:
        procs.close()
        await rt.close()


async def workload(prom: Prometheus, rt: tether.Runtime, ws: Workers) -> None:
    t0 = time.monotonic()
    ids = [(await rt.start(app.agent, {"steps": STEPS, "pause": SLEEP})).thread_id
           for _ in range(COMPLETED)]
    ids += [(await rt.start(app.agent, {"steps": STEPS, "pause": SLEEP, "fail": 3})).thread_id
            for _ in range(FAILED)]
    ids += [(await rt.start(app.agent, {"steps": STEPS, "pause": SLEEP, "ask": 2})).thread_id
            for _ in range(WAITING)]

    async def unfinished() -> int:
        counts = (await rt.status_counts()).runs
        return sum(n for (status, _), n in counts.items() if status in ("queued", "running"))

    # While the runs go on, Prometheus sees steps committed at a positive rate.
    rate: dict[tuple[str, ...], float] = {}

    def stepping() -> bool:
        rate.update(prom.values("sum(rate(tether_steps_total[30s]))"))
        return rate.get((), 0.0) > 0

    await eventually(stepping, what="a positive rate(tether_steps_total[30s])", timeout=30,
                     workers=ws)
    still = await unfinished()
    assert still > 0, (f"the workload ended before Prometheus saw it "
                       f"({time.monotonic() - t0:.1f}s); make it longer")
    assert rate[()] <= CONCURRENCY / SLEEP * 1.5, rate  # no faster than the slots allow

    runs = {tid: (await rt.wait(tid, timeout=60, until="waiting")).status for tid in ids}
    assert Counter(runs.values()) == {"completed": COMPLETED, "failed": FAILED,
                                      "waiting": WAITING}
    steps = sum([len(await rt.checkpoints(tid)) for tid in ids])
    store = Counter[str]()
    for (status, _), n in (await rt.status_counts()).runs.items():
        store[status] += n

    # The counters, once Prometheus has scraped the worker after its last step: every
    # committed step, every finished run.
    def counted() -> bool:
        return prom.values("sum(tether_steps_total)") == {(): float(steps)}

    await eventually(counted, what=f"Prometheus to count {steps} steps", timeout=20, workers=ws)
    finished = prom.values("sum by (status) (tether_runs_finished_total)", "status")
    assert finished == {("completed",): COMPLETED, ("failed",): FAILED}

    # The median step, from the buckets' rate: within one bucket of the known sleep.
    median = prom.values(f"histogram_quantile(0.5, sum by (le) (rate({STEP_BUCKETS}[30s])))")
    assert set(median) == {()}, median
    assert abs(bucket_of(median[()]) - bucket_of(SLEEP)) <= 1, (median, SLEEP)
    p99 = prom.values(f"histogram_quantile(0.99, sum by (le) (rate({STEP_BUCKETS}[30s])))")
    assert bucket_of(p99[()]) >= bucket_of(SLEEP) - 1, p99

    # The store-wide gauges of `tether serve` (a cached read, refreshed every 5 s): the
    # runs by status the store holds.
    seen: dict[tuple[str, ...], float] = {}

    def gauged() -> bool:
        seen.clear()
        seen.update(prom.values("sum by (status) (tether_runs)", "status"))
        return {k[0]: v for k, v in seen.items() if v} == dict(store)

    await eventually(gauged, what=f"tether_runs by status to be {dict(store)}", timeout=20,
                     workers=ws)
    assert dict(store) == {"completed": COMPLETED, "failed": FAILED, "waiting": WAITING}
    open_effects = prom.values("sum by (status) (tether_effects_open)", "status")
    assert open_effects[("pending",)] == 0 and open_effects[("dead",)] == 0, open_effects


DOCS = TESTS_DIR.parent / "docs" / "howto-observability.md"


def doc_queries() -> list[str]:
    """The PromQL of docs/howto-observability.md's table of questions."""
    page = DOCS.read_text()
    table = page[page.index("| question | query |"):]
    table = table[:table.index("\n\n")]
    return [expr for row in table.splitlines()[2:] for expr in re.findall(r"`([^`]+)`", row)]


def test_doc_queries_are_read() -> None:
    queries = doc_queries()
    assert len(queries) >= 7 and all("tether_" in q for q in queries), queries


def test_the_docs_show_the_configuration_this_test_runs() -> None:
    """docs/howto-observability.md's prometheus.yml, its comments aside, is the one
    apps.prometheus writes for a worker on 9464 and `tether serve` on 8000."""
    page = DOCS.read_text()
    shown = next(body for _, body in blocks(page, "yaml") if "tether-worker" in body)
    lines = [re.sub(r"\s+#.*$", "", line) for line in shown.splitlines()]
    lines = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    want = config({"tether-worker": ["127.0.0.1:9464"], "tether-serve": ["127.0.0.1:8000"]}, 1)
    assert "\n".join(lines) + "\n" == want
