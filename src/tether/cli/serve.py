"""`tether serve`: the HTTP API (FastAPI on uvicorn; the `server` extra), optionally with a
worker in the same process."""

from __future__ import annotations

import ipaddress
import os
import signal
from types import FrameType

import click

from ..config import redact
from ..errors import ConfigError
from ..extras import requires_extra
from ._common import PORT, POSITIVE_FLOAT, POSITIVE_INT, connection_options, run, runtime_for
from ._root import cli


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server reachable from this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@cli.command("serve", help="run the HTTP API and the dashboard (FastAPI + uvicorn)")
@click.option("--host", default="127.0.0.1",
              help="address to bind (default 127.0.0.1; any other needs a token)")
@click.option("--port", type=PORT, default=8000, show_default=True, help="port to listen on")
@click.option("--token", help="bearer token clients must send (default $TETHER_TOKEN)")
@click.option("--token-name", metavar="NAME",
              help="who the audit log names for actions made with the token "
                   "(default $TETHER_TOKEN_NAME, else 'token'; 'anonymous' without a token)")
@click.option("--worker", is_flag=True, help="also run a worker in this process")
@click.option("--read-only", is_flag=True,
              help="serve views only: the dashboard shows no actions and the API refuses writes")
@click.option("--concurrency", type=POSITIVE_INT, default=None,
              help="the embedded worker's concurrency (default $TETHER_CONCURRENCY, else "
                   "[tool.tether], else 100)")
@click.option("--lease-ttl", type=POSITIVE_FLOAT, default=None,
              help="the embedded worker's lease TTL in seconds")
@connection_options
def serve(host: str, port: int, token: str | None, token_name: str | None, worker: bool,
          read_only: bool,
          concurrency: int | None, lease_ttl: float | None, db: str | None, app: str | None,
          verbose: bool) -> int:
    async def main() -> int:
        with requires_extra("server", "tether serve"):
            import uvicorn

            from ..service import create_app, drain

        bearer = (token if token is not None else os.environ.get("TETHER_TOKEN")) or None
        if not is_loopback(host) and bearer is None:
            raise ConfigError(
                f"refusing to bind {host!r} without a token: anyone who reaches it could start "
                "and resume runs. Pass --token (or set TETHER_TOKEN), or bind 127.0.0.1"
            )
        rt = runtime_for(db, app, need_app=worker, concurrency=concurrency, lease_ttl=lease_ttl)
        name = token_name or os.environ.get("TETHER_TOKEN_NAME") or None
        if name is not None and (not name.strip() or len(name) > 200):
            raise ConfigError("--token-name must be a non-empty name of at most 200 characters")
        from .. import observe

        shutdown = observe.enable_tracing_from_env(rt, "tether serve")  # bad OTEL_*: stop here
        await rt.open()  # a missing schema or unreachable database is a clear error
        asgi = create_app(rt, token=bearer, worker_concurrency=rt.settings.concurrency if worker else None,
                          read_only=read_only, token_name=name)
        config = uvicorn.Config(
            asgi, host=host, port=port, lifespan="on", access_log=verbose,
            log_level="info" if verbose else "warning", timeout_graceful_shutdown=5,
        )

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: FrameType | None) -> None:
                drain(asgi)
                super().handle_exit(sig, frame)

        server = Server(config)
        # uvicorn re-raises the signal that stopped it once it has shut down; these handlers
        # make that a clean exit (status 0) instead of death by SIGTERM or a KeyboardInterrupt.
        previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)}
        print(f"tether serve: http://{host}:{port} db={redact(rt.db_url)} "
              f"version={rt.version} worker={'on' if worker else 'off'} "
              f"auth={'token' if bearer else 'none'}{' read-only' if read_only else ''} "
              f"dashboard=http://{host}:{port}/ui", flush=True)
        try:
            await server.serve()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            await rt.close()
            for stop in shutdown:
                stop()
        return 0 if server.started else 1

    return run(main(), verbose)
