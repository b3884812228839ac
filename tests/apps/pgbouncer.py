"""A PgBouncer of the tests' own (Debian's `pgbouncer`, 1.18) in front of a Postgres server:
its own port and temporary directory, run as the `postgres` OS user (it refuses root),
transaction pooling by default; every database name is passed through to the server.

    with PgBouncer("127.0.0.1", 5432) as bouncer:
        url = bouncer.url("mydb", listen_url="postgresql://postgres@127.0.0.1:5432/mydb")
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from .ports import free_port


def available() -> str | None:
    if shutil.which("pgbouncer") is None:
        return "no pgbouncer on PATH (apt-get install -y pgbouncer)"
    return None


class PgBouncer:
    def __init__(self, host: str, port: int, *, mode: str = "transaction",
                 pool_size: int = 10) -> None:
        self.host, self.port, self.mode, self.pool_size = host, port, mode, pool_size
        self.root = Path(tempfile.mkdtemp(prefix="tether-bouncer-"))
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.listen_port = free_port()
        self.log = self.root / "pgbouncer.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PgBouncer:
        ini = self.root / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={self.host} port={self.port} user=postgres\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.listen_port}\n"
            "unix_socket_dir =\nauth_type = any\n"
            f"pool_mode = {self.mode}\n"
            f"max_client_conn = 500\ndefault_pool_size = {self.pool_size}\n"
            # Server connections closed once idle for a second: a test's database is dropped
            # soon after, and the server is shared with every other test.
            f"server_idle_timeout = 1\nmax_db_connections = {self.pool_size}\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.log}\npidfile = {self.root / 'pgbouncer.pid'}\n")
        if os.geteuid() == 0:
            shutil.chown(ini, "postgres", "postgres")
        as_postgres = {"user": "postgres", "group": "postgres", "extra_groups": []} \
            if os.geteuid() == 0 else {}
        # (its stderr repeats the log file: a pipe nobody reads would fill and block it)
        self._proc = subprocess.Popen(["pgbouncer", "-q", str(ini)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, **as_postgres)
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError), socket.create_connection(
                    ("127.0.0.1", self.listen_port), timeout=0.5):
                return self
            if self._proc.poll() is not None or time.monotonic() > deadline:
                log = self.log_text()
                self.close()
                raise RuntimeError(f"pgbouncer did not start: {log}")
            time.sleep(0.05)

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def log_text(self) -> str:
        try:
            return self.log.read_text()[-4000:]
        except OSError:
            return ""

    def url(self, dbname: str, *, listen_url: str | None = None) -> str:
        url = f"postgresql://postgres@127.0.0.1:{self.listen_port}/{dbname}?sslmode=disable"
        if self.mode == "transaction":
            url += "&pool_mode=transaction"
        if listen_url is not None:
            url += "&listen_url=" + quote(listen_url, safe="")
        return url

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # immediate shutdown
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
