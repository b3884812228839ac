"""Retention on both stores: the policy removes exactly the terminal runs past their age (from
when they finished) with everything of theirs, leaves tombstones, survives a SIGKILLed
pruner, and compacts long logs keeping state and interrupts; a dry run previews both."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from apps.inprocess import WAIT, eventually, make_runtime, working
from tether import (
    Agent,
    Command,
    ConfigError,
    Context,
    RunNotFound,
    RunPruned,
    RunStatus,
    append,
    finish,
    goto,
    receive,
)
from tether.service.api import create_app

DAY = 86400.0
TABLES = ("runs", "checkpoints", "journal", "outbox", "mailbox", "interrupts", "group_members",
          "tombstones")


@contextmanager
def raw(db_url: str) -> Iterator[Any]:
    if db_url.startswith("sqlite"):
        conn = sqlite3.connect(db_url.removeprefix("sqlite:///"))
        try:
            yield conn
            conn.commit()
        finally:
            conn.close()
    else:
        with psycopg.connect(db_url) as pg:
            yield pg


def ph(db_url: str) -> str:
    return "?" if db_url.startswith("sqlite") else "%s"


def counts(db_url: str) -> dict[str, dict[str, int]]:
    """Rows per table, per thread_id: the whole store, table by table."""
    out: dict[str, dict[str, int]] = {}
    with raw(db_url) as conn:
        for t in TABLES:
            rows = conn.cursor().execute(
                f"SELECT thread_id, count(*) FROM {t} GROUP BY thread_id").fetchall()
            out[t] = {r[0]: int(r[1]) for r in rows}
    return out


def age(db_url: str, thread_ids: list[str], seconds: float) -> None:
    """Make these runs look finished `seconds` ago (and created long before)."""
    p = ph(db_url)
    with raw(db_url) as conn:
        for tid in thread_ids:
            conn.cursor().execute(
                f"UPDATE runs SET updated_at = updated_at - {p}, created_at = created_at - {p}"
                f" WHERE thread_id = {p}", (seconds, seconds + 60 * DAY, tid))


def history_agent() -> Agent:
    agent = Agent("hist")

    @agent.node(start=True)
    async def first(state: dict[str, Any], ctx: Context) -> Command:
        await ctx.call(lambda: 1)
        if state.get("effect"):
            ctx.effect("slow", {"x": 1})
        if state.get("fail"):
            raise ValueError("boom")
        if state.get("ask"):
            ctx.interrupt({"q": 1})
        ctx.join_group("g")
        return goto("second", {"log": append(["a"])})

    @agent.node
    async def second(state: dict[str, Any], ctx: Context) -> Command:
        return finish({"log": append(["b"])})

    return agent


async def test_the_policy_removes_exactly_the_old_terminal_runs(db_url: str) -> None:
    agent = history_agent()
    from tether import RetryPolicy

    agent.retry = RetryPolicy(attempts=1)
    rt = make_runtime(db_url, agent)
    gate = asyncio.Event()

    @rt.effect("slow")
    async def slow(payload: Any, key: str) -> None:
        await gate.wait()

    try:
        async with working(rt, close=False):
            old_done = [(await rt.start("hist", {})).thread_id for _ in range(5)]
            young_done = [(await rt.start("hist", {})).thread_id for _ in range(2)]
            old_failed = [(await rt.start("hist", {"fail": True})).thread_id for _ in range(2)]
            waiting = (await rt.start("hist", {"ask": True})).thread_id
            pending_fx = (await rt.start("hist", {"effect": True})).thread_id
            mailed = (await rt.start("hist", {})).thread_id
            for tid in [*old_done, *young_done, *old_failed, pending_fx, mailed]:
                await asyncio.wait_for(rt.wait(tid), WAIT)
            await eventually(lambda: _status(rt, waiting, "waiting"), "the run to wait")
        p = ph(db_url)
        with raw(db_url) as conn:  # mail that arrived as the run finished: never to be read
            conn.cursor().execute(f"INSERT INTO mailbox (thread_id, sender, message, created_at)"
                                  f" VALUES ({p}, NULL, {p}, 0)", (mailed, b'"unread"'))
        age(db_url, [*old_done, *old_failed, waiting, pending_fx, mailed], 40 * DAY)
        age(db_url, young_done, 10 * DAY)
        before = counts(db_url)

        dry = await rt.prune(completed="30d", failed="30d", dry_run=True)
        assert dry.runs == 7 and dry.bytes > 0
        assert dry.by == {("completed", "hist"): 5, ("failed", "hist"): 2}
        assert counts(db_url) == before  # a dry run changes nothing

        report = await rt.prune(completed="30d", failed="30d")
        assert report.runs == 7
        after = counts(db_url)
        gone = set(old_done) | set(old_failed)
        for t in TABLES[:-1]:
            expected = {k: v for k, v in before[t].items() if k not in gone}
            assert after[t] == expected, t
        assert set(after["tombstones"]) == gone
        assert report.rows == sum(n for t in TABLES[:-1] for k, n in before[t].items()
                                  if k in gone)
        again = await rt.prune(completed="30d", failed="30d")  # idempotent
        assert again.runs == 0 and counts(db_url) == after
        gate.set()
    finally:
        await rt.close()


async def _status(rt: Any, tid: str, status: str) -> bool:
    return bool((await rt.get(tid)).status == status)


async def test_a_pruned_run_is_a_tombstone_and_its_thread_id_starts_fresh(db_url: str) -> None:
    agent = history_agent()
    rt = make_runtime(db_url, agent)
    try:
        async with working(rt, close=False):
            run = await rt.start("hist", {}, thread_id="reused")
            await asyncio.wait_for(rt.wait(run.thread_id), WAIT)
        await asyncio.sleep(0.05)  # "0s" ago is strictly before now (the clock ticks in ms)
        assert (await rt.prune(completed="0s")).runs == 1
        with pytest.raises(RunPruned) as info:
            await rt.get("reused")
        assert isinstance(info.value, RunNotFound) and info.value.pruned_at > 0
        app = create_app(rt)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1") as c:
            r = await c.get("/runs/reused")
            assert r.status_code == 410
            assert r.json()["error"]["type"] == "RunPruned"
            assert r.json()["error"]["pruned_at"] == pytest.approx(info.value.pruned_at)
            assert (await c.get("/runs/never-was")).status_code == 404
        async with working(rt, close=False):
            fresh = await rt.start("hist", {"second": True}, thread_id="reused")
            assert fresh.created and fresh.step == 0
            done = await asyncio.wait_for(rt.wait("reused"), WAIT)
        assert done.state == {"second": True, "log": ["a", "b"]}
        cps = await rt.checkpoints("reused")
        assert [c.step for c in cps] == [1, 2]  # nothing of the old run's log
        assert counts(db_url)["journal"]["reused"] == 1
    finally:
        await rt.close()


async def test_compaction_keeps_state_last_steps_and_interrupts(db_url: str) -> None:
    agent = Agent("actor")

    @agent.node(start=True)
    async def tick(state: dict[str, Any], ctx: Context) -> Command:
        n = state.get("n", 0) + 1
        if n == 500:
            ctx.interrupt({"at": n})
        if n >= 1000:
            return receive({"n": n})
        return goto("tick", {"n": n, "seen": append([n % 7])})

    rt = make_runtime(db_url, agent)
    try:
        async with working(rt, close=False):
            run = await rt.start("actor", {})
            await eventually(lambda: _status(rt, run.thread_id, "waiting"), "the interrupt",
                             timeout=120)
            await rt.resume(run.thread_id, "ok")
            await eventually(lambda: _step(rt, run.thread_id, 1000), "1,000 steps", timeout=300)
        state_before = (await rt.get(run.thread_id)).state
        report = await rt.prune(keep_steps=10, keep_interrupts=True)
        assert report.compacted_runs == 1
        after = await rt.get(run.thread_id)
        assert after.state == state_before and after.state["n"] == 1000
        steps = [c.step for c in await rt.checkpoints(run.thread_id)]
        assert steps == [499, *range(991, 1001)]
        assert [c.state for c in await rt.checkpoints(run.thread_id)][-1] == state_before
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(rt)),
                                     base_url="http://127.0.0.1") as c:
            gone = await c.get(f"/ui/runs/{run.thread_id}/steps/600")  # compacted
            kept = await c.get(f"/ui/runs/{run.thread_id}/steps/499")
            never = await c.get(f"/ui/runs/{run.thread_id}/steps/1001")
        assert gone.status_code == 410 and "compacted its log to 11 of its 1000 steps" in gone.text
        assert kept.status_code == 200
        assert never.status_code == 404 and "has no committed step 1001" in never.text
        forked = await rt.fork(run.thread_id, 499)  # re-asks the interrupt at step 500
        async with working(rt, close=False):
            await eventually(lambda: _status(rt, forked.thread_id, "waiting"), "the fork's ask")
        assert [i.payload for i in await rt.interrupts(thread_id=forked.thread_id)] == [{"at": 500}]
    finally:
        await rt.close()


async def _step(rt: Any, tid: str, step: int) -> bool:
    return bool((await rt.peek(tid)).step >= step)


def fill(db_url: str, runs: int, steps: int) -> None:
    """`runs` completed runs of `steps` checkpoints and journal rows each, finished 40 days ago."""
    p = ph(db_url)
    now = time.time() - 40 * DAY
    with raw(db_url) as conn:
        cur = conn.cursor()
        cur.executemany(
            f"INSERT INTO runs (thread_id, agent, version, status, step, input, input_hash, "
            f"created_at, updated_at) VALUES ({p}, 'a', 'v1', 'completed', {p}, {p}, 'h', {p}, {p})",
            [(f"t{i:06d}", steps, b"{}", now, now) for i in range(runs)])
        cur.executemany(
            f"INSERT INTO checkpoints (thread_id, step, node, kind, data, worker, attempt, "
            f"started_at, finished_at) VALUES ({p}, {p}, 'n', 'd', {p}, 'w', 1, {p}, {p})",
            [(f"t{i:06d}", s, b"{}", now, now) for i in range(runs) for s in range(1, steps + 1)])
        cur.executemany(
            f"INSERT INTO journal (thread_id, step, idx, name, result) VALUES ({p}, {p}, 0, 'f', {p})",
            [(f"t{i:06d}", s, b"1") for i in range(runs) for s in range(1, steps + 1)])


def test_a_sigkilled_pruner_leaves_a_consistent_store_and_the_next_finishes(
        db_url: str, tmp_path: Path) -> None:
    runs, steps = 20_000, 5
    fill(db_url, runs, steps)
    env = {**os.environ, "TETHER_LEASE_TTL": "1", "TETHER_DB": ""}
    cmd = [sys.executable, "-m", "tether", "prune", "--completed", "30d", "--db", db_url, "--json"]
    for _ in range(2):
        before = tombstones(db_url)
        proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while tombstones(db_url) <= before and time.monotonic() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        _assert_consistent(db_url, steps)
        assert len(counts(db_url)["runs"]) < runs  # it had removed some
        time.sleep(1.2)  # the killed pruner's lease expires
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runs"] > 0
    final = counts(db_url)
    assert final["runs"] == {} and final["checkpoints"] == {} and final["journal"] == {}
    assert len(final["tombstones"]) == runs  # the same as one uninterrupted prune


def test_sigint_or_sigterm_stops_a_prune_after_its_batch_and_the_next_finishes(
        db_url: str, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) or SIGTERM: a real `tether prune` stops promptly, prints what it
    removed so far, exits 128 + the signal, and leaves every run whole or gone; a second
    signal stops it at once; the next prune finishes the job. The first is started with
    SIGINT ignored, as a script's background job (`tether prune ... &`) and its children are:
    Python then installs no KeyboardInterrupt handler, and a prune (bench P's) went on."""
    runs, steps = 30_000, 5
    fill(db_url, runs, steps)
    env = {**os.environ, "TETHER_DB": ""}
    cmd = [sys.executable, "-m", "tether", "prune", "--completed", "30d", "--db", db_url, "--json"]
    for sigs, status in (((signal.SIGINT,), 130), ((signal.SIGTERM,), 143),
                         ((signal.SIGINT, signal.SIGINT), 130)):
        before = tombstones(db_url)
        ignored = signal.signal(signal.SIGINT, signal.SIG_IGN) if status == 130 else None
        try:  # an ignored signal stays ignored in the child
            proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        finally:
            if ignored is not None:
                signal.signal(signal.SIGINT, ignored)
        deadline = time.monotonic() + 60
        while tombstones(db_url) <= before and time.monotonic() < deadline:
            time.sleep(0.005)
        assert proc.poll() is None, "the prune ended before it was signalled: fill more runs"
        t0 = time.monotonic()
        for sig in sigs:
            if proc.poll() is None:
                proc.send_signal(sig)
                time.sleep(0.02)  # signals sent closer may arrive as one
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
        assert proc.returncode == status, err
        assert took < 5, f"{took:.1f} s from the signal to the exit"
        removed = tombstones(db_url) - before
        assert 0 < removed < runs - before
        if len(sigs) == 1:  # it printed what it removed, then said it stopped
            report = json.loads(out)
            assert report["stopped"] is True and report["runs"] == removed
            assert f"stopped by {sigs[0].name} after {removed:,} runs" in err
        else:  # at once, or after the batch if that ended before the second signal came
            assert "stopped at once by SIGINT" in err or "stopped by SIGINT" in err, err
        _assert_consistent(db_url, steps)
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stopped"] is False
    final = counts(db_url)
    assert final["runs"] == {} and final["checkpoints"] == {} and final["journal"] == {}
    assert len(final["tombstones"]) == runs  # the same as one uninterrupted prune


async def test_a_worker_stopping_stops_its_standing_prune_after_the_batch(db_url: str) -> None:
    """A worker told to stop while its standing policy is pruning a big store ends promptly
    (the prune stops after its batch), leaving every run whole or gone."""
    runs, steps = 30_000, 5
    await asyncio.to_thread(fill, db_url, runs, steps)
    rt = make_runtime(db_url, Agent("a"), retention={"completed": "30d", "every": "1h"})
    try:
        stop = asyncio.Event()
        worker = asyncio.create_task(rt.work(stop=stop))
        async def pruning() -> bool:
            return await asyncio.to_thread(tombstones, db_url) > 0

        await eventually(pruning, "the standing prune to remove runs", WAIT)
        t0 = time.monotonic()
        stop.set()
        await asyncio.wait_for(worker, 30)
        assert time.monotonic() - t0 < 5
        assert 0 < await asyncio.to_thread(tombstones, db_url) < runs
    finally:
        await rt.close()
    await asyncio.to_thread(_assert_consistent, db_url, steps)


def tombstones(db_url: str) -> int:
    with raw(db_url) as conn:
        return int(conn.cursor().execute("SELECT count(*) FROM tombstones").fetchone()[0])


def _assert_consistent(db_url: str, steps: int) -> None:
    """Every run is whole (all its rows) or gone (a tombstone and no rows at all)."""
    c = counts(db_url)
    for tid in c["runs"]:
        assert c["checkpoints"].get(tid) == steps and c["journal"].get(tid) == steps, tid
        assert tid not in c["tombstones"]
    for tid in c["tombstones"]:
        assert tid not in c["checkpoints"] and tid not in c["journal"], tid


def test_bad_input_is_a_clear_error_and_removes_nothing(db_url: str, tmp_path: Path) -> None:
    fill(db_url, 3, 2)
    before = counts(db_url)
    env = {**os.environ, "TETHER_DB": ""}
    for args, needle in ((["--completed", "soon"], "not a duration"),
                         (["--failed", "-1d"], ">= 0"),
                         (["--completed", "1d", "--agent", "nobody"], "unknown agent"),
                         ([], "needs at least one of")):
        out = subprocess.run([sys.executable, "-m", "tether", "prune", *args, "--db", db_url],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert needle in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert counts(db_url) == before


async def test_the_runtime_api_refuses_bad_policies(db_url: str) -> None:
    rt = make_runtime(db_url, history_agent())
    try:
        for kwargs in ({}, {"completed": "x"}, {"keep_steps": 0}, {"completed": -5}):
            with pytest.raises(ConfigError):
                await rt.prune(**kwargs)
    finally:
        await rt.close()
    assert RunStatus.COMPLETED.terminal


def file_bytes(db_url: str) -> int:
    path = db_url.removeprefix("sqlite:///")
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


async def test_a_prune_gives_the_space_back_in_short_writes(db_url: str) -> None:
    fill(db_url, 3000, 10)
    before = None if db_url.startswith("postgres") else file_bytes(db_url)
    rt = make_runtime(db_url)
    try:
        report = await rt.prune(completed="30d")
    finally:
        await rt.close()
    assert report.runs == 3000
    if before is None:  # Postgres: autovacuum's work
        assert report.freed_bytes == 0 and report.free_bytes is None
        return
    with raw(db_url) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # a new file: incremental
        assert conn.execute("PRAGMA freelist_count").fetchone()[0] == report.free_bytes == 0
    assert report.freed_bytes > 0 and not report.vacuum_needed
    assert file_bytes(db_url) < before // 2  # what stays: the schema and the tombstones


def test_a_file_made_without_auto_vacuum_asks_for_one_vacuum(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'plain.db'}"

    async def prune() -> Any:
        rt = make_runtime(f"{db_url}?auto_vacuum=none")
        try:
            await rt.migrate()
            return await rt.prune(completed="30d")
        finally:
            await rt.close()

    asyncio.run(prune())  # creates the file, in auto_vacuum=none mode
    fill(db_url, 1000, 5)
    before = file_bytes(db_url)
    report = asyncio.run(prune())
    assert report.runs == 1000 and report.freed_bytes == 0
    assert report.vacuum_needed and report.free_bytes is not None and report.free_bytes > 0
    assert file_bytes(db_url) >= before  # freed pages stay in the file, for new rows
    with raw(db_url) as conn:  # the one-off conversion docs/retention.md gives
        conn.isolation_level = None
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("VACUUM")
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    fill(db_url, 1000, 5)
    again = asyncio.run(prune())
    assert again.freed_bytes > 0 and not again.vacuum_needed and again.free_bytes == 0
    with pytest.raises(ConfigError, match="auto_vacuum must be one of"):
        make_runtime(f"{db_url}?auto_vacuum=full")


async def test_the_pruner_sees_whether_a_worker_is_running_runs(db_url: str) -> None:
    """While a run is running the pruner rests longer between batches (BUSY_PACE)."""
    agent = Agent("busy")
    gate = asyncio.Event()
    entered = asyncio.Event()

    @agent.node(start=True)
    async def hold(state: dict[str, Any], ctx: Context) -> Command:
        entered.set()
        await gate.wait()
        return finish({})

    rt = make_runtime(db_url, agent)
    try:
        await rt.open()
        assert not await rt.store.retention.running_now()
        async with working(rt, close=False):
            run = await rt.start("busy", {})
            await asyncio.wait_for(entered.wait(), WAIT)
            assert await rt.store.retention.running_now()
            gate.set()
            await asyncio.wait_for(rt.wait(run.thread_id), WAIT)
        assert not await rt.store.retention.running_now()
    finally:
        await rt.close()


def long_agent() -> Agent:
    agent = Agent("long")

    @agent.node(start=True)
    async def tick(state: dict[str, Any], ctx: Context) -> Command:
        await ctx.call(lambda: 1)  # one journal row per step
        n = state.get("n", 0) + 1
        if n == 2:
            ctx.interrupt({"at": n})
        if n >= state["steps"]:
            return finish({"n": n})
        return goto("tick", {"n": n})

    return agent


async def test_a_dry_run_previews_the_removals_and_the_compaction(db_url: str,
                                                                   tmp_path: Path) -> None:
    rt = make_runtime(db_url, long_agent())
    try:
        async with working(rt, close=False):
            runs = [await rt.start("long", {"steps": s}) for s in (12, 9, 3, 12)]
            for r in runs:
                if (await rt.wait(r.thread_id, until="waiting", timeout=60)).status == "waiting":
                    await rt.resume(r.thread_id, True)
            for r in runs:
                assert (await rt.wait(r.thread_id, timeout=60)).status == "completed"
        age(db_url, [runs[3].thread_id], 40 * 86400.0)  # the prune removes it before compacting
        before = counts(db_url)
        cli = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "tether", "prune", "--completed", "30d", "--keep-steps", "4",
             "--keep-interrupts", "--dry-run", "--db", db_url],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if not k.startswith("TETHER_")})
        dry = {}
        for keep_interrupts in (True, False):
            dry[keep_interrupts] = await rt.prune(completed="30d", keep_steps=4,
                                                  keep_interrupts=keep_interrupts, dry_run=True)
            assert counts(db_url) == before  # nothing changed
            # The old run is removed, not compacted; the 3-step run is short.
            assert (dry[keep_interrupts].runs, dry[keep_interrupts].compacted_runs) == (1, 2)
        assert dry[False].compacted_rows > dry[True].compacted_rows > 0  # interrupts kept
        preview = dry[True]
        assert cli.returncode == 0, cli.stderr
        assert "would remove 1 run " in cli.stdout, cli.stdout
        assert f"would compact 2 runs ({preview.compacted_rows} rows)" in cli.stdout, cli.stdout
        real = await rt.prune(completed="30d", keep_steps=4, keep_interrupts=True)
        assert (real.runs, real.compacted_runs, real.compacted_rows) == (
            preview.runs, preview.compacted_runs, preview.compacted_rows)
        after = counts(db_url)
        long = [runs[0].thread_id, runs[1].thread_id]
        gone = sum(before[t][tid] - after[t].get(tid, 0) for t in ("checkpoints", "journal")
                   for tid in long)
        assert gone == preview.compacted_rows
        again = await rt.prune(completed="30d", keep_steps=4, keep_interrupts=True, dry_run=True)
        assert (again.runs, again.compacted_runs, again.compacted_rows) == (0, 0, 0)
    finally:
        await rt.close()
