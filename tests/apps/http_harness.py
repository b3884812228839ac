"""Real processes for the HTTP acceptance tests: `tether serve` and `tether worker` started
with `sys.executable -m tether` on the http_app module, on a free loopback port.

`Procs` owns every process it starts and ends each one at teardown (SIGTERM, then SIGKILL);
their output goes to files in the test's tmp_path and is shown when a start fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import httpx

try:
    from .ports import free_port
except ImportError:  # imported as a top-level module, with tests/apps on sys.path
    from ports import free_port  # type: ignore[no-redef]

APPS = Path(__file__).resolve().parent


def app_env(db_url: str, log: Path | None = None, **extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(APPS), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "TETHER_DB": db_url}
    env.pop("TETHER_TOKEN", None)
    env.update(extra)
    if log is not None:
        env["HTTP_APP_LOG"] = str(log)
    return env


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    """Poll `check()` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


class Proc:
    def __init__(self, name: str, popen: subprocess.Popen[bytes], out: IO[bytes], path: Path):
        self.name = name
        self.popen = popen
        self._out = out
        self.path = path

    def output(self) -> str:
        self._out.flush()
        return self.path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: the crash case."""
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def terminate(self, timeout: float = 15) -> int:
        """SIGTERM and wait; SIGKILL if it does not stop in time. Returns the exit status."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        return self.popen.returncode

    def close(self) -> None:
        self.terminate()
        self._out.close()


def client_headers(token: str | None = None) -> dict[str, str]:
    """What a client of the API sends: its name (so that a write without a JSON body, such as
    POST /runs/{id}/cancel, is not taken for a browser's form) and the token if any."""
    headers = {"X-Tether-Client": "tests"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


class Server(Proc):
    base_url: str

    def client(self, token: str | None = None, **kw: Any) -> httpx.Client:
        headers = {**client_headers(token), **kw.pop("headers", {})}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=30, **kw)

    def async_client(self, token: str | None = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, headers=client_headers(token),
                                 timeout=30)


class Procs:
    """Starts tether processes for one test and ends all of them at teardown."""

    def __init__(self, tmp: Path, db_url: str, log: Path | None = None) -> None:
        self.tmp = tmp
        self.db_url = db_url
        self.log = log
        self.procs: list[Proc] = []

    def _spawn(self, name: str, args: Sequence[str], env: dict[str, str] | None) -> tuple[
            subprocess.Popen[bytes], IO[bytes], Path]:
        path = self.tmp / f"{name}-{len(self.procs)}.log"
        out = open(path, "wb")
        popen = subprocess.Popen(
            [sys.executable, "-m", "tether", *args],
            env=env or app_env(self.db_url, self.log), stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        return popen, out, path

    def serve(self, *args: str, app: str = "http_app:runtime", worker: bool = False,
              env: dict[str, str] | None = None, token: str | None = None,
              port: int | None = None) -> Server:
        port = port or free_port()
        argv = ["serve", "--app", app, "--db", self.db_url, "--port", str(port), *args]
        if worker:
            argv += ["--worker", "--concurrency", "10"]
        popen, out, path = self._spawn("serve", argv, env)
        server = Server("serve", popen, out, path)
        server.base_url = f"http://127.0.0.1:{port}"
        self.procs.append(server)

        def healthy() -> bool:
            if not server.alive():
                raise AssertionError(f"tether serve exited {popen.returncode}:\n{server.output()}")
            try:
                return httpx.get(server.base_url + "/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, 30, "tether serve to answer /healthz", every=0.1)
        return server

    def worker(self, *args: str, app: str = "http_app:runtime") -> Proc:
        argv = ["worker", "--app", app, "--db", self.db_url, "--concurrency", "10",
                "--lease-ttl", "2", *args]
        popen, out, path = self._spawn("worker", argv, None)
        proc = Proc("worker", popen, out, path)
        self.procs.append(proc)

        def started() -> bool:
            if not proc.alive():
                raise AssertionError(f"tether worker exited {popen.returncode}:\n{proc.output()}")
            return "tether worker:" in proc.output()

        wait_until(started, 30, "tether worker to start", every=0.1)
        return proc

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.close()
        self.procs.clear()
