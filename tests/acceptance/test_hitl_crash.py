"""Human in the loop and durable timers across process crashes, through the HTTP API.

Every process is real: `tether serve` (no embedded worker) and `tether worker` subprocesses on
one database; workers are SIGKILLed. The approval node records each value it is given in a
file, so "delivered exactly once" is counted across processes.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

from http_harness import Procs, wait_until

LEASE_TTL = 2.0  # the workers' --lease-ttl (see http_harness)
POLL = 0.1  # http_app's poll_interval


@pytest.fixture
def procs(tmp_path: Path, db_url: str) -> Iterator[Procs]:
    p = Procs(tmp_path, db_url, log=tmp_path / "calls.log")
    try:
        yield p
    finally:
        p.close()


def wait_status(c: httpx.Client, thread_id: str, status: str, timeout: float = 30) -> Any:
    def check() -> Any:
        run = c.get(f"/runs/{thread_id}").json()
        return run if run["status"] == status else None

    return wait_until(check, timeout, f"run {thread_id} to be {status}")


def deliveries(procs: Procs) -> list[str]:
    assert procs.log is not None
    return procs.log.read_text().splitlines() if procs.log.exists() else []


def test_interrupt_survives_a_killed_worker_and_is_delivered_once(procs: Procs) -> None:
    server = procs.serve()
    a = procs.worker()
    with server.client() as c:
        tids = [c.post("/runs", json={"agent": "approval", "input": {"item": i}}).json()["thread_id"]
                for i in range(3)]
        for tid in tids:
            wait_status(c, tid, "waiting")
        inbox = c.get("/interrupts").json()["interrupts"]
        assert sorted(i["thread_id"] for i in inbox) == sorted(tids)
        a.kill()

        for n, tid in enumerate(tids):
            r = c.post(f"/runs/{tid}/resume", json={"value": {"n": n}})
            assert r.status_code == 200, r.text
            assert c.get(f"/runs/{tid}").json()["status"] == "queued"
        for tid in tids:  # answered once: a second answer conflicts
            r = c.post(f"/runs/{tid}/resume", json={"value": "late"})
            assert r.status_code == 409 and r.json()["error"]["type"] == "ResumeConflict", r.text

        procs.worker()  # B
        for n, tid in enumerate(tids):
            run = wait_status(c, tid, "completed")
            assert run["state"]["answer"] == {"n": n}
        assert sorted(deliveries(procs)) == sorted(f'{tid} {{"n":{n}}}' for n, tid in enumerate(tids))
        assert c.get("/interrupts").json()["interrupts"] == []


def test_an_answered_run_survives_a_kill_mid_step_and_is_answered_once(procs: Procs) -> None:
    """`tether serve --worker`: the answered run is taken by the embedded worker, which is
    killed while the step holds the answer (the step never commits). Another worker takes
    the run over once the lease expires; it finishes with the same answer, and the
    interrupt stays answered once (a late answer conflicts)."""
    server = procs.serve("--lease-ttl", str(LEASE_TTL), worker=True)
    with server.client() as c:
        tid = c.post("/runs", json={"agent": "approval",
                                    "input": {"item": 1, "hold": 120}}).json()["thread_id"]
        wait_status(c, tid, "waiting")
        r = c.post(f"/runs/{tid}/resume", json={"value": {"n": 1}})
        assert r.status_code == 200, r.text
        wait_until(lambda: deliveries(procs), 30, "the step to hold the answer")
        assert c.get(f"/runs/{tid}").json()["status"] == "running"
        server.kill()  # SIGKILL mid-step: the step never commits
    procs.worker()  # B: takes the run over when the dead process's lease expires
    with procs.serve().client() as c:
        run = wait_status(c, tid, "completed")
        assert run["state"]["answer"] == {"n": 1}
        answers = c.get("/interrupts", params={"thread_id": tid, "status": "resolved"}).json()
        assert [i["value"] for i in answers["interrupts"]] == [{"n": 1}]
        r = c.post(f"/runs/{tid}/resume", json={"value": "late"})
        assert r.status_code == 409, r.text
    # The step ran twice (killed, then taken over), each time with the one answer.
    assert deliveries(procs) == [f'{tid} {{"n":1}}'] * 2


async def test_concurrent_resumes_exactly_one_wins(procs: Procs) -> None:
    server = procs.serve()
    procs.worker()
    async with server.async_client() as c:
        tid = (await c.post("/runs", json={"agent": "approval", "input": {}})).json()["thread_id"]
        deadline = time.monotonic() + 30
        while (await c.get(f"/runs/{tid}")).json()["status"] != "waiting":
            assert time.monotonic() < deadline, "the run never waited for input"
            await asyncio.sleep(0.05)

        rs = await asyncio.gather(*[
            c.post(f"/runs/{tid}/resume", json={"value": f"v{i}"}) for i in range(5)])
        codes = sorted(r.status_code for r in rs)
        assert codes == [200, 409, 409, 409, 409], [r.text for r in rs]
        winner = next(r.json()["value"] for r in rs if r.status_code == 200)
        for r in rs:
            if r.status_code == 409:
                assert r.json()["error"]["type"] in ("ResumeConflict", "InvalidState"), r.text

        while (await c.get(f"/runs/{tid}")).json()["status"] != "completed":
            assert time.monotonic() < deadline + 30, "the resumed run never finished"
            await asyncio.sleep(0.05)
        assert (await c.get(f"/runs/{tid}")).json()["state"]["answer"] == winner
    assert deliveries(procs) == [f'{tid} "{winner}"']


def test_a_sleeping_run_survives_a_worker_restart_and_wakes_on_time(procs: Procs) -> None:
    server = procs.serve()
    a = procs.worker()
    with server.client() as c:
        tid = c.post("/runs", json={"agent": "sleeper", "input": {"seconds": 2}}).json()["thread_id"]
        sleeping = wait_status(c, tid, "sleeping")
        a.kill()
        procs.worker()  # B: its only way to the run is the row's wake_at
        done = wait_status(c, tid, "completed")
    slept_at = done["state"]["slept_at"]
    assert sleeping["wake_at"] == pytest.approx(slept_at + 2, abs=0.5)
    assert done["state"]["woke_at"] - slept_at >= 2.0
    # Claimable at wake_at; B polls every POLL s (a lease TTL of slack for a slow start).
    assert done["updated_at"] - slept_at <= 2.0 + LEASE_TTL + POLL + 1.0, done
