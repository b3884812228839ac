"""Acceptance: the MegaAgent example (examples/megaagent/run.py) runs to completion with its
worker subprocess SIGKILLed twice mid-way and restarted, on SQLite and on Postgres.

The script itself checks that every worker's answer reached its admin once and every summary
the boss (it exits non-zero otherwise). This test runs it as a user would, on a fresh
database, with a low worker concurrency so that the run lasts past the script's first kill
(1.5 s in): at full concurrency ~200 agents finish before it, and nothing would be tested.
It then counts the mailbox from outside: exactly the messages the protocol sends, each one
consumed except the admin-channel notes that reach admins who already finished.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from apps.mail_app import mailbox_rows

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


def test_megaagent_survives_two_sigkills(fresh_db: str, tmp_path: Path) -> None:
    db_url = fresh_db
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TETHER_", "MEGA_"))}
    args = [sys.executable, str(SCRIPT), "--agents", str(AGENTS), "--kill", "2",
            "--concurrency", "2", "--db", db_url, "--timeout", str(TIMEOUT - 10)]
    # Its own session: if it hangs, the whole group (the script and its worker) is killed.
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
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

    shape = re.search(r"^boss \S+: (\d+) groups x (\d+) workers = (\d+) agents$", text, re.M)
    assert shape, text
    groups, per_group, total = map(int, shape.groups())
    assert abs(total - AGENTS) <= 10, text
    ok = re.search(r"^OK: all (\d+) agents finished, every result counted once", text, re.M)
    assert ok and int(ok.group(1)) == total, text
    kills = [int(n) for n in re.findall(
        r"^SIGKILLed the worker \(\d/2\); (\d+) runs completed so far", text, re.M)]
    assert len(kills) == 2, text
    assert kills[0] < total, f"the first kill came after everything was done:\n{text}"

    # From outside: per group, N "ready", one task to each of N members, N results, one
    # summary to the boss, and a note to each of the other admins; nothing sent twice.
    rows = mailbox_rows(db_url)
    kinds = Counter(r.body.get("kind", "summary") for r in rows)
    assert kinds == {"ready": groups * per_group, "task": groups * per_group,
                     "result": groups * per_group, "summary": groups,
                     "note": groups * (groups - 1)}, kinds
    pairs = Counter((r.sender, r.thread_id, r.body.get("kind")) for r in rows)
    assert max(pairs.values()) == 1, [p for p, n in pairs.items() if n > 1][:5]
    late = [r for r in rows if r.consumed_step is None and r.body.get("kind") != "note"]
    assert late == [], late[:5]
