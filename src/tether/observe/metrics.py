"""Prometheus metrics of a worker process (the `metrics` extra: prometheus-client).

The observer counts in plain lists on the event loop, each series bound once per (agent,
version) and node, so a step costs a few list increments and one bisect, no label lookup and
no lock; a collector turns them into Prometheus families when scraped. The store's group
commits are observed the same way (batch size and latency), and its pool read when scraped. Labels are
bounded by the code (agent, node, version, status, category, effect name, outcome); never a
thread_id, a key or a message.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..hub import Driver, RunObserver
from ..retry import FailureCategory
from ..store.base import EffectRecord, NewRun, RunRecord, Store

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                              5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0)
"""Histogram bounds in seconds, 1 ms to 1 h (then +Inf)."""

Key = tuple[str, ...]

SIZE_BUCKETS: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0,
                                   2000.0)
"""Bounds of the group-commit batch size histogram (writes per transaction)."""


def _observe(bounds: tuple[float, ...], s: list[float], value: float) -> None:
    s[bisect_left(bounds, value)] += 1
    s[-1] += value


class Histogram:
    """Bucket counts and a sum per label tuple; cumulated when collected. `cell(key)` is one
    series' list, held by a caller that observes it often (no lookup per observation); a
    series never observed is not exported."""

    __slots__ = ("bounds", "series")

    def __init__(self, bounds: tuple[float, ...] = BUCKETS) -> None:
        self.bounds = bounds
        self.series: dict[Key, list[float]] = {}

    def cell(self, key: Key) -> list[float]:
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = [0.0] * (len(self.bounds) + 2)  # buckets, +Inf, sum
        return s

    def observe(self, key: Key, value: float) -> None:
        _observe(self.bounds, self.cell(key), value)

    def samples(self) -> Iterator[tuple[Key, list[tuple[str, float]], float]]:
        for key, s in self.series.copy().items():
            counts = s[:]
            if not any(counts[:-1]):  # bound ahead, never observed: not exported
                continue
            total, buckets = 0.0, []
            for bound, n in zip((*map(repr, self.bounds), "+Inf"), counts[:-1], strict=True):
                total += n
                buckets.append((bound, total))
            yield key, buckets, counts[-1]


class Counter:
    """A count per label tuple, each in a one-item list (`cell(key)`: held by a caller that
    bumps it often); a series still at 0 is not exported (it was only bound ahead)."""

    __slots__ = ("series",)

    def __init__(self) -> None:
        self.series: dict[Key, list[int]] = {}

    def cell(self, key: Key) -> list[int]:
        c = self.series.get(key)
        if c is None:
            c = self.series[key] = [0]
        return c

    def inc(self, key: Key, n: int = 1) -> None:
        self.cell(key)[0] += n

    def value(self, key: Key) -> int:
        c = self.series.get(key)
        return 0 if c is None else c[0]

    def samples(self) -> Iterator[tuple[Key, int]]:
        for key, c in self.series.copy().items():
            if c[0]:  # a series bound ahead and never bumped is not exported
                yield key, c[0]


class _Bound:
    """The series one (agent, version) feeds, bound once: a step or call of its runs bumps
    lists it holds, with no label tuple built or looked up."""

    __slots__ = ("call_s", "completed", "delivered", "failed", "live", "m", "nodes",
                 "replayed", "run_completed_s", "run_failed_s", "sent")

    def __init__(self, m: Metrics, agent: str, version: str) -> None:
        self.m = m
        self.live = m.calls.cell((agent, "live"))
        self.replayed = m.calls.cell((agent, "replayed"))
        self.call_s = m.call_seconds.cell((agent,))
        self.completed = m.finished.cell((agent, version, "completed"))
        self.failed = m.finished.cell((agent, version, "failed"))
        self.run_completed_s = m.run_seconds.cell((agent, "completed"))
        self.run_failed_s = m.run_seconds.cell((agent, "failed"))
        self.delivered = m.mail_delivered.cell((agent,))
        self.sent = m.mail_sent.cell((agent,))
        self.nodes: dict[str, tuple[list[int], list[float]]] = {}

    def node(self, agent: str, version: str, node: str) -> tuple[list[int], list[float]]:
        cells = self.nodes.get(node)
        if cells is None:
            cells = self.nodes[node] = (self.m.steps.cell((agent, node, version)),
                                        self.m.step_seconds.cell((agent, node)))
        return cells


class Metrics:
    """The counters of one process, fed by the workers through the hub (an Observer) and
    by its store's group commits (a tether.store.base.CommitObserver)."""

    def __init__(self) -> None:
        self.started = Counter()       # agent, version
        self.finished = Counter()      # agent, version, status
        self.steps = Counter()         # agent, node, version
        self.retries = Counter()       # agent, category
        self.failures = Counter()      # agent, category
        self.released = Counter()      # reason
        self.calls = Counter()         # agent, outcome
        self.effects = Counter()       # name, outcome
        self.parks = Counter()         # agent, kind
        self.mail_delivered = Counter()  # agent
        self.mail_sent = Counter()     # agent
        self.takeovers = Counter()     # agent, version: expired leases this worker took over
        self.leases_lost = 0           # leases of this worker another one took over
        self.step_seconds = Histogram()          # agent, node
        self.run_seconds = Histogram()           # agent, status
        self.queue_wait = Histogram()            # agent
        self.call_seconds = Histogram()          # agent
        self.effect_seconds = Histogram()        # name
        self.commit_size = Histogram(SIZE_BUCKETS)  # (no labels): writes per group commit
        self.commit_seconds = Histogram()        # (no labels)
        self._commit_size = self.commit_size.cell(())
        self._commit_seconds = self.commit_seconds.cell(())
        self._bound: dict[tuple[str, str], _Bound] = {}
        self.drivers: list[Driver] = []
        self.pools: list[Callable[[], Mapping[str, int]]] = []
        """Connection pool statistics to read when collected (the store's)."""
        self.gauges: list[Callable[[], Iterable[Any]]] = []
        """More families to yield when collected (the store's, on `tether serve`)."""

    def bound(self, agent: str, version: str) -> _Bound:
        b = self._bound.get((agent, version))
        if b is None:
            b = self._bound[(agent, version)] = _Bound(self, agent, version)
        return b

    # -- the store -------------------------------------------------------------------------

    def watch_store(self, store: Store) -> None:
        """Count `store`'s group commits and read its pool when collected."""
        store.observe_commits(self)
        if store.pool_statistics not in self.pools:
            self.pools.append(store.pool_statistics)

    def unwatch_store(self, store: Store) -> None:
        store.observe_commits(None)
        if store.pool_statistics in self.pools:
            self.pools.remove(store.pool_statistics)

    def committed(self, writes: int, seconds: float) -> None:
        _observe(SIZE_BUCKETS, self._commit_size, writes)
        _observe(BUCKETS, self._commit_seconds, seconds)

    # -- Observer --------------------------------------------------------------------------

    def run_observer(self, run: RunRecord, worker: str) -> RunObserver:
        if run.step == 0 and run.attempt <= 1:  # its first claim: the run starts now
            self.started.inc((run.agent, run.version))
            self.queue_wait.observe((run.agent,), max(0.0, time.time() - run.created_at))
        if run.taken_from is not None and run.taken_from != worker:
            self.takeovers.inc((run.agent, run.version))
        return _RunMetrics(self, run)

    def effect(self, effect: EffectRecord, outcome: str, started: float, finished: float) -> None:
        self.effects.inc((effect.name, outcome))
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

        def counter(name: str, doc: str, labels: list[str], c: Counter) -> Any:
            fam = CounterMetricFamily(name, doc, labels=labels)
            for key, n in c.samples():
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
        yield counter("tether_lease_takeovers",
                      "Runs this worker took over from another whose lease had expired "
                      "(a worker killed, hung or cut off): the recoveries it made",
                      ["agent", "version"], self.takeovers)
        lost = CounterMetricFamily(
            "tether_leases_lost", "Leases of this worker that another worker took over")
        lost.add_metric([], self.leases_lost)
        yield lost
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
        yield histogram("tether_commit_batch_size",
                        "Writes per group commit of the store (one transaction each)", [],
                        self.commit_size)
        yield histogram("tether_commit_duration_seconds",
                        "A group commit of the store, begun to committed", [],
                        self.commit_seconds)
        slots = GaugeMetricFamily("tether_worker_slots", "This process's worker slots",
                                  labels=["state"])
        busy = sum(d.active for d in self.drivers)
        slots.add_metric(["busy"], busy)
        slots.add_metric(["free"], max(0, sum(d.concurrency for d in self.drivers) - busy))
        yield slots
        pools = [stats for stats in (read() for read in self.pools) if stats]
        if pools:
            conns = GaugeMetricFamily("tether_pool_connections",
                                      "The store's connection pool: connections in use "
                                      "(checked out, the group commit's writers among them) "
                                      "and idle", labels=["state"])
            conns.add_metric(["in_use"], sum(p["in_use"] for p in pools))
            conns.add_metric(["idle"], sum(p["idle"] for p in pools))
            yield conns
            size = GaugeMetricFamily("tether_pool_max_connections",
                                     "The store's connection pool: its maximum size")
            size.add_metric([], sum(p["max"] for p in pools))
            yield size
            waiting = GaugeMetricFamily("tether_pool_requests_waiting",
                                        "Requests waiting for a connection of the pool")
            waiting.add_metric([], sum(p["waiting"] for p in pools))
            yield waiting
            reconnects = CounterMetricFamily(
                "tether_store_reconnects", "Connections of the store made again after one was "
                "lost (a restart, a failover), by part: pool, committer, listener",
                labels=["part"])
            for part in ("pool", "committer", "listener"):
                reconnects.add_metric([part], sum(p.get(f"reconnects_{part}", 0) for p in pools))
            yield reconnects
        for more in self.gauges:
            yield from more()

    def registry(self) -> CollectorRegistry:
        """A Prometheus registry holding these metrics alone."""
        from prometheus_client import CollectorRegistry

        reg = CollectorRegistry(auto_describe=False)
        reg.register(self)
        return reg


class _RunMetrics:
    """A run's observer: its bounded labels' series, bound once per (agent, version)."""

    __slots__ = ("agent", "b", "created", "m", "version")

    def __init__(self, m: Metrics, run: RunRecord) -> None:
        self.m = m
        self.agent = run.agent
        self.version = run.version
        self.created = run.created_at
        self.b = m.bound(run.agent, run.version)

    def call(self, step: int, name: str, replayed: bool, started: float, finished: float,
             llm: Mapping[str, Any] | None = None) -> None:
        b = self.b
        if replayed:
            b.replayed[0] += 1
        else:
            b.live[0] += 1
            _observe(BUCKETS, b.call_s, finished - started)

    def step(self, step: int, node: str, attempt: int, started: float, finished: float,
             status: str, received: int, sent: int) -> None:
        b = self.b
        cells = b.nodes.get(node)
        if cells is None:
            cells = b.node(self.agent, self.version, node)
        cells[0][0] += 1
        _observe(BUCKETS, cells[1], finished - started)
        if received:
            b.delivered[0] += received
        if sent:
            b.sent[0] += sent
        if status == "completed":
            b.completed[0] += 1
            _observe(BUCKETS, b.run_completed_s, max(0.0, finished - self.created))

    def parked(self, step: int, node: str, attempt: int, started: float, kind: str) -> None:
        self.m.parks.inc((self.agent, kind))

    def failed(self, step: int, node: str | None, attempt: int, started: float,
               category: FailureCategory, exc: BaseException, final: bool) -> None:
        if final:
            self.m.failures.inc((self.agent, category.value))
            self.b.failed[0] += 1
            _observe(BUCKETS, self.b.run_failed_s, max(0.0, time.time() - self.created))
        else:
            self.m.retries.inc((self.agent, category.value))

    def released(self, reason: str) -> None:
        self.m.released.inc((reason,))
        if reason == FailureCategory.LEASE_LOST.value:
            self.m.leases_lost += 1


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
