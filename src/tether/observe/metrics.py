"""Prometheus metrics of a worker process (the `metrics` extra: prometheus-client).

The observer counts in plain dicts on the event loop (a step costs a few dict updates and one
bisect, no lock) and a collector turns them into Prometheus families when scraped. Labels are
bounded by the code (agent, node, version, status, category, effect name, outcome); never a
thread_id, a key or a message.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..hub import Driver, RunObserver
from ..retry import FailureCategory
from ..store.base import EffectRecord, NewRun, RunRecord

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                              5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0)
"""Histogram bounds in seconds, 1 ms to 1 h (then +Inf)."""

Key = tuple[str, ...]


class Histogram:
    """Bucket counts and a sum per label tuple; cumulated when collected."""

    __slots__ = ("bounds", "series")

    def __init__(self, bounds: tuple[float, ...] = BUCKETS) -> None:
        self.bounds = bounds
        self.series: dict[Key, list[float]] = {}

    def observe(self, key: Key, value: float) -> None:
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = [0.0] * (len(self.bounds) + 2)  # buckets, +Inf, sum
        s[bisect_left(self.bounds, value)] += 1
        s[-1] += value

    def samples(self) -> Iterator[tuple[Key, list[tuple[str, float]], float]]:
        for key, s in self.series.copy().items():
            counts = s[:]
            total, buckets = 0.0, []
            for bound, n in zip((*map(repr, self.bounds), "+Inf"), counts[:-1], strict=True):
                total += n
                buckets.append((bound, total))
            yield key, buckets, counts[-1]


def _bump(d: dict[Key, int], key: Key, n: int = 1) -> None:
    d[key] = d.get(key, 0) + n


class Metrics:
    """The counters of one process, fed by the workers through the hub (an Observer)."""

    def __init__(self) -> None:
        self.started: dict[Key, int] = {}       # agent, version
        self.finished: dict[Key, int] = {}      # agent, version, status
        self.steps: dict[Key, int] = {}         # agent, node, version
        self.retries: dict[Key, int] = {}       # agent, category
        self.failures: dict[Key, int] = {}      # agent, category
        self.released: dict[Key, int] = {}      # reason
        self.calls: dict[Key, int] = {}         # agent, outcome
        self.effects: dict[Key, int] = {}       # name, outcome
        self.parks: dict[Key, int] = {}         # agent, kind
        self.mail_delivered: dict[Key, int] = {}  # agent
        self.mail_sent: dict[Key, int] = {}     # agent
        self.takeovers = 0
        self.step_seconds = Histogram()          # agent, node
        self.run_seconds = Histogram()           # agent, status
        self.queue_wait = Histogram()            # agent
        self.call_seconds = Histogram()          # agent
        self.effect_seconds = Histogram()        # name
        self.drivers: list[Driver] = []
        self.gauges: list[Callable[[], Iterable[Any]]] = []
        """More families to yield when collected (the store's, on `tether serve`)."""

    # -- Observer --------------------------------------------------------------------------

    def run_observer(self, run: RunRecord, worker: str) -> RunObserver:
        if run.step == 0 and run.attempt <= 1:  # its first claim: the run starts now
            _bump(self.started, (run.agent, run.version))
            self.queue_wait.observe((run.agent,), max(0.0, time.time() - run.created_at))
        return _RunMetrics(self, run)

    def effect(self, effect: EffectRecord, outcome: str, started: float, finished: float) -> None:
        _bump(self.effects, (effect.name, outcome))
        self.effect_seconds.observe((effect.name,), finished - started)

    def run_created(self, new: NewRun, parent: RunRecord | None, traceparent: str | None,
                    at: float) -> str | None:
        return None

    def worker_started(self, worker: Driver) -> None:
        self.drivers.append(worker)

    def worker_stopped(self, worker: Driver) -> None:
        if worker in self.drivers:
            self.drivers.remove(worker)

    # -- Prometheus ------------------------------------------------------------------------

    def collect(self) -> Iterator[Any]:
        """The metric families now (prometheus_client's Collector protocol)."""
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        def counter(name: str, doc: str, labels: list[str], d: dict[Key, int]) -> Any:
            fam = CounterMetricFamily(name, doc, labels=labels)
            for key, n in d.copy().items():
                fam.add_metric(list(key), n)
            return fam

        def histogram(name: str, doc: str, labels: list[str], h: Histogram) -> Any:
            fam = HistogramMetricFamily(name, doc, labels=labels)
            for key, buckets, total in h.samples():
                fam.add_metric(list(key), buckets, total)
            return fam

        yield counter("tether_runs_started", "Runs whose first step began on this worker",
                      ["agent", "version"], self.started)
        yield counter("tether_runs_finished", "Runs this worker finished (completed, failed)",
                      ["agent", "version", "status"], self.finished)
        yield counter("tether_steps", "Steps committed", ["agent", "node", "version"],
                      self.steps)
        yield counter("tether_retries", "Failed attempts that will be retried",
                      ["agent", "category"], self.retries)
        yield counter("tether_failures", "Failures that failed the run for good",
                      ["agent", "category"], self.failures)
        yield counter("tether_runs_released",
                      "Runs this worker stopped driving without ending them, by reason",
                      ["reason"], self.released)
        yield counter("tether_parks", "Runs parked by a step (interrupt, sleep, join)",
                      ["agent", "kind"], self.parks)
        takeovers = CounterMetricFamily(
            "tether_lease_takeovers", "Leases of this worker taken over by another worker")
        takeovers.add_metric([], self.takeovers)
        yield takeovers
        yield counter("tether_journal_calls", "Journaled calls, made (live) or replayed",
                      ["agent", "outcome"], self.calls)
        yield counter("tether_effects", "Effect handler calls by outcome (done, retry, dead, lost)",
                      ["name", "outcome"], self.effects)
        yield counter("tether_mail_delivered", "Messages delivered to (consumed by) a step",
                      ["agent"], self.mail_delivered)
        yield counter("tether_mail_sent", "Messages sent by committed steps", ["agent"],
                      self.mail_sent)
        yield histogram("tether_step_duration_seconds", "A step's node and commit",
                        ["agent", "node"], self.step_seconds)
        yield histogram("tether_run_duration_seconds", "Created to finished",
                        ["agent", "status"], self.run_seconds)
        yield histogram("tether_queue_wait_seconds", "Created to first claim", ["agent"],
                        self.queue_wait)
        yield histogram("tether_call_duration_seconds", "Live journaled calls", ["agent"],
                        self.call_seconds)
        yield histogram("tether_effect_duration_seconds", "Effect handler calls", ["name"],
                        self.effect_seconds)
        slots = GaugeMetricFamily("tether_worker_slots", "This process's worker slots",
                                  labels=["state"])
        busy = sum(d.active for d in self.drivers)
        slots.add_metric(["busy"], busy)
        slots.add_metric(["free"], max(0, sum(d.concurrency for d in self.drivers) - busy))
        yield slots
        for more in self.gauges:
            yield from more()

    def registry(self) -> CollectorRegistry:
        """A Prometheus registry holding these metrics alone."""
        from prometheus_client import CollectorRegistry

        reg = CollectorRegistry(auto_describe=False)
        reg.register(self)
        return reg


class _RunMetrics:
    """A run's observer: its bounded labels, held once per drive."""

    __slots__ = ("agent", "created", "m", "version")

    def __init__(self, m: Metrics, run: RunRecord) -> None:
        self.m = m
        self.agent = run.agent
        self.version = run.version
        self.created = run.created_at

    def call(self, step: int, name: str, replayed: bool, started: float, finished: float) -> None:
        m = self.m
        if replayed:
            _bump(m.calls, (self.agent, "replayed"))
        else:
            _bump(m.calls, (self.agent, "live"))
            m.call_seconds.observe((self.agent,), finished - started)

    def step(self, step: int, node: str, attempt: int, started: float, finished: float,
             status: str, received: int, sent: int) -> None:
        m, agent = self.m, self.agent
        _bump(m.steps, (agent, node, self.version))
        m.step_seconds.observe((agent, node), finished - started)
        if received:
            _bump(m.mail_delivered, (agent,), received)
        if sent:
            _bump(m.mail_sent, (agent,), sent)
        if status == "completed":
            self._finished("completed", finished)

    def parked(self, step: int, node: str, attempt: int, started: float, kind: str) -> None:
        _bump(self.m.parks, (self.agent, kind))

    def failed(self, step: int, node: str | None, attempt: int, started: float,
               category: FailureCategory, exc: BaseException, final: bool) -> None:
        if final:
            _bump(self.m.failures, (self.agent, category.value))
            self._finished("failed", time.time())
        else:
            _bump(self.m.retries, (self.agent, category.value))

    def released(self, reason: str) -> None:
        _bump(self.m.released, (reason,))
        if reason == FailureCategory.LEASE_LOST.value:
            self.m.takeovers += 1

    def _finished(self, status: str, at: float) -> None:
        _bump(self.m.finished, (self.agent, self.version, status))
        self.m.run_seconds.observe((self.agent, status), max(0.0, at - self.created))


def serve(metrics: Metrics, port: int) -> Callable[[], None]:
    """Serve `metrics` at http://127.0.0.1:port/metrics from a thread; returns its stop.
    A port in use is a ConfigError (a worker must not run blind)."""
    from prometheus_client import start_http_server

    from ..errors import ConfigError

    try:
        server, thread = start_http_server(port, addr="127.0.0.1", registry=metrics.registry())
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on 127.0.0.1:{port}: {exc.strerror or exc}"
                          ) from exc

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop
