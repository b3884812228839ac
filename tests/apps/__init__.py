"""Apps that `tether worker` subprocesses load in the chaos tests, and the harness that runs
those subprocesses: start, SIGKILL, SIGSTOP/SIGCONT, SIGTERM, and never leave one behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

import psycopg

TESTS_DIR = Path(__file__).resolve().parent.parent
CALL_LOG_ENV = "CHAOS_CALL_LOG"


def pid_of(worker_id: str) -> int:
    """The pid in a worker id `host:pid:suffix` (checkpoint.worker, run.lease_owner)."""
    return int(worker_id.rsplit(":", 2)[1])


class WorkerProcess:
    """One `python -m tether worker` subprocess; its stdout and stderr go to `output_path`."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path, output_path: Path):
        self.output_path = output_path
        with open(output_path, "wb") as out:
            self.proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=out,
                                         stderr=subprocess.STDOUT)
        self.killed = False
        self.stopped = False

    def __repr__(self) -> str:
        return f"WorkerProcess(pid={self.pid}, returncode={self.proc.returncode})"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: the crash. Returns once the process is gone."""
        self.killed = True
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def pause(self) -> None:
        """SIGSTOP; returns once the kernel reports the process stopped."""
        self.proc.send_signal(signal.SIGSTOP)
        self.stopped = True
        deadline = time.monotonic() + 5
        while _proc_state(self.pid) not in ("T", None) and time.monotonic() < deadline:
            time.sleep(0.001)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.stopped = False

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM (graceful shutdown); its exit code. SIGKILL if it does not exit in time."""
        if self.stopped:
            self.resume()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"worker {self.pid} ignored SIGTERM for {timeout}s:\n{self.output()}"
            ) from None

    def ensure_dead(self) -> None:
        if self.proc.returncode is None:
            if self.stopped:
                self.resume()
            self.kill()


class Workers:
    """Starts `tether worker` subprocesses for `apps.<module>`; on exit (normal or not) kills
    every one still running, so a failing test leaves no process behind."""

    def __init__(self, db_url: str, workdir: Path, *, call_log: Path,
                 app: str = "apps.chaos_app:make_runtime"):
        self.db_url = db_url
        self.workdir = workdir
        self.call_log = call_log
        self.app = app
        self.started: list[WorkerProcess] = []

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for w in self.started:
            w.ensure_dead()

    def start(self, *, concurrency: int, lease_ttl: float, verbose: bool = False,
              poll_interval: float = 0.1, extra: Sequence[str] = (),
              env: Mapping[str, str] | None = None) -> WorkerProcess:
        path = os.pathsep.join(p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p)
        env = {
            **os.environ,
            "PYTHONPATH": path,
            CALL_LOG_ENV: str(self.call_log),
            "TETHER_POLL_INTERVAL": str(poll_interval),
            **(env or {}),
        }
        args = [sys.executable, "-m", "tether", "worker", "--app", self.app, "--db", self.db_url,
                "--concurrency", str(concurrency), "--lease-ttl", str(lease_ttl)]
        if verbose:
            args.append("-v")
        args.extend(extra)
        output = self.workdir / f"worker-{len(self.started)}.out"
        worker = WorkerProcess(args, env, self.workdir, output)
        self.started.append(worker)
        return worker

    def check(self) -> None:
        """Fail fast, with its output, if a worker died that nobody killed."""
        for w in self.started:
            if not w.killed and w.proc.poll() is not None:
                raise AssertionError(
                    f"worker {w.pid} exited with {w.proc.returncode}:\n{w.output()}"
                )


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], what: str = "a condition",
    timeout: float = 30.0, *, workers: Workers | None = None,
) -> None:
    """Poll `check` (plain or async) until it is true; fail after `timeout` seconds, or at
    once if one of `workers` died that nobody killed. The suite's one polling helper."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if workers is not None:
            workers.check()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


def holds_write_lock(db_url: str) -> bool:
    """Whether some session of the database is inside a write transaction right now: a
    SIGSTOPped worker caught in one would block every other worker, a test artefact that a
    chaos test must avoid (it is not the zombie scenario: that is a paused *node*)."""
    if db_url.startswith("sqlite:"):
        conn = sqlite3.connect(urlsplit(db_url).path[1:], timeout=0.2, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return False
        except sqlite3.OperationalError:
            return True
        finally:
            conn.close()
    with psycopg.connect(db_url, autocommit=True) as pg:
        row = pg.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"
        ).fetchone()
    return bool(row and row[0])


def break_audit(db_url: str) -> None:
    """Make the audit row impossible to write (its table renamed away)."""
    if db_url.startswith("sqlite:"):
        conn = sqlite3.connect(urlsplit(db_url).path[1:])
        conn.execute("ALTER TABLE audit RENAME TO audit_gone")
        conn.commit()
        conn.close()
    else:
        with psycopg.connect(db_url, autocommit=True) as pg:
            pg.execute("ALTER TABLE audit RENAME TO audit_gone")


async def pause_outside_transaction(worker: WorkerProcess, db_url: str) -> None:
    """SIGSTOP `worker` at a moment it holds no write transaction open (see
    holds_write_lock), retrying for up to a second; fails the test otherwise."""
    for _ in range(100):
        worker.pause()
        if not holds_write_lock(db_url):
            return
        worker.resume()  # caught inside a transaction: not the case under test
        await asyncio.sleep(0.01)
    raise AssertionError("could not pause the worker outside a write transaction")


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None  # no procfs (or gone): nothing to wait for
    return stat.rsplit(")", 1)[1].split()[0]
