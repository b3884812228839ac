"""Acceptance: an operator releases a SIGKILLed worker's leases (`tether workers release`), so
its run resumes on a restarted worker at once instead of after the dead worker's lease TTL
(60 s here); committed steps are not run again and the run finishes once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tether
from apps import Workers, eventually
from apps import chaos_app as app

pytestmark = pytest.mark.slow

LEASE_TTL = 60.0


async def test_release_lets_a_restart_skip_the_dead_workers_ttl(db_url: str, tmp_path: Path) -> None:
    call_log = tmp_path / "calls.log"
    data = app.run_input(0, steps=3, slow_step=2, slow=1.5)
    async with tether.Runtime(db_url, agents=[app.agent]) as rt:
        run = await rt.start(app.agent, data, thread_id="released-1")
        with Workers(db_url, tmp_path, call_log=call_log) as workers:
            first = workers.start(concurrency=4, lease_ttl=LEASE_TTL)

            async def in_slow_step() -> bool:
                r = await rt.peek(run.thread_id)
                return r.step >= 1 and r.lease_owner is not None

            await eventually(in_slow_step, "the run to be in its slow step", workers=workers)
            owner = (await rt.peek(run.thread_id)).lease_owner
            assert owner is not None
            first.kill()
            killed_at = time.monotonic()
            held = await rt.peek(run.thread_id)
            assert (held.status, held.lease_owner) == ("running", owner)  # the lease stands

            out = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "tether", "workers", "release", owner, "--db", db_url],
                capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
            assert out.returncode == 0, out.stderr
            assert out.stdout.strip() == f"released 1 run of {owner}: {run.thread_id}"
            freed = await rt.peek(run.thread_id)
            assert (freed.status, freed.lease_owner) == ("queued", None)

            second = workers.start(concurrency=4, lease_ttl=LEASE_TTL)
            async with asyncio.timeout(LEASE_TTL / 2):
                done = await rt.wait(run.thread_id)
            assert time.monotonic() - killed_at < LEASE_TTL / 2
            assert second.terminate() == 0, second.output()
        assert done.status == tether.RunStatus.COMPLETED, done.error
        cps = await rt.checkpoints(run.thread_id)
        assert [cp.step for cp in cps] == [1, 2, 3]
        assert cps[0].worker == owner  # committed before the kill, not run again
        assert {cp.worker for cp in cps[1:]} == {cps[1].worker} != {owner}
        calls = app.read_calls(call_log)
        assert len(calls[run.thread_id, 1]) == 1
