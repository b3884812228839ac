"""Acceptance: rainbow deploys with real worker processes of two versions whose code differs
(apps/deploy_v1.py, apps/deploy_v2.py), on both stores.

Which version ran a step is read from the checkpoint log: each checkpoint names the worker
that committed it, and each worker process serves one version.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import tether
from apps import TESTS_DIR, Workers, eventually, pid_of
from apps import deploy_v1 as v1

pytestmark = pytest.mark.slow

TTL = 1.0
V1, V2 = "apps.deploy_v1:make_runtime", "apps.deploy_v2:make_runtime"


def client(db_url: str) -> tether.Runtime:
    """The test's own runtime: it starts runs (own version v1) and reads the deployment."""
    return tether.Runtime(db_url, agents=[v1.agent], version="v1", lease_ttl=TTL)


def start_worker(workers: Workers, app: str, concurrency: int = 50):  # type: ignore[no-untyped-def]
    workers.app = app
    return workers.start(concurrency=concurrency, lease_ttl=TTL)


async def registered(rt: tether.Runtime, want: dict[str, int], workers: Workers) -> None:
    async def up() -> bool:
        live = Counter(w.version for w in await rt.workers() if w.alive)
        return all(live[v] >= n for v, n in want.items())

    await eventually(up, timeout=60, what=f"workers {want} to register", workers=workers)


async def ran_on(rt: tether.Runtime, thread_id: str) -> set[int]:
    """The pids of the workers that committed the run's steps."""
    return {pid_of(cp.worker) for cp in await rt.checkpoints(thread_id)}


def assert_result(run: tether.Run) -> None:
    assert run.status == tether.RunStatus.COMPLETED, (run.thread_id, run.error)
    if run.version == "v1":
        assert run.state["result"] == "v1" and "polished" not in run.state, run.state
    else:
        assert run.state["result"] == "v2" and run.state["polished"] is True, run.state


async def test_route_50_50_splits_and_each_run_finishes_on_its_version(
        db_url: str, tmp_path: Path) -> None:
    with Workers(db_url, tmp_path, call_log=tmp_path / "calls") as workers:
        w1 = start_worker(workers, V1)
        w2 = start_worker(workers, V2)
        async with client(db_url) as rt:
            await registered(rt, {"v1": 1, "v2": 1}, workers)
            info = {w.version: w for w in await rt.workers()}
            assert info["v1"].agents == {"deal": ("draft", "review", "legacy")}
            assert info["v2"].agents == {"deal": ("draft", "review", "polish")}
            assert {info["v1"].pid, info["v2"].pid} == {w1.pid, w2.pid}
            await rt.route({"v1": 50, "v2": 50})
            runs = [await rt.start(v1.agent, {"i": i}, thread_id=f"split-{i}")
                    for i in range(1000)]
            split = Counter(r.version for r in runs)
            assert 450 <= split["v1"] <= 550 and split["v1"] + split["v2"] == 1000, split
            async with asyncio.timeout(120):
                done = [await rt.wait(r.thread_id) for r in runs]
            pids = {"v1": w1.pid, "v2": w2.pid}
            for r in done[:200]:
                assert_result(r)
                assert await ran_on(rt, r.thread_id) == {pids[r.version]}, r.thread_id
            assert all(r.status == tether.RunStatus.COMPLETED for r in done)
            assert Counter(r.version for r in done) == split

            # Another interpreter (its own hash seed) starts runs by the same weights: each
            # lands where this process's routing puts its thread_id.
            script = (
                "import asyncio, json, sys, tether\n"
                "from apps import deploy_v1 as v1\n"
                "async def main():\n"
                "    async with tether.Runtime(sys.argv[1], agents=[v1.agent]) as rt:\n"
                "        out = {}\n"
                "        for i in range(300):\n"
                "            r = await rt.start(v1.agent, {}, thread_id=f'other-{i}')\n"
                "            out[r.thread_id] = r.version\n"
                "        print(json.dumps(out))\n"
                "asyncio.run(main())\n")
            env = {**os.environ, "PYTHONPATH": str(TESTS_DIR), "PYTHONHASHSEED": "random"}
            proc = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-c", script, db_url], env=env,
                capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, proc.stderr
            theirs = json.loads(proc.stdout)
            weights = [(d.version, d.weight) for d in await rt.deployments() if d.weight]
            ours = {t: tether.deploy.pick(t, weights) for t in theirs}
            assert theirs == ours
            assert 100 < Counter(theirs.values())["v1"] < 200
            assert w1.alive() and w2.alive()
        assert w1.terminate() == 0 and w2.terminate() == 0
    async with client(db_url) as rt:
        assert await rt.workers() == []  # both deregistered on their clean stop


async def test_sigkill_v1_worker_its_runs_resume_on_v1_never_v2(
        db_url: str, tmp_path: Path) -> None:
    with Workers(db_url, tmp_path, call_log=tmp_path / "calls") as workers:
        a = start_worker(workers, V1, concurrency=20)
        b = start_worker(workers, V1, concurrency=20)
        c = start_worker(workers, V2, concurrency=100)
        async with client(db_url) as rt:
            await registered(rt, {"v1": 2, "v2": 1}, workers)
            await rt.route({"v1": 50, "v2": 50})
            runs = [await rt.start(v1.agent, {"pause": 0.5}) for _ in range(120)]

            held: list[str] = []

            async def a_holds_runs() -> bool:
                held[:] = [r.thread_id for r in await rt.list_runs(status="running", limit=500)
                           if r.lease_owner and pid_of(r.lease_owner) == a.pid]
                return len(held) >= 5

            await eventually(a_holds_runs, timeout=60, what="worker a to hold runs",
                             workers=workers)
            a.kill()
            async with asyncio.timeout(120):
                done = [await rt.wait(r.thread_id) for r in runs]
            for r in done:
                assert_result(r)
                by = await ran_on(rt, r.thread_id)
                if r.version == "v1":
                    assert by <= {a.pid, b.pid}, (r.thread_id, by)
                else:
                    assert by == {c.pid}, (r.thread_id, by)
            # The runs a held when it died were finished by b, the other v1 worker.
            for t in held:
                assert b.pid in await ran_on(rt, t), t
            dead = [w for w in await rt.workers() if w.pid == a.pid]
            assert dead and not dead[0].alive  # killed: never deregistered, dead after TTL


async def test_drain_during_load_then_retire(db_url: str, tmp_path: Path) -> None:
    with Workers(db_url, tmp_path, call_log=tmp_path / "calls") as workers:
        w1 = start_worker(workers, V1)
        w2 = start_worker(workers, V2)
        async with client(db_url) as rt:
            await registered(rt, {"v1": 1, "v2": 1}, workers)
            await rt.route({"v1": 50, "v2": 50})
            before = [await rt.start(v1.agent, {"pause": 0.3}) for _ in range(60)]
            assert {r.version for r in before} == {"v1", "v2"}
            drained = await rt.drain("v1")
            assert drained.weight == 0 and drained.state == "draining", drained
            with pytest.raises(tether.InvalidState, match="still has open runs"):
                await rt.retire("v1")
            after = [await rt.start(v1.agent, {"pause": 0.05}) for _ in range(60)]
            assert {r.version for r in after} == {"v2"}

            async def v1_drained() -> bool:
                d = {x.version: x for x in await rt.deployments()}
                return d["v1"].state == "drained"

            await eventually(v1_drained, timeout=60, what="v1 drained", workers=workers)
            for r in before + after:
                run = await rt.wait(r.thread_id, timeout=60)
                assert_result(run)
                assert await ran_on(rt, r.thread_id) == {
                    w1.pid if run.version == "v1" else w2.pid}
            retired = await rt.retire("v1")
            assert retired.state == "retired"
            with pytest.raises(tether.InvalidState, match="retired"):
                await rt.start(v1.agent, {}, version="v1")
            with pytest.raises(tether.InvalidState, match="retired"):
                await rt.route({"v1": 10, "v2": 90})


async def test_upgrade_waiting_runs_dry_run_then_move(db_url: str, tmp_path: Path) -> None:
    with Workers(db_url, tmp_path, call_log=tmp_path / "calls") as workers:
        w1 = start_worker(workers, V1)
        w2 = start_worker(workers, V2)
        async with client(db_url) as rt:
            await registered(rt, {"v1": 1, "v2": 1}, workers)
            asking = [(await rt.start(v1.agent, {"ask": True}, version="v1")).thread_id
                      for _ in range(4)]
            old = (await rt.start(v1.agent, {"legacy": True}, version="v1")).thread_id

            async def all_waiting() -> bool:
                return all([(await rt.peek(t)).status == "waiting" for t in [*asking, old]])

            await eventually(all_waiting, timeout=60, what="runs waiting", workers=workers)
            assert (await rt.peek(old)).node == "legacy"

            plan = await rt.upgrade("v1", "v2", dry_run=True)
            assert sorted(plan.planned) == sorted(asking) and not plan.applied
            assert [t for t, _ in plan.refused] == [old]
            assert "'legacy' does not exist" in plan.refused[0][1]
            refused = await rt.upgrade("v1", "v2")  # all or nothing: the legacy run blocks
            assert not refused.applied and refused.moved == ()
            assert {(await rt.peek(t)).version for t in [*asking, old]} == {"v1"}

            cli = await asyncio.to_thread(subprocess.run, [
                sys.executable, "-m", "tether", "runs", "upgrade", "--db", db_url,
                "--from", "v1", "--to", "v2", "--thread", asking[0], "--thread", asking[1],
                "--json"], capture_output=True, text=True, timeout=60)
            assert cli.returncode == 0, cli.stderr
            assert sorted(json.loads(cli.stdout)["moved"]) == sorted(asking[:2])
            moved = await rt.upgrade("v1", "v2", skip_refused=True)
            assert moved.applied and sorted(moved.moved) == sorted(asking[2:])
            for t in asking:
                run = await rt.peek(t)
                assert (run.version, run.status) == ("v2", tether.RunStatus.WAITING)
                await rt.resume(t, "yes")
            await rt.resume(old, "fine")
            for t in asking:
                run = await rt.wait(t, timeout=60)
                assert_result(run)
                assert run.state["answer"] == "yes" and run.state["drafted_by"] == "v2"
                assert await ran_on(rt, t) == {w2.pid}
            run = await rt.wait(old, timeout=60)
            assert run.state["result"] == "v1-legacy" and run.version == "v1"
            assert await ran_on(rt, old) == {w1.pid}


async def test_stopped_version_is_stranded_within_ttl(db_url: str, tmp_path: Path) -> None:
    with Workers(db_url, tmp_path, call_log=tmp_path / "calls") as workers:
        w1 = start_worker(workers, V1)
        w2 = start_worker(workers, V2)
        async with client(db_url) as rt:
            await registered(rt, {"v1": 1, "v2": 1}, workers)
            ids = [(await rt.start(v1.agent, {"ask": True}, version="v1")).thread_id
                   for _ in range(3)]

            async def waiting() -> bool:
                return all([(await rt.peek(t)).status == "waiting" for t in ids])

            await eventually(waiting, timeout=60, what="runs waiting", workers=workers)
            ok = await asyncio.to_thread(subprocess.run, [
                sys.executable, "-m", "tether", "deploy", "status", "--db", db_url,
                "--check"], capture_output=True, text=True, timeout=60,
                env={**os.environ, "TETHER_LEASE_TTL": str(TTL)})
            assert ok.returncode == 0, (ok.stdout, ok.stderr)
            assert w1.terminate() == 0
            stopped = time.monotonic()

            async def stranded() -> bool:
                d = {x.version: x for x in await rt.deployments()}
                return d["v1"].stranded == 3

            await eventually(stranded, timeout=30, what="v1's runs stranded")
            assert time.monotonic() - stopped <= TTL + 2.0
            check = await asyncio.to_thread(subprocess.run, [
                sys.executable, "-m", "tether", "deploy", "status", "--db", db_url,
                "--check", "--json"], capture_output=True, text=True, timeout=60,
                env={**os.environ, "TETHER_LEASE_TTL": str(TTL)})
            assert check.returncode == 1, (check.stdout, check.stderr)
            v1_row = next(d for d in json.loads(check.stdout) if d["version"] == "v1")
            assert v1_row["stranded"] == 3 and v1_row["workers"] == 0

            def logged() -> bool:
                return "3 runs of version v1 are stranded" in w2.output()

            await eventually(logged, timeout=30, what="the v2 worker to log the stranding")


async def test_stranding_uses_the_workers_lease_ttl_not_the_callers(
        db_url: str, tmp_path: Path) -> None:
    """Workers at a 3 s TTL, a CLI at its default (30 s): every v1 worker SIGKILLed, `deploy
    status --check` exits 1 within TTL + 3 s (it once waited for the CLI's own 30 s)."""
    ttl = 3.0
    with Workers(db_url, tmp_path, call_log=tmp_path / "calls") as workers:
        workers.app = V1
        w1a = workers.start(concurrency=10, lease_ttl=ttl)
        w1b = workers.start(concurrency=10, lease_ttl=ttl)
        async with client(db_url) as rt:
            await registered(rt, {"v1": 2}, workers)
            ids = [(await rt.start(v1.agent, {"ask": True}, version="v1")).thread_id
                   for _ in range(3)]

            async def waiting() -> bool:
                return all([(await rt.peek(t)).status == "waiting" for t in ids])

            await eventually(waiting, timeout=60, what="runs waiting", workers=workers)
            env = {k: v for k, v in os.environ.items() if k != "TETHER_LEASE_TTL"}
            w1a.kill()
            w1b.kill()
            killed = time.monotonic()
            # A run is stranded once the version's last heartbeat and its own last update are
            # both a TTL old: a run that parked after the last heartbeat comes a little later
            # than the first, so wait for all three (each parked before the kill).
            while True:
                check = await asyncio.to_thread(subprocess.run, [
                    sys.executable, "-m", "tether", "deploy", "status", "--db", db_url,
                    "--check", "--json"], capture_output=True, text=True, timeout=60, env=env)
                v1_row = next((d for d in json.loads(check.stdout or "[]")
                               if d["version"] == "v1"), {})
                if (check.returncode == 1 and v1_row.get("stranded") == 3) or \
                        time.monotonic() - killed > 40:
                    break
                await asyncio.sleep(0.2)
            waited = time.monotonic() - killed
            assert check.returncode == 1, (check.stdout, check.stderr)
            assert waited <= ttl + 3.0, waited
            assert v1_row["stranded"] == 3 and v1_row["workers"] == 0


async def test_status_says_no_routing_and_drain_wait_prints_on_change(
        db_url: str, tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tether", "deploy", *args, "--db", db_url],
                              capture_output=True, text=True, timeout=60)

    with Workers(db_url, tmp_path, call_log=tmp_path / "calls") as workers:
        start_worker(workers, V1)
        start_worker(workers, V2)
        async with client(db_url) as rt:
            await registered(rt, {"v1": 1, "v2": 1}, workers)
            ids = [(await rt.start(v1.agent, {"ask": True}, version="v1")).thread_id
                   for _ in range(2)]

            async def waiting() -> bool:
                return all([(await rt.peek(t)).status == "waiting" for t in ids])

            await eventually(waiting, timeout=60, what="runs waiting", workers=workers)
            before = await asyncio.to_thread(cli, "status")
            assert before.returncode == 0, before.stderr
            assert "no routing set (runs go to the starting runtime's version)" in before.stdout
            v1_line = next(line for line in before.stdout.splitlines() if "v1" in line)
            assert " 0 " not in v1_line.split("active")[0], before.stdout  # not "weight 0"
            await rt.route({"v2": 100})
            after = await asyncio.to_thread(cli, "status")
            assert "no routing set" not in after.stdout
            drained = await asyncio.to_thread(cli, "drain", "v1", "--wait", "--timeout", "3.5")
            assert drained.returncode == 1, (drained.stdout, drained.stderr)
            lines = [line for line in drained.stdout.splitlines() if "draining," in line]
            assert lines == ["v1: draining, 2 open runs (2 waiting) after 0s"], drained.stdout
            assert "not drained after 3.5s" in drained.stdout


async def test_bad_input_is_refused_and_changes_nothing(db_url: str, tmp_path: Path) -> None:
    with Workers(db_url, tmp_path, call_log=tmp_path / "calls") as workers:
        start_worker(workers, V1)
        async with client(db_url) as rt:
            await registered(rt, {"v1": 1}, workers)
            await rt.route({"v1": 100})
            before = await rt.deployments()
            bad: list[object] = [{"v9": 10}, {"v1": -1}, {"v1": 0}, {"v1": 1.5}, {"v1": True},
                                 {}, {"": 1}]
            for weights in bad:
                with pytest.raises(tether.TetherError) as err:
                    await rt.route(weights)  # type: ignore[arg-type]
                assert str(err.value), weights
            with pytest.raises(tether.DefinitionError, match="unknown version 'v9'"):
                await rt.drain("v9")
            with pytest.raises(tether.InvalidState, match="no version for new runs"):
                await rt.drain("v1")
            with pytest.raises(tether.InvalidState, match="still has weight 100"):
                await rt.retire("v1")
            with pytest.raises(tether.DefinitionError, match="unknown to_version 'v2'"):
                await rt.upgrade("v1", "v2")
            with pytest.raises(tether.DefinitionError, match="both 'v1'"):
                await rt.upgrade("v1", "v1")
            with pytest.raises(tether.DefinitionError, match="unknown version 'v7'"):
                await rt.start(v1.agent, {}, version="v7")
            assert await rt.deployments() == before
            for args in (["route", "v1=-5"], ["route", "v1=0"], ["route", "v1"],
                         ["route", "v9=3"], ["drain", "v9"], ["retire", "v1"]):
                out = await asyncio.to_thread(subprocess.run, [
                    sys.executable, "-m", "tether", "deploy", *args, "--db", db_url],
                    capture_output=True, text=True, timeout=60)
                assert out.returncode == 2, (args, out.stdout, out.stderr)
                assert out.stderr.startswith("tether: error:") or "Error:" in out.stderr, \
                    (args, out.stderr)
                assert "Traceback" not in out.stderr
            out = await asyncio.to_thread(subprocess.run, [
                sys.executable, "-m", "tether", "runs", "upgrade", "--db", db_url,
                "--from", "v1", "--to", "v2"], capture_output=True, text=True, timeout=60)
            assert out.returncode == 2 and "unknown to_version 'v2'" in out.stderr
            assert await rt.deployments() == before
