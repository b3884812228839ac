"""The primary killed in the middle of a group commit (issue 34): 200 runs of short journaled
steps on two workers (a primary and a synchronous standby of the test's own, apps.pg_cluster,
a multi-host URL), so that at any moment a batch of step commits is at the server waiting for
the standby's acknowledgement. The primary's postmaster and backends are SIGKILLed at a
checkpoint count, the standby promoted (`pg_ctl promote`), no tether process restarted.

Afterwards every step is there exactly once: per run, checkpoints 1..STEPS (no step missing,
none twice), one journal entry per step, each step's call made once (the call log counts
every invocation) with its result the one in the run's state, and each effect performed once
under its key (the sink counts every performance) and marked done. The commits in flight at
the kill were settled by reading back (the workers say so; test_pg_reconnect.py and
test_pg_effect_readback.py pin the read-back itself).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import tether
from apps import Workers, eventually
from apps import ha_app as app
from apps.chaos_app import read_calls
from apps.effects_app import SINK_ENV, by_key, read_lines
from apps.pg_cluster import PgPair, available, in_ci

pytestmark = [pytest.mark.failover, pytest.mark.slow]

RUNS, STEPS = 200, 6
EFFECT_EVERY = 4  # every 4th run requests an effect at step 3
PAUSE = (0.0, 0.01)
KILL_AT = 400  # checkpoints committed when the primary is killed (of RUNS * STEPS)
LEASE_TTL = 6.0


@pytest.fixture(autouse=True)
def _needs_a_pair() -> None:
    reason = available()
    if reason is not None:
        if in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)


def _rows(url: str, sql: str) -> list[tuple[object, ...]]:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=1) as conn:
            return list(conn.execute(sql).fetchall())
    except psycopg.OperationalError:
        return []


def _checkpoints(url: str) -> int:
    rows = _rows(url, "SELECT count(*) FROM checkpoints")
    return int(str(rows[0][0])) if rows else -1


async def test_a_kill_in_the_middle_of_a_group_commit(tmp_path: Path) -> None:
    call_log, sink = tmp_path / "calls.log", tmp_path / "sink.log"
    with PgPair(sync=True) as pair:
        url = pair.url()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "tether", "migrate", "--db", url],
            check=True, env=env, capture_output=True, timeout=60)
        inputs = [app.run_input(i, steps=STEPS, pause=PAUSE,
                                effect_at=3 if i % EFFECT_EVERY == 0 else None)
                  for i in range(RUNS)]
        async with tether.Runtime(url, agents=[app.agent], version="v1") as rt:
            with Workers(url, tmp_path, call_log=call_log, app="apps.ha_app:make_runtime") as ws:
                extra = {"TETHER_DB": url, SINK_ENV: str(sink)}
                workers = [ws.start(concurrency=RUNS // 2, lease_ttl=LEASE_TTL, verbose=True,
                                    env=extra) for _ in range(2)]
                await eventually(lambda: all("tether worker:" in w.output() for w in workers),
                                 timeout=30, what="both workers up", workers=ws)
                ids = [r.thread_id for r in await asyncio.gather(*(
                    rt.start(app.agent, data, thread_id=f"gc{i:03}")
                    for i, data in enumerate(inputs)))]
                primary_url = pair.node_url(pair.primary)
                await eventually(lambda: _checkpoints(primary_url) >= KILL_AT, timeout=60,
                                 what=f"{KILL_AT} checkpoints", workers=ws)
                pair.kill_primary()
                pair.promote()
                standby_url = pair.node_url(pair.standby)
                at_promotion = _checkpoints(standby_url)

                async def all_done() -> bool:
                    runs = await rt.store.list_runs(limit=RUNS + 1)
                    return sum(r.status == "completed" for r in runs) == RUNS

                await eventually(all_done, timeout=90, what="every run completed", workers=ws)
                wanted = RUNS // EFFECT_EVERY

                async def effects_done() -> bool:
                    return len(await rt.store.list_effects(status="done", limit=RUNS)) == wanted

                await eventually(effects_done, timeout=30, what="every effect done", workers=ws)
                log = "".join(w.output() for w in workers)
                for w in workers:
                    assert w.terminate() == 0, w.output()
            settled = [line for line in log.splitlines() if "read back: it" in line]
            print(f"\n{at_promotion} of {RUNS * STEPS} checkpoints on the standby at promotion; "
                  f"writes settled by reading back: {len(settled)} "
                  f"({sum('it landed' in line for line in settled)} had landed)")
            assert "Traceback" not in log, log
            assert settled, "no write was in flight at the kill"  # (the test's premise)

            steps = _rows(standby_url, "SELECT thread_id, step FROM checkpoints "
                                       "ORDER BY thread_id, step")
            by_run: dict[str, list[int]] = {}
            for thread_id, step in steps:
                by_run.setdefault(str(thread_id), []).append(int(str(step)))
            assert by_run == {t: list(range(1, STEPS + 1)) for t in ids}
            journal = _rows(standby_url, "SELECT thread_id, step, idx, count(*) FROM journal "
                                         "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")
            assert [(str(t), int(str(s)), int(str(i)), int(str(n))) for t, s, i, n in journal] \
                == [(t, s, 0, 1) for t in sorted(ids) for s in range(1, STEPS + 1)]
            calls = read_calls(call_log)
            twice = {k: len(v) for k, v in calls.items() if len(v) != 1}
            assert twice == {}, twice  # each step's call made once
            assert set(calls) == {(t, s) for t in ids for s in range(1, STEPS + 1)}
            sunk = by_key(read_lines(sink))
            for thread_id, data in zip(ids, inputs, strict=True):
                run = await rt.get(thread_id)
                assert run.status == tether.RunStatus.COMPLETED, (thread_id, run.error)
                assert run.state["nonces"] == [calls[thread_id, s][0].nonce
                                               for s in range(1, STEPS + 1)], thread_id
                effects = await rt.store.list_effects(thread_id=thread_id)
                if "effect_at" in data:
                    assert [e.status for e in effects] == ["done"], effects
                    assert len(sunk.get(effects[0].key, [])) == 1, (effects, sunk)
                else:
                    assert effects == []
            assert len(sunk) == wanted, sunk
