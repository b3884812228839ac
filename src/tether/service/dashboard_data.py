"""What each dashboard view shows, read through the Runtime's public calls (but a run's
checkpoint rows: Views.checkpoint_rows), with the fingerprint its live probe compares
(dashboard_live): a page and its probe share one reader.

Reads are bounded whatever the store holds: a page of runs is a keyset range, a run's
children tree stops at TREE_CAP runs, counts of pending interrupts stop at COUNT_CAP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import orjson

from .. import serde
from ..calls import args_of
from ..deploy import COUNT_CAP as DEPLOY_CAP
from ..errors import RunNotFound, TetherError
from ..history import record_of
from ..runtime import Run, RunStatus, Runtime
from ..store.base import CheckpointRecord, StatusCounts
from ..store.charts import CALL_ROWS, reader, run_calls
from ..types import Call
from .dashboard_input import (
    MAX_ID,
    ORDERS,
    PAGE_SIZES,
    Refused,
    RunFilter,
    decode_cursor,
    encode_cursor,
)
from .dashboard_render import timeline

COUNT_CAP = 1000
"""Counts of pending interrupts stop here ("1000+")."""
SAMPLE = 1000
"""The overview's latest failures are those among the newest SAMPLE runs."""
COUNTS_EVERY = 5.0
"""Seconds between two store-wide counts (runtime.status_counts, capped at RUN_CAP)."""
RUN_CAP = 10_000
"""Counts of runs by status and version stop here ("10,000+"): each an index range read at
most that far, never every parked run."""
TREE_CAP = 100
SENT_CAP = 100  # the newest messages a run sent, shown on its page
"""A run page shows at most this many runs of its children tree (then says so)."""
TREE_DEPTH = 6
"""... and goes at most this many generations down."""


def fingerprint(value: Any) -> str:
    return hashlib.sha1(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


@dataclass(slots=True)
class Node:
    """A run in a children tree, with its own children (`more`: some were not read)."""

    run: Run
    children: list[Node] = field(default_factory=list)
    more: bool = False


class Views:
    """The data of every view over one Runtime; one per dashboard (it caches store-wide
    counts for COUNTS_EVERY seconds, shared by every page and probe)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._counted: list[tuple[float, StatusCounts]] = []
        self._counting = asyncio.Lock()

    async def store_counts(self) -> StatusCounts:
        async with self._counting:
            if not self._counted or time.monotonic() - self._counted[0][0] >= COUNTS_EVERY:
                self._counted[:] = [(time.monotonic(),
                                     await self.runtime.status_counts(cap=RUN_CAP))]
            return self._counted[0][1]

    async def overview(self) -> dict[str, Any]:
        totals = await self.store_counts()
        counts = {s.value: 0 for s in RunStatus}
        versions: dict[str, dict[str, int]] = {}
        more: set[str] = set()  # statuses whose total is a lower bound
        for (status, version), n in totals.runs.items():
            counts[status] = counts.get(status, 0) + n
            versions.setdefault(version, {s.value: 0 for s in RunStatus})[status] = n
            if (status, version) in totals.runs_more:
                more.add(status)
        # Failures among the newest runs: a bounded index range, where a filtered read of a
        # rare status would scan a big store's whole table.
        sample = await self.runtime.list_runs(limit=SAMPLE)
        failed = [r for r in sample if r.status == RunStatus.FAILED][:5]
        pending = await self.runtime.interrupts(limit=COUNT_CAP + 1)
        dead = totals.effects.get("dead", 0)
        flags = attention(await self.runtime.deployments(), dead, pending, sample, time.time())
        return {"attention": flags, "counts": counts, "versions": dict(sorted(versions.items())),
                "more": more, "runs_more": totals.runs_more, "effects_more": totals.effects_more,
                "run_cap": RUN_CAP,
                "sample": SAMPLE, "pending": len(pending), "dead": dead,
                "effects": dict(sorted(totals.effects.items())),
                "recent": sample[:10], "failed": failed, "cap": COUNT_CAP,
                "fp": fingerprint([[(r.thread_id, r.status, r.step) for r in sample[:50]],
                                   sorted(totals.runs.items()), totals.effects,
                                   sorted(totals.runs_more),
                                   len(pending), flags])}

    async def runs(self, f: RunFilter) -> dict[str, Any]:
        before = decode_cursor(f.cursor) if f.cursor else None
        try:
            runs = await self.runtime.list_runs(
                status=f.status, agent=f.agent, version=f.version, since=f.since_ts,
                until=f.until_ts, prefix=f.prefix, order=f.order, limit=f.limit + 1,
                before=before)
        except TetherError as exc:
            raise Refused(400, str(exc)) from None
        page_runs = runs[: f.limit]
        nxt = (f.query(cursor=encode_cursor(page_runs[-1], f.order))
               if len(runs) > f.limit else None)
        return {"runs": page_runs, "filter": f, "next": nxt, "statuses": list(RunStatus),
                "sizes": PAGE_SIZES, "orders": ORDERS, "agents": sorted(self.runtime.agents),
                "fp": fingerprint([(r.thread_id, r.status, r.step, r.updated_at)
                                   for r in page_runs])}

    def refused_runs(self, f: RunFilter) -> dict[str, Any]:
        """The runs page for a filter that was refused: its form, no runs."""
        return {"runs": [], "filter": f, "next": None, "statuses": list(RunStatus),
                "sizes": PAGE_SIZES, "orders": ORDERS, "agents": sorted(self.runtime.agents),
                "fp": ""}

    async def run_live(self, thread_id: str) -> tuple[Run, list[Any], list[Any], list[Any],
                                                      list[Any], list[Run], str]:
        """The run's row (peek: no state), interrupts, effects, mail in (unread) and out
        (the newest SENT_CAP + 1 it sent), direct children and their fingerprint: what the
        live probe of a run page reads every poll."""
        rt = self.runtime
        try:
            run = await rt.peek(thread_id)
        except RunNotFound:
            raise Refused(404, f"No run with thread_id {thread_id!r}.") from None
        interrupts = await rt.interrupts(thread_id=thread_id, status=None, limit=1000)
        effects = await rt.effects(thread_id, limit=1000)
        inbox = await rt.inbox(thread_id)
        sent = await rt.sent(thread_id, limit=SENT_CAP + 1)
        children = await rt.list_runs(parent=thread_id, order="oldest", limit=TREE_CAP + 1)
        fp = fingerprint([run.status, run.step, run.updated_at, len(inbox),
                          [(m.id, m.consumed_step) for m in sent],
                          [(i.id, i.status) for i in interrupts],
                          [(e.key, e.status, e.attempts) for e in effects],
                          [(c.thread_id, c.status, c.step) for c in children]])
        return run, interrupts, effects, inbox, sent, children, fp

    async def tree(self, children: list[Run]) -> tuple[list[Node], int, bool]:
        """The children tree under a run whose direct children are `children` (read with
        one more than TREE_CAP): breadth first, one read per run that has children, at most
        TREE_CAP runs and TREE_DEPTH generations. Returns the roots, how many runs it holds
        and whether it was cut short."""
        roots = [Node(c) for c in children[:TREE_CAP]]
        shown, cut = len(roots), len(children) > TREE_CAP
        level, depth = roots, 1
        while level and shown < TREE_CAP and depth < TREE_DEPTH:
            nxt: list[Node] = []
            for node in level:
                room = TREE_CAP - shown
                if room <= 0:
                    node.more, cut = True, True
                    continue
                kids = await self.runtime.list_runs(parent=node.run.thread_id, order="oldest",
                                                    limit=room + 1)
                node.children = [Node(k) for k in kids[:room]]
                if len(kids) > room:
                    node.more, cut = True, True
                shown += len(node.children)
                nxt += node.children
            level, depth = nxt, depth + 1
        if level and depth >= TREE_DEPTH:
            for node in level:  # the last generation shown: do its runs have children?
                if await self.runtime.list_runs(parent=node.run.thread_id, limit=1):
                    node.more, cut = True, True
        return roots, shown, cut

    async def checkpoint_rows(self, thread_id: str) -> tuple[bytes, list[CheckpointRecord]]:
        """The run's input and checkpoint rows, states not decoded: a page rebuilds only the
        states it shows (dashboard_render.timeline), where Runtime.checkpoints decodes and
        copies every step's (a 1,000-step run's page spent most of its time there). The one
        read below the Runtime's calls, with the same not-found and pruned answers."""
        rt = await self.runtime.open()
        try:
            rec = await record_of(rt.store, thread_id)
        except RunNotFound:
            raise Refused(404, f"No run with thread_id {thread_id!r}.") from None
        return rec.input, await rt.store.checkpoints(thread_id)

    async def run(self, thread_id: str, upto: int | None = None) -> dict[str, Any]:
        run, interrupts, effects, inbox, sent, children, fp = await self.run_live(thread_id)
        base, rows = await self.checkpoint_rows(thread_id)
        tl = timeline(rows, base, upto)
        # The state after the last checkpoint is the run's state; before its first step it
        # is the input, which only get() reads.
        if rows and rows[-1].step == run.step:
            run = dataclasses.replace(run, state=tl["state"], inbox_depth=len(inbox))
        else:
            run = dataclasses.replace(await self.runtime.get(thread_id), inbox_depth=len(inbox))
        roots, shown, cut = await self.tree(children)
        calls, calls_cut = await self.calls(thread_id, tl["rows"])
        return {"run": run, "usage": await self.runtime.usage(thread_id),
                "calls": calls, "calls_cut": calls_cut, "calls_cap": CALL_ROWS,
                "interrupts": interrupts, "effects": effects, "inbox": inbox,
                "sent": sent[:SENT_CAP], "sent_more": len(sent) > SENT_CAP,
                "sent_cap": SENT_CAP,
                "timeline": tl, "fp": fp,
                "tree": roots, "tree_size": shown, "tree_cut": cut, "tree_cap": TREE_CAP,
                "pending": [i for i in interrupts if i.status == "pending"]}

    async def calls(self, thread_id: str, shown: list[dict[str, Any]]) -> tuple[list[Call], bool]:
        """The calls journaled in the steps a run page shows (`shown`: its timeline rows), at
        most CALL_ROWS, each with its arguments and its result (a result this server cannot
        decode, a typed one whose class it cannot load, is its error's text); and whether
        there were more."""
        if not shown:
            return [], False
        rt = await self.runtime.open()
        rows = await run_calls(reader(rt.store), thread_id, shown[0]["cp"].step,
                               shown[-1]["cp"].step, CALL_ROWS + 1)
        calls = []
        for step, idx, name, raw, args in rows[:CALL_ROWS]:
            try:
                result = serde.loads(raw)
            except TetherError as exc:
                result = f"(cannot be read here: {exc})"
            calls.append(Call(thread_id, step, idx, name, result, args_of(args)))
        return calls, len(rows) > CALL_ROWS

    async def inbox(self) -> dict[str, Any]:
        pending = await self.runtime.interrupts(limit=500)
        return {"interrupts": pending, "fp": fingerprint([i.id for i in pending])}

    async def effects(self) -> dict[str, Any]:
        rt = self.runtime
        dead = await rt.effects(status="dead", limit=500)
        pending = [*await rt.effects(status="pending", limit=500),
                   *await rt.effects(status="running", limit=500)]
        return {"dead": dead, "pending": pending,
                "fp": fingerprint([(e.thread_id, e.key, e.status, e.attempts)
                                   for e in (*dead, *pending)])}

    async def deployments(self) -> dict[str, Any]:
        found = await self.runtime.deployments()
        statuses = ("queued", "running", "waiting", "sleeping")
        return {"deployments": found, "open_statuses": statuses, "cap": DEPLOY_CAP,
                "routable": [d for d in found if d.state != "retired"],
                "fp": fingerprint([(d.version, d.weight, d.state, d.workers,
                                    sorted(d.runs.items()), d.stranded, sorted(d.capped))
                                   for d in found])}

    async def workers(self) -> dict[str, Any]:
        found = sorted(await self.runtime.workers(),
                       key=lambda w: (not w.alive, w.version, w.started_at, w.id))
        return {"workers": found,
                "fp": fingerprint([(w.id, w.alive, w.busy, w.concurrency) for w in found])}

    def probe(self, topic: str) -> Callable[[], Awaitable[str]] | None:
        """The live probe of a topic a page named, or None for one no page names."""
        kind, _, arg = topic.partition(":")
        plain: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
            "overview": self.overview, "inbox": self.inbox, "effects": self.effects,
            "deployments": self.deployments, "workers": self.workers}
        if kind in plain and not arg:
            view = plain[kind]
            return lambda: _fp(view())
        if kind == "runs":
            f = RunFilter.parse({k: v[-1] for k, v in parse_qs(arg).items()})
            return lambda: _fp(self.runs(f))
        if kind == "run" and arg and len(arg) <= MAX_ID:
            async def run_probe() -> str:
                return (await self.run_live(arg))[6]
            return run_probe
        return None


async def _fp(data: Awaitable[dict[str, Any]]) -> str:
    fp: str = (await data)["fp"]
    return fp


FAILURE_ALERT = 0.1
"""The share of failed runs among the newest finished ones past which the overview warns."""


def attention(deployments: list[Any], dead: int, pending: list[Any], sample: list[Run],
              now: float) -> list[tuple[str, str]]:
    """What needs a person, most urgent first, as (link, sentence): stranded runs, versions
    with open runs and no live worker, dead effects, a failure rate above FAILURE_ALERT among
    the newest finished runs, and the interrupt that has waited longest."""
    out: list[tuple[str, str]] = []
    for d in deployments:
        if d.stranded:
            out.append(("/ui/deployments", f"{_n(d.stranded, 'run', 'stranded' in d.capped)} "
                        f"of {d.version} {'is' if d.stranded == 1 else 'are'} stranded: no "
                        "live worker of their version can resume them"))
        elif d.open and not d.workers and d.state != "retired":
            out.append(("/ui/deployments", f"{d.version} has {_n(d.open, 'open run', d.open_more)}"
                        " and no live worker: start a worker of it, or move its parked runs"))
    if dead:
        out.append(("/ui/effects", f"{_n(dead, 'effect')} {'is' if dead == 1 else 'are'} dead: "
                    "retry once the cause is fixed"))
    finished = [r for r in sample if r.status.terminal and r.status != RunStatus.CANCELLED]
    failed = sum(r.status == RunStatus.FAILED for r in finished)
    if len(finished) >= 10 and failed / len(finished) > FAILURE_ALERT:
        out.append(("/ui/runs?status=failed", f"{failed} of the newest {len(finished)} finished "
                    f"runs failed ({failed / len(finished):.0%}, over {FAILURE_ALERT:.0%})"))
    if pending:
        oldest = min(pending, key=lambda i: i.created_at)
        out.append(("/ui/interrupts", f"a person has been asked for {_waited(now - oldest.created_at)}"
                    f" (run {oldest.thread_id}); {_n(len(pending), 'interrupt')} "
                    f"{'waits' if len(pending) == 1 else 'wait'}"))
    return out


def _n(n: int, word: str, more: bool = False) -> str:
    return f"{n:,}{'+' if more else ''} {word}" + ("" if n == 1 and not more else "s")


def _waited(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"
