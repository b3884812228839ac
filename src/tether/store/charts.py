"""What the dashboard's charts (/ui/metrics) and agent pages (/ui/agents/{name}) read of a
store, assembled once for both dialects from the named queries of queries/charts.sql.

Every query is bounded whatever the store holds: the counts per bucket are capped time ranges
of an index (runs_finished, checkpoints_finished; a busier range is estimated: Buckets), the
latency, queue-wait and failure figures are taken over the newest SAMPLE rows of the window
(the page says so when a sample was full), and an agent's edges over the checkpoints of its
newest runs (at most EDGE_ROWS of them).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

Query = Callable[[str, Mapping[str, Any]], Awaitable[list[tuple[Any, ...]]]]
Counted = tuple[list[int], bool]
"""Counts per bucket, and whether any of them is an estimate (Buckets.counts)."""

SAMPLE = 1000
"""Steps, runs and failed runs read for the percentiles and the failure categories."""
EDGE_ROWS = 100_000
"""Checkpoints read for an agent's edges (its newest runs' steps)."""
PATH_STEPS = 10_000
"""Steps of one run read to highlight its path."""
WINDOWS = {"hour": (3600.0, 60.0), "day": (86400.0, 900.0)}
"""Window name -> (seconds, seconds per bucket): 60 one-minute bars, 96 quarter hours."""


def reader(store: Any) -> Query:
    """The store's named read-only queries, through the read path its own `measure` uses
    (SQLite's reader connection, Postgres's pool)."""
    q: Mapping[str, str] = store._q
    if store.dialect == "sqlite":
        read = store._r

        async def sqlite_query(name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
            sql = q[name]
            rows = await read(lambda c: c.execute(sql, dict(params)).fetchall())
            return [tuple(r) for r in rows]

        return sqlite_query
    conns = store._conns

    async def pg_query(name: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        # Each an index range or a LIMIT of one: read so, whatever the statistics say (an
        # unanalyzed checkpoints table was read whole for an agent's edges).
        return [tuple(r) for r in await conns.read_by_index(q[name], dict(params))]

    return pg_query


def id_list(store: Any, ids: Sequence[str]) -> Any:
    """A list of thread_ids as a query parameter of the store's dialect."""
    return orjson.dumps(list(ids)).decode() if store.dialect == "sqlite" else list(ids)


def percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0-100) of `values`, nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True, slots=True)
class Spread:
    """How many values, their p50 and p95 (seconds)."""

    n: int
    p50: float | None
    p95: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(len(values), percentile(values, 50), percentile(values, 95))


@dataclass(frozen=True, slots=True)
class Window:
    """The figures of one window ending `now` (database clock): counts per bucket of `width`
    seconds from `since` (the last bucket holds `now`), and spreads over the newest SAMPLE
    rows (`*_full`: the sample was full, older rows of the window were not read)."""

    name: str
    since: float
    now: float
    width: float
    runs: list[int]
    steps: list[int]
    step_latency: dict[str, Spread]
    run_latency: dict[str, Spread]
    queue_wait: dict[str, Spread]
    failures: dict[str, int]
    failed_by_agent: dict[str, int]
    steps_full: bool = False
    runs_full: bool = False
    queue_full: bool = False
    failed_full: bool = False
    statuses: dict[str, int] = field(default_factory=dict)
    runs_estimated: bool = False
    steps_estimated: bool = False

    @property
    def agents(self) -> list[str]:
        """The agents of the latency tables, "(all)" last."""
        names = sorted((self.step_latency.keys() | self.run_latency.keys()) - {"(all)"})
        return names + (["(all)"] if "(all)" in self.step_latency or "(all)" in
                        self.run_latency else [])

    @property
    def runs_total(self) -> int:
        return sum(self.runs)

    @property
    def steps_total(self) -> int:
        return sum(self.steps)

    def per_minute(self, total: int) -> float:
        return total / ((self.now - self.since) / 60.0)


class Buckets:
    """Counts per bucket of the runs and steps finished, remembered once a bucket is complete
    (it ended GRACE seconds ago): a window's next read counts only from its first bucket not
    remembered, so the day's 96 bars cost one quarter hour's range, not a day's. One per
    dashboard; a bucket pruned (tether prune) after it was counted keeps its count until it
    leaves the window.

    A read is bounded however busy the window was: each bucket is read as SLICES slices, each
    counted up to a cap (BUDGET shared by the slices read); a slice that reaches it is
    estimated from the time its first rows took (`estimate`), and its bucket marked so."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, float], dict[int, tuple[int, bool]]] = {}

    async def counts(self, query: Query, name: str, width: float, first: int, last: int,
                     now: float) -> Counted:
        """The counts of query `name` in buckets first..last (bucket k: [k, k+1) * width), and
        whether any of them is an estimate."""
        known = self._known.setdefault((name, width), {})
        for k in [k for k in known if k < first]:
            del known[k]
        start = first
        while start in known and start <= last:
            start += 1
        got: dict[int, tuple[int, bool]] = {}
        if start <= last:
            n = (last - start + 1) * SLICES
            cap = max(MIN_CAP, BUDGET // n)
            part = width / SLICES
            since = start * width
            for k, c, end in await query(name, {"since": since, "slice": part, "n": n,
                                                 "cap": cap}):
                b = start + int(k) // SLICES
                count, guessed = estimate(int(c), cap, end, since + int(k) * part, part)
                had, was = got.get(b, (0, False))
                got[b] = (had + count, was or guessed)
        complete = math.floor((now - GRACE) / width)  # buckets below it are complete
        for k in range(start, min(last + 1, complete)):
            known[k] = got.get(k, (0, False))
        both = [known[k] if k < start else got.get(k, (0, False)) for k in range(first, last + 1)]
        return [c for c, _ in both], any(e for _, e in both)


SLICES = 12
"""Slices a bucket is read in (5 s of a minute's bar, 75 s of a quarter hour's)."""
BUDGET = 240_000
"""Index entries one read of a chart's counts may walk in all: a whole hour of 60 buckets
unread is 720 slices of up to 333 rows each, the one bucket under way 12 of up to 20,000."""
MIN_CAP = 50
"""The cap of a slice however many are read."""


def estimate(count: int, cap: int, last: float | None, lo: float, part: float
             ) -> tuple[int, bool]:
    """A slice's count: `count` itself below `cap` (exact); a full slice, whose `cap`-th row
    finished at `last`, as `cap` rows per the time they took from the slice's start `lo`
    (at least a millisecond), over the whole slice of `part` seconds: (count, estimated)."""
    if count < cap or last is None:
        return count, False
    took = max(float(last) - lo, 0.001)
    return max(cap, round(cap * part / took)), True


GRACE = 30.0
"""A bucket is complete this long after its end: a step or run that finished before the end
has committed by then (finished_at is taken before the commit)."""


def _span(now: float, name: str) -> tuple[float, int, int]:
    """A window's bucket width and its first and last bucket (the last holds `now`)."""
    span, width = WINDOWS[name]
    last = math.floor(now / width)
    return width, last - int(span // width) + 1, last


def _by_agent(rows: Sequence[tuple[str, float]]) -> dict[str, Spread]:
    grouped: dict[str, list[float]] = {}
    for agent, seconds in rows:
        grouped.setdefault(agent, []).append(max(0.0, float(seconds)))
    spreads = {a: Spread.of(v) for a, v in sorted(grouped.items())}
    if len(grouped) > 1:
        spreads["(all)"] = Spread.of([max(0.0, float(s)) for _, s in rows])
    return spreads


def category_of(error: Any) -> str:
    """The failure category a failed run's stored error names ("exception" if none)."""
    try:
        raw = bytes(error) if error is not None else b"{}"
        got = orjson.loads(raw)
    except (TypeError, ValueError, orjson.JSONDecodeError):
        return "unknown"
    return str(got.get("category") or "exception") if isinstance(got, dict) else "unknown"


SAMPLES = ("charts_step_sample", "charts_run_sample", "charts_queue_sample")


async def windows(query: Query, now: float, names: Sequence[str] = tuple(WINDOWS),
                  sample: int = SAMPLE, buckets: Buckets | None = None) -> list[Window]:
    """The figures of the windows `names` (WINDOWS, narrowest first) ending at `now`: their
    buckets are aligned to their width (the first starts at `since`, the last is the one under
    way). A wider window takes a narrower one's sample when it was full (the newest `sample`
    rows of the day are the hour's then), and the failed runs are read once, for the widest."""
    b = buckets or Buckets()
    widest = _span(now, names[-1])
    failed = await query("charts_failed_sample", {"since": widest[0] * widest[1],
                                                  "limit": sample})
    failed_full = len(failed) >= sample
    out: list[Window] = []
    prev: dict[str, list[tuple[Any, ...]]] = {}
    for name in names:
        width, first, last = _span(now, name)
        since = first * width
        runs = await b.counts(query, "charts_runs_finished", width, first, last, now)
        steps = await b.counts(query, "charts_steps_finished", width, first, last, now)
        rows = {q: prev[q] if len(prev.get(q, ())) >= sample else
                await query(q, {"since": since, "limit": sample}) for q in SAMPLES}
        prev = rows
        out.append(_window(name, since, now, width, runs, steps, rows,
                           [r for r in failed if float(r[2]) >= since], sample, failed_full))
    return out


async def window(query: Query, now: float, name: str, sample: int = SAMPLE,
                 buckets: Buckets | None = None) -> Window:
    """The figures of the one window called `name` (see windows)."""
    (w,) = await windows(query, now, (name,), sample, buckets)
    return w


def _window(name: str, since: float, now: float, width: float, runs: Counted,
            steps: Counted, rows: Mapping[str, list[tuple[Any, ...]]],
            failed_rows: list[tuple[Any, ...]], sample: int, failed_full: bool) -> Window:
    """`runs`, `steps`: Buckets.counts of the window."""
    step_rows, run_rows = rows["charts_step_sample"], rows["charts_run_sample"]
    queue_rows = rows["charts_queue_sample"]
    waits = [(str(a), (float(started) if started is not None else now) - float(created))
             for a, created, started in queue_rows]
    failures: dict[str, int] = {}
    by_agent: dict[str, int] = {}
    for agent, error, _ in failed_rows:
        cat = category_of(error)
        failures[cat] = failures.get(cat, 0) + 1
        by_agent[str(agent)] = by_agent.get(str(agent), 0) + 1
    statuses: dict[str, int] = {}
    for _, status, _ in run_rows:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return Window(
        name=name, since=since, now=now, width=width, runs=runs[0], steps=steps[0],
        runs_estimated=runs[1], steps_estimated=steps[1],
        step_latency=_by_agent([(str(a), float(s)) for a, s in step_rows]),
        run_latency=_by_agent([(str(a), float(s)) for a, _, s in run_rows]),
        queue_wait=_by_agent(waits),
        failures=dict(sorted(failures.items(), key=lambda kv: (-kv[1], kv[0]))),
        failed_by_agent=dict(sorted(by_agent.items(), key=lambda kv: (-kv[1], kv[0]))),
        steps_full=len(step_rows) >= sample, runs_full=len(run_rows) >= sample,
        queue_full=len(queue_rows) >= sample, failed_full=failed_full,
        statuses=statuses)


async def throughput(query: Query, now: float, buckets: Buckets | None = None
                     ) -> tuple[Counted, Counted]:
    """Runs and steps finished per minute over the last hour (the overview's sparkline),
    each with whether it holds an estimate (see Buckets)."""
    width, first, last = _span(now, "hour")
    b = buckets or Buckets()
    return (await b.counts(query, "charts_runs_finished", width, first, last, now),
            await b.counts(query, "charts_steps_finished", width, first, last, now))


@dataclass(frozen=True, slots=True)
class Edges:
    """The transitions seen in some runs: (node, next node or None once finished) -> count,
    and whether the EDGE_ROWS cap cut the read short."""

    counts: dict[tuple[str, str | None], int]
    cut: bool


async def edges(query: Query, ids: Any, limit: int = EDGE_ROWS) -> Edges:
    rows = await query("agent_edges", {"ids": ids, "limit": limit})
    counts = {(str(a), None if b is None else str(b)): int(c) for a, b, c in rows}
    return Edges(counts, sum(counts.values()) >= limit)


async def path(query: Query, thread_id: str, limit: int = PATH_STEPS
               ) -> list[tuple[int, str, str | None]]:
    """One run's steps in order: (step, node, next node)."""
    rows = await query("agent_path", {"thread_id": thread_id, "limit": limit})
    return [(int(s), str(a), None if b is None else str(b)) for s, a, b in rows]


CALL_ROWS = 200
"""Journaled calls a run's page lists (the steps it shows; each step's page has all of its own)."""


async def run_calls(query: Query, thread_id: str, first: int, last: int, limit: int = CALL_ROWS
                    ) -> list[tuple[int, int, str, bytes, str | None]]:
    """The calls the run journaled in steps first..last, in order, at most `limit`:
    (step, index, name, result bytes, arguments preview)."""
    rows = await query("run_calls", {"thread_id": thread_id, "first": first, "last": last,
                                     "limit": limit})
    return [(int(s), int(i), str(n), bytes(r), None if a is None else str(a))
            for s, i, n, r, a in rows]
