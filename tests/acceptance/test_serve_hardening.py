"""`tether serve` as an attacker on the network meets it (a real subprocess, raw sockets and
httpx): slow clients dropped, connections capped, foreign Host names refused, tokens from a
file or the environment and never too short beyond loopback, /docs off unless asked, and
docs that never put a token on a command line."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apps"))

from http_harness import Procs, app_env, free_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "a-long-enough-token-for-tests"


@pytest.fixture
def procs(tmp_path: Path, db_url: str) -> Iterator[Procs]:
    p = Procs(tmp_path, db_url)
    try:
        yield p
    finally:
        p.close()


def address(base_url: str) -> tuple[str, int]:
    host, port = base_url.removeprefix("http://").split(":")
    return host, int(port)


def read_all(sock: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed."""
    sock.settimeout(timeout)
    got = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            raise AssertionError(f"connection still open after {timeout}s: {got!r}") from None
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return got, time.monotonic()
        got += chunk


def test_slow_clients_are_dropped_and_connections_capped(procs: Procs) -> None:
    server = procs.serve("--request-timeout", "1.5", "--max-connections", "40")
    where = address(server.base_url)
    began = time.monotonic()
    headers = [socket.create_connection(where) for _ in range(30)]  # slowloris
    for s in headers:
        s.sendall(b"GET /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    silent = socket.create_connection(where)  # connects, never sends
    body = socket.create_connection(where)  # headers, then half its body
    body.sendall(b"POST /runs HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                 b"content-length: 200\r\n\r\n{\"agent\": ")
    drip = socket.create_connection(where)  # a byte a quarter second never buys more time
    try:
        for byte in b"GET ":  # a valid request's first bytes (httptools refuses "GG" at once)
            drip.sendall(bytes([byte]))
            time.sleep(0.25)
        # Meanwhile an ordinary client is served at once.
        with server.client() as c:
            assert c.get("/runs").status_code == 200
        for s in [*headers, silent, drip]:
            got, closed = read_all(s, 10)
            assert got.startswith(b"HTTP/1.1 408 "), got
            assert closed - began < 6
        got, closed = read_all(body, 10)
        assert closed - began < 6 and b" 201 " not in got
        # Past the cap, a connection is refused at once, before it sends a byte.
        held = [socket.create_connection(where) for _ in range(40)]
        try:
            extra = socket.create_connection(where)
            got, _ = read_all(extra, 5)
            assert got.startswith(b"HTTP/1.1 503 "), got
            extra.close()
        finally:
            for s in held:
                s.close()
        time.sleep(0.2)
        with server.client() as c:
            assert c.get("/runs").status_code == 200
        assert "Traceback" not in server.output()
    finally:
        for s in [*headers, silent, body, drip]:
            s.close()


def test_host_names_refused_unless_allowed(procs: Procs) -> None:
    plain = procs.serve()
    with plain.client() as c:
        r = c.get("/runs", headers={"Host": "evil.example"})
        assert r.status_code == 421 and r.json()["error"]["type"] == "MisdirectedRequest"
        assert c.get("/ui", headers={"Host": "evil.example"}).status_code == 421
        assert c.get("/runs", headers={"Host": "localhost"}).status_code == 200
    flagged = procs.serve("--allowed-host", "tether.internal", "--allowed-host", "ops.example")
    env = app_env(procs.db_url, TETHER_ALLOWED_HOSTS="tether.internal, ops.example")
    from_env = procs.serve(env=env)
    for server in (flagged, from_env):
        with server.client() as c:
            for name in ("tether.internal", "ops.example:8000"):
                assert c.get("/runs", headers={"Host": name}).status_code == 200, name
            assert c.get("/runs", headers={"Host": "evil.example"}).status_code == 421


def test_token_from_a_file_or_the_environment(procs: Procs, tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    server = procs.serve("--token-file", str(path))
    with server.client() as anon:
        assert anon.get("/runs").status_code == 401
    with server.client(token=TOKEN) as c:
        assert c.get("/runs").status_code == 200
        assert c.post(f"/runs/{'x' * 3}/cancel").status_code == 404  # authorized, no such run
    assert TOKEN not in " ".join(server.popen.args)  # type: ignore[arg-type]

    def refused(*args: str, **env: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "tether", "serve", "--app", "http_app:runtime",
             "--port", str(free_port()), *args],
            env=app_env(procs.db_url, **env), capture_output=True, text=True, timeout=60,
            stdin=subprocess.DEVNULL)
        assert done.returncode == 2, done
        return done.stderr

    assert "not both" in refused("--token", TOKEN, "--token-file", str(path))
    assert "cannot read --token-file" in refused("--token-file", str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("\n")
    assert "is empty" in refused("--token-file", str(tmp_path / "empty"))
    # Beyond loopback a short token is refused, however it is given.
    (tmp_path / "short").write_text("x\n")
    for args, env in ((["--token-file", str(tmp_path / "short")], {}),
                      ([], {"TETHER_TOKEN": "short-15-chars!"})):
        err = refused("--host", "0.0.0.0", *args, **env)
        assert "at least 16 characters" in err and "refusing to bind" in err, err


def test_api_docs_only_when_asked(procs: Procs) -> None:
    plain = procs.serve()
    with plain.client() as c:
        assert c.get("/docs").status_code == 404 and c.get("/redoc").status_code == 404
        assert c.get("/openapi.json").status_code == 200
    docs = procs.serve("--api-docs")
    with docs.client() as c:
        assert c.get("/docs").status_code == 200 and c.get("/redoc").status_code == 200


def test_docs_never_show_a_token_on_the_command_line() -> None:
    """A token given as `--token VALUE` is visible to every local user in `ps`: the docs show
    TETHER_TOKEN or --token-file."""
    shown: list[str] = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"--token[ =](?!-)[\"'$\w<]", line):
                shown.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not shown, "\n".join(shown)
    text = (ROOT / "docs" / "howto-deploy.md").read_text()
    assert "--token-file" in text and "TETHER_TOKEN" in text
