"""`tether serve`: the HTTP API (FastAPI on uvicorn; the `server` extra), optionally with a
worker in the same process."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
from pathlib import Path
from types import FrameType

import click

from ..config import redact
from ..errors import ConfigError
from ..extras import requires_extra
from ._common import PORT, POSITIVE_FLOAT, POSITIVE_INT, connection_options, run, runtime_for
from ._root import cli

REQUEST_TIMEOUT = 10.0
MAX_CONNECTIONS = 1000
MAX_STREAMS = 1000
MAX_STREAMS_PER_CLIENT = 50
"""The defaults of tether.service.streams (not imported here: the CLI loads without FastAPI)."""
MIN_TOKEN = 16
"""The shortest token a server reachable from other machines accepts: guesses are throttled,
but a short token would still fall to a patient attacker."""


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_port(host: str, port: int) -> None:
    """Bind (host, port) once as uvicorn will, so that a port in use is one line and exit
    status 2 before the banner says the server is up (uvicorn's own error came after it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            raise ConfigError(f"cannot serve on {host}:{port}: {exc.strerror or exc}; is "
                              "another server on that port? Pick another with --port") from None


def read_token(token: str | None, token_file: Path | None) -> str | None:
    """The bearer token: --token, else --token-file's first line, else $TETHER_TOKEN."""
    if token is not None and token_file is not None:
        raise ConfigError("give the token once: --token or --token-file, not both")
    if token_file is not None:
        try:
            text = token_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read --token-file {str(token_file)!r}: {exc}") from None
        token = text.strip()
        if not token:
            raise ConfigError(f"--token-file {str(token_file)!r} is empty")
        if "\n" in token:
            raise ConfigError(f"--token-file {str(token_file)!r} holds more than one line: "
                              "put the token alone in it")
        return token
    return (token if token is not None else os.environ.get("TETHER_TOKEN", "").strip()) or None


def allowed_hosts(flags: tuple[str, ...], host: str) -> list[str]:
    """--allowed-host names (else $TETHER_ALLOWED_HOSTS, comma-separated), and the bound
    address when it is a name (an address literal is recognised as the connection's own)."""
    names = list(flags) or [n for n in os.environ.get("TETHER_ALLOWED_HOSTS", "").split(",")]
    names = [n.strip() for n in names if n.strip()]
    for name in names:
        if any(c in name for c in "/@ \t") or name.count("*") > (name == "*"):
            raise ConfigError(f"--allowed-host {name!r} is not a host name (give the name "
                              "alone, without scheme or path; '*' for any)")
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        names.append(host)
    return names


@cli.command("serve", help="run the HTTP API and the dashboard (FastAPI + uvicorn)")
@click.option("--host", default="127.0.0.1",
              help="address to bind (default 127.0.0.1; any other needs a token)")
@click.option("--port", type=PORT, default=8000, show_default=True, help="port to listen on")
@click.option("--token", help="bearer token clients must send (default $TETHER_TOKEN; "
                              "prefer that or --token-file: any local user sees arguments)")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="read the bearer token from this file (its one line)")
@click.option("--token-name", metavar="NAME",
              help="who the audit log names for actions made with the token "
                   "(default $TETHER_TOKEN_NAME, else 'token'; 'anonymous' without a token)")
@click.option("--allowed-host", "allowed_host", metavar="NAME", multiple=True,
              help="a Host name clients reach this server by, besides 127.0.0.1, localhost, "
                   "[::1] and the bound address (repeatable; default $TETHER_ALLOWED_HOSTS, "
                   "comma-separated; '*' for any, behind a proxy that checks it)")
@click.option("--request-timeout", type=POSITIVE_FLOAT, default=REQUEST_TIMEOUT,
              show_default=True,
              help="seconds a client has to send a request's headers and body")
@click.option("--max-connections", type=POSITIVE_INT, default=MAX_CONNECTIONS,
              show_default=True, help="open connections at most; more are refused with 503")
@click.option("--max-streams", type=POSITIVE_INT, default=MAX_STREAMS, show_default=True,
              envvar="TETHER_MAX_STREAMS",
              help="event streams open at once at most (API and dashboard; default "
                   "$TETHER_MAX_STREAMS, else 1000); more are refused with 429")
@click.option("--max-streams-per-client", type=POSITIVE_INT, default=MAX_STREAMS_PER_CLIENT,
              show_default=True, envvar="TETHER_MAX_STREAMS_PER_CLIENT",
              help="event streams one client address has open at most (default "
                   "$TETHER_MAX_STREAMS_PER_CLIENT, else 50); more are refused with 429")
@click.option("--api-docs", is_flag=True,
              help="serve /docs and /redoc (their pages load scripts from a CDN)")
@click.option("--worker", is_flag=True, help="also run a worker in this process")
@click.option("--read-only", is_flag=True,
              help="serve views only: the dashboard shows no actions and the API refuses writes")
@click.option("--concurrency", type=POSITIVE_INT, default=None,
              help="the embedded worker's concurrency (default $TETHER_CONCURRENCY, else "
                   "[tool.tether], else 100)")
@click.option("--lease-ttl", type=POSITIVE_FLOAT, default=None,
              help="the embedded worker's lease TTL in seconds")
@connection_options
def serve(host: str, port: int, token: str | None, token_file: Path | None,
          token_name: str | None, allowed_host: tuple[str, ...], request_timeout: float,
          max_connections: int, max_streams: int, max_streams_per_client: int, api_docs: bool,
          worker: bool, read_only: bool,
          concurrency: int | None, lease_ttl: float | None, db: str | None, app: str | None,
          verbose: bool) -> int:
    async def main() -> int:
        with requires_extra("server", "tether serve"):
            import uvicorn

            from ..service import create_app, drain
            from ..service.connections import http_protocol

        bearer = read_token(token, token_file)
        if not is_loopback(host) and bearer is None:
            raise ConfigError(
                f"refusing to bind {host!r} without a token: anyone who reaches it could start "
                "and resume runs. Set TETHER_TOKEN (or pass --token-file), or bind 127.0.0.1"
            )
        if not is_loopback(host) and bearer is not None and len(bearer) < MIN_TOKEN:
            raise ConfigError(
                f"refusing to bind {host!r} with a {len(bearer)}-character token: one "
                f"reachable from other machines needs at least {MIN_TOKEN} characters (make "
                "one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')")
        hosts = allowed_hosts(allowed_host, host)
        check_port(host, port)
        rt = runtime_for(db, app, need_app=worker, concurrency=concurrency, lease_ttl=lease_ttl)
        name = token_name or os.environ.get("TETHER_TOKEN_NAME") or None
        if name is not None and (not name.strip() or len(name) > 200):
            raise ConfigError("--token-name must be a non-empty name of at most 200 characters")
        from .. import observe

        shutdown = observe.enable_tracing_from_env(rt, "tether serve")  # bad OTEL_*: stop here
        await rt.open()  # a missing schema or unreachable database is a clear error
        asgi = create_app(rt, token=bearer, worker_concurrency=rt.settings.concurrency if worker else None,
                          read_only=read_only, token_name=name, allowed_hosts=hosts,
                          api_docs=api_docs, max_streams=max_streams,
                          max_streams_per_client=max_streams_per_client)
        config = uvicorn.Config(
            asgi, host=host, port=port, lifespan="on", access_log=verbose,
            log_level="info" if verbose else "warning", timeout_graceful_shutdown=5,
            http=http_protocol(request_timeout, max_connections),
        )

        stopped_by: list[int] = []

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: FrameType | None) -> None:
                stopped_by.append(sig)
                drain(asgi)
                super().handle_exit(sig, frame)

        server = Server(config)
        # The server's own exit handler from here on, not only once uvicorn installs it: a
        # signal that comes after the banner but before uvicorn is listening stops it as soon
        # as it has started (it was lost). uvicorn raises the signal again once it has shut
        # down, with these handlers back: that is a clean exit (status 0), not death by SIGTERM
        # or a KeyboardInterrupt.
        previous = {s: signal.signal(s, server.handle_exit) for s in (signal.SIGTERM, signal.SIGINT)}
        print(f"tether serve: http://{host}:{port} db={redact(rt.db_url)} "
              f"version={rt.version} worker={'on' if worker else 'off'} "
              f"auth={'token' if bearer else 'none'}{' read-only' if read_only else ''} "
              f"dashboard=http://{host}:{port}/ui", flush=True)
        if host.strip("[]") in ("0.0.0.0", "::") and not hosts:
            print("tether serve: requests must name this machine by an address of it; give "
                  "each host name clients use with --allowed-host NAME", flush=True)
        try:
            await server.serve()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            await rt.close()
            for stop in shutdown:
                stop()
        if server.started:  # its last line, as `tether worker` has one
            why = f" by {signal.Signals(stopped_by[0]).name}" if stopped_by else ""
            print(f"tether serve: stopped{why}", flush=True)
        return 0 if server.started else 1

    return run(main(), verbose)
