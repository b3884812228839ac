"""Acceptance: every message is consumed exactly once, in per-sender order, by a worker that
is SIGKILLed again and again (issue 5; guarantees 2, 3 and 4 for mailboxes).

Several `sender` runs each send K numbered messages to each of several `actor` runs, a few
numbers per step, pausing inside every step; the actors record each batch they are handed
with the step that consumes it (apps/mail_app.py). One worker subprocess does all of it and
is SIGKILLed at random moments, each time after more mail moved, and restarted. At the end
the mailbox table and the actors' committed states must agree: each message was sent once
(a killed step's messages never leak, its re-execution sends them once), consumed by exactly
one committed step (its row's consumed_step), recorded by that step once, and each actor saw
each sender's messages in the order they were sent.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from pathlib import Path

import pytest

import tether
from apps import Workers, eventually
from apps import mail_app as app

pytestmark = pytest.mark.slow

SENDERS, ACTORS, K, PER_STEP = 4, 3, 60, 3
SENDER_PAUSE, ACTOR_PAUSE = (0.02, 0.08), (0.0, 0.03)
KILLS = 4
CONCURRENCY = 32
LEASE_TTL = 1.0
TOTAL = SENDERS * ACTORS * K  # messages


async def test_mail_is_consumed_exactly_once_in_order_under_repeated_sigkill(
    db_url: str, tmp_path: Path
) -> None:
    rng = random.Random()
    actors = [f"actor{i}" for i in range(ACTORS)]
    senders = [f"sender{i}" for i in range(SENDERS)]
    kills_at: list[int] = []  # mail progress (sent + consumed) right after each kill
    async with tether.Runtime(db_url, agents=[app.sender, app.actor]) as rt:
        for a in actors:
            await rt.start(app.actor, app.actor_input(SENDERS * K, ACTOR_PAUSE), thread_id=a)
        for s in senders:
            await rt.start(app.sender, app.sender_input(actors, k=K, per_step=PER_STEP,
                                                        pause=SENDER_PAUSE), thread_id=s)
        with Workers(db_url, tmp_path, call_log=tmp_path / "unused.log",
                     app="apps.mail_app:make_runtime") as workers:
            worker = workers.start(concurrency=CONCURRENCY, lease_ttl=LEASE_TTL)
            for _ in range(KILLS):
                target = await asyncio.to_thread(app.mail_progress, db_url) + rng.randint(30, 150)

                async def progressed(target: int = target) -> bool:
                    return await asyncio.to_thread(app.mail_progress, db_url) >= target

                await eventually(progressed, timeout=60, what=f"mail progress {target}",
                                 workers=workers)
                await asyncio.sleep(rng.uniform(0, 0.1))
                worker.kill()
                kills_at.append(await asyncio.to_thread(app.mail_progress, db_url))
                worker = workers.start(concurrency=CONCURRENCY, lease_ttl=LEASE_TTL)

            async def finished() -> bool:
                return all(r.status in ("completed", "failed", "cancelled")
                           for r in await rt.list_runs(limit=100))

            await eventually(finished, timeout=90, what="every run to finish", workers=workers)
            assert worker.terminate() == 0, worker.output()
        runs = {t: await rt.get(t) for t in senders + actors}

        assert len(kills_at) == KILLS
        assert kills_at == sorted(set(kills_at)), f"no progress between kills: {kills_at}"
        assert kills_at[-1] < 2 * TOTAL, "the work was done before the last kill"
        for tid, run in runs.items():
            assert run.status == tether.RunStatus.COMPLETED, (tid, run.error)

        # Sent once: each pair's messages are in the mailbox once each, in order.
        rows = app.mailbox_rows(db_url)
        assert len(rows) == TOTAL, len(rows)
        by_pair: dict[tuple[str | None, str], list[int]] = defaultdict(list)
        for r in rows:
            assert r.body["sender"] == r.sender, r
            by_pair[r.sender, r.thread_id].append(r.body["n"])
        assert by_pair == {(s, a): list(range(K)) for s in senders for a in actors}
        # Each sender committed each of its steps once.
        steps = -(-K // PER_STEP)
        for s in senders:
            assert runs[s].state["steps"] == list(range(1, steps + 1)), s
            assert [cp.step for cp in await rt.checkpoints(s)] == list(range(1, steps + 1))

        # Consumed once: every row is marked with the actor step that recorded it, and each
        # actor recorded each of its messages once, in each sender's order.
        consumed_by = {r.id: (r.thread_id, r.consumed_step) for r in rows}
        assert all(step is not None for _, step in consumed_by.values()), [
            r for r in rows if r.consumed_step is None][:5]
        reexecuted = 0
        for a in actors:
            got = runs[a].state["got"]
            assert runs[a].state["count"] == len(got) == SENDERS * K
            ids = [m[0] for m in got]
            assert len(set(ids)) == len(ids), "a message was recorded twice"
            assert {i: (a, step) for i, _, _, step in got} == {
                i: v for i, v in consumed_by.items() if v[0] == a}
            order: dict[str, list[int]] = defaultdict(list)
            for _, sender, n, _ in got:
                order[sender].append(n)
            assert order == {s: list(range(K)) for s in senders}, a
            # The recorded step is the checkpoint that committed the batch.
            cps = await rt.checkpoints(a)
            assert [cp.step for cp in cps] == list(range(1, len(cps) + 1))
            for cp in cps:
                assert [m for m in cp.state["got"] if m[3] == cp.step] == [
                    m for m in got if m[3] == cp.step]
            assert max(m[3] for m in got) <= cps[-1].step
            reexecuted += sum(cp.attempt > 1 for cp in cps)
        for s in senders:
            reexecuted += sum(cp.attempt > 1 for cp in await rt.checkpoints(s))
        # Kills did land inside steps (re-executed after the restart): otherwise this test
        # proved little.
        assert reexecuted >= 1, "no step was ever re-executed after a kill"
