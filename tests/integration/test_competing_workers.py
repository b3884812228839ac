"""Two worker processes on one database compete for the same runs: every step runs and is
committed exactly once, by the worker that ran it (guarantee 2), and both share the work.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

import tether
from apps import Workers, eventually, pid_of
from apps import chaos_app as app

pytestmark = pytest.mark.slow

RUNS, STEPS = 200, 5
CONCURRENCY = 20
# Long enough that no lease expires under load: any re-execution here would be a bug.
LEASE_TTL = 10.0


async def test_two_workers_never_run_a_step_twice(db_url: str, tmp_path: Path) -> None:
    call_log = tmp_path / "calls.log"
    inputs = [app.run_input(i, steps=STEPS) for i in range(RUNS)]
    async with tether.Runtime(db_url, agents=[app.agent]) as rt:
        with Workers(db_url, tmp_path, call_log=call_log) as workers:
            pair = [workers.start(concurrency=CONCURRENCY, lease_ttl=LEASE_TTL)
                    for _ in range(2)]

            async def both_up() -> bool:
                return all("tether worker:" in w.output() for w in pair)

            # Runs are created while both workers are polling, so they race for every one.
            await eventually(both_up, timeout=30, what="both workers to start", workers=workers)
            ids = [(await rt.start(app.agent, data, thread_id=f"c{i:03}")).thread_id
                   for i, data in enumerate(inputs)]
            async with asyncio.timeout(60):
                runs = {t: await rt.wait(t) for t in ids}
            for w in pair:
                assert w.terminate() == 0, w.output()

        calls = app.read_calls(call_log)
        assert set(calls) == {(t, s) for t in ids for s in range(1, STEPS + 1)}
        committed_by: Counter[int] = Counter()
        for thread_id, data in zip(ids, inputs, strict=True):
            run = runs[thread_id]
            assert run.status == tether.RunStatus.COMPLETED, (thread_id, run.error)
            cps = await rt.checkpoints(thread_id)
            assert [cp.step for cp in cps] == list(range(1, STEPS + 1)), thread_id
            for cp in cps:
                # The node ran once, in the process that committed its checkpoint.
                invocations = calls[thread_id, cp.step]
                assert [c.pid for c in invocations] == [pid_of(cp.worker)], (cp, invocations)
                assert cp.attempt == 1, cp
                committed_by[pid_of(cp.worker)] += 1
            assert run.state == app.final_state(
                data, [calls[thread_id, s][0].nonce for s in range(1, STEPS + 1)])
        assert set(committed_by) <= {w.pid for w in pair}, committed_by
        assert all(committed_by[w.pid] > 0 for w in pair), f"one worker did all: {committed_by}"
        outputs = "".join(w.output() for w in pair)
        assert "Traceback" not in outputs, outputs
