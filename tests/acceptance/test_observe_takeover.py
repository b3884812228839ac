"""Acceptance: recovery is counted where it happens. A worker subprocess SIGKILLed mid-step
leaves its leases to expire; the worker that takes its runs over counts each one in
`tether_lease_takeovers_total` (by agent and version), and nothing else does. A worker
frozen (SIGSTOP) past its lease TTL counts, once it runs again, the leases it lost in
`tether_leases_lost_total`. Both stores; real `tether worker` processes, scraped over HTTP."""

from __future__ import annotations

from pathlib import Path

import tether
from apps import Workers, eventually, pause_outside_transaction
from apps import observe_app as app
from apps.scrape import free_port, scrape, total

RUNS = 6


async def held_by(rt: tether.Runtime, ids: list[str]) -> dict[str, str | None]:
    """Each run's lease holder now, from the store (None: not leased)."""
    return {t: (await rt.store.get_run(t)).lease_owner for t in ids}  # type: ignore[union-attr]


async def test_the_worker_that_takes_over_counts_each_run(db_url: str, tmp_path: Path) -> None:
    first_port, second_port = free_port(), free_port()
    async with tether.Runtime(db_url, agents=[app.agent, app.child_agent]) as rt:
        ids = [(await rt.start(app.agent, {"steps": 3, "pause": 1.0},
                               thread_id=f"took-{i}")).thread_id for i in range(RUNS)]
        with Workers(db_url, tmp_path, call_log=tmp_path / "log",
                     app="apps.observe_app:make_runtime") as ws:
            first = ws.start(concurrency=RUNS, lease_ttl=1.0,
                             extra=["--metrics-port", str(first_port)])

            async def all_mid_run() -> bool:
                runs = [await rt.peek(t) for t in ids]
                return all(r.status == "running" and r.step >= 1 for r in runs)

            await eventually(all_mid_run, what="every run past its first step", workers=ws)
            first.kill()
            holders = await held_by(rt, ids)
            killed_id = holders[ids[0]]
            assert killed_id is not None and set(holders.values()) == {killed_id}, holders
            version = (await rt.peek(ids[0])).version

            # The taker's own leases are not under test: a TTL a loaded machine cannot miss
            # keeps a late renewal of its own from counting as a lost lease.
            second = ws.start(concurrency=RUNS, lease_ttl=10.0, verbose=True,
                              extra=["--metrics-port", str(second_port)])
            done = [await rt.wait(t, timeout=60) for t in ids]
            assert {r.status for r in done} == {"completed"}
            _, samples = scrape(second_port)
            assert second.terminate() == 0, second.output()
        took = total(samples, "tether_lease_takeovers_total", agent="obs", version=version)
        assert took == RUNS, samples.get("tether_lease_takeovers_total")
        assert total(samples, "tether_lease_takeovers_total") == RUNS
        assert total(samples, "tether_leases_lost_total") == 0
        assert f"from worker {killed_id} (its lease expired)" in second.output()


async def test_a_frozen_worker_counts_the_leases_it_lost(db_url: str, tmp_path: Path) -> None:
    frozen_port, other_port = free_port(), free_port()
    async with tether.Runtime(db_url, agents=[app.agent, app.child_agent]) as rt:
        ids = [(await rt.start(app.agent, {"steps": 2, "pause": 1.5},
                               thread_id=f"lost-{i}")).thread_id for i in range(RUNS)]
        with Workers(db_url, tmp_path, call_log=tmp_path / "log",
                     app="apps.observe_app:make_runtime") as ws:
            frozen = ws.start(concurrency=RUNS, lease_ttl=1.0,
                              extra=["--metrics-port", str(frozen_port)])

            async def all_leased() -> bool:
                return all(h is not None for h in (await held_by(rt, ids)).values())

            await eventually(all_leased, what="every run leased", workers=ws)
            frozen_id = (await held_by(rt, ids))[ids[0]]
            await pause_outside_transaction(frozen, db_url)
            other = ws.start(concurrency=RUNS, lease_ttl=1.0,
                             extra=["--metrics-port", str(other_port)])

            async def all_taken() -> bool:
                return frozen_id not in set((await held_by(rt, ids)).values())

            await eventually(all_taken, what="every lease taken over", workers=ws)
            frozen.resume()
            done = [await rt.wait(t, timeout=60) for t in ids]
            assert {r.status for r in done} == {"completed"}

            def lost_counted() -> bool:
                return total(scrape(frozen_port)[1], "tether_leases_lost_total") == RUNS

            await eventually(lost_counted, what="the frozen worker's lost leases counted",
                             workers=ws)
            took = total(scrape(other_port)[1], "tether_lease_takeovers_total")
            assert took == RUNS
            assert total(scrape(frozen_port)[1], "tether_lease_takeovers_total") == 0
            assert frozen.terminate() == 0, frozen.output()
            assert other.terminate() == 0, other.output()
