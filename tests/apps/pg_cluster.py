"""A Postgres primary and a streaming standby of the tests' own (issue 34's failover tests):
`initdb` and `pg_basebackup -R` into a temporary directory, ports of their own, run as the
`postgres` OS user; the machine's cluster (5432) is never touched.

    with PgPair(sync=True) as pair:       # both up, the standby streaming (sync: acknowledged)
        url = pair.url()                  # postgresql://...:P1,...:P2/postgres?target_session_attrs=read-write
        pair.kill_primary()               # SIGKILL its postmaster and every backend (a host lost)
        pair.promote()                    # pg_ctl promote the standby

Needs the PostgreSQL 15 server binaries (PG_BIN, default /usr/lib/postgresql/15/bin) and, when
run as root, `runuser`. `available()` says why not, for a skip outside CI.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from .ports import free_port

PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
STANDBY_NAME = "standby"


def available() -> str | None:
    """None if a pair can be made here, else why not."""
    if not (PG_BIN / "initdb").exists():
        return f"no PostgreSQL server binaries in {PG_BIN} (set PG_BIN)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser"
    return None


def _as_postgres(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


class Node:
    def __init__(self, root: Path, name: str) -> None:
        self.dir = root / name
        self.log = root / f"{name}.log"
        self.port = free_port()
        self.root = root

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        out = subprocess.run(_as_postgres([str(PG_BIN / args[0]), *args[1:]]),
                             capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if check and out.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({out.returncode}): {out.stderr}{out.stdout}"
                               f"\n{self.log_text()}")
        return out.stdout

    def log_text(self) -> str:
        try:
            return self.log.read_text()[-4000:]
        except OSError:
            return ""

    def conf(self, **settings: str | int) -> None:
        with open(self.dir / "postgresql.auto.conf", "a") as f:
            for key, value in settings.items():
                text = value if isinstance(value, int) else "'" + value.replace("'", "''") + "'"
                f.write(f"{key} = {text}\n")

    def start(self) -> None:
        self.run("pg_ctl", "-D", str(self.dir), "-l", str(self.log), "-w", "-t", "60", "start")

    def pids(self) -> list[int]:
        """The postmaster, then its children."""
        try:
            pid = int((self.dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
        return [pid, *(int(p) for p in out.stdout.split())]

    def kill(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        if (self.dir / "postmaster.pid").exists():
            self.run("pg_ctl", "-D", str(self.dir), "-m", "immediate", "-w", "stop", check=False)
            self.kill()


class PgPair:
    """A primary and a standby streaming from it; `sync`: synchronous replication
    (synchronous_standby_names names the standby, synchronous_commit=on): a commit is
    acknowledged once the standby has flushed it."""

    def __init__(self, *, sync: bool = True) -> None:
        self.sync = sync
        self.root = Path(tempfile.mkdtemp(prefix="tether-ha-"))
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.root.chmod(0o755)
        self.primary = Node(self.root, "primary")
        self.standby = Node(self.root, "standby")

    def __enter__(self) -> PgPair:
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _make(self) -> None:
        p, s = self.primary, self.standby
        p.run("initdb", "-D", str(p.dir), "-U", "postgres", "--auth=trust", "-E", "UTF8",
              "--locale=C", "--no-sync")
        common = {"listen_addresses": "127.0.0.1", "unix_socket_directories": str(self.root),
                  "fsync": "off",  # a SIGKILL loses no page the OS holds: durability intact
                  "full_page_writes": "off", "shared_buffers": "32MB", "max_connections": 100,
                  "wal_level": "replica", "max_wal_senders": 5, "hot_standby": "on",
                  "synchronous_commit": "on", "wal_receiver_status_interval": "1s"}
        p.conf(port=p.port, **common,
               synchronous_standby_names=STANDBY_NAME if self.sync else "")
        p.start()
        p.run("pg_basebackup", "-h", "127.0.0.1", "-p", str(p.port), "-U", "postgres",
              "-D", str(s.dir), "-R", "-X", "stream", "--no-sync")
        # Its own port; the name the primary waits for; and once promoted, no standby of its
        # own to wait for.
        # wal_retrieve_retry_interval: after its primary is gone the standby retries for WAL
        # every 5 s by default, and a promotion waits for the retry in progress.
        s.conf(port=s.port, synchronous_standby_names="", wal_retrieve_retry_interval="100ms",
               primary_conninfo=f"host=127.0.0.1 port={p.port} user=postgres "
                                f"application_name={STANDBY_NAME}")
        s.start()
        self.wait_streaming()

    def wait_streaming(self, timeout: float = 30.0) -> None:
        want = "sync" if self.sync else "async"
        deadline = time.monotonic() + timeout
        while True:
            out = self.primary.run(
                "psql", "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
                "-At", "-c", "SELECT state, sync_state FROM pg_stat_replication", check=False)
            if f"streaming|{want}" in out:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"standby not streaming ({out!r}):\n"
                                   f"{self.standby.log_text()}")
            time.sleep(0.1)

    def url(self, dbname: str = "postgres", auth: str = "postgres") -> str:
        """A multi-host URL: whichever node accepts writes."""
        return (f"postgresql://{auth}@127.0.0.1:{self.primary.port},127.0.0.1:"
                f"{self.standby.port}/{dbname}?target_session_attrs=read-write")

    def node_url(self, node: Node, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{node.port}/{dbname}"

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and its backends: the host is gone."""
        self.primary.kill()

    def promote(self) -> None:
        self.standby.run("pg_ctl", "-D", str(self.standby.dir), "-w", "-t", "60", "promote")

    def restart_old_primary(self) -> str:
        """Start the killed primary again, alone, to read what it had committed (with
        asynchronous replication: the tail the promoted standby never received); its URL.
        Only once no tether process runs: it accepts writes, and is the URL's first host."""
        self.primary.start()
        return self.node_url(self.primary)

    def close(self) -> None:
        for node in (self.standby, self.primary):
            with contextlib.suppress(Exception):
                node.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def in_ci() -> bool:
    """CI=true: a test that cannot make its cluster here fails rather than skip."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
