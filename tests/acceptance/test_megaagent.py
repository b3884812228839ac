"""Acceptance: the MegaAgent example (examples/megaagent/run.py) runs to completion on SQLite
and on Postgres, (1) with its worker subprocess SIGKILLed twice mid-way and restarted, and
(2) on two `tether worker` processes sharing the database (--workers 2), one of them
SIGKILLed once mid-way and restarted.

The script itself checks that every worker's answer reached its admin once and every summary
the boss, and audits the mailbox (it exits non-zero otherwise). This test runs it as a user
would, on a fresh database, with a low worker concurrency so that the run lasts past the
script's first kill: at full concurrency ~200 agents finish before it, and nothing would be
tested. It then counts the mailbox from outside: exactly the messages the protocol sends,
each one consumed except the admin-channel notes that reach admins who already finished.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from apps.mail_app import mailbox_rows, query_rows

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "megaagent" / "run.py"
AGENTS = 200
TIMEOUT = 90


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def fresh_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database without the tether schema (the script migrates it): a new SQLite file, or
    a new Postgres database from the session's pg fixtures (dropped afterwards)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'mega.db'}"
    url: str = request.getfixturevalue("pg_empty_url")
    return url


def run_example(db_url: str, cwd: Path, *extra: str) -> tuple[str, dict[str, Any]]:
    """Run the script to completion (its whole process group is killed if it hangs); its
    output and the figures dict it prints last."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TETHER_", "MEGA_"))}
    args = [sys.executable, str(SCRIPT), "--agents", str(AGENTS), "--concurrency", "2",
            "--db", db_url, "--timeout", str(TIMEOUT - 10), *extra]
    # Its own session: if it hangs, the whole group (the script and its workers) is killed.
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"run.py did not finish in {TIMEOUT}s:\n{out.decode()}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text
    figures = ast.literal_eval(text.strip().splitlines()[-1])
    assert isinstance(figures, dict), text
    return text, figures


def check_run(db_url: str, text: str, kills: int) -> tuple[int, int]:
    """The script's own verdict, its kills, and the mailbox counted from outside: per group,
    N "ready", one task to each of N members, N results, one summary to the boss, and a note
    to each of the other admins; nothing sent twice, nothing left unconsumed but notes."""
    # "5 groups of 38-39 workers = 200 agents": groups of unequal size since --agents is exact
    shape = re.search(r"^boss \S+: (\d+) groups (?:x|of) \d+(?:-\d+)? workers = (\d+) agents",
                      text, re.M)
    assert shape, text
    groups, total = map(int, shape.groups())
    members = total - groups - 1  # every agent but the boss and the group admins
    assert abs(total - AGENTS) <= 10, text
    ok = re.search(r"^OK: all (\d+) agents finished, every result counted once", text, re.M)
    assert ok and int(ok.group(1)) == total, text
    done = [int(n) for n in re.findall(
        rf"^SIGKILLed the worker \(\d/{kills}\); (\d+) runs completed so far", text, re.M)]
    assert len(done) == kills, text
    assert done[0] < total, f"the first kill came after everything was done:\n{text}"

    rows = mailbox_rows(db_url)
    kinds = Counter(r.body.get("kind", "summary") for r in rows)
    assert kinds == {"ready": members, "task": members,
                     "result": members, "summary": groups,
                     "note": groups * (groups - 1)}, kinds
    pairs = Counter((r.sender, r.thread_id, r.body.get("kind")) for r in rows)
    assert max(pairs.values()) == 1, [p for p, n in pairs.items() if n > 1][:5]
    late = [r for r in rows if r.consumed_step is None and r.body.get("kind") != "note"]
    assert late == [], late[:5]
    return total, len(rows)


def test_megaagent_survives_two_sigkills(fresh_db: str, tmp_path: Path) -> None:
    text, _ = run_example(fresh_db, tmp_path, "--kill", "2")
    check_run(fresh_db, text, kills=2)


def test_megaagent_on_two_worker_processes(fresh_db: str, tmp_path: Path) -> None:
    """--workers 2: the script only starts the boss and waits; two `tether worker` processes
    share the database and do every step, one of them is SIGKILLed once and restarted."""
    text, fig = run_example(fresh_db, tmp_path, "--workers", "2", "--kill", "1", "--lease-ttl", "4")
    total, messages = check_run(fresh_db, text, kills=1)
    assert fig["agents"] == total and fig["messages"] == messages, fig
    assert fig["worker_processes"] == 2 and fig["kills"] == 1, fig
    # Three worker processes ran: the killed one, its replacement and the other one.
    procs = fig["workers"]
    assert sorted(p["slot"] for p in procs) == [0, 0, 1], procs
    assert [p["ended"] for p in procs].count("SIGKILL") == 1, procs
    assert all(p["ended"] == "exit 0" for p in procs[1:]), procs
    assert all(p["peak_rss_mib"] > 10 for p in procs), procs
    # Every step was committed by a worker process (none by the script), and both slots did
    # steps: the work was shared.
    by_pid = step_pids(fresh_db)
    assert sum(by_pid.values()) == fig["steps"], (by_pid, fig)
    slot_of = {p["pid"]: p["slot"] for p in procs}
    assert set(by_pid) <= set(slot_of), (by_pid, procs)
    assert {slot_of[pid] for pid in by_pid} == {0, 1}, (by_pid, procs)


def step_pids(db_url: str) -> Counter[int]:
    """Committed steps per worker process id (a worker id is host:pid:suffix)."""
    out: Counter[int] = Counter()
    for worker, n in query_rows(db_url, "SELECT worker, count(*) FROM checkpoints GROUP BY worker"):
        out[int(worker.split(":")[1])] += n
    return out
