"""Two dashboard pages over the store's charts queries (store/charts.py):

- /ui/metrics: throughput (runs and steps finished per minute), step and run latency p50/p95
  per agent, queue wait, failures by category and parked runs, over the last hour and day;
  the overview gets a sparkline of the hour's throughput.
- /ui/agents/{name}: the agent's nodes and the edges its runs took (node -> next node, with
  counts, from the checkpoints of its newest AGENT_RUNS runs); `?thread_id=` highlights one
  run's path.

PageViews extends the dashboard's Views with their data and live probes; add_pages puts their
routes on the dashboard's router, behind the same sessions.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..errors import RunNotFound
from ..runtime import RunStatus, Runtime
from ..store import charts
from .dashboard_data import Views, fingerprint
from .dashboard_input import MAX_ID, Refused, check_id
from .dashboard_svg import END, bars, graph, sparkline

AGENT_RUNS = 200
"""An agent's page reads the edges of its newest AGENT_RUNS runs."""
TIP_EVERY = 5.0
"""The metrics page refreshes live at most this often (seconds), and once a minute anyway."""
PARKED = ("waiting", "sleeping")


class PageViews(Views):
    """The dashboard's views, with the metrics and agent pages' and the overview's sparkline."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        self._tip: tuple[float, str] | None = None  # (when it last changed, fingerprint)
        self._buckets = charts.Buckets()  # complete buckets' counts, read once

    async def _query(self) -> tuple[Any, charts.Query]:
        store = (await self.runtime.open()).store
        return store, charts.reader(store)

    async def overview(self) -> dict[str, Any]:
        data = await super().overview()
        store, query = await self._query()
        (runs, runs_est), (steps, steps_est) = await charts.throughput(
            query, await store.now(), self._buckets)
        data["spark"] = {
            "runs": sparkline(runs, label=f"runs finished per minute, last hour: "
                                          f"{'about ' if runs_est else ''}{sum(runs)}"),
            "steps": sparkline(steps, label=f"steps per minute, last hour: "
                                            f"{'about ' if steps_est else ''}{sum(steps)}"),
            "runs_total": sum(runs), "steps_total": sum(steps),
            "runs_estimated": runs_est, "steps_estimated": steps_est}
        return data

    async def metrics(self) -> dict[str, Any]:
        store, query = await self._query()
        now = await store.now()
        started = time.perf_counter()
        windows = await charts.windows(query, now, buckets=self._buckets)
        took = time.perf_counter() - started
        totals = await self.store_counts()
        parked: dict[str, dict[str, int]] = {}
        for (status, version), n in totals.runs.items():
            if status in PARKED and n:
                parked.setdefault(version, dict.fromkeys(PARKED, 0))[status] = n
        more = {k for k in totals.runs_more if k[0] in PARKED}
        charts_of = {w.name: {
            "runs": bars(w.runs, since=w.since, width_s=w.width, kind="runs",
                         label=f"runs finished, last {w.name}"),
            "steps": bars(w.steps, since=w.since, width_s=w.width, kind="steps",
                          label=f"steps finished, last {w.name}")} for w in windows}
        return {"windows": windows, "charts": charts_of, "parked": dict(sorted(parked.items())),
                "parked_total": {s: sum(p[s] for p in parked.values()) for s in PARKED},
                "parked_more": more, "parked_total_more": {s for s, _ in more},
                "sample": charts.SAMPLE, "took_ms": took * 1000.0,
                "fp": await self.metrics_tip(now)}

    async def metrics_tip(self, now: float | None = None) -> str:
        """What the live probe compares: the last run and step finished, parked counts and the
        minute (the bars move along); a change within TIP_EVERY seconds of the one before
        waits for the next poll after that (a busy store reloads open pages that often)."""
        store, query = await self._query()
        now = await store.now() if now is None else now
        (last_run, last_step), = await query("charts_tip", {})
        totals = await self.store_counts()
        parked = sorted((k, n) for k, n in totals.runs.items() if k[0] in PARKED)

        fp = fingerprint([last_run, last_step, parked, int(now // 60)])
        mono, prev = time.monotonic(), self._tip
        if prev is not None and fp != prev[1] and mono - prev[0] < TIP_EVERY:
            return prev[1]  # changed again soon after the last change: shown a little later
        if prev is None or fp != prev[1]:
            self._tip = (mono, fp)
        return fp

    async def agent(self, name: str, thread_id: str | None = None) -> dict[str, Any]:
        store, query = await self._query()
        declared = self.runtime.agents.get(name)
        nodes: list[str] = []
        start: str | None = None
        if declared is not None:
            start = declared.start
            nodes = [*([start] if start else []), *declared.nodes]
        for w in await self.runtime.workers():  # a server without the app: the registry
            if w.agents.get(name):
                start = start or w.agents[name][0]
                nodes += list(w.agents[name])
        runs = await self.runtime.list_runs(agent=name, limit=AGENT_RUNS)
        if declared is None and not nodes and not runs:
            raise Refused(404, f"No agent named {name!r}: this server's app does not define "
                               "it, no registered worker serves it and no run of it is stored.")
        seen = await charts.edges(query, charts.id_list(store, [r.thread_id for r in runs]))
        edges: dict[tuple[str, str], int] = {}
        for (a, b), n in sorted(seen.counts.items(), key=lambda kv: (-kv[1], kv[0][0],
                                                                        kv[0][1] or "")):
            edges[(a, END if b is None else b)] = n
            nodes += [a] if b is None else [a, b]
        if any(b == END for _, b in edges):
            nodes.append(END)
        run, steps, on = None, [], frozenset[tuple[str, str]]()
        if thread_id is not None:
            try:
                run = await self.runtime.peek(thread_id)
            except RunNotFound:
                raise Refused(404, f"No run with thread_id {thread_id!r}.") from None
            if run.agent != name:
                raise Refused(404, f"Run {thread_id!r} is a run of agent {run.agent!r}, "
                                   f"not {name!r}.")
            steps = await charts.path(query, thread_id)
            on = frozenset((a, END if b is None else b) for _, a, b in steps)
            for _, a, b in steps:  # a run older than the newest AGENT_RUNS: its own edges
                key = (a, END if b is None else b)
                if key not in edges:
                    edges[key] = sum(1 for _, x, y in steps if (x, END if y is None else y) == key)
                    nodes += [a, key[1]]
        nodes = list(dict.fromkeys(nodes))
        per_node: dict[str, int] = {}
        for (a, _), n in edges.items():
            per_node[a] = per_node.get(a, 0) + n
        return {"agent": name, "declared": declared is not None, "start": start,
                "nodes": nodes, "edges": edges, "per_node": per_node, "on": on,
                "svg": graph(nodes, edges, start, on), "runs": runs[:10],
                "runs_read": len(runs), "runs_cap": AGENT_RUNS, "cut": seen.cut,
                "run": run, "path": steps, "end": END,
                "fp": fingerprint([sorted((a, b, n) for (a, b), n in edges.items()),
                                   [(r.thread_id, r.status, r.step) for r in runs[:10]]])}

    def probe(self, topic: str) -> Callable[[], Awaitable[str]] | None:
        kind, _, arg = topic.partition(":")
        if kind == "metrics" and not arg:
            return self.metrics_tip
        if kind == "agent" and arg and len(arg) <= MAX_ID:
            async def agent_probe() -> str:
                fp: str = (await self.agent(arg))["fp"]
                return fp
            return agent_probe
        return super().probe(topic)


Page = Callable[..., Response]
View = Callable[[Callable[[Request, Any], Awaitable[Response]]],
                Callable[[Request], Awaitable[Response]]]


def add_pages(router: APIRouter, views: PageViews, view: View, page: Page) -> None:
    """Put /ui/metrics and /ui/agents/{name} on the dashboard's router (before its catch-all
    404), as `view` pages rendered by `page`."""

    async def metrics_page(request: Request, v: Any) -> Response:
        return page(request, v, "metrics.html", nav="metrics", live="metrics",
                    statuses=list(RunStatus), **await views.metrics())

    async def agent_page(request: Request, v: Any) -> Response:
        name = check_id(request.path_params["name"], "Agent name")
        raw = request.query_params.get("thread_id")
        tid = check_id(raw, "thread_id") if raw is not None else None
        data = await views.agent(name, tid)
        return page(request, v, "agent.html", nav="runs", live="agent:" + name, **data)

    router.add_api_route("/ui/metrics", view(metrics_page), methods=["GET"])
    router.add_api_route("/ui/agents/{name:path}", view(agent_page), methods=["GET"])
