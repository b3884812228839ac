"""Failover under load (issue 34): a primary and a standby of the test's own (apps.pg_cluster),
two worker processes on a multi-host URL busy with runs of journaled steps (some parked on
interrupts, some requesting an effect); the primary's postmaster and backends are SIGKILLed and
the standby promoted (`pg_ctl promote`), with no tether process restarted.

Synchronous replication: every run completes with the history it would have had (each step's
call made once, its result the one in the final state), no checkpoint lost or doubled, every
effect performed under its one key, and work goes on within 5 s of the promotion (measured:
the figure is printed, and docs/howto-ha.md quotes it). Asynchronous replication: every run
still completes and effects keep their key; what the unreplicated tail cost is measured: at
the end the killed primary is started again alone, and what it had committed that the new
primary does not have (checkpoints, journal entries) is counted and printed (none, with
synchronous replication). If some run does not complete, its rows are printed.

After the failover, a run started by this process is picked up through the listener's
reconnected LISTEN at once, not at the workers' next poll (5 s here).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

import tether
from apps import Workers, eventually
from apps import ha_app as app
from apps.chaos_app import read_calls
from apps.effects_app import SINK_ENV, by_key, read_lines
from apps.pg_cluster import PgPair, available, in_ci
from tether.store.base import Store

pytestmark = [pytest.mark.failover, pytest.mark.slow]

RUNS, STEPS = 60, 8
ASK_EVERY, EFFECT_EVERY = 6, 3  # every 6th run parks at step 4; every 3rd requests an effect
PAUSE = (0.03, 0.12)
LEASE_TTL = 4.0
POLL = 5.0  # workers claim on LISTEN wake-ups; a poll would take this long
KILL_AFTER = 120  # checkpoints committed before the primary is killed


@pytest.fixture(autouse=True)
def _needs_a_pair() -> None:
    reason = available()
    if reason is not None:
        if in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)


def _checkpoints(url: str) -> int:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=1) as conn:
            row = conn.execute("SELECT count(*) FROM checkpoints").fetchone()
            return int(row[0]) if row else 0
    except psycopg.OperationalError:
        return -1


async def _unfinished(store: Store, ids: list[str]) -> str:
    """The rows of the runs not completed: the run, its interrupts, its checkpoints' steps
    and the journal of the step after its last."""
    lines = []
    for thread_id in ids:
        run = await store.get_run(thread_id)
        if run is None or run.status == "completed":
            continue
        interrupts = await store.list_interrupts(thread_id=thread_id, status=None)
        steps = [cp.step for cp in await store.checkpoints(thread_id)]
        journal = await store.load_journal(thread_id, run.step + 1)
        lines.append(f"{run}\n  interrupts: {interrupts}\n  checkpoints: {steps}\n"
                     f"  journal of step {run.step + 1}: {[(j.idx, j.name) for j in journal]}")
    return "unfinished runs:\n" + "\n".join(lines)


def _lost_tail(pair: PgPair) -> dict[str, Any]:
    """What the old primary had committed that the new one does not have: its checkpoints
    ((thread_id, step), their steps run again since, with other times), their finish times,
    and the number of its journal entries (a result the new primary does not hold)."""
    old_url, new_url = pair.restart_old_primary(), pair.node_url(pair.standby)
    rows: list[tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]] = []
    for query in ("SELECT thread_id, step, finished_at FROM checkpoints",
                  "SELECT thread_id, step, idx, result FROM journal"):
        found = []
        for url in (old_url, new_url):
            with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
                found.append({tuple(r) for r in conn.execute(query).fetchall()})
        rows.append((found[0], found[1]))
    (old_cps, new_cps), (old_journal, new_journal) = rows
    gone = sorted(old_cps - new_cps)
    return {"checkpoints": [(t, s) for t, s, _ in gone],
            "finished_at": [f for _, _, f in gone],
            "journal": len(old_journal - new_journal)}


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_failover_under_load(sync: bool, tmp_path: Path) -> None:
    call_log, sink = tmp_path / "calls.log", tmp_path / "sink.log"
    with PgPair(sync=sync) as pair:
        url = pair.url()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        await asyncio.to_thread(  # the CLI, on the multi-host URL
            subprocess.run, [sys.executable, "-m", "tether", "migrate", "--db", url],
            check=True, env=env, capture_output=True, timeout=60)
        inputs = [app.run_input(i, steps=STEPS, pause=PAUSE,
                                ask_at=4 if i % ASK_EVERY == 0 else None,
                                effect_at=2 if i % EFFECT_EVERY == 0 else None)
                  for i in range(RUNS)]
        async with tether.Runtime(url, agents=[app.agent], version="v1") as rt:
            with Workers(url, tmp_path, call_log=call_log, app="apps.ha_app:make_runtime") as ws:
                extra = {"TETHER_DB": url, SINK_ENV: str(sink)}
                pair_of = [ws.start(concurrency=25, lease_ttl=LEASE_TTL, poll_interval=POLL,
                                    env=extra) for _ in range(2)]
                await eventually(lambda: all("tether worker:" in w.output() for w in pair_of),
                                 timeout=30, what="both workers up", workers=ws)
                ids = [(await rt.start(app.agent, data, thread_id=f"ha{i:03}")).thread_id
                       for i, data in enumerate(inputs)]
                primary_url = pair.node_url(pair.primary)
                await eventually(lambda: _checkpoints(primary_url) >= KILL_AFTER, timeout=60,
                                 what=f"{KILL_AFTER} checkpoints", workers=ws)
                before_kill = _checkpoints(primary_url)  # (a lower bound: commits go on)
                t_kill = time.monotonic()
                pair.kill_primary()
                killed_at = time.time()  # (its last commits were sent before this)
                pair.promote()
                t_promoted = time.monotonic()
                standby_url = pair.node_url(pair.standby)
                at_promotion = _checkpoints(standby_url)
                await eventually(lambda: _checkpoints(standby_url) > at_promotion, timeout=30,
                                 what="a commit on the promoted standby", workers=ws)
                resumed = time.monotonic() - t_promoted
                print(f"\n[{'sync' if sync else 'async'}] promote took "
                      f"{t_promoted - t_kill:.2f} s; work went on {resumed:.2f} s after it "
                      f"({before_kill} checkpoints on the primary just before the kill, "
                      f"{at_promotion} on the standby at promotion)")
                assert resumed < 5.0, resumed

                async def all_done() -> bool:
                    for it in await rt.interrupts(status="pending", limit=RUNS):
                        await rt.resume(it.thread_id, "yes")
                    runs = await rt.store.list_runs(limit=RUNS + 1)
                    return sum(r.status == "completed" for r in runs) == RUNS

                try:
                    await eventually(all_done, timeout=90, what="every run completed",
                                     workers=ws)
                except AssertionError:
                    print(await _unfinished(rt.store, ids))
                    raise
                wanted = RUNS // EFFECT_EVERY

                async def effects_done() -> bool:
                    done = await rt.store.list_effects(status="done", limit=RUNS)
                    return len(done) == wanted

                await eventually(effects_done, timeout=30, what="every effect done", workers=ws)
                # The listener reconnected: a run started now is claimed at once.
                t0 = time.monotonic()
                late = await rt.start(app.agent, app.run_input(999, steps=1, pause=(0, 0)))
                await rt.wait(late.thread_id, timeout=POLL * 3)
                picked_up = time.monotonic() - t0
                print(f"a run started after the failover was done in {picked_up:.2f} s")
                assert picked_up < POLL / 2, picked_up
                outputs = [w.output() for w in pair_of]
                for w in pair_of:
                    assert w.terminate() == 0, w.output()
            calls = read_calls(call_log)
            twice = {k: len(v) for k, v in calls.items() if len(v) > 1}
            sunk = by_key(read_lines(sink))
            doubled = {k: len(v) for k, v in sunk.items() if len(v) > 1}
            print(f"calls made twice: {len(twice)}; effects performed twice: {len(doubled)}")
            for thread_id, data in zip(ids, inputs, strict=True):
                run = await rt.get(thread_id)
                assert run.status == tether.RunStatus.COMPLETED, (thread_id, run.error)
                cps = await rt.checkpoints(thread_id)
                assert [cp.step for cp in cps] == list(range(1, STEPS + 1)), thread_id
                assert run.state["done"] == list(range(1, STEPS + 1)), run.state
                if "effect_at" in data:
                    effects = await rt.store.list_effects(thread_id=thread_id)
                    assert [e.status for e in effects] == ["done"], effects
                    assert effects[0].key in sunk, effects  # performed, under its one key
                if sync:  # the history it would have had: one call per step, its result kept
                    nonces = [calls[thread_id, s][0].nonce for s in range(1, STEPS + 1)]
                    assert run.state["nonces"] == nonces, thread_id
            assert {t for t, _ in calls} >= set(ids)
            if sync:
                assert twice == {}, twice
            log = "".join(outputs)
            assert "Traceback" not in log, log
            assert "reconnected to" in log, log
            parts = Counter(line.split("Postgres ")[1].split()[0]
                            for line in log.splitlines() if "reconnected to" in line)
            print(f"reconnect lines by part: {dict(parts)}")
            assert {"pool", "listener"} <= set(parts), parts
        # What the failover lost: the old primary, started again alone once every tether
        # process has stopped, against the new one.
        try:
            lost = await asyncio.to_thread(_lost_tail, pair)
        except RuntimeError as exc:  # the old primary did not start again (once in 40)
            print(f"lost in the failover: not measured ({str(exc)[:200]})")
            return
        ages = [killed_at - t for t in lost["finished_at"]]
        print(f"lost in the failover: {len(lost['checkpoints'])} checkpoints of "
              f"{len({t for t, _ in lost['checkpoints']})} runs, {lost['journal']} journal "
              f"entries; the oldest lost checkpoint finished {max(ages, default=0) * 1000:.0f} "
              f"ms before the kill")
        if sync:
            assert lost["checkpoints"] == [] and lost["journal"] == 0, lost
