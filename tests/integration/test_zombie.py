"""A paused worker (a "zombie": GC pause, VM freeze, SIGSTOP) loses its runs when its lease
expires, and once resumed cannot commit anything for them (guarantee 2: fencing epoch).

The zombie is paused while each run is inside a slow step whose call is already journaled.
A successor takes the runs over, replays that call from the journal (guarantee 4) and
finishes them; the zombie, resumed meanwhile, must have every write refused.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

import tether
from apps import Workers, eventually, pause_outside_transaction, pid_of
from apps import chaos_app as app

pytestmark = pytest.mark.slow

RUNS, STEPS = 20, 3
SLOW_STEP, SLOW = 2, 2.5
LEASE_TTL = 1.0
LOST = re.compile(r"lease lost|lost lease|LeaseLost", re.IGNORECASE)


async def test_zombie_worker_commits_nothing_after_takeover(db_url: str, tmp_path: Path) -> None:
    call_log = tmp_path / "calls.log"
    inputs = [app.run_input(i, steps=STEPS, pause=(0.001, 0.005), slow_step=SLOW_STEP, slow=SLOW)
              for i in range(RUNS)]
    async with tether.Runtime(db_url, agents=[app.agent]) as rt:
        ids = [(await rt.start(app.agent, data, thread_id=f"z{i:02}")).thread_id
               for i, data in enumerate(inputs)]
        with Workers(db_url, tmp_path, call_log=call_log) as workers:
            zombie = workers.start(concurrency=RUNS, lease_ttl=LEASE_TTL, verbose=True)

            async def all_in_slow_step() -> bool:
                recs = await rt.store.list_runs(limit=RUNS + 1)
                return all(r.step == SLOW_STEP - 1 for r in recs) and all(
                    [await rt.store.load_journal(t, SLOW_STEP) for t in ids])

            await eventually(all_in_slow_step, timeout=30, what="every run in its slow step",
                             workers=workers)
            slow_since = time.monotonic()
            await pause_outside_transaction(zombie, db_url)

            async def leases_expired() -> bool:
                now = await rt.store.now()
                recs = await rt.store.list_runs(limit=RUNS + 1)
                return all(r.status == "running" and r.lease_owner is not None
                           and pid_of(r.lease_owner) == zombie.pid
                           and r.lease_expires_at is not None and r.lease_expires_at < now
                           for r in recs)

            await eventually(leases_expired, timeout=10, what="the zombie's leases to expire",
                             workers=workers)
            successor = workers.start(concurrency=RUNS, lease_ttl=LEASE_TTL, verbose=True)

            async def taken_over() -> bool:
                recs = await rt.store.list_runs(limit=RUNS + 1)
                return all(r.lease_owner is not None and pid_of(r.lease_owner) == successor.pid
                           for r in recs)

            await eventually(taken_over, timeout=15, what="the successor to claim every run",
                             workers=workers)
            # Resume once the zombie's slow steps are due, so they try to commit at once,
            # while the successor (which started its own slow step later) still holds the runs.
            await asyncio.sleep(max(0.0, slow_since + SLOW + 0.1 - time.monotonic()))
            zombie.resume()
            async with asyncio.timeout(30):
                runs = {t: await rt.wait(t) for t in ids}
            await asyncio.sleep(LEASE_TTL)  # the zombie's heartbeat has run by now
            assert zombie.terminate() == 0, zombie.output()
            assert successor.terminate() == 0, successor.output()

        calls = app.read_calls(call_log)
        for thread_id, data in zip(ids, inputs, strict=True):
            run = runs[thread_id]
            assert run.status == tether.RunStatus.COMPLETED, (thread_id, run.error)
            cps = await rt.checkpoints(thread_id)
            assert [cp.step for cp in cps] == list(range(1, STEPS + 1)), thread_id
            # Before the pause the zombie committed; after the takeover only the successor.
            assert [pid_of(cp.worker) for cp in cps] == \
                [zombie.pid] * (SLOW_STEP - 1) + [successor.pid] * (STEPS - SLOW_STEP + 1)
            # The successor re-executed the slow step (a second attempt) but not its call: it ran
            # once, in the zombie, and the successor got the journaled result back.
            assert cps[SLOW_STEP - 1].attempt == 2, cps[SLOW_STEP - 1]
            invocations = [[c.pid for c in calls[thread_id, s]] for s in range(1, STEPS + 1)]
            assert invocations == \
                [[zombie.pid]] * SLOW_STEP + [[successor.pid]] * (STEPS - SLOW_STEP)
            assert run.state == app.final_state(
                data, [calls[thread_id, s][0].nonce for s in range(1, STEPS + 1)])
        zombie_log, successor_log = zombie.output(), successor.output()
        assert "Traceback" not in zombie_log + successor_log, zombie_log + successor_log
        # Resumed, the zombie found every run gone: through a refused commit (LeaseLost) or its
        # heartbeat, whichever ran first; it must say so, per run.
        lines = zombie_log.splitlines()
        for thread_id in ids:
            assert any(thread_id in line and LOST.search(line) for line in lines), \
                (thread_id, zombie_log)
